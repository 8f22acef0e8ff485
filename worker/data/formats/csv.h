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

// The most columns a CSV file may have (header and data lines alike). A header is bounded in bytes
// by data.max_record_bytes, but every column costs a parser more than its bytes (4 bytes per
// column and parser, and a view per column while the header is read): the column count is
// checked first, by a scan that allocates nothing, so that a header of millions of empty columns
// is an error, not gigabytes (issue 26 item 6). Real CTR files have tens to a few thousand.
inline constexpr int kMaxCsvColumns = 65536;

// The number of columns of a CSV line (its commas outside double quotes, plus one), counting no
// further than max_columns + 1: linear, allocates nothing. A line with an unclosed quote counts
// the columns before it; SplitCsvLine then says what is wrong.
int CountCsvColumns(absl::string_view line, int max_columns = kMaxCsvColumns);

// Splits one CSV line into its fields per the rules above; quoted fields are unescaped into
// *storage, which the views in *fields point into (valid until the next call). INVALID_ARGUMENT
// naming the column for an unclosed quote or a stray one, and for more than `max_fields` fields
// (found before the views of more are stored). Exposed for tests.
absl::Status SplitCsvLine(absl::string_view line, std::vector<absl::string_view>* fields,
                          std::string* storage, int max_fields = kMaxCsvColumns);

// Fails (INVALID_ARGUMENT, naming the field) if a field or the label has no column in `header`,
// and (naming the limit) if the header has more than kMaxCsvColumns columns, before anything is
// allocated per column. The CSV source (line_source.h) refuses such a header already, naming
// the file and line 1.
absl::StatusOr<std::unique_ptr<RecordParser>> NewCsvParser(const FeatureSpec& spec,
                                                           absl::string_view header);

// Header `label,<field names>`; values as the TSV writer's (hex keys, integer or round-trip
// numbers). Categorical values other than 1 are refused.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewCsvWriter(const FeatureSpec& spec,
                                                           const std::string& path);

}  // namespace pstrain
