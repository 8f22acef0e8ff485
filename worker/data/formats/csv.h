// CSV with a header line (like DeepCTR's criteo_sample.txt), docs/FORMATS.md.
//
// Columns are matched to fields by header name and the label by FeatureSpec::label_name();
// other columns are ignored. Every data line has exactly the header's number of columns. Values:
// empty = missing; numeric = integer or float text ("260.0"); categorical = 1..16 hex digits
// (key = their value) or any other text (key = HashBytes(text)). No quoting: values cannot hold
// commas. Framing is LineSource's with a header.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"

namespace pstrain {

// Fails (INVALID_ARGUMENT, naming the field) if a field or the label has no column in `header`.
absl::StatusOr<std::unique_ptr<RecordParser>> NewCsvParser(const FeatureSpec& spec,
                                                           absl::string_view header);

// Header `label,<field names>`; values as the TSV writer's (hex keys, integer or round-trip
// numbers). Categorical values other than 1 are refused.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewCsvWriter(const FeatureSpec& spec,
                                                           const std::string& path);

}  // namespace pstrain
