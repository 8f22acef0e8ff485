// The embedding and dense stores in block files (checkpoint/block_file.h): block tags EMBM, EMBR
// and DNSE, byte layout in docs/CHECKPOINT.md. Embedding rows are read back as a stream of row
// batches, so a restore can re-partition them onto stores with different ranges.
//
// Thread-safety: as safe as the objects given (the stores are thread-safe; BlockWriter and
// BlockReader are not).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/block_file.h"
#include "checkpoint/warm_start.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"

namespace pstrain {

constexpr char kEmbeddingMetaTag[] = "EMBM";
constexpr char kEmbeddingRowsTag[] = "EMBR";
constexpr char kDenseTag[] = "DNSE";
constexpr int kRowsPerBlock = 65536;  // rows per EMBR block, at most

// The EMBM block: what the following EMBR blocks hold.
struct EmbeddingMeta {
  int64_t begin = 0;  // the saved store's range
  int64_t end = 0;
  int dim = 0;
  OptimizerType optimizer = SGD;
  int state_floats = 0;
  int64_t last_step = 0;
};

// Writes one EMBM block and the snapshot's rows in EMBR blocks of at most kRowsPerBlock rows.
absl::Status SaveEmbeddingStore(const EmbeddingSnapshot& snapshot, BlockWriter* writer);
// The same for a live store, streamed: snapshots of successive row ranges are written one at a
// time, so memory stays bounded by a range, not the table. Each row is still consistent.
// changed_since > 0 (an incremental checkpoint): only the rows stamped >= changed_since
// (EmbeddingStore::Snapshot); the EMBM block is the same, so readers need not know. With the
// store's change logs kept since changed_since, the rows come from one walk of the logs
// (EmbeddingStore::ChangedRows) and are copied in pieces of at most a range's row count.
absl::Status SaveEmbeddingStore(const EmbeddingStore& store, BlockWriter* writer,
                                uint32_t changed_since = 0);
// The same for the store as an Image holds it (a copy-on-write instant, EmbeddingStore::Freeze),
// while training goes on: the rows of the instant, and its last_step. Adds the rows written to
// *rows_written when it is not null.
absl::Status SaveEmbeddingStore(const EmbeddingStore::Image& image, BlockWriter* writer,
                                uint32_t changed_since = 0, int64_t* rows_written = nullptr);

// Called for each EMBR block: ids[n] (ascending), weights n x dim, state n x state_floats.
using EmbeddingRowsFn =
    std::function<absl::Status(const EmbeddingMeta& meta, absl::Span<const int64_t> ids,
                               const float* weights, const float* state)>;

// Reads one embedding group: the next block must be EMBM (DATA_LOSS otherwise), then every EMBR
// block that follows it, passing their rows to `fn` (an error from fn stops the load and is
// returned). Returns the group's meta. Checks that ids are ascending and inside [begin, end).
absl::StatusOr<EmbeddingMeta> LoadEmbeddingRows(BlockReader* reader, const EmbeddingRowsFn& fn);

// What a load keeps of the saved values besides the weights.
struct ParameterLoadMode {
  // false (a warm start): the stores' last_step restarts at 0, since the new job counts its own
  // steps; true (a resume): the saved last_step.
  bool keep_step = true;
  // false (--reset_optimizer): every restored row and the dense slice get the stores' own
  // Optimizer::InitState, as if never trained, and the saved optimizer type may differ from the
  // stores'; true: the saved slots (the same optimizer type and state size, FAILED_PRECONDITION
  // otherwise).
  bool keep_optimizer_state = true;
  // A warm start across changed tables (checkpoint/warm_start.h TableWarmStart): when not empty,
  // only the saved rows in a move's [from_begin, from_end) are loaded, each as row
  // to_begin + (id - from_begin); every other saved row is skipped. Empty: every row as saved.
  struct RowMove {
    int64_t from_begin = 0, from_end = 0, to_begin = 0;
  };
  std::vector<RowMove> moves;
  // false: the saved dense vector is not loaded (a warm start whose fields feeding it changed).
  bool dense = true;
  // true (a warm start): a saved dynamic table the config does not have is skipped (the table
  // was dropped); false (a resume): refused (LoadDynamicTables).
  bool skip_unknown_dynamic = false;
};

// The load mode of a warm start (keep_step false, the slots unless reset_optimizer, dynamic
// tables the config dropped skipped), table by
// table when `tables` is set (ChooseWarmStartCheckpoint's plan): its taken tables as moves, and
// the dense vector only when the plan copies it.
ParameterLoadMode WarmStartLoadMode(bool reset_optimizer,
                                    const std::optional<TableWarmStart>& tables);

// Re-partitioning restore: reads one embedding group and gives every row to the store among
// `stores` that owns it; rows no store owns are skipped (a shard reading another layout's
// files). A group written at another width than a store's dim (compact table widths: a PS
// partition store holds its table's 1 + dim, a single-process store the model's stride; or a
// checkpoint written at the stride before compact widths) is resized row by row (ResizeRow,
// ps/store/table_rows.h: the first min of the two widths kept, zeros / InitState's slots after
// them). FAILED_PRECONDITION if a store's optimizer / state size differ from the file's.
// Adds the number of rows restored to *rows_loaded when it is not null. `mode`: what is kept
// besides the weights.
absl::Status LoadEmbeddingStores(BlockReader* reader, absl::Span<EmbeddingStore* const> stores,
                                 int64_t* rows_loaded, ParameterLoadMode mode = {});

// One DNSE block holding the snapshot; and reading it back (the next block must be DNSE).
absl::Status SaveDenseStore(const DenseSnapshot& snapshot, BlockWriter* writer);
absl::StatusOr<DenseSnapshot> LoadDenseSnapshot(BlockReader* reader);
// `saved` as `mode` restores it into `store`: last_step 0 without keep_step; without
// keep_optimizer_state, store's optimizer with its InitState slots over saved's range.
DenseSnapshot DenseSnapshotForLoad(DenseSnapshot saved, const DenseStore& store,
                                   ParameterLoadMode mode);

}  // namespace pstrain
