#include "ps/store/dynamic_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "ps/store/generation_logs.h"

namespace pstrain {
namespace {

// Below this many keys per thread a thread team costs more than it saves.
int ThreadsFor(int64_t n, int threads) { return ThreadsWorthIt(n, threads, 2048); }

template <typename T>
int64_t FirstNotAscending(const std::vector<T>& v) {
  for (size_t i = 1; i < v.size(); ++i) {
    if (!(v[i - 1] < v[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

// A slot's 4-byte words (see the header): the stamp just before the row, the others after the
// optimizer state, so that a Gather reads the stamp's and the weights' lines only.
uint32_t* DynamicEmbeddingStore::WordAt(const float* row, int i) const {
  const float* at = i == kStamp ? row - 1 : row + opt_.dim + state_floats_ + (i - 1);
  return reinterpret_cast<uint32_t*>(const_cast<float*>(at));
}
uint32_t DynamicEmbeddingStore::Word(const float* row, int i) const {
  uint32_t v;
  std::memcpy(&v, WordAt(row, i), sizeof(v));
  return v;
}
void DynamicEmbeddingStore::SetWord(float* row, int i, uint32_t v) const {
  std::memcpy(WordAt(row, i), &v, sizeof(v));
}
int64_t DynamicEmbeddingStore::StepOf(const float* row) const {
  return static_cast<int64_t>((uint64_t{Word(row, kStepHi)} << 32) | Word(row, kStepLo));
}
void DynamicEmbeddingStore::SetStep(float* row, int64_t step) const {
  SetWord(row, kStepLo, static_cast<uint32_t>(static_cast<uint64_t>(step)));
  SetWord(row, kStepHi, static_cast<uint32_t>(static_cast<uint64_t>(step) >> 32));
}

CountMinSketch::CountMinSketch(int64_t width, int depth, int parts, uint64_t seed)
    : width_((width + parts - 1) / parts * parts),
      depth_(depth),
      part_width_(width_ / parts),
      seed_(seed),
      counters_(static_cast<size_t>(width_ * depth)) {}

size_t CountMinSketch::Index(uint64_t key, int row, int part) const {
  const uint64_t h = HashKey(key, seed_ + static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ull);
  // Multiply-shift onto the block: unbiased enough and no division.
  const uint64_t col = static_cast<uint64_t>(
      (static_cast<unsigned __int128>(h) * static_cast<uint64_t>(part_width_)) >> 64);
  return static_cast<size_t>(row * width_ + part * part_width_ + static_cast<int64_t>(col));
}

uint32_t CountMinSketch::Add(uint64_t key, int part) {
  size_t at[64];
  const int d = std::min(depth_, 64);
  uint32_t min = UINT32_MAX;
  for (int r = 0; r < d; ++r) {
    at[r] = Index(key, r, part);
    min = std::min(min, counters_[at[r]]);
  }
  if (min == UINT32_MAX) return min;  // saturated
  // Conservative update: only the counters at the minimum grow; the others already overcount.
  for (int r = 0; r < d; ++r) {
    if (counters_[at[r]] == min) counters_[at[r]] = min + 1;
  }
  return min + 1;
}

uint32_t CountMinSketch::Estimate(uint64_t key, int part) const {
  uint32_t min = UINT32_MAX;
  for (int r = 0; r < depth_; ++r) min = std::min(min, counters_[Index(key, r, part)]);
  return min;
}

absl::StatusOr<std::unique_ptr<DynamicEmbeddingStore>> DynamicEmbeddingStore::Create(
    Options o) {
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic embedding store: ", what));
  };
  if (o.dim <= 0) return bad(absl::StrCat("dim must be > 0, got ", o.dim));
  if (o.optimizer == nullptr) return bad("no optimizer given");
  if (o.chunk_rows < 8 || o.chunk_rows > 65536) {
    return bad(absl::StrCat("chunk_rows must be in [8, 65536], got ", o.chunk_rows));
  }
  if (o.admission == Admission::kCount) {
    if (o.admit_count < 1) return bad("admit_count must be >= 1");
    if (o.sketch_width < 1 || o.sketch_width > (int64_t{1} << 32)) {
      return bad(absl::StrCat("sketch_width must be in [1, 2^32], got ", o.sketch_width));
    }
    if (o.sketch_depth < 1 || o.sketch_depth > 16) {
      return bad(absl::StrCat("sketch_depth must be in [1, 16], got ", o.sketch_depth));
    }
  }
  if (o.admission == Admission::kProbability &&
      !(o.admit_probability > 0 && o.admit_probability <= 1)) {
    return bad(absl::StrCat("admit_probability must be in (0, 1], got ", o.admit_probability));
  }
  if (o.ttl_steps < 0 || o.ttl_passes < 0 || o.max_rows < 0 || o.max_bytes < 0) {
    return bad("ttl_steps, ttl_passes, max_rows and max_bytes must be >= 0 (0: off)");
  }
  if (o.threads < 1) o.threads = 1;
  return std::unique_ptr<DynamicEmbeddingStore>(new DynamicEmbeddingStore(std::move(o)));
}

DynamicEmbeddingStore::DynamicEmbeddingStore(Options options)
    : opt_(std::move(options)),
      state_floats_(static_cast<int>(opt_.optimizer->StateFloats(opt_.dim))),
      stride_(kWords + opt_.dim + state_floats_),
      arena_(size_t{4} << 20),
      stripes_(new Stripe[kStripes]) {
  if (opt_.admission == Admission::kCount) {
    sketch_ = std::make_unique<CountMinSketch>(opt_.sketch_width, opt_.sketch_depth, kStripes,
                                               opt_.seed);
  }
}

DynamicEmbeddingStore::~DynamicEmbeddingStore() = default;

int DynamicEmbeddingStore::StripeIndex(uint64_t key) const {
  // The top bits of a mix: the map hashes the key again with its own function.
  return static_cast<int>(Fmix64(key) >> 54);
}

float* DynamicEmbeddingStore::NewSlot(Stripe* s) {
  if (!s->free.empty()) {
    float* row = s->free.back();
    s->free.pop_back();
    return row;
  }
  if (s->chunk_left == 0) {
    s->chunk = static_cast<float*>(arena_.Allocate(opt_.chunk_rows * stride_ * sizeof(float)));
    s->chunk_left = opt_.chunk_rows;
    ++s->chunks;
  }
  float* row = s->chunk + 1;  // after the stamp
  s->chunk += stride_;
  --s->chunk_left;
  return row;
}

bool DynamicEmbeddingStore::Admit(uint64_t key, int stripe, int64_t step) {
  switch (opt_.admission) {
    case Admission::kAlways:
      return true;
    case Admission::kCount:
      return sketch_->Add(key, stripe) >= opt_.admit_count;
    case Admission::kProbability: {
      if (opt_.admit_probability >= 1) return true;
      const uint64_t coin =
          HashKey(key ^ Fmix64(static_cast<uint64_t>(step)), opt_.seed ^ 0xc01dc0ffeeull);
      // p x 2^64 as a double rounds; the comparison in double space is exact enough for a coin.
      return static_cast<double>(coin) < opt_.admit_probability * 18446744073709551616.0;
    }
  }
  return false;
}

DynamicEmbeddingStore::GenerationLog& DynamicEmbeddingStore::LogOf(Stripe* s,
                                                                   uint32_t generation) {
  if (s->logs.empty() || s->logs.back().generation != generation) {
    s->logs.push_back(GenerationLog{generation, {}, {}});
  }
  return s->logs.back();
}

void DynamicEmbeddingStore::RaiseLastStep(int64_t step) {
  int64_t cur = last_step_.load(std::memory_order_relaxed);
  while (step > cur && !last_step_.compare_exchange_weak(cur, step, std::memory_order_relaxed)) {
  }
}

int64_t DynamicEmbeddingStore::bytes_per_row() const {
  // A flat_hash_map entry is the (key, row pointer) pair (16 bytes) and one control byte, at a
  // load of at most 7/8.
  const int64_t entry = sizeof(std::pair<const uint64_t, float*>) + 1;
  return stride_ * static_cast<int64_t>(sizeof(float)) + (entry * 8 + 6) / 7;
}

void DynamicEmbeddingStore::GroupByStripe(absl::Span<const uint64_t> keys,
                                          std::vector<uint32_t>* order,
                                          std::vector<uint16_t>* stripe_of,
                                          std::vector<uint32_t>* at) const {
  const size_t n = keys.size();
  std::vector<uint16_t>& stripe = *stripe_of;
  stripe.resize(n);
  at->assign(kStripes + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    stripe[i] = static_cast<uint16_t>(StripeIndex(keys[i]));
    ++(*at)[stripe[i] + 1];
  }
  for (int si = 0; si < kStripes; ++si) (*at)[si + 1] += (*at)[si];
  order->resize(n);
  uint32_t next[kStripes];
  std::copy(at->begin(), at->end() - 1, next);
  for (size_t i = 0; i < n; ++i) (*order)[next[stripe[i]]++] = static_cast<uint32_t>(i);
  // Now the stripe of each sorted position.
  for (int si = 0; si < kStripes; ++si) {
    std::fill(stripe.begin() + (*at)[si], stripe.begin() + (*at)[si + 1],
              static_cast<uint16_t>(si));
  }
}

template <typename Fn>
void DynamicEmbeddingStore::ForEachByStripe(absl::Span<const uint64_t> keys, int threads,
                                            int64_t prefetch_bytes, Fn&& fn) const {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n == 0) return;
  // Scratch reused by the calling thread's next call: no allocation per call in steady state.
  // The team's threads reach it through these pointers (a thread_local named inside the
  // lambda would be each worker's own).
  thread_local std::vector<uint32_t> order, at_scratch;
  thread_local std::vector<uint16_t> stripe;
  GroupByStripe(keys, &order, &stripe, &at_scratch);
  const uint32_t* const pos = order.data();
  const uint16_t* const stripe_at = stripe.data();
  const uint32_t* const at = at_scratch.data();
  // A pass over scattered rows is bound by memory latency, so the map's probe of the key
  // kMapAhead positions ahead and the row of the key kRowAhead ahead are prefetched, and their
  // misses overlap. Both need that key's stripe locked: the locks are taken ahead too, hand over
  // hand in ascending stripe order (deadlock-free: every other method holds one stripe at a
  // time), and a stripe is released after its last key. A row found ahead stays valid (only
  // Evict and Restore remove rows, under the lock); a key found missing ahead is looked up again
  // (an earlier occurrence may have created it).
  constexpr int64_t kMapAhead = 12, kRowAhead = 6;
  ParallelFor(kStripes, ThreadsFor(n, threads > 0 ? threads : opt_.threads),
              [&](int, int, int64_t sb, int64_t se) {
                const int64_t pb = at[sb], pe = at[se];
                if (pb == pe) return;
                int last_locked = -1;
                const auto probe = [&](int64_t p) {
                  const int st = stripe_at[p];
                  if (st != last_locked) {
                    stripes_[st].mu.lock();
                    last_locked = st;
                    // The next stripes' locks and map headers (two lines each), a stripe ahead
                    // of their first probes: one miss per stripe otherwise, not overlapped.
                    for (int k = 1; k <= 2 && st + k < kStripes; ++k) {
                      const char* next = reinterpret_cast<const char*>(&stripes_[st + k]);
                      __builtin_prefetch(next);
                      __builtin_prefetch(next + 64);
                    }
                  }
                  stripes_[st].rows.prefetch(keys[pos[p]]);
                };
                const auto find = [&](int64_t p) -> float* {
                  const Stripe& s = stripes_[stripe_at[p]];
                  const auto it = s.rows.find(keys[pos[p]]);
                  if (it == s.rows.end()) return nullptr;
                  const char* row = reinterpret_cast<const char*>(it->second - 1);
                  for (int64_t off = 0; off < prefetch_bytes; off += 64) {
                    __builtin_prefetch(row + off);
                  }
                  return it->second;
                };
                for (int64_t p = pb; p < std::min(pb + kMapAhead, pe); ++p) probe(p);
                float* ahead[kRowAhead];
                for (int64_t p = pb; p < std::min(pb + kRowAhead, pe); ++p) {
                  ahead[(p - pb) % kRowAhead] = find(p);
                }
                for (int64_t j = pb; j < pe; ++j) {
                  if (j + kMapAhead < pe) probe(j + kMapAhead);
                  float* row = ahead[(j - pb) % kRowAhead];
                  if (row == nullptr) {
                    const Stripe& s = stripes_[stripe_at[j]];
                    const auto it = s.rows.find(keys[pos[j]]);
                    if (it != s.rows.end()) row = it->second;
                  }
                  if (j + kRowAhead < pe) ahead[(j - pb) % kRowAhead] = find(j + kRowAhead);
                  fn(stripes_[stripe_at[j]], stripe_at[j], static_cast<int64_t>(pos[j]), row);
                  if (j + 1 == pe || stripe_at[j + 1] != stripe_at[j]) {
                    stripes_[stripe_at[j]].mu.unlock();
                  }
                }
              });
}

void DynamicEmbeddingStore::Gather(absl::Span<const uint64_t> keys, float* out,
                                   int threads) const {
  GatherAt(keys, /*at=*/nullptr, opt_.dim, out, threads);
}

void DynamicEmbeddingStore::GatherAt(absl::Span<const uint64_t> keys, const int32_t* at,
                                     int64_t stride, float* out, int threads) const {
  const int dim = opt_.dim;
  const bool init_missing = opt_.admission == Admission::kAlways && opt_.row_init;
  ForEachByStripe(keys, threads, (1 + dim) * sizeof(float),
                  [&](Stripe&, int, int64_t i, const float* row) {
                    float* dst = out + (at != nullptr ? int64_t{at[i]} : i) * stride;
                    if (row != nullptr) {
                      std::memcpy(dst, row, dim * sizeof(float));
                    } else if (init_missing) {
                      opt_.row_init(static_cast<int64_t>(keys[i]), dst);
                    } else {
                      std::memset(dst, 0, dim * sizeof(float));
                    }
                  });
}

void DynamicEmbeddingStore::Apply(absl::Span<const uint64_t> keys, const float* grads,
                                  int64_t step, int threads) {
  ApplyAt(keys, /*at=*/nullptr, opt_.dim, grads, step, threads);
}

void DynamicEmbeddingStore::ApplyAt(absl::Span<const uint64_t> keys, const int32_t* at,
                                    int64_t stride, const float* grads, int64_t step,
                                    int threads) {
  RaiseLastStep(step);
  const int dim = opt_.dim;
  const Optimizer& optimizer = *opt_.optimizer;
  const double lr = optimizer.LearningRate(step);
  const int32_t pass = pass_.load();
  const int64_t n = static_cast<int64_t>(keys.size());
  std::atomic<int64_t> created{0}, rejected{0};
  ForEachByStripe(keys, threads, stride_ * sizeof(float),
                  [&](Stripe& s, int si, int64_t i, float* row) {
                    const uint64_t key = keys[i];
                    const uint32_t generation = generation_.load();
                    if (row != nullptr) {
                      const uint32_t stamp = Word(row, kStamp);
                      if (stamp != generation) {
                        if (stamp < generation) LogOf(&s, generation).updated.push_back(key);
                        SetWord(row, kStamp, generation);
                      }
                    } else {
                      if (!Admit(key, si, step)) {
                        rejected.fetch_add(1, std::memory_order_relaxed);
                        return;
                      }
                      row = NewSlot(&s);
                      s.rows.emplace(key, row);
                      SetWord(row, kStamp, generation);
                      SetWord(row, kCount, 0);
                      LogOf(&s, generation).updated.push_back(key);
                      if (opt_.row_init) {
                        opt_.row_init(static_cast<int64_t>(key), row);
                      } else {
                        std::memset(row, 0, dim * sizeof(float));
                      }
                      optimizer.InitState(row + dim, dim);
                      created.fetch_add(1, std::memory_order_relaxed);
                    }
                    const uint32_t count = Word(row, kCount);
                    if (count != UINT32_MAX) SetWord(row, kCount, count + 1);
                    SetWord(row, kPass, static_cast<uint32_t>(pass));
                    SetStep(row, step);
                    const int64_t place = at != nullptr ? int64_t{at[i]} : i;
                    optimizer.ApplyRow(row, row + dim, grads + place * stride, dim, lr);
                  });
  seen_.fetch_add(n, std::memory_order_relaxed);
  rejected_.fetch_add(rejected.load(), std::memory_order_relaxed);
  admitted_.fetch_add(created.load(), std::memory_order_relaxed);
  live_.fetch_add(created.load(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(step_mu_);
  if (step > new_keys_step_) {
    new_keys_step_ = step;
    new_keys_count_ = 0;
  }
  if (step == new_keys_step_) new_keys_count_ += created.load();
}

void DynamicEmbeddingStore::Remove(Stripe* s, uint64_t key, float* row, uint32_t generation) {
  s->rows.erase(key);
  s->free.push_back(row);
  LogOf(s, generation).evicted.push_back(key);
  live_.fetch_sub(1, std::memory_order_relaxed);
}

DynamicEmbeddingStore::EvictionResult DynamicEmbeddingStore::Evict(int32_t now_pass) {
  std::lock_guard<std::mutex> log_lock(log_mu_);
  EvictionResult result;
  const int64_t now_step = last_step();
  const auto expired = [&](const float* row) {
    return (opt_.ttl_steps > 0 && now_step - StepOf(row) >= opt_.ttl_steps) ||
           (opt_.ttl_passes > 0 &&
            int64_t{now_pass} - static_cast<int32_t>(Word(row, kPass)) >= opt_.ttl_passes);
  };
  if (opt_.ttl_steps > 0 || opt_.ttl_passes > 0) {
    for (int si = 0; si < kStripes; ++si) {
      Stripe& s = stripes_[si];
      std::lock_guard<std::mutex> lock(s.mu);
      const uint32_t generation = generation_.load();
      std::vector<std::pair<uint64_t, float*>> gone;
      for (const auto& [key, row] : s.rows) {
        if (expired(row)) gone.emplace_back(key, row);
      }
      for (const auto& [key, row] : gone) Remove(&s, key, row, generation);
      result.ttl += static_cast<int64_t>(gone.size());
    }
  }
  int64_t cap = opt_.max_rows;
  if (opt_.max_bytes > 0) {
    const int64_t by_bytes = opt_.max_bytes / bytes_per_row();
    cap = cap > 0 ? std::min(cap, by_bytes) : by_bytes;
  }
  const int64_t live = live_.load();
  if ((opt_.max_rows > 0 || opt_.max_bytes > 0) && live > cap) {
    const bool lru = opt_.capacity_policy == CapacityPolicy::kLru;
    std::vector<Victim> all;
    all.reserve(live);
    for (int si = 0; si < kStripes; ++si) {
      Stripe& s = stripes_[si];
      std::lock_guard<std::mutex> lock(s.mu);
      for (const auto& [key, row] : s.rows) {
        const int64_t step = StepOf(row), count = Word(row, kCount);
        all.push_back(Victim{key, lru ? step : count, lru ? count : step});
      }
    }
    const auto before = [](const Victim& a, const Victim& b) {
      if (a.primary != b.primary) return a.primary < b.primary;
      if (a.secondary != b.secondary) return a.secondary < b.secondary;
      return a.key < b.key;
    };
    const int64_t excess = std::max<int64_t>(0, static_cast<int64_t>(all.size()) - cap);
    std::nth_element(all.begin(), all.begin() + excess, all.end(), before);
    all.resize(excess);
    for (const Victim& v : all) {
      Stripe& s = stripes_[StripeIndex(v.key)];
      std::lock_guard<std::mutex> lock(s.mu);
      const auto it = s.rows.find(v.key);
      if (it == s.rows.end()) continue;
      Remove(&s, v.key, it->second, generation_.load());
      ++result.capacity;
    }
  }
  evicted_ttl_.fetch_add(result.ttl, std::memory_order_relaxed);
  evicted_capacity_.fetch_add(result.capacity, std::memory_order_relaxed);
  return result;
}

void DynamicEmbeddingStore::AgeAdmissionCounts() {
  if (sketch_ == nullptr) return;
  const int64_t part = sketch_->width() / kStripes;
  for (int si = 0; si < kStripes; ++si) {
    std::lock_guard<std::mutex> lock(stripes_[si].mu);
    for (int r = 0; r < sketch_->depth(); ++r) {
      uint32_t* c = sketch_->mutable_counters()->data() + r * sketch_->width() + si * part;
      for (int64_t j = 0; j < part; ++j) c[j] >>= 1;
    }
  }
}

void DynamicEmbeddingStore::BeginGeneration(uint32_t g, uint32_t keep_from) {
  PSTRAIN_CHECK(g > generation() && keep_from <= g)
      << "BeginGeneration(" << g << ", " << keep_from << ") at generation " << generation();
  std::lock_guard<std::mutex> lock(log_mu_);
  generation_.store(g);
  if (keep_from <= oldest_logged_) return;
  oldest_logged_ = keep_from;
  DropLogsBefore(stripes_.get(), kStripes, keep_from);
}

uint32_t DynamicEmbeddingStore::oldest_logged_generation() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return oldest_logged_;
}

absl::StatusOr<DynamicSnapshot> DynamicEmbeddingStore::Snapshot(uint32_t changed_since) const {
  std::lock_guard<std::mutex> log_lock(log_mu_);
  if (changed_since > 0 && changed_since < oldest_logged_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dynamic embedding store: a delta since generation ", changed_since,
        " needs the change logs and tombstones of that generation on, and the oldest kept is ",
        oldest_logged_, "; take a full snapshot"));
  }
  DynamicSnapshot snap;
  snap.dim = opt_.dim;
  snap.optimizer = opt_.optimizer->type();
  snap.state_floats = state_floats_;
  snap.last_step = last_step();
  snap.pass = pass();
  snap.changed_since = changed_since;
  const int dim = opt_.dim, sf = state_floats_;
  // Rows in stripe order first (each stripe copied under its lock), sorted by key at the end.
  std::vector<uint64_t> keys;
  std::vector<float> rows;  // (dim + sf) floats each
  std::vector<uint32_t> counts;
  std::vector<int32_t> passes;
  std::vector<int64_t> steps;
  const auto take = [&](uint64_t key, const float* row) {
    keys.push_back(key);
    rows.insert(rows.end(), row, row + dim + sf);
    counts.push_back(Word(row, kCount));
    passes.push_back(static_cast<int32_t>(Word(row, kPass)));
    steps.push_back(StepOf(row));
  };
  for (int si = 0; si < kStripes; ++si) {
    const Stripe& s = stripes_[si];
    std::lock_guard<std::mutex> lock(s.mu);
    if (changed_since == 0) {
      for (const auto& [key, row] : s.rows) take(key, row);
    } else {
      std::vector<uint64_t> updated, evicted;
      for (const GenerationLog& log : s.logs) {
        if (log.generation < changed_since) continue;
        updated.insert(updated.end(), log.updated.begin(), log.updated.end());
        evicted.insert(evicted.end(), log.evicted.begin(), log.evicted.end());
      }
      std::sort(updated.begin(), updated.end());
      updated.erase(std::unique(updated.begin(), updated.end()), updated.end());
      for (uint64_t key : updated) {
        const auto it = s.rows.find(key);
        // Evicted since, or restored since (stamped 0): not this delta's row.
        if (it == s.rows.end() || Word(it->second, kStamp) < changed_since) continue;
        take(key, it->second);
      }
      for (uint64_t key : evicted) {
        if (!s.rows.contains(key)) snap.deleted.push_back(key);
      }
    }
  }
  if (sketch_ != nullptr) {
    // Block by block, each under its stripe's lock, so that no block is torn.
    snap.sketch_width = sketch_->width();
    snap.sketch_depth = sketch_->depth();
    snap.sketch.assign(sketch_->counters().size(), 0);
    const int64_t part = sketch_->width() / kStripes;
    for (int si = 0; si < kStripes; ++si) {
      std::lock_guard<std::mutex> lock(stripes_[si].mu);
      for (int r = 0; r < sketch_->depth(); ++r) {
        const size_t at = static_cast<size_t>(r * sketch_->width() + si * part);
        std::memcpy(snap.sketch.data() + at, sketch_->counters().data() + at,
                    part * sizeof(uint32_t));
      }
    }
  }
  std::sort(snap.deleted.begin(), snap.deleted.end());
  snap.deleted.erase(std::unique(snap.deleted.begin(), snap.deleted.end()), snap.deleted.end());
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  const size_t n = keys.size();
  snap.keys.resize(n);
  snap.weights.resize(n * dim);
  snap.state.resize(n * sf);
  snap.counts.resize(n);
  snap.last_pass.resize(n);
  snap.last_step_of.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = order[i];
    snap.keys[i] = keys[j];
    std::memcpy(snap.weights.data() + i * dim, rows.data() + j * (dim + sf), dim * sizeof(float));
    if (sf > 0) {
      std::memcpy(snap.state.data() + i * sf, rows.data() + j * (dim + sf) + dim,
                  sf * sizeof(float));
    }
    snap.counts[i] = counts[j];
    snap.last_pass[i] = passes[j];
    snap.last_step_of[i] = steps[j];
  }
  snap.admitted = admitted_.load();
  snap.rejected = rejected_.load();
  snap.seen = seen_.load();
  snap.evicted_ttl = evicted_ttl_.load();
  snap.evicted_capacity = evicted_capacity_.load();
  return snap;
}

absl::Status DynamicEmbeddingStore::Check(const DynamicSnapshot& s) const {
  if (s.dim != opt_.dim || s.state_floats != state_floats_ ||
      s.optimizer != opt_.optimizer->type()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dynamic embedding store has dim ", opt_.dim, " and ",
        OptimizerType_Name(opt_.optimizer->type()), " state of ", state_floats_,
        " floats per row; the snapshot has dim ", s.dim, " and ", OptimizerType_Name(s.optimizer),
        " state of ", s.state_floats));
  }
  const int64_t want_w = sketch_ ? sketch_->width() : 0, want_d = sketch_ ? sketch_->depth() : 0;
  if (s.sketch_width != want_w || s.sketch_depth != want_d) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dynamic embedding store: the admission sketch is ", want_w, " x ", want_d,
        " (width x depth); the snapshot's is ", s.sketch_width, " x ", s.sketch_depth));
  }
  const size_t n = s.keys.size();
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic embedding snapshot: ", what));
  };
  if (s.weights.size() != n * s.dim) {
    return bad(absl::StrCat("weights has ", s.weights.size(), " floats, expected ", n, " keys x ",
                            s.dim));
  }
  if (s.state.size() != n * s.state_floats) {
    return bad(absl::StrCat("state has ", s.state.size(), " floats, expected ", n, " keys x ",
                            s.state_floats));
  }
  if (s.counts.size() != n || s.last_pass.size() != n || s.last_step_of.size() != n) {
    return bad(absl::StrCat("counts / last_pass / last_step_of have ", s.counts.size(), " / ",
                            s.last_pass.size(), " / ", s.last_step_of.size(),
                            " entries, expected one per key (", n, ")"));
  }
  if (s.sketch.size() != static_cast<size_t>(s.sketch_width * s.sketch_depth)) {
    return bad(absl::StrCat("sketch has ", s.sketch.size(), " counters, expected ",
                            s.sketch_width, " x ", s.sketch_depth));
  }
  if (const int64_t i = FirstNotAscending(s.keys); i >= 0) {
    return bad(absl::StrCat("keys[", i, "] = ", s.keys[i], " is not above keys[", i - 1,
                            "] (keys must be ascending and unique)"));
  }
  if (const int64_t i = FirstNotAscending(s.deleted); i >= 0) {
    return bad(absl::StrCat("deleted[", i, "] = ", s.deleted[i], " is not above deleted[", i - 1,
                            "] (tombstones must be ascending and unique)"));
  }
  if (s.changed_since == 0 && !s.deleted.empty()) {
    return bad("a full snapshot (changed_since 0) has tombstones");
  }
  for (size_t i = 0; i < s.deleted.size(); ++i) {
    if (std::binary_search(s.keys.begin(), s.keys.end(), s.deleted[i])) {
      return bad(absl::StrCat("deleted[", i, "] = ", s.deleted[i], " is also a live row"));
    }
  }
  return absl::OkStatus();
}

absl::Status DynamicEmbeddingStore::Restore(const DynamicSnapshot& snap) {
  if (absl::Status st = Check(snap); !st.ok()) return st;
  std::lock_guard<std::mutex> log_lock(log_mu_);
  const int dim = opt_.dim, sf = state_floats_;
  // Keys grouped by stripe, so that each stripe is locked once.
  std::vector<std::vector<uint32_t>> by_stripe(kStripes);
  for (size_t i = 0; i < snap.keys.size(); ++i) {
    by_stripe[StripeIndex(snap.keys[i])].push_back(static_cast<uint32_t>(i));
  }
  std::vector<std::vector<uint64_t>> deleted(kStripes);
  for (uint64_t key : snap.deleted) deleted[StripeIndex(key)].push_back(key);
  int64_t live = 0;
  for (int si = 0; si < kStripes; ++si) {
    Stripe& s = stripes_[si];
    std::lock_guard<std::mutex> lock(s.mu);
    if (snap.changed_since == 0) {
      for (const auto& [key, row] : s.rows) s.free.push_back(row);
      s.rows.clear();
    }
    for (uint64_t key : deleted[si]) {
      const auto it = s.rows.find(key);
      if (it == s.rows.end()) continue;
      s.free.push_back(it->second);
      s.rows.erase(it);
    }
    for (uint32_t i : by_stripe[si]) {
      const uint64_t key = snap.keys[i];
      auto it = s.rows.find(key);
      if (it == s.rows.end()) it = s.rows.emplace(key, NewSlot(&s)).first;
      float* row = it->second;
      std::memcpy(row, snap.weights.data() + int64_t{i} * dim, dim * sizeof(float));
      if (sf > 0) std::memcpy(row + dim, snap.state.data() + int64_t{i} * sf, sf * sizeof(float));
      SetWord(row, kStamp, 0);  // as restored: not changed since any checkpoint
      SetWord(row, kCount, snap.counts[i]);
      SetWord(row, kPass, static_cast<uint32_t>(snap.last_pass[i]));
      SetStep(row, snap.last_step_of[i]);
    }
    live += static_cast<int64_t>(s.rows.size());
    if (sketch_ != nullptr) {
      const int64_t part = sketch_->width() / kStripes;
      for (int r = 0; r < sketch_->depth(); ++r) {
        const size_t at = static_cast<size_t>(r * sketch_->width() + si * part);
        std::memcpy(sketch_->mutable_counters()->data() + at, snap.sketch.data() + at,
                    part * sizeof(uint32_t));
      }
    }
  }
  live_.store(live);
  admitted_.store(snap.admitted);
  rejected_.store(snap.rejected);
  seen_.store(snap.seen);
  evicted_ttl_.store(snap.evicted_ttl);
  evicted_capacity_.store(snap.evicted_capacity);
  RaiseLastStep(snap.last_step);
  pass_.store(snap.pass);
  return absl::OkStatus();
}

DynamicEmbeddingStore::Metrics DynamicEmbeddingStore::metrics() const {
  Metrics m;
  m.rows_live = live_.load();
  m.admitted = admitted_.load();
  m.rejected = rejected_.load();
  m.seen = seen_.load();
  m.evicted_ttl = evicted_ttl_.load();
  m.evicted_capacity = evicted_capacity_.load();
  m.last_step = last_step();
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    m.new_keys_last_step = new_keys_step_ == m.last_step ? new_keys_count_ : 0;
  }
  m.arena_bytes = static_cast<int64_t>(arena_.allocated());
  using Slot = std::pair<const uint64_t, float*>;
  for (int si = 0; si < kStripes; ++si) {
    const Stripe& s = stripes_[si];
    std::lock_guard<std::mutex> lock(s.mu);
    // absl's flat map: one slot and one control byte per capacity entry, plus a group's worth of
    // cloned control bytes (16).
    const int64_t cap = static_cast<int64_t>(s.rows.capacity());
    m.map_bytes += cap > 0 ? cap * static_cast<int64_t>(sizeof(Slot) + 1) + 16 : 0;
    m.map_bytes += static_cast<int64_t>(s.free.capacity() * sizeof(float*));
    for (const GenerationLog& log : s.logs) {
      m.map_bytes += static_cast<int64_t>(sizeof(GenerationLog) +
                                          (log.updated.capacity() + log.evicted.capacity()) *
                                              sizeof(uint64_t));
    }
  }
  m.sketch_bytes = sketch_ ? sketch_->bytes() : 0;
  m.bytes = m.arena_bytes + m.map_bytes + m.sketch_bytes +
            static_cast<int64_t>(kStripes * sizeof(Stripe));
  return m;
}

}  // namespace pstrain
