// Loading, overriding and validating pstrain::Config (proto/pstrain/config.proto).
#pragma once

#include <cstdint>
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

// A field's list and share_rows_with settings, on their own (FeatureSpec::Create checks the
// share target against the other fields): a list only on a CATEGORICAL field, max_length in
// [1, kMaxListLength], a separator that is not empty, not a column delimiter (',' or tab), not a
// quote or line break. `path` prefixes the error ("features.field[3]").
inline constexpr int kMaxListLength = 4096;
absl::Status ValidateListSpec(const FieldSpec& field, absl::string_view path);

// One features.table entry on its own (FeatureSpec::Create checks names against the fields and
// each other): name [A-Za-z0-9_]+, dim in [0, kMaxTableDim], rows >= 2, initializer stddev >= 0
// and UNIFORM limit > 0, optimizer overrides in OptimizerConfig's ranges, partitions in
// [0, kMaxTablePartitions]. `path` prefixes the error ("features.table[2]").
inline constexpr int kMaxTableDim = 1024;
inline constexpr int kMaxTablePartitions = 1 << 16;
absl::Status ValidateTableConfig(const TableConfig& table, absl::string_view path);

// Fills the defaults a proto2 schema cannot state: an absent dense_optimizer becomes
// { type: ADAM learning_rate: 0.001 } (OptimizerConfig's own defaults are the sparse side's).
// BuildConfig (cmd/cli.h) calls it after loading --config and before the --set overrides, so
// `--set dense_optimizer.learning_rate=...` tunes that Adam.
void ApplyConfigDefaults(Config* config);

// The largest batch a config may ask for (train.batch_size, global_batch_size, eval_batch_size):
// batches are allocated whole, and a bound turns a typo into a validation error, not a failed
// allocation.
inline constexpr int kMaxBatch = 1 << 20;
// Model sizes a config may ask for (ValidateConfig; Model::Create checks the whole dense vector,
// the first layer included, against kMaxDenseFloats): hidden layers and their widths, and the
// dense floats (2^28: 1 GiB of weights, 3 with Adam's slots). k is bounded by the FM kernels'
// 1024 (worker/model/fm.h).
inline constexpr int kMaxHiddenLayers = 64;
inline constexpr int kMaxLayerWidth = 1 << 16;
inline constexpr int64_t kMaxDenseFloats = int64_t{1} << 28;
// The most threads of one kind (towers, intra-op, inter-op) and the largest core count (--cores)
// a process takes.
inline constexpr int kMaxThreads = 1024;

// The smallest per-tower share of a step that the automatic tower count makes (train.global_
// batch_size): below it a tower's GEMMs and per-step costs outweigh another tower's parallelism,
// so the remaining cores become intra-op threads (docs/PERFORMANCE.md "Many cores").
inline constexpr int kMinTowerBatch = 32;

// The examples worker `worker_index` of `num_workers` reads per step: its share of
// train.global_batch_size (the first global % workers workers one more), or towers x batch_size
// when that is 0. `threads` must be resolved (towers > 0).
int64_t StepBatch(const TrainConfig& train, const ThreadConfig& threads, int worker_index = 0,
                  int num_workers = 1);

// The factor cluster.scale_sparse_lr_by_share puts on the sparse learning rates of a PS job of
// `num_workers` workers: sqrt(1 / N) in ASYNC and BOUNDED with train.global_batch_size > 0,
// N > 1 and a sparse optimizer that normalizes each coordinate's step by its gradient history
// (ADAGRAD, FTRL), where each worker's push is one update of its share B / N; 1 otherwise (SYNC,
// SGD, ADAM, a per-tower batch, one worker, or the option off).
double SparseLrShareFactor(const Config& config, int num_workers);

// Multiplies sparse_optimizer.learning_rate and the learning_rate of every features.table
// optimizer override that sets one by `factor`.
void ScaleSparseLearningRates(double factor, Config* config);

// Fills the 0 = "automatic" thread settings from the CPUs this process may use (`cores`: the
// affinity mask capped by the cgroup quota, common/cpu.h), and with train.global_batch_size the
// per-tower train.batch_size, for worker `worker_index` of `num_workers`:
//   - inter_op = min(4, cores / 2), at least 1;
//   - compute cores: with a global batch and 8 cores or more, cores - inter_op / 2 (left to the
//     parsers and the trainer thread); else cores;
//   - towers: with a global batch, min(compute cores, share / kMinTowerBatch), at least 1 (a
//     share of 512 on 2 cores: 2 towers of 256; on 16: 14 towers of 36-37; on 72: 16 towers of
//     32 with 4 intra-op threads each); without, one per core (the update batch then grows with
//     the cores);
//   - intra_op = compute cores / towers;
//   - with a global batch, batch_size = ceil(share / towers), the largest tower's share.
// OMP_NUM_THREADS, when set (omp_num_threads > 0), bounds intra_op_threads, the automatic value
// and a configured one alike, as it bounds every OpenMP team. Returns a note for the log when it
// lowered a configured value, else "".
std::string ResolveThreadDefaults(int cores, Config* config, int omp_num_threads = 0,
                                  int worker_index = 0, int num_workers = 1);

// Text-proto rendering, for logs and for `tune` fragments.
std::string ConfigToText(const google::protobuf::Message& message);

}  // namespace pstrain
