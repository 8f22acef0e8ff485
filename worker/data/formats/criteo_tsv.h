// CRITEO_TSV: `label \t I1..I13 \t C1..C26`, one example per line (docs/FORMATS.md).
//
// Positional: column 1 is the label, column f + 2 is field f of the FeatureSpec (the CRITEO
// preset gives 13 NUMERIC then 26 CATEGORICAL). Empty = missing; lines may stop early (public
// copies strip trailing empty fields), the rest are then missing. Numeric: decimal integers or
// float text. Categorical: 1..16 hex digits, key = their value. Framing is LineSource's.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"

namespace pstrain {

std::unique_ptr<RecordParser> NewCriteoTsvParser(const FeatureSpec& spec);

// Writes every field (label first); categorical keys as lowercase hex of at least 8 digits,
// numeric values as integers when integral, else shortest round-trip text. Categorical values
// other than 1 are refused (TSV cannot store them).
absl::StatusOr<std::unique_ptr<RecordWriter>> NewCriteoTsvWriter(const FeatureSpec& spec,
                                                                 const std::string& path);

}  // namespace pstrain
