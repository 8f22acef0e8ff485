#include "worker/data/formats/libsvm.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

inline bool IsSpace(char c) { return c == ' ' || c == '\t'; }

class LibSvmParser : public RowParser {
 public:
  explicit LibSvmParser(const FeatureSpec& spec) : RowParser(spec) {}

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
