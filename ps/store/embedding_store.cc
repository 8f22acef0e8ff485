#include "ps/store/embedding_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/status.h"
#include "ps/store/generation_logs.h"

namespace pstrain {
namespace {

// Below this many rows per thread a thread team costs more than it saves.
int ThreadsFor(int64_t n, int threads) { return ThreadsWorthIt(n, threads, 2048); }

int Log2(int64_t x) {
  int s = 0;
  while ((int64_t{1} << s) < x) ++s;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingStore>> EmbeddingStore::Create(Options o) {
  // Slots are uint32 with 0 meaning "none", hence at most 2^32 - 1 rows per store.
  if (o.begin < 0 || o.end <= o.begin || o.end - o.begin > int64_t{0xffffffff}) {
    return absl::InvalidArgumentError(absl::StrCat("embedding store: bad row range [", o.begin,
                                                   ", ", o.end, ") (at most 2^32 - 1 rows)"));
  }
  if (o.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding store: dim must be > 0, got ", o.dim));
  }
  if (o.optimizer == nullptr) {
    return absl::InvalidArgumentError("embedding store: no optimizer given");
  }
  for (const auto& r : o.range_optimizers) {
    if (r.optimizer == nullptr || r.optimizer->type() != o.optimizer->type() ||
        r.optimizer->StateFloats(o.dim) != o.optimizer->StateFloats(o.dim) || r.end < r.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding store: the optimizer of rows [", r.begin, ", ", r.end, ") must be a ",
          OptimizerType_Name(o.optimizer->type()), " as the store's"));
    }
  }
  if (o.chunk_rows < 64 || (o.chunk_rows & (o.chunk_rows - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding store: chunk_rows must be a power of two >= 64, got ", o.chunk_rows));
  }
  if (o.threads < 1) o.threads = 1;
  return std::unique_ptr<EmbeddingStore>(new EmbeddingStore(std::move(o)));
}

EmbeddingStore::EmbeddingStore(Options options)
    : opt_(std::move(options)),
      state_floats_(static_cast<int>(opt_.optimizer->StateFloats(opt_.dim))),
      stride_(opt_.dim + state_floats_ + 1 + (opt_.row_versions ? 1 : 0)),
      chunk_shift_(Log2(opt_.chunk_rows)),
      num_index_pages_((opt_.end - opt_.begin + kIndexPageRows - 1) >> kIndexShift),
      max_chunks_((opt_.end - opt_.begin + opt_.chunk_rows - 1) >> chunk_shift_),
      index_(new std::atomic<std::atomic<uint32_t>*>[num_index_pages_]()),
      chunks_(new std::atomic<float*>[max_chunks_]()),
      stripes_(new Stripe[kStripes]) {}

// The index pages and chunks live in slabs_, unmapped with it.
EmbeddingStore::~EmbeddingStore() = default;

absl::Status EmbeddingStore::CheckIds(absl::Span<const int64_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!Owns(ids[i])) {
      return absl::InvalidArgumentError(absl::StrCat("embedding store [", opt_.begin, ", ",
                                                     opt_.end, "): row id ", ids[i], " (at index ",
                                                     i, ") is outside the store's range"));
    }
  }
  return absl::OkStatus();
}

float* EmbeddingStore::SlotData(uint32_t slot) const {
  // A slot is the stamp, then the row (see the header): the row starts one word in.
  return chunks_[slot >> chunk_shift_].load(std::memory_order_acquire) +
         (slot & (opt_.chunk_rows - 1)) * stride_ + 1;
}

float* EmbeddingStore::FindRow(int64_t row) const {
  const int64_t local = row - opt_.begin;
  const std::atomic<uint32_t>* page = index_[local >> kIndexShift].load(std::memory_order_acquire);
  if (page == nullptr) return nullptr;
  const uint32_t entry = page[local & (kIndexPageRows - 1)].load(std::memory_order_acquire);
  return entry == 0 ? nullptr : SlotData(entry - 1);
}

float* EmbeddingStore::ClaimRow(int64_t row, bool* fresh) {
  const int64_t local = row - opt_.begin;
  std::atomic<std::atomic<uint32_t>*>& page_ptr = index_[local >> kIndexShift];
  std::atomic<uint32_t>* page = page_ptr.load(std::memory_order_acquire);
  if (page == nullptr) {
    // First touches of one index page from different stripes race: the first allocates it.
    std::lock_guard<std::mutex> lock(grow_mu_);
    page = page_ptr.load(std::memory_order_acquire);
    if (page == nullptr) {
      page = static_cast<std::atomic<uint32_t>*>(
          slabs_.Allocate(kIndexPageRows * sizeof(std::atomic<uint32_t>)));
      for (int64_t i = 0; i < kIndexPageRows; ++i) new (&page[i]) std::atomic<uint32_t>(0);
      page_ptr.store(page, std::memory_order_release);
      index_pages_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::atomic<uint32_t>& entry = page[local & (kIndexPageRows - 1)];
  const uint32_t e = entry.load(std::memory_order_relaxed);
  *fresh = e == 0;
  if (!*fresh) return SlotData(e - 1);

  // Each row takes a slot at most once, so slots never exceed the range's row count.
  const int64_t slot = next_slot_.fetch_add(1, std::memory_order_relaxed);
  std::atomic<float*>& chunk = chunks_[slot >> chunk_shift_];
  if (chunk.load(std::memory_order_acquire) == nullptr) {
    std::lock_guard<std::mutex> lock(grow_mu_);
    if (chunk.load(std::memory_order_acquire) == nullptr) {
      const size_t bytes = (opt_.chunk_rows * stride_ * sizeof(float) + 63) / 64 * 64;
      chunk.store(static_cast<float*>(slabs_.Allocate(bytes)), std::memory_order_release);
      chunks_allocated_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  entry.store(static_cast<uint32_t>(slot + 1), std::memory_order_release);
  return SlotData(static_cast<uint32_t>(slot));
}

void EmbeddingStore::Prefetch(absl::Span<const int64_t> ids, int64_t i, int64_t end,
                              int64_t bytes) const {
  constexpr int64_t kIndexAhead = 16, kRowAhead = 8;
  if (i + kIndexAhead < end) {
    const int64_t local = ids[i + kIndexAhead] - opt_.begin;
    const auto* page = index_[local >> kIndexShift].load(std::memory_order_acquire);
    if (page != nullptr) __builtin_prefetch(page + (local & (kIndexPageRows - 1)));
  }
  if (i + kRowAhead < end) {
    const int64_t local = ids[i + kRowAhead] - opt_.begin;
    const auto* page = index_[local >> kIndexShift].load(std::memory_order_acquire);
    if (page == nullptr) return;
    const uint32_t entry = page[local & (kIndexPageRows - 1)].load(std::memory_order_acquire);
    if (entry == 0) return;
    const uint32_t slot = entry - 1;
    const char* row = reinterpret_cast<const char*>(
        chunks_[slot >> chunk_shift_].load(std::memory_order_acquire) +
        (slot & (opt_.chunk_rows - 1)) * stride_);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off);
  }
}

uint32_t EmbeddingStore::StampOf(const float* row) const {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(row - 1), __ATOMIC_RELAXED);
}

void EmbeddingStore::SetStamp(float* row, uint32_t generation) const {
  __atomic_store_n(reinterpret_cast<uint32_t*>(row - 1), generation, __ATOMIC_RELAXED);
}

void EmbeddingStore::RaiseLastStep(int64_t step) {
  int64_t cur = last_step_.load(std::memory_order_relaxed);
  while (step > cur && !last_step_.compare_exchange_weak(cur, step, std::memory_order_relaxed)) {
  }
}

namespace {
// The version word of a row with row_versions, after its weights and optimizer slots.
uint32_t LoadVersion(const float* word) {
  uint32_t v;
  std::memcpy(&v, word, sizeof(v));
  return v;
}
void StoreVersion(float* word, uint32_t v) { std::memcpy(word, &v, sizeof(v)); }
}  // namespace

absl::Status EmbeddingStore::Gather(absl::Span<const int64_t> ids, float* out,
                                    uint32_t* versions, int threads) const {
  RETURN_IF_ERROR(CheckIds(ids));
  const int dim = opt_.dim;
  const int version_at =
      opt_.row_versions && versions != nullptr ? dim + state_floats_ : -1;  // after the slots
  ParallelFor(ids.size(), ThreadsFor(ids.size(), threads > 0 ? threads : opt_.threads),
              [&](int, int, int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) {
                  Prefetch(ids, i, e, (1 + dim) * sizeof(float));  // the stamp and weights
                  float* dst = out + i * dim;
                  bool stored;
                  {
                    std::lock_guard<std::mutex> lock(StripeOf(ids[i]).mu);
                    const float* row = FindRow(ids[i]);
                    stored = row != nullptr;
                    if (stored) std::memcpy(dst, row, dim * sizeof(float));
                    if (version_at >= 0) versions[i] = stored ? LoadVersion(row + version_at) : 0;
                  }
                  // A row never trained reads as its initial value; row_init is pure, so it can
                  // run outside the lock.
                  if (!stored) {
                    if (opt_.row_init) {
                      opt_.row_init(ids[i], dst);
                    } else {
                      std::memset(dst, 0, dim * sizeof(float));
                    }
                  }
                }
              });
  return absl::OkStatus();
}

absl::Status EmbeddingStore::Apply(absl::Span<const int64_t> ids, const float* grads,
                                   int64_t step, const uint32_t* computed_from, int threads) {
  RETURN_IF_ERROR(CheckIds(ids));
  RaiseLastStep(step);
  const int dim = opt_.dim;
  const Optimizer& optimizer = *opt_.optimizer;
  const double lr = optimizer.LearningRate(step);
  // Rows of a range with its own optimizer (a table's): that optimizer, at its own rate.
  std::vector<double> range_lr(opt_.range_optimizers.size());
  for (size_t r = 0; r < range_lr.size(); ++r) {
    range_lr[r] = opt_.range_optimizers[r].optimizer->LearningRate(step);
  }
  const int version_at = opt_.row_versions ? dim + state_floats_ : -1;  // after the slots
  const bool versioned = version_at >= 0 && computed_from != nullptr;
  ParallelFor(ids.size(), ThreadsFor(ids.size(), threads > 0 ? threads : opt_.threads),
              [&](int, int, int64_t b, int64_t e) {
                int64_t updates = 0, sum = 0, max = 0;
                for (int64_t i = b; i < e; ++i) {
                  Prefetch(ids, i, e, stride_ * sizeof(float));
                  Stripe& stripe = StripeOf(ids[i]);
                  std::lock_guard<std::mutex> lock(stripe.mu);
                  bool fresh;
                  float* row = ClaimRow(ids[i], &fresh);
                  // The stamp first, so that its load overlaps the update. The generation is
                  // read under the row's lock: a snapshot that raised it before it copied this
                  // row either holds this update or sees the new stamp next time. A fresh row's
                  // stamp is not written yet: it is a change of this generation. A row already
                  // stamped with it (the common case) costs a load and a compare.
                  const uint32_t generation = generation_.load();
                  const uint32_t stamp = fresh ? 0 : StampOf(row);
                  if (ABSL_PREDICT_FALSE(stamp != generation)) {
                    if (stamp < generation) {
                      LogChange(stripe, ids[i], generation);
                      // The row's first update since an Image's instant: keep the row of then.
                      if (!fresh && stamp < image_generation_.load()) Preserve(ids[i], row);
                    }
                    SetStamp(row, generation);
                  }
                  const int range = RangeOf(ids[i]);
                  const Optimizer* row_opt =
                      range < 0 ? &optimizer : opt_.range_optimizers[range].optimizer.get();
                  double row_lr = range < 0 ? lr : range_lr[range];
                  if (fresh) {
                    if (opt_.row_init) {
                      opt_.row_init(ids[i], row);
                    } else {
                      std::memset(row, 0, dim * sizeof(float));
                    }
                    row_opt->InitState(row + dim, dim);
                    if (version_at >= 0) StoreVersion(row + version_at, 0);
                  }
                  if (version_at >= 0) {
                    const uint32_t now = LoadVersion(row + version_at);
                    if (versioned) {
                      // Unsigned: a version ahead of the row's (restored since) wraps above 2^31.
                      const uint32_t d = now - computed_from[i];
                      const int64_t tau = d > (1u << 31) ? 0 : d;
                      ++updates;
                      sum += tau;
                      max = std::max(max, tau);
                      if (tau > 1) row_lr /= static_cast<double>(tau);
                    }
                    StoreVersion(row + version_at, now + 1);
                  }
                  row_opt->ApplyRow(row, row + dim, grads + i * dim, dim, row_lr);
                }
                if (updates > 0) {
                  stale_updates_.fetch_add(updates, std::memory_order_relaxed);
                  stale_sum_.fetch_add(sum, std::memory_order_relaxed);
                  int64_t seen = stale_max_.load(std::memory_order_relaxed);
                  while (max > seen && !stale_max_.compare_exchange_weak(seen, max)) {
                  }
                }
              });
  return absl::OkStatus();
}

EmbeddingStore::Staleness EmbeddingStore::staleness() const {
  Staleness s;
  s.updates = stale_updates_.load(std::memory_order_relaxed);
  s.sum = stale_sum_.load(std::memory_order_relaxed);
  s.max = stale_max_.load(std::memory_order_relaxed);
  return s;
}

void EmbeddingStore::LogChange(Stripe& stripe, int64_t row, uint32_t generation) const {
  if (stripe.logs.empty() || stripe.logs.back().generation != generation) {
    stripe.logs.push_back(GenerationLog{generation, {}});
  }
  stripe.logs.back().rows.push_back(static_cast<uint32_t>(row - opt_.begin));
}

void EmbeddingStore::BeginGeneration(uint32_t g, uint32_t keep_from) {
  PSTRAIN_CHECK(g > generation() && keep_from <= g)
      << "BeginGeneration(" << g << ", " << keep_from << ") at generation " << generation();
  std::lock_guard<std::mutex> lock(log_mu_);
  generation_.store(g);
  if (keep_from <= oldest_logged_) return;
  oldest_logged_ = keep_from;
  DropLogsBefore(stripes_.get(), kStripes, keep_from);
}

std::unique_ptr<EmbeddingStore::Image> EmbeddingStore::Freeze(uint32_t g, uint32_t keep_from) {
  PSTRAIN_CHECK(image_generation_.load() == 0) << "EmbeddingStore::Freeze with an Image held";
  pre_images_.reset(new PreImages[kStripes]);
  // Before the generation: an Apply that reads g (under a stripe, after generation_) sees it.
  image_generation_.store(g);
  BeginGeneration(g, keep_from);
  return std::unique_ptr<Image>(new Image(this, g, last_step()));
}

void EmbeddingStore::Preserve(int64_t row, const float* data) {
  PreImages& pre = pre_images_[row & (kStripes - 1)];
  const auto [it, added] = pre.at.try_emplace(static_cast<uint32_t>(row - opt_.begin),
                                              static_cast<uint32_t>(pre.slots.size() / stride_));
  if (!added) return;  // the first pre-image is the instant's
  pre.slots.insert(pre.slots.end(), data - 1, data - 1 + stride_);  // the stamp and the row
  preserved_rows_.fetch_add(1, std::memory_order_relaxed);
}

void EmbeddingStore::EndImage() {
  image_generation_.store(0);
  // An Apply that read the old value holds its stripe until its Preserve is done.
  for (int s = 0; s < kStripes; ++s) std::lock_guard<std::mutex> lock(stripes_[s].mu);
  pre_images_.reset();
  preserved_rows_.store(0);
}

const float* EmbeddingStore::RowInImage(int64_t row, uint32_t image) const {
  const float* live = FindRow(row);
  if (live == nullptr) return nullptr;
  if (StampOf(live) < image) return live;  // not updated since the instant
  const PreImages& pre = pre_images_[row & (kStripes - 1)];
  const auto it = pre.at.find(static_cast<uint32_t>(row - opt_.begin));
  if (it == pre.at.end()) return nullptr;  // stored since the instant
  return pre.slots.data() + int64_t{it->second} * stride_ + 1;
}

EmbeddingStore::Image::~Image() { store_->EndImage(); }

EmbeddingSnapshot EmbeddingStore::Image::Read(std::vector<int64_t> ids,
                                              uint32_t changed_since) const {
  EmbeddingSnapshot snap = store_->EmptySnapshot();
  snap.last_step = last_step_;
  snap.ids = std::move(ids);
  store_->CopyRows(changed_since, /*recheck=*/true, &snap, generation_);
  return snap;
}

EmbeddingSnapshot EmbeddingStore::Image::Snapshot(int64_t from, int64_t to,
                                                  uint32_t changed_since) const {
  if (changed_since > 0) {
    if (std::optional<std::vector<int64_t>> rows = store_->ChangedRows(from, to, changed_since)) {
      return Read(std::move(*rows), changed_since);
    }
  }
  from = std::max(from, store_->begin());
  to = std::min(to, store_->end());
  return Read(from < to ? store_->StoredRows(from, to) : std::vector<int64_t>(), changed_since);
}

EmbeddingSnapshot EmbeddingStore::Image::SnapshotRows(absl::Span<const int64_t> ids,
                                                      uint32_t changed_since) const {
  std::vector<int64_t> owned;
  owned.reserve(ids.size());
  for (int64_t id : ids) {
    if (store_->Owns(id)) owned.push_back(id);
  }
  return Read(std::move(owned), changed_since);
}

int64_t EmbeddingStore::Image::preserved_rows() const {
  return store_->preserved_rows_.load(std::memory_order_relaxed);
}

int64_t EmbeddingStore::Image::preserved_bytes() const {
  return preserved_rows() * store_->stride_ * static_cast<int64_t>(sizeof(float));
}

uint32_t EmbeddingStore::oldest_logged_generation() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return oldest_logged_;
}

int64_t EmbeddingStore::change_log_entries() const {
  int64_t n = 0;
  for (int s = 0; s < kStripes; ++s) {
    std::lock_guard<std::mutex> lock(stripes_[s].mu);
    for (const GenerationLog& log : stripes_[s].logs) n += static_cast<int64_t>(log.rows.size());
  }
  return n;
}

std::vector<int64_t> EmbeddingStore::StoredRows(int64_t from, int64_t to) const {
  // A row stored after its entry was read is simply not part of the answer; an entry never goes
  // back to 0, and its row is complete once the caller holds the row's lock.
  std::vector<int64_t> rows;
  for (int64_t row = from; row < to;) {
    const int64_t local = row - opt_.begin;
    const std::atomic<uint32_t>* page =
        index_[local >> kIndexShift].load(std::memory_order_acquire);
    const int64_t page_end =
        std::min(to, opt_.begin + ((local >> kIndexShift) + 1) * kIndexPageRows);
    if (page != nullptr) {
      for (int64_t r = row; r < page_end; ++r) {
        if (page[(r - opt_.begin) & (kIndexPageRows - 1)].load(std::memory_order_relaxed) != 0) {
          rows.push_back(r);
        }
      }
    }
    row = page_end;
  }
  return rows;
}

std::optional<std::vector<int64_t>> EmbeddingStore::ChangedRows(int64_t from, int64_t to,
                                                                uint32_t changed_since) const {
  std::lock_guard<std::mutex> lock(log_mu_);
  if (changed_since == 0 || changed_since < oldest_logged_) return std::nullopt;
  from = std::max(from, opt_.begin);
  to = std::max(from, std::min(to, opt_.end));
  // Offsets, not ids: half the bytes to sort. A row logged after its stripe was read is stamped
  // with the raised generation, so the next delta has it.
  const uint32_t lo = static_cast<uint32_t>(from - opt_.begin);
  const uint32_t hi = static_cast<uint32_t>(to - opt_.begin);
  std::vector<uint32_t> offsets;
  for (int s = 0; s < kStripes; ++s) {
    std::lock_guard<std::mutex> stripe_lock(stripes_[s].mu);
    for (const GenerationLog& log : stripes_[s].logs) {
      if (log.generation < changed_since) continue;
      for (uint32_t r : log.rows) {
        if (r >= lo && r < hi) offsets.push_back(r);
      }
    }
  }
  // A row updated in several kept generations (or restored and updated again) is logged more
  // than once.
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  std::vector<int64_t> rows(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) rows[i] = opt_.begin + offsets[i];
  return rows;
}

void EmbeddingStore::KeepStampedSince(uint32_t changed_since, std::vector<int64_t>* ids) const {
  // The stamps are read without the rows' locks (a row's entry never goes back to 0): a row
  // whose update races with this pass is stamped with the raised generation, so if this pass
  // misses it, the next delta has it. The pass is bound by memory latency (one cache line per
  // row), hence the prefetch.
  std::vector<uint8_t> keep(ids->size());
  const int64_t n = static_cast<int64_t>(ids->size());
  const int64_t stamp_end = sizeof(uint32_t);  // the stamp is a slot's first word
  ParallelFor(n, ThreadsFor(n, opt_.threads), [&](int, int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Prefetch(*ids, i, e, stamp_end);
      keep[i] = StampOf(FindRow((*ids)[i])) >= changed_since;
    }
  });
  size_t kept = 0;
  for (size_t i = 0; i < ids->size(); ++i) {
    if (keep[i]) (*ids)[kept++] = (*ids)[i];
  }
  ids->resize(kept);
}

EmbeddingSnapshot EmbeddingStore::EmptySnapshot() const {
  EmbeddingSnapshot snap;
  snap.begin = opt_.begin;
  snap.end = opt_.end;
  snap.dim = opt_.dim;
  snap.optimizer = opt_.optimizer->type();
  snap.state_floats = state_floats_;
  snap.last_step = last_step();
  return snap;
}

EmbeddingSnapshot EmbeddingStore::Snapshot(int64_t from, int64_t to,
                                           uint32_t changed_since) const {
  if (changed_since > 0) {
    if (std::optional<std::vector<int64_t>> rows = ChangedRows(from, to, changed_since)) {
      return SnapshotRows(*rows, changed_since);
    }
  }
  EmbeddingSnapshot snap = EmptySnapshot();
  from = std::max(from, opt_.begin);
  to = std::min(to, opt_.end);
  if (from >= to) return snap;
  snap.ids = StoredRows(from, to);
  if (changed_since > 0) KeepStampedSince(changed_since, &snap.ids);
  CopyRows(changed_since, /*recheck=*/false, &snap);
  return snap;
}

EmbeddingSnapshot EmbeddingStore::SnapshotRows(absl::Span<const int64_t> ids,
                                               uint32_t changed_since) const {
  EmbeddingSnapshot snap = EmptySnapshot();
  snap.ids.reserve(ids.size());
  for (int64_t id : ids) {
    if (Owns(id)) snap.ids.push_back(id);
  }
  // A listed row may have been restored since it was logged (stamped 0 now), or not be stored.
  CopyRows(changed_since, /*recheck=*/true, &snap);
  return snap;
}

void EmbeddingStore::CopyRows(uint32_t changed_since, bool recheck, EmbeddingSnapshot* snap,
                              uint32_t image) const {
  const int64_t n = snap->rows();
  const int dim = opt_.dim, sf = state_floats_;
  snap->weights.resize(n * dim);
  snap->state.resize(n * sf);
  std::vector<uint8_t> dropped(recheck ? n : 0);
  std::atomic<bool> any_dropped{false};
  ParallelFor(n, ThreadsFor(n, opt_.threads), [&](int, int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Prefetch(snap->ids, i, e, stride_ * sizeof(float));
      std::lock_guard<std::mutex> lock(StripeOf(snap->ids[i]).mu);
      const float* row = image > 0 ? RowInImage(snap->ids[i], image) : FindRow(snap->ids[i]);
      if (recheck && (row == nullptr || StampOf(row) < changed_since)) {
        dropped[i] = 1;
        any_dropped.store(true, std::memory_order_relaxed);
        continue;
      }
      std::memcpy(snap->weights.data() + i * dim, row, dim * sizeof(float));
      if (sf > 0) std::memcpy(snap->state.data() + i * sf, row + dim, sf * sizeof(float));
    }
  });
  if (!any_dropped.load()) return;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    snap->ids[kept] = snap->ids[i];
    std::memmove(snap->weights.data() + kept * dim, snap->weights.data() + i * dim,
                 dim * sizeof(float));
    if (sf > 0) {
      std::memmove(snap->state.data() + kept * sf, snap->state.data() + i * sf, sf * sizeof(float));
    }
    ++kept;
  }
  snap->ids.resize(kept);
  snap->weights.resize(kept * dim);
  snap->state.resize(kept * sf);
}

absl::Status EmbeddingStore::RestoreRows(absl::Span<const int64_t> ids, const float* weights,
                                         const float* state) {
  RETURN_IF_ERROR(CheckIds(ids));
  const int dim = opt_.dim, sf = state_floats_;
  ParallelFor(ids.size(), ThreadsFor(ids.size(), opt_.threads),
              [&](int, int, int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) {
                  std::lock_guard<std::mutex> lock(StripeOf(ids[i]).mu);
                  bool fresh;
                  float* row = ClaimRow(ids[i], &fresh);
                  std::memcpy(row, weights + i * dim, dim * sizeof(float));
                  if (state != nullptr) {
                    std::memcpy(row + dim, state + i * sf, sf * sizeof(float));
                  } else {
                    OptimizerOf(ids[i]).InitState(row + dim, dim);
                  }
                  SetStamp(row, 0);  // as restored: not changed since any checkpoint
                  if (opt_.row_versions) StoreVersion(row + dim + sf, 0);
                }
              });
  return absl::OkStatus();
}

absl::Status EmbeddingStore::Restore(const EmbeddingSnapshot& s) {
  if (s.dim != opt_.dim || s.state_floats != state_floats_ ||
      s.optimizer != opt_.optimizer->type()) {
    return absl::FailedPreconditionError(
        absl::StrCat("embedding store [", opt_.begin, ", ", opt_.end, ") has dim ", opt_.dim,
                     " and ", OptimizerType_Name(opt_.optimizer->type()), " state of ",
                     state_floats_, " floats per row; the snapshot has dim ", s.dim, " and ",
                     OptimizerType_Name(s.optimizer), " state of ", s.state_floats));
  }
  if (s.weights.size() != s.ids.size() * s.dim || s.state.size() != s.ids.size() * s.state_floats) {
    return absl::InvalidArgumentError("embedding snapshot: weights/state sizes do not match ids");
  }
  RETURN_IF_ERROR(RestoreRows(s.ids, s.weights.data(), s.state.data()));
  RaiseLastStep(s.last_step);
  return absl::OkStatus();
}

EmbeddingStore::Stats EmbeddingStore::stats() const {
  Stats s;
  s.rows_initialized = next_slot_.load(std::memory_order_relaxed);
  s.chunk_bytes = (opt_.chunk_rows * stride_ * sizeof(float) + 63) / 64 * 64;
  s.index_bytes = index_pages_.load(std::memory_order_relaxed) * kIndexPageRows * 4;
  s.max_index_bytes = num_index_pages_ * kIndexPageRows * 4;
  s.index_page_bytes = kIndexPageRows * 4;
  s.bytes = chunks_allocated_.load(std::memory_order_relaxed) * s.chunk_bytes + s.index_bytes +
            (num_index_pages_ + max_chunks_) * sizeof(void*) + kStripes * sizeof(Stripe);
  s.last_step = last_step();
  return s;
}

}  // namespace pstrain
