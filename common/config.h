// Loading, overriding and validating pstrain::Config (proto/pstrain/config.proto).
#pragma once

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// Parses a text-proto Config. Unknown fields and malformed values are errors that name the file,
// line, column and field.
absl::StatusOr<Config> ParseConfigText(absl::string_view text, absl::string_view source_name);
absl::StatusOr<Config> LoadConfigFile(const std::string& path);

// Applies one `a.b.c=value` override. For a repeated field the value is a list in text-proto
// form, `[1, 2, 3]`, and replaces the field; a scalar value appends one element. Paths through
// repeated messages take an index: `data.train[0].path=[...]`. Errors name the path.
absl::Status ApplyOverride(absl::string_view assignment, Config* config);

// Checks values that the schema's types cannot express (positive sizes, known combinations).
// Errors name the offending field path, e.g. "model.embedding_dim: must be > 0, got -3".
absl::Status ValidateConfig(const Config& config);

// Fills the defaults a proto2 schema cannot state: an absent dense_optimizer becomes
// { type: ADAM learning_rate: 0.001 } (OptimizerConfig's own defaults are the sparse side's).
// BuildConfig (cmd/cli.h) calls it after loading --config and before the --set overrides, so
// `--set dense_optimizer.learning_rate=...` tunes that Adam.
void ApplyConfigDefaults(Config* config);

// Fills the 0 = "automatic" thread settings from the CPUs this process may use (`cores`: the
// affinity mask capped by the cgroup quota, common/cpu.h): towers = cores, intra_op = cores /
// towers, inter_op = min(4, cores / 2). OMP_NUM_THREADS, when set (omp_num_threads > 0), bounds
// intra_op_threads, the automatic value and a configured one alike, as it bounds every OpenMP
// team. Returns a note for the log when it lowered a configured value, else "".
std::string ResolveThreadDefaults(int cores, ThreadConfig* threads, int omp_num_threads = 0);

// Text-proto rendering, for logs and for `tune` fragments.
std::string ConfigToText(const google::protobuf::Message& message);

}  // namespace pstrain
