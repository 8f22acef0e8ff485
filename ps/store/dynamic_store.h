// DynamicEmbeddingStore: embedding rows keyed by a 64-bit key (the hash of a raw categorical id)
// instead of a row number in a fixed range, for tables whose ids come and go (issue 28): no
// vocabulary size, no collisions, rows created when a key is ADMITTED and deleted when EVICTED.
// It is the core of a "dynamic" table; the wiring (config, PS routing by key hash, checkpoint
// files, export, serving) is not done yet (docs/ARCHITECTURE.md "Dynamic tables").
//
// The API mirrors EmbeddingStore (ps/store/embedding_store.h) where it applies, so that wiring is
// mechanical: Gather / Apply with a step, Snapshot / Restore, generations for deltas, the same
// Optimizer and RowInit, and striped locks.
//
// Storage: 1024 stripes (by a mix of the key), each with its own lock, an absl::flat_hash_map
// key -> row pointer, and its own slots: chunks of chunk_rows (16) slots taken from one
// SlabArena (mmap'd, out of malloc's heaps; ps/store/slab_arena.h). An evicted row's slot goes
// on its stripe's free list and the next new row of the stripe reuses it, so memory follows the
// LIVE rows' high-water mark, not the rows ever created: with eviction keeping the live rows
// flat, memory stays flat (docs/PERFORMANCE.md "Dynamic rows"). Why not a map of key ->
// std::vector<float> (or a node map): one malloc per row (a 16-byte header and size-class
// rounding, plus the vector's 24 bytes in the map), scattered over malloc's heaps, which keep
// the freed rows of evicted keys pinned among the trainer's transient messages (see
// slab_arena.h), and one more dependent load per access. That alternative was reasoned about,
// not benchmarked; this layout measures 203 bytes a row for dim 17 + Adagrad (156 of them the
// slot) at 1M rows (bench/dynamic_store_bench.cc's bytes_per_row). A slot is
//   [stamp, dim weights, StateFloats(dim) state, count, last_pass, last_step (2 words)]
//
// 4-byte words: the generation stamp (as EmbeddingStore's), the row's update count (saturating at
// 2^32 - 1; LFU's frequency), the pass and step of its last update (TTL, LRU); the stamp before
// the weights and the rest after the state, so that a Gather reads only the stamp's and the
// weights' cache lines, as in EmbeddingStore. The map holds each key's row pointer (16 bytes an
// entry and a control byte), so a lookup is a probe of the control bytes (1 byte a row, mostly
// cached), one slot and the row.
//
// Admission (Options::admission): a key without a row is a candidate. Its Apply creates the row
// (from row_init, then Optimizer::InitState) only if the key is admitted, else the update is
// dropped and counted (Metrics::rejected):
//   kAlways: every key is admitted on its first Apply.
//   kCount: after the key's K-th Apply, counted in a count-min sketch with conservative update
//     (Estan & Varghese 2002): depth rows of counters, each key increments in each row the
//     counter its hash picks, but only the counters equal to the key's current minimum; the
//     estimate is the minimum. It never undercounts; with width W and depth d it overcounts by at
//     most eps x N with probability >= 1 - delta, eps = e / W, delta = e^-d, N the number of
//     counted Applies. Here each stripe owns W / 1024 columns of every row, guarded by the
//     stripe's lock, so the bound holds per stripe with N the stripe's count: e x N_s / (W / 1024),
//     which is e x N / W when keys spread evenly over the stripes (a hash spreads them). Memory:
//     W x d x 4 bytes (uint32 counters, saturating). Only keys without a row are counted; an
//     evicted key keeps its counts, so it is re-admitted on its next Apply (the sketch
//     remembers: a key evicted by TTL that comes back is still a frequent key). The counts are
//     aged only when the caller asks (AgeAdmissionCounts halves every counter): otherwise N
//     grows with every counted Apply, and so does the overcount bound, so over many days of new
//     ids more keys get in early. The wiring should age them at each pass's checkpoint.
//   kProbability: each Apply of a key without a row admits it with probability p, by a
//     deterministic coin: Fmix64 of (key, step, seed) < p x 2^64. Reproducible and resume-exact:
//     the same (key, step) always gives the same answer.
// A key without a row reads as zeros with admission (kCount, kProbability), as row_init's value
// with kAlways (whose first Apply creates the row from row_init, so Gather is continuous), in
// both cases without storing anything.
//
// Eviction (Evict, run explicitly: the wiring will call it at checkpoint time), counted:
//   TTL: a row is evicted when now - (its last update) >= T, in steps (ttl_steps, now =
//     last_step()) or in passes (ttl_passes, now = pass(); a pass is a day of data): "not updated
//     in the last T".
//   Capacity: then, above max_rows or max_bytes (converted to rows: bytes_per_row() each), the
//     rows of lowest (last_step, count, key) (kLru) or (count, last_step, key) (kLfu) go, down to
//     the cap. The key breaks ties, so the victims do not depend on the order of the map.
// Memory already resident stays resident (slots are reused, not unmapped): a cap bounds growth.
//
// Generations and deltas (as EmbeddingStore, docs/CHECKPOINT.md): Apply stamps each row it
// updates with generation() and logs the key once per generation in its stripe's change log;
// Evict logs each evicted key as a TOMBSTONE of the current generation. Snapshot(changed_since)
// with changed_since > 0 is a delta: the live rows stamped >= changed_since and the keys evicted
// in generations >= changed_since that are not live now. Restore of a full snapshot replaces the
// whole store; Restore of a delta deletes its tombstones and writes its rows. So full + deltas,
// with evictions in between, restore exactly the store's rows, their metadata and the sketch.
// Unlike EmbeddingStore, a delta NEEDS the logs (a scan cannot find the deleted keys): a
// Snapshot asking for changed_since below oldest_logged_generation() is FAILED_PRECONDITION.
// Not mirrored yet: copy-on-write Images (Freeze), per-row versions (async staleness).
//
// Thread-safety: every method may be called concurrently. A row, its stripe's map, slots, logs
// and sketch columns are guarded by the stripe's mutex. Gather and Apply take a batch stripe by
// stripe in ascending order, each stripe's lock held for its keys of the batch (and taken a few
// keys ahead, hand over hand); every other method holds one stripe at a time. One call gives
// the same result whatever its thread count (a repeated key's updates apply in batch order).
// Concurrent Apply calls on DISJOINT keys give exactly the result of a serial order, except that
// with kCount admission two keys that share sketch counters may see each other's counts in
// either order (within the sketch's overcount bound); on overlapping keys each update is applied
// whole, in some order (floats then differ in rounding, as in any asynchronous PS). Evict's TTL
// decides and removes under each stripe's lock; its capacity pass chooses the victims from one
// pass over the stripes and removes them in a second, so a victim updated in between is removed
// anyway.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ps/store/embedding_store.h"
#include "ps/store/optimizer.h"
#include "ps/store/slab_arena.h"

namespace pstrain {

// A count-min sketch with conservative update (see the top of the file), split into `parts`
// column blocks: a key counts only in the block its caller names (DynamicEmbeddingStore: the
// key's stripe, whose lock guards the block). Thread-compatible per block.
class CountMinSketch {
 public:
  // width: total columns, rounded up to a multiple of parts; depth >= 1.
  CountMinSketch(int64_t width, int depth, int parts, uint64_t seed);
  int64_t width() const { return width_; }
  int depth() const { return depth_; }
  // Counts one occurrence of key in block `part` (conservative update) and returns the new
  // estimate.
  uint32_t Add(uint64_t key, int part);
  // The estimate of key's count (>= its true count).
  uint32_t Estimate(uint64_t key, int part) const;
  int64_t bytes() const { return static_cast<int64_t>(counters_.size() * sizeof(uint32_t)); }
  // The counters, row-major [depth][width]; for snapshots.
  const std::vector<uint32_t>& counters() const { return counters_; }
  std::vector<uint32_t>* mutable_counters() { return &counters_; }

 private:
  size_t Index(uint64_t key, int row, int part) const;
  const int64_t width_;
  const int depth_;
  const int64_t part_width_;
  const uint64_t seed_;
  std::vector<uint32_t> counters_;
};

// A full or delta capture of a DynamicEmbeddingStore (see the top of the file).
struct DynamicSnapshot {
  int dim = 0;
  OptimizerType optimizer = SGD;
  int state_floats = 0;
  int64_t last_step = 0;
  int32_t pass = 0;
  uint32_t changed_since = 0;  // 0: a full snapshot; > 0: a delta of the generations >= it

  std::vector<uint64_t> keys;     // ascending, unique: the live rows captured
  std::vector<float> weights;     // keys.size() x dim
  std::vector<float> state;       // keys.size() x state_floats
  std::vector<uint32_t> counts;   // per row: updates applied
  std::vector<int32_t> last_pass;  // per row
  std::vector<int64_t> last_step_of;  // per row
  std::vector<uint64_t> deleted;  // a delta's tombstones: ascending, unique, none in keys

  // The admission sketch (kCount), [depth][width] counters; empty otherwise.
  int64_t sketch_width = 0;
  int sketch_depth = 0;
  std::vector<uint32_t> sketch;

  // The store's cumulative counters (Metrics), so that a resumed store counts on.
  int64_t admitted = 0, rejected = 0, evicted_ttl = 0, evicted_capacity = 0, seen = 0;

  int64_t rows() const { return static_cast<int64_t>(keys.size()); }
};

class DynamicEmbeddingStore {
 public:
  enum class Admission { kAlways, kCount, kProbability };
  enum class CapacityPolicy { kLru, kLfu };
  struct Options {
    int dim = 0;
    std::shared_ptr<const Optimizer> optimizer;  // required
    // Initial weights of a row, called with the key's bits as the int64 row id; null: zeros.
    RowInit row_init;
    int threads = 1;      // OpenMP threads Gather / Apply split one call over
    // Slots a stripe allocates at once (8 .. 65536): a stripe holds at most 2^16 chunks. Small,
    // so that a stripe's memory follows its live rows closely (a stripe over its high-water
    // mark grows by one chunk, not by a doubling): at most chunk_rows - 1 unused slots a stripe.
    int chunk_rows = 16;

    Admission admission = Admission::kAlways;
    uint32_t admit_count = 1;         // kCount: admit on the K-th Apply (>= 1)
    int64_t sketch_width = 1 << 20;   // kCount: counters per row (rounded up to x 1024)
    int sketch_depth = 4;             // kCount
    double admit_probability = 1.0;   // kProbability: in (0, 1]
    uint64_t seed = 0;                // the sketch's hashes and the coin

    // Eviction (Evict). 0: off.
    int64_t ttl_steps = 0;
    int32_t ttl_passes = 0;
    int64_t max_rows = 0;
    int64_t max_bytes = 0;
    CapacityPolicy capacity_policy = CapacityPolicy::kLru;
  };

  struct Metrics {
    int64_t rows_live = 0;
    int64_t admitted = 0;          // rows created by Apply (not by Restore)
    int64_t rejected = 0;          // updates dropped: key not admitted
    int64_t seen = 0;              // updates asked for (keys in Apply calls)
    int64_t evicted_ttl = 0;
    int64_t evicted_capacity = 0;
    int64_t new_keys_last_step = 0;  // rows created by the Apply calls of step last_step
    int64_t last_step = 0;
    // Memory held, measured: arena bytes handed out, the maps' and free lists' capacities, the
    // logs, the sketch and the stripes.
    int64_t bytes = 0;
    int64_t arena_bytes = 0;
    int64_t map_bytes = 0;
    int64_t sketch_bytes = 0;
  };

  struct EvictionResult {
    int64_t ttl = 0;
    int64_t capacity = 0;
  };

  // INVALID_ARGUMENT naming the option for a bad dim, chunk_rows, admission or eviction option,
  // or a missing optimizer.
  static absl::StatusOr<std::unique_ptr<DynamicEmbeddingStore>> Create(Options options);
  ~DynamicEmbeddingStore();
  DynamicEmbeddingStore(const DynamicEmbeddingStore&) = delete;
  DynamicEmbeddingStore& operator=(const DynamicEmbeddingStore&) = delete;

  int dim() const { return opt_.dim; }
  int state_floats() const { return state_floats_; }
  const Options& options() const { return opt_; }
  // Bytes a live row costs: its slot and its map entry (at the map's max load 7/8).
  int64_t bytes_per_row() const;

  // out[i * dim, (i + 1) * dim) = the weights of keys[i] (zeros or row_init's value for a key
  // without a row, see above). `threads` as EmbeddingStore::Gather.
  void Gather(absl::Span<const uint64_t> keys, float* out, int threads = 0) const;

  // One optimizer update per key (grads is keys.size() x dim), creating admitted rows; updates of
  // keys not admitted are dropped. A repeated key is updated once per occurrence, in batch
  // order. `step` as EmbeddingStore::Apply (kept as last_step(), the TTL's clock and the coin's
  // input). Rows updated record pass(). `threads` as EmbeddingStore::Apply.
  void Apply(absl::Span<const uint64_t> keys, const float* grads, int64_t step, int threads = 0);

  // Gather and Apply with key i's row at the caller's place: out (grads) + at[i] * stride floats
  // (stride >= dim; Gather writes a row's first dim floats only), so that a caller whose rows sit
  // at a wider stride and in another order (LocalParams: the step's rows at row_dim) needs no
  // buffer between. `at` null: at[i] = i. Otherwise as above.
  void GatherAt(absl::Span<const uint64_t> keys, const int32_t* at, int64_t stride, float* out,
                int threads = 0) const;
  void ApplyAt(absl::Span<const uint64_t> keys, const int32_t* at, int64_t stride,
               const float* grads, int64_t step, int threads = 0);

  // The current pass ("day"), recorded by Apply in the rows it updates; the TTL in passes
  // compares with it.
  void SetPass(int32_t pass) { pass_.store(pass); }
  int32_t pass() const { return pass_.load(); }

  // Runs the TTL and then the capacity eviction of the options; counted, and logged as
  // tombstones of the current generation.
  EvictionResult Evict() { return Evict(pass()); }
  // The same with the TTL in passes compared with `now_pass` instead of pass(): the PS evicts
  // before a pass's end at the last finished pass (pass() - 1) without moving pass(), which
  // concurrent Applies record.
  EvictionResult Evict(int32_t now_pass);
  // kCount: halves every counter of the admission sketch (rounding down), so that old sightings
  // weigh half; N, and the sketch's overcount bound, halve with them. No-op otherwise.
  void AgeAdmissionCounts();

  // See the top of the file. A delta (changed_since > 0) below oldest_logged_generation():
  // FAILED_PRECONDITION.
  absl::StatusOr<DynamicSnapshot> Snapshot(uint32_t changed_since = 0) const;
  // Full (changed_since 0): replaces every row, the sketch and the counters. Delta: deletes the
  // tombstones, writes the rows, replaces the sketch and the counters. Refuses a snapshot of
  // another dim, optimizer or sketch shape (FAILED_PRECONDITION), and one whose sizes do not
  // match or whose keys or tombstones are not ascending and unique or overlap
  // (INVALID_ARGUMENT, naming the first bad index); nothing is changed then. Restored rows are
  // stamped 0 (not changed since any checkpoint). Raises last_step and sets the pass.
  absl::Status Restore(const DynamicSnapshot& snapshot);

  // As EmbeddingStore's.
  uint32_t generation() const { return generation_.load(); }
  void BeginGeneration(uint32_t g, uint32_t keep_from);
  uint32_t oldest_logged_generation() const;

  int64_t last_step() const { return last_step_.load(std::memory_order_relaxed); }
  Metrics metrics() const;

 private:
  static constexpr int kStripes = 1024;
  // A slot's 4-byte words: the stamp (before the row), then, after the state, the count, the
  // last pass and the last step (2).
  static constexpr int kWords = 5;
  enum Words { kStamp = 0, kCount = 1, kPass = 2, kStepLo = 3, kStepHi = 4 };
  uint32_t* WordAt(const float* row, int i) const;
  uint32_t Word(const float* row, int i) const;
  void SetWord(float* row, int i, uint32_t v) const;
  int64_t StepOf(const float* row) const;
  void SetStep(float* row, int64_t step) const;
  struct GenerationLog {
    uint32_t generation;
    std::vector<uint64_t> updated;
    std::vector<uint64_t> evicted;
  };
  struct alignas(64) Stripe {
    mutable std::mutex mu;
    absl::flat_hash_map<uint64_t, float*> rows;  // key -> its row (the header before it)
    std::vector<float*> free;                    // rows of evicted keys, to reuse
    float* chunk = nullptr;                      // the next unused slot of the last chunk
    int chunk_left = 0;                          // unused slots there
    int64_t chunks = 0;                          // chunks taken
    std::vector<GenerationLog> logs;               // oldest generation first
  };
  struct Victim {
    uint64_t key;
    int64_t primary, secondary;  // the policy's order
  };

  explicit DynamicEmbeddingStore(Options options);
  int StripeIndex(uint64_t key) const;
  // The positions of keys grouped by stripe, each group in batch order (a stable counting sort):
  // stripe s has keys[order[at[s] .. at[s + 1])]; stripe_of[p] is the stripe of position p.
  void GroupByStripe(absl::Span<const uint64_t> keys, std::vector<uint32_t>* order,
                     std::vector<uint16_t>* stripe_of, std::vector<uint32_t>* at) const;
  // fn(stripe, stripe index, position i in keys, keys[i]'s row or null) for every key, stripe by
  // stripe in ascending order, under the stripe's lock (taken once per stripe), with the rows'
  // first prefetch_bytes (from the header) prefetched ahead; stripes split over `threads`. A
  // repeated key's occurrences come in batch order.
  template <typename Fn>
  void ForEachByStripe(absl::Span<const uint64_t> keys, int threads, int64_t prefetch_bytes,
                       Fn&& fn) const;
  // The row of a free or new slot of stripe s (caller holds it).
  float* NewSlot(Stripe* s);
  bool Admit(uint64_t key, int stripe, int64_t step);
  GenerationLog& LogOf(Stripe* s, uint32_t generation);
  // Removes key's row (caller holds its stripe) and logs its tombstone.
  void Remove(Stripe* s, uint64_t key, float* row, uint32_t generation);
  void RaiseLastStep(int64_t step);
  absl::Status Check(const DynamicSnapshot& s) const;

  const Options opt_;
  const int state_floats_;
  const int64_t stride_;  // floats per slot
  SlabArena arena_;
  std::unique_ptr<Stripe[]> stripes_;
  std::unique_ptr<CountMinSketch> sketch_;  // kCount only
  std::atomic<int64_t> last_step_{0};
  std::atomic<int32_t> pass_{0};
  std::atomic<uint32_t> generation_{1};
  mutable std::mutex log_mu_;     // BeginGeneration and Evict against each other; then a stripe
  uint32_t oldest_logged_ = 1;    // guarded by log_mu_
  std::atomic<int64_t> live_{0}, admitted_{0}, rejected_{0}, seen_{0}, evicted_ttl_{0},
      evicted_capacity_{0};
  mutable std::mutex step_mu_;
  int64_t new_keys_step_ = 0;   // guarded by step_mu_
  int64_t new_keys_count_ = 0;  // guarded by step_mu_
};

}  // namespace pstrain
