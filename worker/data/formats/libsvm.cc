#include "worker/data/formats/libsvm.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

inline bool IsSpace(char c) { return c == ' ' || c == '\t'; }

class LibSvmParser : public RowParser {
 public:
  explicit LibSvmParser(const FeatureSpec& spec) : RowParser(spec) {
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (spec.field(f).list) {
        has_lists_ = true;
      } else {
        pair_field_.push_back(f);
      }
    }
  }

 private:
  absl::Status ParseOne(const RecordRef& rec, RawRows* rows) override {
    const char* p = rec.data.data();
    const char* const end = p + rec.data.size();
    const int nf = spec_.num_fields();
    auto next_token = [&](const char** tok_end) {
      while (p < end && IsSpace(*p)) ++p;
      const char* e = p;
      while (e < end && !IsSpace(*e)) ++e;
      *tok_end = e;
    };
    const char* e;
    next_token(&e);
    float label;
    const absl::string_view label_text(p, e - p);
    if (label_text == "-1" || label_text == "+1") {
      label = label_text[0] == '+' ? 1.0f : 0.0f;
    } else if (!ParseLabel(p, e, &label)) {
      return BadRecord(rec, LIBSVM, absl::StrCat("bad label ", Quote(label_text),
                                                 ": expected 0, 1, -1, +1 or a number in [0, 1]"));
    }
    p = e;
    if (has_lists_) return ParseWithLists(rec, label, rows);
    const size_t base = static_cast<size_t>(rows->AddRow(label)) * nf;
    int f = 0;
    for (;; ++f) {
      next_token(&e);
      if (p == end) break;
      if (f < nf) {
        const char* colon = p;
        while (colon < e && *colon != ':') ++colon;
        uint64_t id;
        if (colon == e || !ParseUint64(p, colon, &id) ||
            !ParseNumber(colon + 1, e, &rows->value[base + f])) {
          rows->PopRow();
          return BadRecord(rec, LIBSVM, absl::StrCat("pair ", f + 1, " (", spec_.field(f).name,
                                                     "): bad pair ",
                                                     Quote(absl::string_view(p, e - p)),
                                                     ": expected id:value with an unsigned "
                                                     "integer id and a finite number"));
        }
        rows->key[base + f] = id;
        rows->present[base + f] = 1;
      }
      p = e;
    }
    if (f != nf) {
      rows->PopRow();
      return BadRecord(rec, LIBSVM, absl::StrCat("found ", f, " id:value pairs, expected ", nf,
                                                 " (one per field, in field order)"));
    }
    return absl::OkStatus();
  }

  // With list fields: the single-valued fields' `id:value` pairs in field order (list fields take
  // no pair), and any number of `field:id:value` triples, in any order, each one id (and its
  // weight) of list field `field` (its index in the spec). A list field without triples is an
  // empty list.
  absl::Status ParseWithLists(const RecordRef& rec, float label, RawRows* rows) {
    const char* p = rec.data.data();
    const char* const end = p + rec.data.size();
    while (p < end && !IsSpace(*p)) ++p;  // the label, parsed by the caller
    const int row = rows->AddRow(label);
    const size_t base = static_cast<size_t>(row) * spec_.num_fields();
    triples_.clear();
    size_t pairs = 0;
    absl::Status error;
    while (error.ok()) {
      while (p < end && IsSpace(*p)) ++p;
      if (p == end) break;
      const char* e = p;
      while (e < end && !IsSpace(*e)) ++e;
      const absl::string_view tok(p, e - p);
      const size_t c1 = tok.find(':');
      const size_t c2 = c1 == absl::string_view::npos ? c1 : tok.find(':', c1 + 1);
      if (c2 != absl::string_view::npos) {
        Triple t;
        uint64_t field = 0;
        if (!ParseUint64(p, p + c1, &field) || !ParseUint64(p + c1 + 1, p + c2, &t.id) ||
            !ParseNumber(p + c2 + 1, e, &t.weight)) {
          error = BadRecord(rec, LIBSVM, absl::StrCat("bad triple ", Quote(tok),
                                                      ": expected field:id:value with unsigned "
                                                      "integers and a finite number"));
        } else if (field >= static_cast<uint64_t>(spec_.num_fields()) ||
                   !spec_.field(static_cast<int>(field)).list) {
          error = BadRecord(rec, LIBSVM, absl::StrCat("triple ", Quote(tok), ": field ", field,
                                                      " is not a list field"));
        } else {
          t.field = static_cast<int>(field);
          triples_.push_back(t);
        }
      } else if (pairs < pair_field_.size()) {
        const int f = pair_field_[pairs++];
        uint64_t id;
        if (c1 == absl::string_view::npos || !ParseUint64(p, p + c1, &id) ||
            !ParseNumber(p + c1 + 1, e, &rows->value[base + f])) {
          error = BadRecord(rec, LIBSVM, absl::StrCat("pair ", pairs, " (", spec_.field(f).name,
                                                      "): bad pair ", Quote(tok),
                                                      ": expected id:value with an unsigned "
                                                      "integer id and a finite number"));
        } else {
          rows->key[base + f] = id;
          rows->present[base + f] = 1;
        }
      } else {
        ++pairs;
      }
      p = e;
    }
    if (error.ok() && pairs != pair_field_.size()) {
      error = BadRecord(rec, LIBSVM, absl::StrCat("found ", pairs, " id:value pairs, expected ",
                                                  pair_field_.size(),
                                                  " (one per single-valued field, in field order)"));
    }
    // Each list field's triples, in the order given.
    for (int f = 0; error.ok() && f < spec_.num_fields(); ++f) {
      if (!spec_.field(f).list) continue;
      rows->StartList(row, f);
      size_t n = 0;
      for (const Triple& t : triples_) n += t.field == f;
      absl::StatusOr<size_t> keep = ListLengthToKeep(rec, LIBSVM, spec_.field(f), n, rows);
      if (!keep.ok()) {
        error = keep.status();
        break;
      }
      size_t added = 0;
      for (const Triple& t : triples_) {
        if (t.field != f || added == *keep) continue;
        rows->AddToList(row, f, t.id, t.weight);
        ++added;
      }
    }
    if (!error.ok()) rows->PopRow();
    return error;
  }

  struct Triple {
    int field = 0;
    uint64_t id = 0;
    double weight = 1.0;
  };
  bool has_lists_ = false;
  std::vector<int> pair_field_;  // the single-valued fields, in order: pair k is field pair_field_[k]
  std::vector<Triple> triples_;  // the record's list entries
};

class LibSvmWriter : public BufferedRecordWriter {
 public:
  LibSvmWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out)
      : BufferedRecordWriter(LIBSVM, spec, std::move(out),
                             WritableRows{/*missing_ok=*/false, /*categorical_scale_ok=*/true}),
        row_(new char[kMaxLabelChars +
                      spec.num_fields() * (2 + kMaxUint64Chars + kMaxNumberChars) + 1]) {}

 private:
  // "label id:value ...": the key is the id of a categorical field, the field index of a
  // numeric one.
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    const int nf = spec_.num_fields();
    const size_t base = static_cast<size_t>(r) * nf;
    if (spec_.has_lists()) return AppendRowWithLists(rows, r, out);
    char* p = WriteLabel(rows.labels[r], row_.get());
    for (int f = 0; f < nf; ++f) {
      *p++ = ' ';
      p = WriteUint64(categorical_[f] ? rows.key[base + f] : uint64_t(f), p);
      *p++ = ':';
      const double v = rows.value[base + f];
      *p = '1';  // the usual value of a categorical field
      p = v == 1.0 ? p + 1 : WriteNumber(v, p);
    }
    *p++ = '\n';
    out->append(row_.get(), p - row_.get());
    return absl::OkStatus();
  }

  // With list fields: the single-valued fields' pairs, then each list's `field:id:value`
  // triples (the parser's syntax, docs/FORMATS.md "Lists").
  absl::Status AppendRowWithLists(const RawRows& rows, int r, std::string* out) {
    char* p = WriteLabel(rows.labels[r], row_.get());
    out->append(row_.get(), p - row_.get());
    char buf[3 + 2 * kMaxUint64Chars + kMaxNumberChars];
    for (int f = 0; f < spec_.num_fields(); ++f) {
      if (spec_.field(f).list) continue;
      const size_t i = rows.Cell(r, f);
      p = buf;
      *p++ = ' ';
      p = WriteUint64(categorical_[f] ? rows.key[i] : uint64_t(f), p);
      *p++ = ':';
      p = WriteNumber(rows.value[i], p);
      out->append(buf, p - buf);
    }
    for (int f = 0; f < spec_.num_fields(); ++f) {
      if (!spec_.field(f).list) continue;
      const size_t i = rows.Cell(r, f);
      for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
        const size_t at = rows.list_begin[i] + j;
        p = buf;
        *p++ = ' ';
        p = WriteUint64(static_cast<uint64_t>(f), p);
        *p++ = ':';
        p = WriteUint64(rows.list_key[at], p);
        *p++ = ':';
        p = WriteNumber(rows.list_weight[at], p);
        out->append(buf, p - buf);
      }
    }
    out->push_back('\n');
    return absl::OkStatus();
  }

  std::unique_ptr<char[]> row_;  // one formatted row
};

}  // namespace

std::unique_ptr<RecordParser> NewLibSvmParser(const FeatureSpec& spec) {
  return std::make_unique<LibSvmParser>(spec);
}

absl::StatusOr<std::unique_ptr<RecordWriter>> NewLibSvmWriter(const FeatureSpec& spec,
                                                              const std::string& path) {
  ASSIGN_OR_RETURN(auto out, BufferedWriter::Create(path));
  return std::unique_ptr<RecordWriter>(new LibSvmWriter(spec, std::move(out)));
}

}  // namespace pstrain
