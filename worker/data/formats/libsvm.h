// LIBSVM in the tensorflow-DeepFM / tf_repos convention: `label id:val id:val ...` with exactly
// one pair per field, in field order (docs/FORMATS.md).
//
// Pair j is field j. Categorical: key = id (a global feature index), value = val. Numeric:
// value = val, key = id (kept, unused by the encoding). Tokens are separated by spaces or tabs.
// The label is 0, 1, a number in [0, 1], or LibSVM's -1 / +1 (read as 0 / 1).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"

namespace pstrain {

std::unique_ptr<RecordParser> NewLibSvmParser(const FeatureSpec& spec);

// Writes `label key:value ...`; numeric fields get their field index as id. A missing field
// cannot be represented: Write fails naming the row.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewLibSvmWriter(const FeatureSpec& spec,
                                                              const std::string& path);

}  // namespace pstrain
