// CSV with a header line (like DeepCTR's criteo_sample.txt), docs/FORMATS.md.
//
// Columns are matched to fields by header name and the label by FeatureSpec::label_name();
// other columns are ignored. Every data line has exactly the header's number of columns. Values:
// empty = missing; numeric = integer or float text ("260.0"); categorical = 1..16 hex digits
// (key = their value) or any other text (key = HashBytes(text)).
//
// Quoting, RFC 4180: a field in double quotes may hold commas, and "" inside it is one quote
// ("a ""b"", c" is `a "b", c`); the header may be quoted too. A newline inside a quoted field is
// NOT supported: framing is LineSource's (one record per line, with a header), which is what lets
// the pipeline shard records and resume them by byte offset; such a line is a bad record whose
// message says so (an unclosed quote). A quote inside an unquoted field is a bad record too.
// Lines without a quote take the fast path (no copy).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"

namespace pstrain {

// Splits one CSV line into its fields per the rules above; quoted fields are unescaped into
// *storage, which the views in *fields point into (valid until the next call). INVALID_ARGUMENT
// naming the column for an unclosed quote or a stray one. Exposed for tests.
absl::Status SplitCsvLine(absl::string_view line, std::vector<absl::string_view>* fields,
                          std::string* storage);

// Fails (INVALID_ARGUMENT, naming the field) if a field or the label has no column in `header`.
absl::StatusOr<std::unique_ptr<RecordParser>> NewCsvParser(const FeatureSpec& spec,
                                                           absl::string_view header);

// Header `label,<field names>`; values as the TSV writer's (hex keys, integer or round-trip
// numbers). Categorical values other than 1 are refused.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewCsvWriter(const FeatureSpec& spec,
                                                           const std::string& path);

}  // namespace pstrain
