// Choosing the checkpoint a warm start copies (train.warm_start, --warm_start_from;
// docs/CHECKPOINT.md "Warm start"). What is copied, and into what, is each mode's restore code:
// ps/store/parameter_files.h LoadParameterFiles reads any mode's and shard count's files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "common/env.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// The checkpoint `warm_start.from()` names, verified completely with the chain of a delta
// (VerifyCheckpointChain; CheckpointChoice::chain is what a loader reads): a model dir
// (ChooseCheckpoint: LATEST, falling back past a corrupt checkpoint) or one of its ckpt-<step>
// directories (that one, no fallback). Its MANIFEST's model description is compared with
// `wanted` (CompareModelDescriptions: FAILED_PRECONDITION naming the field, e.g.
// model.embedding_dim); without reset_optimizer the optimizer types must match too. A version-1
// MANIFEST (no description) is accepted with a warning: the restore's shape check (rows, row
// size, dense size) is then all that guards it. Errors name the source: NOT_FOUND for a missing
// directory or a model dir without a checkpoint, DATA_LOSS for one whose checkpoints are all
// corrupt. `env` checks that the source is a directory (or a symlink to one).
//
// Tables changed (docs/CHECKPOINT.md "Warm start across changed tables"): when the descriptions
// differ and either names tables (features.table), the warm start goes table by table instead
// (PlanTableWarmStart); *tables (when not null) is set to its plan, and left empty when the
// descriptions are the same (every row and the dense vector, as before tables).
struct TableWarmStart {
  // A source table whose rows the target takes: source rows [from_begin, from_end) become
  // target rows [to_begin, to_begin + from_end - from_begin). A dynamic table's rows are not
  // ranges: its live rows are taken by table name (ps/store/dynamic_checkpoint.h), the range is
  // empty and `dynamic` set.
  struct Take {
    std::string name;  // "" for the default table (the fields that name no table)
    int64_t from_begin = 0, from_end = 0, to_begin = 0;
    bool dynamic = false;
  };
  std::vector<Take> taken;
  std::vector<std::string> fresh;  // target tables the source lacks: initialized as new
  // The dense vector (the MLP and the rest) is copied only when the fields' layout feeding it
  // is the same (the same fields in the same order at the same dims); else it starts fresh.
  bool dense = true;
  std::string dense_reason;  // why not, when dense is false
  // One line for the log: which tables were taken, which are new, and the dense vector.
  std::string Summary() const;
};
absl::StatusOr<CheckpointChoice> ChooseWarmStartCheckpoint(
    const WarmStart& warm_start, const ModelDescription& wanted, Env* env = Env::Default(),
    std::optional<TableWarmStart>* tables = nullptr);

// The table-by-table warm start from a checkpoint described by `saved` into a config described
// by `wanted` (both resolved, FeatureSpec::Resolved's layout: the default table's slices first,
// one per field without a table, then the named tables in order). Each target table takes the
// rows of the source table of the same name when it has the same dim and rows; a table of the
// same name with another dim or rows is refused (FAILED_PRECONDITION naming the table and both
// values: its rows would mean something else, and no rule maps them); a table the source lacks
// is fresh. A dynamic table takes the live rows of a dynamic table of the same name and dim
// (its lifetime settings may change); a fixed table of the name of a dynamic one, or the other
// way round, is refused naming both kinds (a fixed row is a hash bucket of many raw ids, a
// dynamic key the hash of one: neither maps to the other). The default table is the same table
// only if its fields are the same (names, vocab_size, positions: a field's hash seed is its
// position), refused naming the first difference otherwise. The model (type, embedding_dim,
// hidden) and features.hash_seed must be the same (a named table's hashing depends on hash_seed
// and its name only).
absl::StatusOr<TableWarmStart> PlanTableWarmStart(const ModelDescription& saved,
                                                  const ModelDescription& wanted);

}  // namespace pstrain
