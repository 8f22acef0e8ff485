#include "worker/data/formats/csv.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/hash.h"
#include "common/status.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

constexpr int kIgnored = -1;
constexpr int kLabel = -2;

inline const char* FindComma(const char* p, const char* end) {
  const void* c = std::memchr(p, ',', static_cast<size_t>(end - p));
  return c ? static_cast<const char*>(c) : end;
}

}  // namespace

int CountCsvColumns(absl::string_view line, int max_columns) {
  int columns = 1;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;  // "" inside a quoted field toggles twice
    } else if (c == ',' && !quoted && ++columns > max_columns) {
      break;
    }
  }
  return columns;
}

absl::Status SplitCsvLine(absl::string_view line, std::vector<absl::string_view>* fields,
                          std::string* storage, int max_fields) {
  fields->clear();
  storage->clear();
  storage->reserve(line.size());  // views into it stay valid: it never grows past this
  size_t i = 0;
  while (true) {
    if (static_cast<int>(fields->size()) >= max_fields) {
      return absl::InvalidArgumentError(
          max_fields == kMaxCsvColumns
              ? absl::StrCat("more than ", max_fields, " columns, the most a CSV line may have")
              : absl::StrCat("found more than ", max_fields, " columns, expected ", max_fields,
                             " as in the header"));
    }
    if (i < line.size() && line[i] == '"') {
      // A quoted field: up to the closing quote; "" is one quote.
      const size_t start = storage->size();
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            storage->push_back('"');
            i += 2;
            continue;
          }
          closed = true;
          ++i;
          break;
        }
        storage->push_back(line[i++]);
      }
      if (!closed) {
        return absl::InvalidArgumentError(absl::StrCat(
            "column ", fields->size() + 1, ": a quoted field is not closed on this line: "
            "expected a closing '\"' (newlines inside quoted fields are not supported: CSV is "
            "read by line, so that records can be sharded and resumed by byte offset)"));
      }
      fields->emplace_back(storage->data() + start, storage->size() - start);
      if (i == line.size()) return absl::OkStatus();
      if (line[i] != ',') {
        return absl::InvalidArgumentError(absl::StrCat(
            "column ", fields->size(), ": expected ',' or the end of the line after a quoted "
            "field, got '", std::string(1, line[i]), "'"));
      }
      ++i;
      continue;
    }
    const size_t comma = line.find(',', i);
    const absl::string_view text =
        line.substr(i, comma == absl::string_view::npos ? absl::string_view::npos : comma - i);
    if (text.find('"') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", fields->size() + 1, ": a '\"' inside an unquoted field: expected the whole "
          "field in quotes with the quote doubled (RFC 4180)"));
    }
    fields->push_back(text);
    if (comma == absl::string_view::npos) return absl::OkStatus();
    i = comma + 1;
  }
}

namespace {

class CsvParser : public RowParser {
 public:
  CsvParser(const FeatureSpec& spec, std::vector<int> column_target)
      : RowParser(spec), target_(std::move(column_target)) {}

 private:
  absl::Status ParseOne(const RecordRef& rec, RawRows* rows) override {
    const char* const begin = rec.data.data();
    const char* const end = begin + rec.data.size();
    const int columns = static_cast<int>(target_.size());
    // Quoted fields (RFC 4180) take the slow path; plain lines are split in place.
    const bool quoted = std::memchr(begin, '"', rec.data.size()) != nullptr;
    int found = 1;
    if (quoted) {
      // At most one field more than the header's is stored: a line of a million quoted fields
      // is refused without a million views.
      if (absl::Status s = SplitCsvLine(rec.data, &fields_, &unquoted_, columns); !s.ok()) {
        return BadRecord(rec, CSV, std::string(s.message()));
      }
      found = static_cast<int>(fields_.size());
    } else {
      for (const char* q = begin; q < end; ++q) found += *q == ',';
    }
    if (found != columns) {
      return BadRecord(rec, CSV, absl::StrCat("found ", found, " columns, expected ", columns,
                                              " as in the header"));
    }
    const int row = rows->AddRow(0.0f);
    const size_t base = static_cast<size_t>(row) * spec_.num_fields();
    const char* p = begin;
    for (int c = 0; c < columns; ++c, ++p) {
      absl::string_view text;
      if (quoted) {
        text = fields_[c];
      } else {
        const char* comma_in_line = FindComma(p, end);
        text = absl::string_view(p, static_cast<size_t>(comma_in_line - p));
        p = comma_in_line;
      }
      const char* comma = text.data() + text.size();
      const int t = target_[c];
      if (t == kIgnored) continue;
      if (t == kLabel) {
        if (!ParseLabel(text.data(), comma, &rows->labels[row])) {
          rows->PopRow();
          return BadRecord(rec, CSV, absl::StrCat("column ", c + 1, " (", spec_.label_name(),
                                                  "): bad label ", Quote(text),
                                                  ": expected 0, 1 or a number in [0, 1]"));
        }
        continue;
      }
      const size_t i = base + t;
      if (spec_.field(t).list) {
        if (absl::Status s = ParseList(rec, c, t, text, row, rows); !s.ok()) {
          rows->PopRow();
          return s;
        }
        continue;
      }
      if (text.empty()) continue;  // missing
      if (spec_.field(t).kind == CATEGORICAL) {
        if (!ParseHexKey(text.data(), comma, &rows->key[i])) rows->key[i] = HashBytes(text);
        rows->value[i] = 1.0;
      } else if (!ParseNumber(text.data(), comma, &rows->value[i])) {
        rows->PopRow();
        return BadRecord(rec, CSV, absl::StrCat("column ", c + 1, " (", spec_.field(t).name,
                                                "): bad number ", Quote(text),
                                                ": expected an integer, a decimal number or empty"));
      }
      rows->present[i] = 1;
    }
    return absl::OkStatus();
  }

  // A list column: ParseListText's syntax ("a|b:0.5|c"), errors naming the record and column.
  absl::Status ParseList(const RecordRef& rec, int column, int f, absl::string_view text,
                         int row, RawRows* rows) {
    absl::Status s = ParseListText(text, spec_, f, row, rows, &pieces_);
    if (s.ok()) return s;
    return BadRecord(rec, CSV, absl::StrCat("column ", column + 1, " (", spec_.field(f).name,
                                            "): ", s.message()));
  }

  // Per column: field index, kLabel or kIgnored (a column's name, in messages, is its field's:
  // the header matched them by name). The only memory a parser holds per column.
  const std::vector<int> target_;
  std::vector<absl::string_view> fields_;  // a quoted line's fields (views into unquoted_)
  std::string unquoted_;
  std::vector<absl::string_view> pieces_;  // a list column's ids
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordParser>> NewCsvParser(const FeatureSpec& spec,
                                                           absl::string_view header) {
  // The column count first, without allocating: every column costs the parser memory.
  if (CountCsvColumns(header) > kMaxCsvColumns) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CSV header (line 1, ", header.size(), " bytes): more than ", kMaxCsvColumns,
        " columns, the most a CSV file may have (docs/FORMATS.md)"));
  }
  std::vector<absl::string_view> split;
  std::string storage;
  if (absl::Status s = SplitCsvLine(header, &split, &storage); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("CSV header ", Quote(header), ": ", s.message()));
  }
  std::vector<int> target(split.size(), kIgnored);
  std::vector<int> column_of_field(spec.num_fields(), -1);
  int label_column = -1;
  for (size_t c = 0; c < split.size(); ++c) {
    const absl::string_view name = absl::StripAsciiWhitespace(split[c]);
    int t = name == spec.label_name() ? kLabel : spec.FieldIndex(std::string(name));
    if (t == kIgnored) continue;
    int* seen = t == kLabel ? &label_column : &column_of_field[t];
    if (*seen >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("CSV header: column '", name,
                                                     "' appears twice (columns ", *seen + 1,
                                                     " and ", c + 1, ")"));
    }
    *seen = static_cast<int>(c);
    target[c] = t;
  }
  if (label_column < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CSV header has no label column '",
                                                   spec.label_name(), "' (header: ",
                                                   Quote(header), ")"));
  }
  for (int f = 0; f < spec.num_fields(); ++f) {
    if (column_of_field[f] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("CSV header has no column for field '",
                                                     spec.field(f).name, "' (header: ",
                                                     Quote(header), ")"));
    }
  }
  return std::unique_ptr<RecordParser>(new CsvParser(spec, std::move(target)));
}

namespace {

// The CSV writer of a spec with list fields: DelimitedTextWriter's text for the other fields, and
// a list as its items joined by the field's separator, each the key in hex with ":weight" when
// the weight is not 1 (docs/FORMATS.md "Lists"). Field by field, not vectorized.
class CsvListWriter : public BufferedRecordWriter {
 public:
  CsvListWriter(const FeatureSpec& spec, std::unique_ptr<BufferedWriter> out,
                absl::string_view header)
      : BufferedRecordWriter(CSV, spec, std::move(out), WritableRows{}) {
    absl::StrAppend(out_->buffer(), header, "\n");
  }

 private:
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override {
    char buf[kMaxLabelChars + kMaxNumberChars + kMaxHexKeyChars + 8];
    out->append(buf, WriteLabel(rows.labels[r], buf) - buf);
    for (int f = 0; f < spec_.num_fields(); ++f) {
      out->push_back(',');
      const size_t i = rows.Cell(r, f);
      const FeatureSpec::Field& field = spec_.field(f);
      if (field.list) {
        for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
          if (j > 0) out->append(field.separator);
          const size_t at = rows.list_begin[i] + j;
          char* p = WriteHexKey(rows.list_key[at], buf);
          if (rows.list_weight[at] != 1.0) {
            *p++ = ':';
            p = WriteNumber(rows.list_weight[at], p);
          }
          out->append(buf, p - buf);
        }
        continue;
      }
      if (!rows.present[i]) continue;
      char* p = categorical_[f] ? WriteHexKey(rows.key[i], buf) : WriteNumber(rows.value[i], buf);
      out->append(buf, p - buf);
    }
    out->push_back('\n');
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordWriter>> NewCsvWriter(const FeatureSpec& spec,
                                                           const std::string& path) {
  ASSIGN_OR_RETURN(auto out, BufferedWriter::Create(path));
  std::string header = spec.label_name();
  for (const auto& f : spec.fields()) absl::StrAppend(&header, ",", f.name);
  if (spec.has_lists()) {
    return std::unique_ptr<RecordWriter>(new CsvListWriter(spec, std::move(out), header));
  }
  return std::unique_ptr<RecordWriter>(
      new DelimitedTextWriter(CSV, spec, std::move(out), ',', header));
}

}  // namespace pstrain
