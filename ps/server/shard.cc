#include "ps/server/shard.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/dynamic_rows.h"
#include "common/rpc/wire.h"
#include "common/status.h"
#include "ps/store/dynamic_routing.h"
#include "ps/store/store_memory.h"
#include "ps/store/table_rows.h"

namespace pstrain {

namespace {

uint64_t RandomIncarnation(Env* env) {
  std::random_device rd;
  return (uint64_t{rd()} << 32 ^ rd()) ^ static_cast<uint64_t>(absl::ToUnixNanos(env->Now()));
}

}  // namespace

Shard::Shard(Options options)
    : opt_(std::move(options)),
      map_(opt_.table_splits.empty() ? PartitionMap(opt_.rows, opt_.partitions, opt_.num_shards)
                                     : PartitionMap(opt_.table_splits, opt_.num_shards)),
      incarnation_(RandomIncarnation(opt_.env)),
      start_time_(opt_.env->MonotonicNow()) {}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(Options options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " of ",
                                                   options.num_shards,
                                                   ": need 0 <= shard < "
                                                   "num_shards"));
  }
  // No fixed row at all is a job whose every table is dynamic (its ids are keys, not rows).
  if (options.rows < 0 || (options.rows == 0 && options.dynamic_tables.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows must be > 0 (or 0 with dynamic tables: every table dynamic), got ", options.rows));
  }
  if (options.partitions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("partitions must be > 0, got ", options.partitions));
  }
  if (options.row_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("row_dim must be > 0, got ", options.row_dim));
  }
  if (options.dense_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_size must be >= 0, got ", options.dense_size));
  }
  if (options.dynamic_tables.size() > static_cast<size_t>(kMaxDynamicTables)) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic_tables: ",
                                                   options.dynamic_tables.size(),
                                                   " tables, at most ", kMaxDynamicTables));
  }
  for (size_t t = 0; t < options.dynamic_tables.size(); ++t) {
    const int dim = options.dynamic_tables[t].dim;
    if (dim < 1 || dim > options.row_dim) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic_tables[", t, "].dim must be in [1, ",
                                                     options.row_dim, "] (row_dim), got ", dim));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> sparse_opt,
                   Optimizer::Create(options.sparse_optimizer));
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> dense_opt,
                   Optimizer::Create(options.dense_optimizer));

  std::unique_ptr<Shard> s(new Shard(std::move(options)));
  const Options& o = s->opt_;
  for (int p : s->map_.PartitionsOfShard(o.shard)) {
    if (s->map_.PartitionSize(p) == 0) break;  // V < P: the trailing partitions are empty
    // The partition's table's width (compact widths, ps/store/table_rows.h): its rows are
    // expanded to the stride on a gather and cut to the width on an apply.
    const int width = RowWidth(s->map_, p, o.row_dim);
    EmbeddingStore::Options eo;
    eo.begin = s->map_.PartitionBegin(p);
    eo.end = s->map_.PartitionBegin(p + 1);
    eo.dim = width;
    eo.optimizer = sparse_opt;
    eo.row_init = NarrowRowInit(o.row_init, o.row_dim, width);
    eo.range_optimizers = o.range_optimizers;
    eo.threads = o.threads;
    eo.row_versions = o.scale_row_lr_by_staleness;
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> store, EmbeddingStore::Create(std::move(eo)));
    s->stores_.push_back(std::move(store));
  }
  for (size_t t = 0; t < o.dynamic_tables.size(); ++t) {
    DynamicEmbeddingStore::Options d = o.dynamic_tables[t];
    if (d.optimizer == nullptr) d.optimizer = sparse_opt;
    d.threads = o.threads;
    auto store = DynamicEmbeddingStore::Create(std::move(d));
    if (!store.ok()) {
      return Annotate(store.status(), absl::StrCat("dynamic_tables[", t, "]"));
    }
    s->dynamic_stores_.push_back(*std::move(store));
  }
  const PartitionMap dense_map(o.dense_size, o.num_shards, o.num_shards);
  s->dense_begin_ = dense_map.PartitionBegin(o.shard);
  s->dense_slice_size_ = dense_map.PartitionSize(o.shard);
  if (s->dense_slice_size_ > 0) {
    DenseStore::Options d;
    d.begin = s->dense_begin_;
    d.size = s->dense_slice_size_;
    d.optimizer = dense_opt;
    d.threads = o.threads;
    d.scale_lr_by_staleness = o.scale_dense_lr_by_staleness;
    ASSIGN_OR_RETURN(s->dense_, DenseStore::Create(std::move(d)));
    if (o.dense_init) {
      std::vector<float> full(o.dense_size);
      o.dense_init(full.data());
      s->dense_->Set(full.data() + s->dense_begin_);
    }
  }
  return s;
}

absl::Status Shard::Route(absl::Span<const int64_t> ids, std::vector<Run>* runs) const {
  runs->clear();
  const int S = opt_.num_shards;
  for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) {
    const int64_t id = ids[i];
    if (IsDynamicRow(id)) {
      RETURN_IF_ERROR(RouteDynamic(id, i, runs));
      continue;
    }
    // Ids usually come grouped by partition (PsClient sorts them so): extend the current run
    // without a division when the id is in the same store.
    if (!runs->empty() && runs->back().dynamic < 0 && stores_[runs->back().store]->Owns(id)) {
      runs->back().end = i + 1;
      continue;
    }
    if (id < 0 || id >= map_.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": row ", id, " is outside the table [0, ", map_.rows(), ")"));
    }
    const int p = map_.PartitionOf(id);
    if (map_.ShardOfPartition(p) != opt_.shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": row ", id, " is owned by shard ", map_.ShardOfPartition(p),
          " (partition ", p, " of ", map_.partitions(), "), not by this shard"));
    }
    runs->push_back(Run{p / S, i, i + 1});
  }
  return absl::OkStatus();
}

absl::Status Shard::RouteDynamic(int64_t id, int64_t i, std::vector<Run>* runs) const {
  const int t = DynamicTableOf(id);
  if (t >= static_cast<int>(dynamic_stores_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": dynamic row ", id, " (position ", i, ") is of dynamic table ", t,
        ", but this shard has ", dynamic_stores_.size(),
        " dynamic tables (a worker with another config?)"));
  }
  const int owner = DynamicShardOf(id, opt_.num_shards);
  if (owner != opt_.shard) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", opt_.shard, ": dynamic row ", id,
                                                   " (table ", t, ", key ", DynamicKeyOf(id),
                                                   ") is owned by shard ", owner,
                                                   ", not by this shard"));
  }
  if (!runs->empty() && runs->back().dynamic == t && runs->back().end == i) {
    runs->back().end = i + 1;
  } else {
    runs->push_back(Run{-1, i, i + 1, t});
  }
  return absl::OkStatus();
}

namespace {

// The keys of dynamic rows `ids`, in the calling thread's buffer (valid until its next call on
// this thread): every pull and push of a dynamic table needs them, and a buffer that has grown to
// the thread's largest run allocates nothing more in the steady state.
absl::Span<const uint64_t> DynamicKeys(absl::Span<const int64_t> ids) {
  thread_local std::vector<uint64_t> keys;
  keys.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) keys[i] = DynamicKeyOf(ids[i]);
  return keys;
}

}  // namespace

void Shard::GatherDynamic(absl::Span<const int64_t> ids, const Run& r, float* rows) const {
  dynamic_stores_[r.dynamic]->Gather(DynamicKeys(ids.subspan(r.begin, r.end - r.begin)), rows);
}

void Shard::ApplyDynamic(absl::Span<const int64_t> ids, const Run& r, const float* grads,
                         int64_t step) {
  dynamic_stores_[r.dynamic]->Apply(DynamicKeys(ids.subspan(r.begin, r.end - r.begin)), grads,
                                    step);
}

void Shard::MaybeEvictAfter(int64_t step) {
  const int64_t every = opt_.dynamic_evict_every_steps;
  if (dynamic_stores_.empty() || every <= 0 || step <= 0 || step % every != 0) return;
  int64_t last = evicted_at_step_.load();
  // Once per step, whichever push of it comes first (ASYNC, BOUNDED: several workers push it).
  while (last < step) {
    if (evicted_at_step_.compare_exchange_weak(last, step)) {
      EvictDynamic(absl::StrCat("after step ", step));
      return;
    }
  }
}

int64_t Shard::RowFloats(absl::Span<const Run> runs) const {
  int64_t n = 0;
  for (const Run& r : runs) {
    n += (r.end - r.begin) *
         (r.dynamic >= 0 ? dynamic_stores_[r.dynamic]->dim() : stores_[r.store]->dim());
  }
  return n;
}

int Shard::RowWidthOf(int64_t id) const {
  if (IsDynamicRow(id)) return dynamic_stores_[DynamicTableOf(id)]->dim();
  return RowWidth(map_, map_.PartitionOf(id), opt_.row_dim);
}

absl::Status Shard::GatherInto(absl::Span<const int64_t> ids, float* rows, float* dense,
                               int64_t* dense_version, uint32_t* row_versions) {
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));
  return GatherRuns(ids, runs, rows, dense, dense_version, row_versions);
}

absl::Status Shard::GatherRuns(absl::Span<const int64_t> ids, absl::Span<const Run> runs,
                               float* rows, float* dense, int64_t* dense_version,
                               uint32_t* row_versions) {
  pull_requests_.fetch_add(1, std::memory_order_relaxed);
  // Each run's rows at its store's width, one after the other (the rows' layout of the wire).
  float* out = rows;
  for (const Run& r : runs) {
    if (r.dynamic >= 0) {
      // No row versions: a dynamic row reads as version 0 (never stale-scaled).
      GatherDynamic(ids, r, out);
      if (row_versions != nullptr) std::fill_n(row_versions + r.begin, r.end - r.begin, 0u);
      out += (r.end - r.begin) * dynamic_stores_[r.dynamic]->dim();
      continue;
    }
    const EmbeddingStore& store = *stores_[r.store];
    RETURN_IF_ERROR(store.Gather(ids.subspan(r.begin, r.end - r.begin), out,
                                 row_versions != nullptr ? row_versions + r.begin : nullptr));
    out += (r.end - r.begin) * store.dim();
  }
  if (dense != nullptr && dense_ != nullptr) {
    const int64_t version = dense_->Get(dense);
    if (dense_version != nullptr) *dense_version = version;
  }
  pull_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Shard::Gather(const PullRequest& request, PullResponse* response) {
  bytes_in_.fetch_add(request.ByteSizeLong(), std::memory_order_relaxed);
  std::vector<int64_t> id_scratch;
  absl::Span<const int64_t> ids;
  RETURN_IF_ERROR(UnpackArray(request.ids(), "PullRequest.ids", &id_scratch, &ids));
  // Gather straight into the response bytes when they are float-aligned (heap storage is): the
  // dense slice is megabytes, copied on every pull.
  auto view = [](std::string* bytes, size_t floats, std::vector<float>* scratch) {
    bytes->resize(floats * sizeof(float));
    if (reinterpret_cast<uintptr_t>(bytes->data()) % alignof(float) == 0) {
      return reinterpret_cast<float*>(&(*bytes)[0]);
    }
    scratch->resize(floats);
    return scratch->data();
  };
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));
  std::vector<float> row_scratch, dense_scratch;
  std::string* rows = response->mutable_rows();
  float* rows_out = view(rows, RowFloats(runs), &row_scratch);
  const bool want_dense = request.want_dense() && dense_ != nullptr;
  float* dense_out =
      want_dense ? view(response->mutable_dense(), dense_slice_size_, &dense_scratch) : nullptr;
  int64_t dense_version = 0;
  std::vector<uint32_t> versions(row_versions() && request.step() > 0 ? ids.size() : 0);
  RETURN_IF_ERROR(GatherRuns(ids, runs, rows_out, dense_out, &dense_version,
                             versions.empty() ? nullptr : versions.data()));
  if (want_dense) response->set_dense_version(dense_version);
  if (!versions.empty()) {
    PackArray(versions.data(), versions.size(), response->mutable_row_versions());
  }
  if (!row_scratch.empty()) PackArray(row_scratch.data(), row_scratch.size(), rows);
  if (!dense_scratch.empty()) {
    PackArray(dense_scratch.data(), dense_scratch.size(), response->mutable_dense());
  }
  response->set_dense_begin(dense_begin_);
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  bytes_out_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Shard::CheckFinite(size_t row_floats, const float* row_grads,
                                const float* dense_grad) {
  // One pass with no branch per value: x - x is 0 for finite x and NaN for NaN or +-Inf, and the
  // largest magnitude must stay within max_gradient_abs (a finite 3.4e38 would overflow the
  // optimizers' squared-gradient slots to +Inf and freeze what it touched).
  const float cap = opt_.max_gradient_abs;
  auto all_finite = [cap](const float* p, size_t n) {
    float acc = 0.f, largest = 0.f;
    for (size_t i = 0; i < n; ++i) {
      acc += p[i] - p[i];
      largest = std::max(largest, std::fabs(p[i]));
    }
    return acc == 0.f && largest <= cap;
  };
  const size_t n = row_floats;
  const bool rows_ok = n == 0 || all_finite(row_grads, n);
  const bool dense_ok = dense_grad == nullptr || dense_ == nullptr ||
                        all_finite(dense_grad, static_cast<size_t>(dense_slice_size_));
  if (rows_ok && dense_ok) return absl::OkStatus();
  nonfinite_pushes_.fetch_add(1, std::memory_order_relaxed);
  return absl::InvalidArgumentError(absl::StrCat(
      "shard ", opt_.shard, ": push with a NaN, infinite or huge (|g| > cluster.max_gradient_abs ",
      cap, ") ", rows_ok ? "dense" : "row",
      " gradient refused (nothing applied; the worker's training diverged?)"));
}

absl::Status Shard::Unpack(const PushRequest& request, Update* u) {
  RETURN_IF_ERROR(UnpackArray(request.ids(), "PushRequest.ids", &u->id_scratch, &u->ids));
  RETURN_IF_ERROR(
      UnpackArray(request.row_grads(), "PushRequest.row_grads", &u->grad_scratch, &u->grads));
  RETURN_IF_ERROR(UnpackArray(request.dense_grad(), "PushRequest.dense_grad", &u->dense_scratch,
                              &u->dense_grad));
  u->dense_version =
      request.has_dense_version() && request.dense_version() >= 0 ? request.dense_version() : -1;
  RETURN_IF_ERROR(UnpackArray(request.row_versions(), "PushRequest.row_versions",
                              &u->version_scratch, &u->row_versions));
  if (!u->row_versions.empty() && u->row_versions.size() != u->ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": PushRequest.row_versions has ", u->row_versions.size(),
        " versions for ", u->ids.size(), " ids (expected one per id, or none)"));
  }
  return Check(u->ids, u->grads, u->dense_grad, &u->runs);
}

absl::Status Shard::Check(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                          absl::Span<const float> dense_grad, std::vector<Run>* runs) {
  RETURN_IF_ERROR(Route(ids, runs));
  // Each row at its table's width (compact widths; every row at row_dim without tables).
  const int64_t want = RowFloats(*runs);
  if (static_cast<int64_t>(grads.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": push of ", ids.size(), " rows carries ", grads.size(),
        " gradient floats, expected ", want, " (row_dim ", opt_.row_dim,
        ", each row at its table's width)"));
  }
  if (!dense_grad.empty() && static_cast<int64_t>(dense_grad.size()) != dense_slice_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": dense gradient of ", dense_grad.size(),
                     " floats, but this shard's dense slice has ", dense_slice_size_));
  }
  RETURN_IF_ERROR(
      CheckFinite(grads.size(), grads.data(), dense_grad.empty() ? nullptr : dense_grad.data()));
  // A row named twice would be updated twice by one push (workers dedup their ids). Ascending
  // ids are settled in one pass; others by a sorted copy (n log n, small beside the update).
  if (std::adjacent_find(ids.begin(), ids.end(), std::greater_equal<int64_t>()) == ids.end()) {
    return absl::OkStatus();
  }
  std::vector<int64_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice == sorted.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "shard ", opt_.shard, ": PushRequest.ids names row ", *twice,
      " more than once (expected each row at most once a push)"));
}

absl::Status Shard::Apply(const Update& u, int64_t step) {
  RETURN_IF_ERROR(ApplyRuns(u.runs, u.ids, u.grads.data(), step,
                            u.row_versions.empty() ? nullptr : u.row_versions.data()));
  if (!u.dense_grad.empty() && dense_ != nullptr) {
    dense_->Apply(u.dense_grad.data(), step, u.dense_version);
  }
  push_rows_.fetch_add(u.ids.size(), std::memory_order_relaxed);
  MaybeEvictAfter(step);
  return absl::OkStatus();
}

absl::Status Shard::Apply(absl::Span<const int64_t> ids, const float* row_grads,
                          const float* dense_grad, int64_t step, int64_t dense_version,
                          const uint32_t* row_versions) {
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));
  RETURN_IF_ERROR(ApplyRuns(runs, ids, row_grads, step, row_versions));
  if (dense_grad != nullptr && dense_ != nullptr) dense_->Apply(dense_grad, step, dense_version);
  push_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  MaybeEvictAfter(step);
  return absl::OkStatus();
}

absl::Status Shard::ApplyRuns(absl::Span<const Run> runs, absl::Span<const int64_t> ids,
                              const float* row_grads, int64_t step,
                              const uint32_t* row_versions) {
  const float* grads = row_grads;  // each run's rows at its store's width, one after the other
  for (const Run& r : runs) {
    if (r.dynamic >= 0) {
      ApplyDynamic(ids, r, grads, step);
      grads += (r.end - r.begin) * dynamic_stores_[r.dynamic]->dim();
      continue;
    }
    EmbeddingStore& store = *stores_[r.store];
    const int64_t n = r.end - r.begin;
    RETURN_IF_ERROR(store.Apply(ids.subspan(r.begin, n), grads, step,
                                row_versions != nullptr ? row_versions + r.begin : nullptr));
    grads += n * store.dim();
  }
  return absl::OkStatus();
}

absl::StatusOr<Shard::PushGuard> Shard::BeginPush(int32_t worker_id, uint64_t incarnation,
                                                  uint64_t sequence) {
  PushGuard g;
  if (sequence == 0) return g;
  {
    absl::MutexLock lock(&push_mu_);
    if (!push_states_.contains(worker_id) &&
        static_cast<int>(push_states_.size()) >= kMaxPushWorkers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard ", opt_.shard, ": pushes of ", kMaxPushWorkers, " worker ids already; worker ",
          worker_id, " refused"));
    }
    auto& by_incarnation = push_states_[worker_id];
    std::shared_ptr<PushGuard::State>& s = by_incarnation[incarnation];
    if (s == nullptr) {
      s = std::make_shared<PushGuard::State>();
      if (static_cast<int>(by_incarnation.size()) > kIncarnationsPerWorker) {
        // Forget the incarnation pushed to longest ago (a dead process's).
        auto oldest = by_incarnation.end();
        for (auto it = by_incarnation.begin(); it != by_incarnation.end(); ++it) {
          if (it->first == incarnation) continue;
          if (oldest == by_incarnation.end() || it->second->last_use < oldest->second->last_use) {
            oldest = it;
          }
        }
        by_incarnation.erase(oldest);
      }
    }
    std::shared_ptr<PushGuard::State>& state = by_incarnation[incarnation];
    state->last_use = ++push_clock_;
    g.state_ = state;  // shared: an eviction while the push runs does not free it
  }
  g.sequence_ = sequence;
  g.lock_ = std::unique_lock<std::mutex>(g.state_->mu);
  g.duplicate_ = sequence <= g.state_->last_sequence;
  return g;
}

void Shard::PushGuard::Commit() {
  if (state_ != nullptr && lock_.owns_lock()) state_->last_sequence = sequence_;
}

void Shard::PushGuard::Release() {
  if (lock_.owns_lock()) lock_.unlock();
}

void Shard::CountPushRequest(int64_t bytes_in) {
  push_requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(bytes_in, std::memory_order_relaxed);
}

void Shard::CountDuplicatePush() { duplicate_pushes_.fetch_add(1, std::memory_order_relaxed); }

void Shard::CountUnauthenticated() { unauthenticated_.fetch_add(1, std::memory_order_relaxed); }

void Shard::CountBytesOut(int64_t bytes) {
  bytes_out_.fetch_add(bytes, std::memory_order_relaxed);
}

EmbeddingStore::Staleness Shard::RowStaleness() const {
  EmbeddingStore::Staleness all;
  for (const auto& store : stores_) {
    const EmbeddingStore::Staleness s = store->staleness();
    all.updates += s.updates;
    all.sum += s.sum;
    all.max = std::max(all.max, s.max);
  }
  return all;
}

DenseStore::Staleness Shard::DenseStaleness() const {
  return dense_ != nullptr ? dense_->staleness() : DenseStore::Staleness{};
}

int64_t Shard::LastStep() const {
  int64_t step = dense_ != nullptr ? dense_->last_step() : 0;
  for (const auto& s : stores_) step = std::max(step, s->last_step());
  for (const auto& s : dynamic_stores_) step = std::max(step, s->last_step());
  return step;
}

void Shard::FillInfo(InfoResponse* info) const {
  info->set_shard(opt_.shard);
  ShardMap* m = info->mutable_map();
  m->set_rows(opt_.rows);
  m->set_partitions(opt_.partitions);
  m->set_shards(opt_.num_shards);
  m->set_row_dim(opt_.row_dim);
  m->set_dense_size(opt_.dense_size);
  m->set_version(0);
  for (const auto& d : dynamic_stores_) m->add_dynamic_row_dims(d->dim());
  for (const int w : PartitionWidths(map_, opt_.row_dim)) m->add_partition_row_dims(w);
  info->set_ready(true);
  info->set_last_step(LastStep());
  info->set_dense_begin(dense_begin_);
  info->set_dense_slice_size(dense_slice_size_);
  info->set_incarnation(incarnation_);
  info->set_sparse_optimizer(opt_.sparse_optimizer.type());
  info->set_dense_optimizer(opt_.dense_optimizer.type());
}

ShardStats Shard::Stats() const {
  ShardStats s;
  s.set_shard(opt_.shard);
  s.set_rows_owned(map_.RowsOfShard(opt_.shard));
  int64_t rows = 0;
  StoreMemory memory;
  for (const auto& store : stores_) {
    rows += store->stats().rows_initialized;
    memory += MemoryOf(*store);
  }
  if (dense_ != nullptr) memory += MemoryOf(*dense_);
  // A dynamic table's live rows count as initialized rows, and its measured bytes (rows, map,
  // sketch) as the shard's; they are not split into parameter and optimizer bytes.
  for (size_t d = 0; d < dynamic_stores_.size(); ++d) {
    const DynamicEmbeddingStore::Metrics m = dynamic_stores_[d]->metrics();
    rows += m.rows_live;
    memory.total_bytes += m.bytes;
    DynamicTableStats* t = s.add_dynamic_tables();
    t->set_name(DynamicName(static_cast<int>(d)));
    t->set_rows_live(m.rows_live);
    t->set_admitted(m.admitted);
    t->set_rejected(m.rejected);
    t->set_evicted_ttl(m.evicted_ttl);
    t->set_evicted_capacity(m.evicted_capacity);
    t->set_new_keys_last_step(m.new_keys_last_step);
    t->set_last_step(m.last_step);
    t->set_bytes(m.bytes);
  }
  s.set_rows_initialized(rows);
  s.set_bytes(memory.total_bytes);
  s.set_parameter_bytes(memory.parameter_bytes);
  s.set_optimizer_bytes(memory.optimizer_bytes);
  const DenseStore::Staleness tau = DenseStaleness();
  s.set_dense_versioned_pushes(tau.updates);
  s.set_dense_staleness_mean(tau.updates > 0 ? static_cast<double>(tau.sum) / tau.updates : 0.0);
  s.set_dense_staleness_max(tau.max);
  const EmbeddingStore::Staleness row_tau = RowStaleness();
  s.set_row_versioned_updates(row_tau.updates);
  s.set_row_staleness_mean(row_tau.updates > 0 ? static_cast<double>(row_tau.sum) / row_tau.updates
                                               : 0.0);
  s.set_row_staleness_max(row_tau.max);
  s.set_dense_floats(dense_slice_size_);
  s.set_pull_requests(pull_requests_.load(std::memory_order_relaxed));
  s.set_push_requests(push_requests_.load(std::memory_order_relaxed));
  s.set_duplicate_pushes(duplicate_pushes_.load(std::memory_order_relaxed));
  s.set_pull_rows(pull_rows_.load(std::memory_order_relaxed));
  s.set_push_rows(push_rows_.load(std::memory_order_relaxed));
  s.set_bytes_in(bytes_in_.load(std::memory_order_relaxed));
  s.set_bytes_out(bytes_out_.load(std::memory_order_relaxed));
  const double uptime =
      std::max(1e-9, absl::ToDoubleSeconds(opt_.env->MonotonicNow() - start_time_));
  s.set_uptime_seconds(uptime);
  s.set_pull_qps(s.pull_requests() / uptime);
  s.set_push_qps(s.push_requests() / uptime);
  s.set_last_step(LastStep());
  s.set_nonfinite_pushes(nonfinite_pushes_.load(std::memory_order_relaxed));
  s.set_unauthenticated_calls(unauthenticated_.load(std::memory_order_relaxed));
  return s;
}

}  // namespace pstrain
