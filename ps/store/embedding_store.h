// EmbeddingStore: the rows [begin, end) of the one logical embedding table, with their optimizer
// state. The single-process trainer owns one store for [0, total_rows); a PS shard owns one store
// per partition it holds (ps/store/partition.h).
//
// Memory grows with the rows TRAINED, not with the table size. A row gets storage on its first
// Apply (or Restore): a slot in an arena that grows in chunks of chunk_rows rows, in touch
// order, so hashed ids scattered over a huge table cost only their own rows. An index maps each
// row id to its slot: 4 bytes per row, allocated lazily in pages of 4096 rows (16 KB). In all:
// touched rows x (dim + StateFloats(dim) + 1) x 4 bytes, plus at most 4 bytes per table row.
// Chunks and index pages come from mmap'd slabs (ps/store/slab_arena.h), not malloc: among the
// per-step messages in malloc's heaps they pinned freed memory the process could not give back.
//
// A row is initialized on its first Apply with Options::row_init (typically Model::InitRow) and
// Optimizer::InitState. Gather of a row that was never trained returns row_init's value without
// storing anything, so evaluation traffic costs no memory. row_init must therefore be a pure
// function of the row id (Model::InitRow is).
//
// Each stored row is a 4-byte generation stamp (below; first, so that Apply's read of it shares
// the weights' cache line), dim weights, StateFloats(dim) optimizer floats, and with row_versions
// one more 4-byte word: the row's version, the count of updates applied to it since it got
// storage (Gather reports it; a restored row starts again at 0).
//
// Dirty rows (incremental checkpoints, docs/CHECKPOINT.md): the store has a current generation
// (initially 1; BeginGeneration). Every Apply stamps each row it updates with the generation it
// reads under the row's lock; RestoreRows stamps 0. Snapshot(from, to, changed_since) captures
// only the rows stamped >= changed_since. A checkpointer begins generation g right before it
// snapshots, and the next delta asks for changed_since = g: exactly the rows updated after that
// snapshot's copy of them. The stamp costs Apply a load and a compare in a cache line it writes
// anyway, and a store when the generation changed.
//
// Change log: so that a delta costs what it writes, not what is stored, the store also keeps,
// per stripe and per generation, the rows first stamped in that generation (an Apply that finds
// a row new, or stamped below the current generation, appends its id: once per row per
// generation, under the stripe's lock Apply already holds). A delta walks the logs of the
// generations >= changed_since instead of every stored row. The logs are complete from
// generation 1 (construction) on; BeginGeneration(g, keep_from) drops those of generations below
// keep_from, and a later Snapshot with 0 < changed_since < keep_from scans every stored row's
// stamp instead (the same rows, slower). Memory: 4 bytes per (row, kept generation) in which the
// row was updated, vector slack included at most 8: with a checkpointer that keeps only the
// generations a future delta may ask for, bounded by the rows dirtied since the oldest of them;
// with no checkpointer at all, 4-8 bytes per trained row (about 3-6% of a k = 16 Adagrad row).
//
// Copy-on-write images (a PS checkpoint, docs/CHECKPOINT.md "PS mode"): Freeze(g, keep_from)
// begins generation g as BeginGeneration does and returns an Image: the store as it was at that
// instant, readable while training goes on. Until the Image is destroyed, the first update of a
// row stamped below g saves the row's whole slot first (its pre-image, under the row's lock, in
// the stripe's pre-image table). A row of the image is then its pre-image if it has one, else the
// live row if that is stamped below g (not updated since); a row stored since the instant has
// neither and is not in the image. So a checkpoint of a shard costs the memory of the rows
// updated while it is written, not a copy of every row. The cost to Apply: none for a row already
// stamped with the current generation; a row's first update after the freeze copies its slot.
//
// Per-row staleness (async PS, Options::row_versions): an Apply that names, for each row, the
// version its gradient was computed from has per-row staleness tau = (the row's updates since);
// counted in staleness(), and each row's learning rate is divided by max(1, tau) - the
// staleness-aware ASGD of Zhang et al. (IJCAI 2016) per parameter row: a row every worker
// updates is damped, a row only one worker touches keeps its rate.
//
// Thread-safety: every method may be called concurrently from any number of threads. Each row
// is guarded by one of 1024 striped mutexes (by row id), held for the whole read or update of
// the row, so concurrent Apply calls never tear a row or its optimizer state, and Gather and
// Snapshot never see a half-updated row.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ps/store/optimizer.h"
#include "ps/store/slab_arena.h"

namespace pstrain {

// Initial weights of one row: fills row[dim] as a function of the global row id only. Called
// concurrently; must be thread-safe and deterministic.
using RowInit = std::function<void(int64_t row, float* out)>;

// Every initialized row of a store, captured row by row under the row's lock: each row's weights
// and all its optimizer slots come from the same instant (rows may come from different
// instants, as in any asynchronous parameter server).
struct EmbeddingSnapshot {
  int64_t begin = 0;  // the store's range [begin, end)
  int64_t end = 0;
  int dim = 0;
  OptimizerType optimizer = SGD;
  int state_floats = 0;   // StateFloats(dim)
  int64_t last_step = 0;  // the store's last_step() when the capture began

  std::vector<int64_t> ids;    // ascending global row ids
  std::vector<float> weights;  // ids.size() x dim
  std::vector<float> state;    // ids.size() x state_floats

  int64_t rows() const { return static_cast<int64_t>(ids.size()); }
};

class EmbeddingStore {
 public:
  struct Options {
    int64_t begin = 0;  // global row range [begin, end); end > begin
    int64_t end = 0;
    int dim = 0;  // floats per row (Model::row_dim(), or a table's 1 + dim: table_rows.h)
    // Required. Shared: one optimizer usually serves every store of a shard.
    std::shared_ptr<const Optimizer> optimizer;
    // Initial weights of a row; null means zeros.
    RowInit row_init;
    // OpenMP threads that Gather / Apply / Snapshot split one call over (ParallelFor).
    int threads = 1;
    // Rows per arena chunk (the unit of allocation); a power of two, >= 64.
    int chunk_rows = 4096;
    // Keep a version per row, and scale a versioned Apply's learning rate per row (see above).
    bool row_versions = false;
    // The optimizers of global row ranges with settings of their own (a table's overrides of the
    // sparse optimizer, FeatureConfig.table.optimizer; ps/store/table_rows.h): a row in an
    // entry's [begin, end) is initialized and updated by its optimizer, every other row by
    // `optimizer`. Each must be of `optimizer`'s type (the same slots); entries are disjoint.
    struct RangeOptimizer {
      int64_t begin = 0;
      int64_t end = 0;
      std::shared_ptr<const Optimizer> optimizer;
    };
    std::vector<RangeOptimizer> range_optimizers;
  };
  // The staleness of the versioned row updates applied so far.
  struct Staleness {
    int64_t updates = 0;  // rows updated with a version
    int64_t sum = 0;      // of their tau
    int64_t max = 0;
  };

  struct Stats {
    int64_t rows_initialized = 0;  // rows with stored values
    // Memory held: arena chunks, index pages and bookkeeping; not the change logs (their
    // entries: change_log_entries()).
    int64_t bytes = 0;
    // Of `bytes`: the index pages allocated so far, the most they can take (every page), and
    // one page (a new row's first touch of its page allocates it).
    int64_t index_bytes = 0;
    int64_t max_index_bytes = 0;
    int64_t index_page_bytes = 0;
    // Bytes one new arena chunk takes (chunk_rows rows of weights and slots).
    int64_t chunk_bytes = 0;
    int64_t last_step = 0;         // largest step passed to Apply / Restore
  };

  // INVALID_ARGUMENT for a bad range (at most 2^32 - 1 rows), dim, chunk_rows or a missing
  // optimizer.
  static absl::StatusOr<std::unique_ptr<EmbeddingStore>> Create(Options options);
  ~EmbeddingStore();
  EmbeddingStore(const EmbeddingStore&) = delete;
  EmbeddingStore& operator=(const EmbeddingStore&) = delete;

  int64_t begin() const { return opt_.begin; }
  int64_t end() const { return opt_.end; }
  int dim() const { return opt_.dim; }
  int state_floats() const { return state_floats_; }
  const Optimizer& optimizer() const { return *opt_.optimizer; }
  bool Owns(int64_t row) const { return row >= opt_.begin && row < opt_.end; }

  // out[i * dim, (i + 1) * dim) = current weights of ids[i] (row_init's value for a row never
  // trained). INVALID_ARGUMENT naming the first id outside [begin, end); nothing is written then.
  // With row_versions and versions not null, versions[i] = ids[i]'s version (0 if never trained).
  // `threads`: the OpenMP threads this call splits over; 0: Options::threads. 1 runs it on the
  // calling thread, for callers that split the work over their own threads (TrainStep).
  absl::Status Gather(absl::Span<const int64_t> ids, float* out, uint32_t* versions = nullptr,
                      int threads = 0) const;

  // Applies one optimizer update to each row: grads is ids.size() x dim. Rows are initialized on
  // first touch. Callers normally pass unique ids (the worker merges duplicates); a repeated id
  // is applied once per occurrence, one after the other (in unspecified order when threads > 1).
  // `step` is the caller's global step of this update, kept as last_step() and saved with
  // snapshots; the optimizer math does not use it (Adam counts updates per row).
  // With row_versions and computed_from not null, computed_from[i] is the version of ids[i] the
  // gradient was computed from (a Gather's answer): per-row staleness (see above). A version
  // ahead of the row's (restored since) counts as tau = 0.
  // INVALID_ARGUMENT naming the first id outside [begin, end); nothing is applied then.
  // `threads` as for Gather.
  absl::Status Apply(absl::Span<const int64_t> ids, const float* grads, int64_t step,
                     const uint32_t* computed_from = nullptr, int threads = 0);
  Staleness staleness() const;

  // Captures every initialized row in [from, to) (clamped to the store's range) whose generation
  // stamp is >= changed_since (0: every row); see EmbeddingSnapshot. Training is blocked only row
  // by row, for the copy of one row. Snapshot() is the whole range; a caller writing a huge table
  // can stream it range by range instead. A row updated while the snapshot runs is captured with
  // or without that update, and in the latter case it is stamped with the generation of then:
  // exactness of "changed since" needs the generation raised before the snapshot starts.
  // Cost: with changed_since in the kept change logs (see the top of this file), a walk of every
  // kept log entry (whatever the range) and a sort of those in the range; otherwise a pass over
  // every stored row of the range. Then the copy of the rows captured.
  EmbeddingSnapshot Snapshot(int64_t from, int64_t to, uint32_t changed_since = 0) const;
  EmbeddingSnapshot Snapshot() const { return Snapshot(opt_.begin, opt_.end); }

  // A delta in pieces, for a writer that streams one (SaveEmbeddingStore): ChangedRows is the
  // rows of [from, to) in the change logs of the generations >= changed_since (> 0), ascending
  // and unique, from one walk of the logs; nullopt if those logs were dropped (Snapshot then
  // scans). SnapshotRows(ids, changed_since) captures the rows of `ids` (ascending) that are
  // stored and still stamped >= changed_since, as Snapshot does; Snapshot(from, to, c) with the
  // logs kept is SnapshotRows(*ChangedRows(from, to, c), c).
  std::optional<std::vector<int64_t>> ChangedRows(int64_t from, int64_t to,
                                                  uint32_t changed_since) const;
  EmbeddingSnapshot SnapshotRows(absl::Span<const int64_t> ids, uint32_t changed_since) const;

  // A copy-on-write image of the store at this instant (see the top of this file): begins
  // generation g as BeginGeneration(g, keep_from) does. At most one Image of a store at a time
  // (a programmer's error otherwise); the store must outlive it. No RestoreRows while it is held.
  class Image;
  std::unique_ptr<Image> Freeze(uint32_t g, uint32_t keep_from);

  // The generation Apply stamps rows with (see the top of this file).
  uint32_t generation() const { return generation_.load(); }
  // Later Apply calls stamp g (> generation(); a programmer's error otherwise), and the change
  // logs of the generations below keep_from (<= g) are dropped: the caller promises that no
  // Snapshot it takes from now on asks for 0 < changed_since < keep_from quickly (it still may,
  // and gets the slow, exact scan). A checkpointer passes g for a full checkpoint and the
  // changed_since of its last committed checkpoint for a delta, whose write may fail and be
  // retried from that generation.
  void BeginGeneration(uint32_t g, uint32_t keep_from);
  // The oldest generation whose change log is complete (1 until a BeginGeneration drops logs).
  uint32_t oldest_logged_generation() const;
  // Entries in the kept change logs (a row restored and updated again within one generation is
  // logged twice): the logs' memory is 4 bytes per entry plus vector slack.
  int64_t change_log_entries() const;

  // Writes rows as given (giving them storage as needed): weights is ids.size() x dim, state is
  // ids.size() x state_floats, or null to start the rows from InitState. Rows not listed keep
  // their current contents. Meant for loading a checkpoint into a fresh store, possibly from
  // several sources (re-partitioning). INVALID_ARGUMENT naming the first id outside the range.
  absl::Status RestoreRows(absl::Span<const int64_t> ids, const float* weights, const float* state);
  // RestoreRows of a whole snapshot, after checking that its dim, optimizer type and state size
  // match this store (FAILED_PRECONDITION naming both otherwise). Also raises last_step to the
  // snapshot's.
  absl::Status Restore(const EmbeddingSnapshot& snapshot);

  int64_t last_step() const { return last_step_.load(std::memory_order_relaxed); }
  Stats stats() const;

 private:
  // The rows a stripe saw first stamped in one generation, as offsets from begin.
  struct GenerationLog {
    uint32_t generation;
    std::vector<uint32_t> rows;
  };
  // One lock and its change logs (oldest generation first: the kept generations in which a row
  // of the stripe was updated), in one cache line.
  // std::mutex, not absl::Mutex: Debian's abseil is built with its debug-mode deadlock
  // detection on, which made each lock/unlock pair cost ~100 ns here (38.6k per batch).
  struct alignas(64) Stripe {
    std::mutex mu;
    std::vector<GenerationLog> logs;  // guarded by mu
  };
  static_assert(sizeof(Stripe) == 64, "a stripe's lock and logs share one cache line");
  static constexpr int kStripes = 1024;
  static constexpr int kIndexShift = 12;  // 4096 rows per index page
  static constexpr int64_t kIndexPageRows = int64_t{1} << kIndexShift;

  explicit EmbeddingStore(Options options);
  absl::Status CheckIds(absl::Span<const int64_t> ids) const;
  Stripe& StripeOf(int64_t row) const { return stripes_[row & (kStripes - 1)]; }
  // Appends `row` to its stripe's log of `generation` (the newest). Caller holds the stripe.
  // Out of line and cold: Apply's loop stays as tight as without the log.
  ABSL_ATTRIBUTE_NOINLINE void LogChange(Stripe& stripe, int64_t row, uint32_t generation) const;
  // The stored rows of [from, to), ascending, from the index (every page of the range).
  std::vector<int64_t> StoredRows(int64_t from, int64_t to) const;
  // Keeps the rows of `ids` stamped >= changed_since (read without the rows' locks).
  void KeepStampedSince(uint32_t changed_since, std::vector<int64_t>* ids) const;
  // A snapshot's header fields (no rows).
  EmbeddingSnapshot EmptySnapshot() const;
  // Copies the rows of snap->ids (ascending) under their locks into snap; with recheck, drops
  // those not stored or stamped below changed_since by now. With image > 0 (an Image's
  // generation), the rows as they were at that Image's instant (RowInImage); an Image's reads
  // pass recheck, since rows stored after the instant have no image.
  void CopyRows(uint32_t changed_since, bool recheck, EmbeddingSnapshot* snap,
                uint32_t image = 0) const;
  // Under the row's stripe, with an Image of generation `image` held: the row as it was at the
  // Image's instant (a pre-image or the live row; see the top of this file), or null if it was
  // not stored then.
  const float* RowInImage(int64_t row, uint32_t image) const;
  // Saves the slot of `row` (stored, stamped below the held Image's generation) as its pre-image,
  // unless it has one. Caller holds the row's stripe. Cold: once per row per Image.
  ABSL_ATTRIBUTE_NOINLINE void Preserve(int64_t row, const float* data);
  void EndImage();
  // The row of a slot (one word past the slot's start, the stamp).
  float* SlotData(uint32_t slot) const;
  // The stored row of `row`, or null if it has none. Caller holds the row's stripe.
  float* FindRow(int64_t row) const;
  // The stored row of `row`, giving it a slot if it has none; then sets *fresh and the caller
  // must fill the row. Caller holds the row's stripe (exclusively).
  float* ClaimRow(int64_t row, bool* fresh);
  // The index of the Options::range_optimizers entry holding `row`, or -1 (the store's).
  int RangeOf(int64_t row) const {
    for (size_t r = 0; r < opt_.range_optimizers.size(); ++r) {
      const Options::RangeOptimizer& ro = opt_.range_optimizers[r];
      if (row >= ro.begin && row < ro.end) return static_cast<int>(r);
    }
    return -1;
  }
  // The optimizer of a row: its range's or the store's.
  const Optimizer& OptimizerOf(int64_t row) const {
    const int r = RangeOf(row);
    return r < 0 ? *opt_.optimizer : *opt_.range_optimizers[r].optimizer;
  }
  void RaiseLastStep(int64_t step);
  // The generation stamp of a stored row (the word before its weights), read and written
  // atomically: Apply writes it under the row's lock, a delta's stamp pass reads it without.
  uint32_t StampOf(const float* row) const;
  void SetStamp(float* row, uint32_t generation) const;
  // Software prefetch for a pass over ids[i, end): the index entry of a row far ahead and the
  // stored row (its first `bytes`) of a row nearer ahead. A pass over scattered rows is bound by
  // memory latency, not compute. Reads the index without the row's lock: a hint only.
  void Prefetch(absl::Span<const int64_t> ids, int64_t i, int64_t end, int64_t bytes) const;

  const Options opt_;
  const int state_floats_;
  const int64_t stride_;  // floats per slot: 1 (the stamp) + dim + state_floats (+ 1 version)
  const int chunk_shift_;
  const int64_t num_index_pages_;
  const int64_t max_chunks_;
  // index_[p][i] = 1 + slot of row begin + p * 4096 + i, or 0 if the row has no stored values.
  // Entries change only under the row's stripe (0 -> slot, once); pages and chunks come from
  // slabs_ (out of malloc's heaps, ps/store/slab_arena.h), each installed once under grow_mu_,
  // and are unmapped at destruction.
  SlabArena slabs_;
  std::mutex grow_mu_;
  std::unique_ptr<std::atomic<std::atomic<uint32_t>*>[]> index_;
  std::unique_ptr<std::atomic<float*>[]> chunks_;  // chunk c holds slots [c, c + 1) x chunk_rows
  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<int64_t> next_slot_{0};
  std::atomic<int64_t> index_pages_{0};
  std::atomic<int64_t> chunks_allocated_{0};
  std::atomic<int64_t> last_step_{0};
  std::atomic<uint32_t> generation_{1};
  // Held by BeginGeneration and by a snapshot's walk of the logs (never by Apply), so that the
  // logs a walk relies on are not dropped under it. Lock order: log_mu_, then a stripe.
  mutable std::mutex log_mu_;
  uint32_t oldest_logged_ = 1;  // guarded by log_mu_
  std::atomic<int64_t> stale_updates_{0}, stale_sum_{0}, stale_max_{0};

  // The held Image: its generation (0: none; read by Apply under a stripe, after generation_),
  // and per stripe the pre-images of its rows (row offset -> index in slots, stride_ floats each,
  // the stamp first), each guarded by its stripe's mutex; allocated by Freeze, freed by EndImage.
  struct PreImages {
    absl::flat_hash_map<uint32_t, uint32_t> at;
    std::vector<float> slots;
  };
  std::atomic<uint32_t> image_generation_{0};
  std::unique_ptr<PreImages[]> pre_images_;
  std::atomic<int64_t> preserved_rows_{0};
};

// The store as it was at Freeze's instant (see the top of the file). Thread-compatible: one
// reader at a time; training goes on concurrently. Destroying it ends the copy-on-write and
// frees the pre-images.
class EmbeddingStore::Image {
 public:
  ~Image();
  Image(const Image&) = delete;
  Image& operator=(const Image&) = delete;

  const EmbeddingStore& store() const { return *store_; }
  uint32_t generation() const { return generation_; }
  // As EmbeddingStore::Snapshot and SnapshotRows, of the rows as they were at the instant (the
  // snapshot's last_step is the store's then). ChangedRows of the store serves a delta of an
  // Image too: it lists every row updated since changed_since, and SnapshotRows keeps those whose
  // instant's stamp is >= changed_since.
  EmbeddingSnapshot Snapshot(int64_t from, int64_t to, uint32_t changed_since = 0) const;
  EmbeddingSnapshot SnapshotRows(absl::Span<const int64_t> ids, uint32_t changed_since) const;
  int64_t last_step() const { return last_step_; }
  // Rows saved as pre-images so far (updated since the instant), and their bytes.
  int64_t preserved_rows() const;
  int64_t preserved_bytes() const;

 private:
  friend class EmbeddingStore;
  Image(EmbeddingStore* store, uint32_t generation, int64_t last_step)
      : store_(store), generation_(generation), last_step_(last_step) {}
  // The rows of `ids` (ascending, in the store's range) as they were at the instant.
  EmbeddingSnapshot Read(std::vector<int64_t> ids, uint32_t changed_since) const;
  EmbeddingStore* const store_;
  const uint32_t generation_;
  const int64_t last_step_;
};

}  // namespace pstrain
