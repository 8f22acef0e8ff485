#include "serving/request_rows.h"

#include <google/protobuf/descriptor.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

// A value for messages: quoted, escaped, at most 40 characters.
std::string Shown(absl::string_view v) {
  if (v.size() > 40) return absl::StrCat("'", absl::CHexEscape(v.substr(0, 40)), "...'");
  return absl::StrCat("'", absl::CHexEscape(v), "'");
}

absl::Status Bad(const char* kind, int row, const FeatureSpec& spec, int f, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kind, " ", row, ", field ", f + 1, " (",
                                                 spec.field(f).name, "): ", what));
}

// Sets field f of row r from text. A list field's text is a list as a CSV list column writes it
// (ParseListText, the CSV reader's own code: "a|b:0.5|c", empty = an empty list); any other
// field's empty text is missing. `hash_text`: categorical text that is not hex is hashed (CSV)
// rather than refused (TSV); list items are always read as the CSV reader reads them.
absl::Status SetFromText(const FeatureSpec& spec, int r, int f, absl::string_view text,
                         bool hash_text, const char* kind, RawRows* rows,
                         std::vector<absl::string_view>* pieces) {
  if (spec.field(f).list) {
    absl::Status s = ParseListText(text, spec, f, r, rows, pieces);
    return s.ok() ? s : Bad(kind, r, spec, f, s.message());
  }
  if (text.empty()) return absl::OkStatus();
  const char* b = text.data();
  const char* e = b + text.size();
  if (spec.field(f).kind == CATEGORICAL) {
    uint64_t key;
    if (!ParseHexKey(b, e, &key)) {
      if (!hash_text) {
        return Bad(kind, r, spec, f,
                   absl::StrCat("bad key ", Shown(text), ": expected 1..16 hex digits or empty"));
      }
      key = HashBytes(text);
    }
    rows->SetCategorical(r, f, key);
    return absl::OkStatus();
  }
  double v;
  if (!ParseNumber(b, e, &v)) {
    return Bad(kind, r, spec, f,
               absl::StrCat("bad number ", Shown(text),
                            ": expected an integer, a finite decimal number or empty"));
  }
  rows->SetNumeric(r, f, v);
  return absl::OkStatus();
}

// A categorical key for field f of row r: a list field's list of that one id (weight 1).
void SetKey(const FeatureSpec& spec, int r, int f, uint64_t key, RawRows* rows) {
  if (spec.field(f).list) {
    rows->StartList(r, f);
    rows->AddToList(r, f, key);
  } else {
    rows->SetCategorical(r, f, key);
  }
}

absl::Status ParseTextRows(const PredictRequest& req, const FeatureSpec& spec, RawRows* rows) {
  const char sep = req.row_format() == PredictRequest::CSV ? ',' : '\t';
  const bool csv = req.row_format() == PredictRequest::CSV;
  const int nf = spec.num_fields();
  const int want = nf + (req.rows_have_label() ? 1 : 0);
  std::vector<absl::string_view> pieces;  // a list column's items
  for (int i = 0; i < req.rows_size(); ++i) {
    absl::string_view line = req.rows(i);
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<absl::string_view> cols;
    size_t start = 0;
    while (true) {
      const size_t at = line.find(sep, start);
      cols.push_back(line.substr(start, at == absl::string_view::npos ? absl::string_view::npos
                                                                         : at - start));
      if (at == absl::string_view::npos || static_cast<int>(cols.size()) > want) break;
      start = at + 1;
    }
    if (static_cast<int>(cols.size()) != want) {
      const bool more = cols.size() > static_cast<size_t>(want);
      return absl::InvalidArgumentError(absl::StrCat(
          "row ", i, ": ", more ? "more than " : "", more ? want : static_cast<int>(cols.size()),
          " ", csv ? "comma" : "tab", "-separated values, expected ", want, " (",
          req.rows_have_label() ? "the label and " : "", "the model's ", nf, " fields ",
          spec.field(0).name, "..", spec.field(nf - 1).name, ")"));
    }
    const int r = rows->AddRow(0.f);
    const int skip = req.rows_have_label() ? 1 : 0;
    for (int f = 0; f < nf; ++f) {
      absl::Status s = SetFromText(spec, r, f, cols[f + skip], csv, "row", rows, &pieces);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseExamples(const PredictRequest& req, const FeatureSpec& spec, RawRows* rows) {
  const int nf = spec.num_fields();
  std::vector<int> seen(nf, -1);
  std::vector<absl::string_view> pieces;  // a list's items
  for (int i = 0; i < req.examples_size(); ++i) {
    const FeatureList& ex = req.examples(i);
    const int r = rows->AddRow(0.f);
    for (int j = 0; j < ex.feature_size(); ++j) {
      const Feature& feat = ex.feature(j);
      const int f = spec.FieldIndex(feat.name());
      if (f < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "example ", i, ", feature ", j, ": no field named ", Shown(feat.name()),
            " in the model (its fields: ", spec.field(0).name, "..", spec.field(nf - 1).name, ")"));
      }
      if (seen[f] == i) return Bad("example", i, spec, f, "given twice");
      seen[f] = i;
      const bool categorical = spec.field(f).kind == CATEGORICAL;
      switch (feat.value_case()) {
        case Feature::VALUE_NOT_SET:
          break;  // missing
        case Feature::kNumber: {
          const double v = feat.number();
          if (!std::isfinite(v)) return Bad("example", i, spec, f, "number is not finite");
          if (!categorical) {
            rows->SetNumeric(r, f, v);
          } else if (v >= 0 && v < 18446744073709551616.0 && v == std::floor(v)) {
            SetKey(spec, r, f, static_cast<uint64_t>(v), rows);
          } else {
            return Bad("example", i, spec, f,
                       absl::StrCat("number ", v, " for a categorical field: expected a whole "
                                    "key in [0, 2^64), a key or text"));
          }
          break;
        }
        case Feature::kText: {
          absl::Status s = SetFromText(spec, r, f, feat.text(), /*hash_text=*/true, "example", rows,
                                       &pieces);
          if (!s.ok()) return s;
          break;
        }
        case Feature::kKey:
          if (!categorical) {
            return Bad("example", i, spec, f, "a key for a numeric field: give a number");
          }
          SetKey(spec, r, f, feat.key(), rows);
          break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestFields(const PredictRequest& request) {
  if (PredictRequest::RowFormat_IsValid(request.row_format())) return absl::OkStatus();
  // The valid values from the schema itself, so that a new one is named without an edit here.
  const google::protobuf::EnumDescriptor* e = PredictRequest::RowFormat_descriptor();
  std::string valid;
  for (int i = 0; i < e->value_count(); ++i) {
    absl::StrAppend(&valid, i == 0 ? "" : i + 1 == e->value_count() ? " or " : ", ",
                    e->value(i)->name(), " (", e->value(i)->number(), ")");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("row_format ", static_cast<int>(request.row_format()), ": expected ", valid));
}

absl::Status ParseRequestRows(const PredictRequest& request, const FeatureSpec& spec,
                              RawRows* rows) {
  if (absl::Status s = CheckRequestFields(request); !s.ok()) return s;
  if (request.rows_size() > 0 && request.examples_size() > 0) {
    return absl::InvalidArgumentError(
        "a request carries rows or examples, not both (split it in two)");
  }
  if (rows->size() == 0) rows->Clear(spec.num_fields());
  if (request.rows_size() > 0) return ParseTextRows(request, spec, rows);
  return ParseExamples(request, spec, rows);
}

}  // namespace pstrain
