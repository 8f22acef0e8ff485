#include "worker/params/local_params.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dynamic_rows.h"

#include "common/logging.h"
#include "common/status.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<LocalParams>> LocalParams::Create(const Model& model,
                                                                  int64_t total_rows,
                                                                  const Config& config,
                                                                  int threads,
                                                                  StoreTables tables) {
  auto p = std::make_unique<LocalParams>();
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> sparse_opt,
                   Optimizer::Create(config.sparse_optimizer()));
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> dense_opt,
                   Optimizer::Create(config.dense_optimizer()));
  const uint64_t seed = config.train().seed();
  const int stride = model.row_dim();
  p->row_dim_ = stride;
  RowInit row_init = tables.row_init ? std::move(tables.row_init)
                                     : [&model, seed](int64_t row, float* out) {
                                         model.InitRow(row, seed, out);
                                       };
  std::vector<TableRows> widths = std::move(tables.widths);
  if (widths.empty()) widths.push_back({0, total_rows, stride, {}});
  if (widths.size() > kMaxTables) {
    return absl::InvalidArgumentError(absl::StrCat("LocalParams: ", widths.size(),
                                                   " tables, at most ", kMaxTables));
  }
  for (size_t t = 0; t < widths.size(); ++t) {
    const TableRows& w = widths[t];
    if (w.begin != (t == 0 ? 0 : widths[t - 1].end) || w.end <= w.begin || w.dim < 1 ||
        w.dim > stride || (t + 1 == widths.size() && w.end != total_rows)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LocalParams: table ", t, " [", w.begin, ", ", w.end, ") of width ", w.dim,
          " does not continue a row space of ", total_rows, " rows at stride ", stride));
    }
    EmbeddingStore::Options eo;
    eo.begin = w.begin;
    eo.end = w.end;
    eo.dim = w.dim;
    eo.optimizer = sparse_opt;
    eo.row_init = NarrowRowInit(row_init, stride, w.dim);
    for (const auto& ro : tables.optimizers) {
      if (ro.begin < w.end && ro.end > w.begin) eo.range_optimizers.push_back(ro);
    }
    eo.threads = threads;
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> store, EmbeddingStore::Create(std::move(eo)));
    p->store_ptrs_.push_back(store.get());
    p->stores_.push_back(std::move(store));
  }
  DenseStore::Options dopt;
  dopt.size = model.dense_size();
  dopt.optimizer = dense_opt;
  dopt.threads = threads;
  ASSIGN_OR_RETURN(p->dense_, DenseStore::Create(std::move(dopt)));
  std::vector<float> init(model.dense_size());
  model.InitDense(seed, init.data());
  p->dense_->Set(init.data());
  return p;
}

absl::Status LocalParams::AddDynamicTables(std::vector<DynamicTable> tables) {
  if (!dynamic_.empty()) return absl::FailedPreconditionError("dynamic tables added twice");
  if (tables.size() > static_cast<size_t>(kMaxDynamicTables)) {
    return absl::InvalidArgumentError(
        absl::StrCat(tables.size(), " dynamic tables, at most ", kMaxDynamicTables));
  }
  for (const DynamicTable& t : tables) {
    if (t.store == nullptr || t.store->dim() > row_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dynamic table '", t.name, "': its store's width ",
          t.store == nullptr ? 0 : t.store->dim(), " exceeds the row stride ", row_dim()));
    }
  }
  dynamic_ = std::move(tables);
  return absl::OkStatus();
}

EmbeddingStore* LocalParams::embedding() const {
  PSTRAIN_CHECK(stores_.size() == 1) << "LocalParams::embedding() with " << stores_.size()
                                     << " table stores: use embeddings()";
  return stores_[0].get();
}

namespace {

// One call's ids grouped by store (counting sort): group s < S (the fixed stores) holds the ids
// of stores[s], group S + d those of dynamic table d; order[bounds[s], bounds[s + 1]) are the
// positions of a group's ids, grouped[...] those ids. Kept per thread (the tower threads call
// concurrently) so that a step allocates nothing once warm. keys[i] = DynamicKeyOf(grouped[i])
// for the dynamic groups' ids (from bounds[S] on).
struct Grouping {
  std::vector<uint32_t> of;  // the group of each id
  std::vector<int32_t> order;
  std::vector<int64_t> bounds, next, grouped;
  std::vector<uint64_t> keys;
  std::vector<float> rows;  // a fixed store's group's rows at its width
  // What the grouping above is of (GroupOnce): these ids over stores whose first rows (and the
  // last store's end) were `begins`, with `num_dynamic` dynamic tables; valid: it is complete.
  bool valid = false;
  std::vector<int64_t> ids, begins;
  int num_dynamic = 0;
};

// INVALID_ARGUMENT naming the first id outside every store or of a dynamic table past
// num_dynamic; nothing is grouped then.
absl::Status GroupByStore(absl::Span<const int64_t> ids, absl::Span<EmbeddingStore* const> stores,
                          int num_dynamic, Grouping* g) {
  const int64_t total = stores.back()->end();
  const size_t groups = stores.size() + num_dynamic;
  g->of.resize(ids.size());
  g->bounds.assign(groups + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    size_t s;
    if (IsDynamicRow(id)) {
      const int d = DynamicTableOf(id);
      if (d >= num_dynamic) {
        return absl::InvalidArgumentError(absl::StrCat("row id ", id, " is of dynamic table ", d,
                                                       "; this job has ", num_dynamic));
      }
      s = stores.size() + d;
    } else {
      if (id >= total) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", id, " is outside the table [0, ", total, ")"));
      }
      // A handful of tables: a linear scan from the last is faster than a search.
      s = stores.size() - 1;
      while (id < stores[s]->begin()) --s;
    }
    g->of[i] = static_cast<uint32_t>(s);
    ++g->bounds[s + 1];
  }
  for (size_t s = 0; s < groups; ++s) g->bounds[s + 1] += g->bounds[s];
  g->next.assign(g->bounds.begin(), g->bounds.end() - 1);
  g->order.resize(ids.size());
  g->grouped.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t at = g->next[g->of[i]]++;
    g->order[at] = static_cast<int32_t>(i);
    g->grouped[at] = ids[i];
  }
  return absl::OkStatus();
}

// GroupByStore, unless *g already holds the grouping of these very ids over the same stores (a
// pure function of them): a training step's ApplyRows after its GatherRows on the same thread
// (TrainStep's in-process step) splits and keys its ids once, at the cost of a copy of the ids
// and a comparison with them.
absl::Status GroupOnce(absl::Span<const int64_t> ids, absl::Span<EmbeddingStore* const> stores,
                       int num_dynamic, Grouping* g) {
  const auto same_stores = [&] {
    if (g->begins.size() != stores.size() + 1) return false;
    for (size_t s = 0; s < stores.size(); ++s) {
      if (g->begins[s] != stores[s]->begin()) return false;
    }
    return g->begins.back() == stores.back()->end();
  };
  if (g->valid && g->num_dynamic == num_dynamic && g->ids.size() == ids.size() && same_stores() &&
      std::equal(ids.begin(), ids.end(), g->ids.begin())) {
    return absl::OkStatus();
  }
  g->valid = false;
  RETURN_IF_ERROR(GroupByStore(ids, stores, num_dynamic, g));
  const int64_t dynamic_begin = g->bounds[stores.size()];
  g->keys.resize(ids.size());
  for (size_t i = dynamic_begin; i < ids.size(); ++i) g->keys[i] = DynamicKeyOf(g->grouped[i]);
  g->ids.assign(ids.begin(), ids.end());
  g->begins.clear();
  for (EmbeddingStore* store : stores) g->begins.push_back(store->begin());
  g->begins.push_back(stores.back()->end());
  g->num_dynamic = num_dynamic;
  g->valid = true;
  return absl::OkStatus();
}

Grouping& ThreadGrouping() {
  thread_local Grouping g;
  return g;
}

// One group of a call's ids (GroupByStore): a fixed store's, or a dynamic table's with its keys.
struct StoreGroup {
  EmbeddingStore* store = nullptr;           // a fixed store's group
  DynamicEmbeddingStore* dynamic = nullptr;  // else a dynamic table's
  absl::Span<const int64_t> ids;             // the group's ids
  absl::Span<const uint64_t> keys;           // a dynamic group's keys (DynamicKeyOf)
  absl::Span<const int32_t> positions;       // the caller's index of each id
  int width = 0;                             // the store's floats per row
};

// Groups `ids` by store into `g` and calls fn(group) for each non-empty group, fixed stores in
// row order then dynamic tables in dynamic-index order; stops at the first error (fn's or
// GroupByStore's, before any fn). The one group loop of GatherAt and ApplyAt.
template <typename Fn>
absl::Status ForEachGroup(absl::Span<const int64_t> ids, absl::Span<EmbeddingStore* const> stores,
                          const std::vector<LocalParams::DynamicTable>& dynamic, Grouping* g,
                          Fn fn) {
  RETURN_IF_ERROR(GroupOnce(ids, stores, static_cast<int>(dynamic.size()), g));
  const size_t S = stores.size();
  for (size_t s = 0; s < S + dynamic.size(); ++s) {
    const int64_t n = g->bounds[s + 1] - g->bounds[s];
    if (n == 0) continue;
    StoreGroup group;
    group.ids = absl::MakeConstSpan(g->grouped).subspan(g->bounds[s], n);
    group.positions = absl::MakeConstSpan(g->order).subspan(g->bounds[s], n);
    if (s < S) {
      group.store = stores[s];
      group.width = group.store->dim();
    } else {
      group.dynamic = dynamic[s - S].store.get();
      group.width = group.dynamic->dim();
      group.keys = absl::MakeConstSpan(g->keys).subspan(g->bounds[s], n);
    }
    RETURN_IF_ERROR(fn(group));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LocalParams::GatherAt(absl::Span<const int64_t> ids, float* rows,
                                   int threads) const {
  if (stores_.size() == 1 && dynamic_.empty()) {
    return stores_[0]->Gather(ids, rows, nullptr, threads);
  }
  Grouping& g = ThreadGrouping();
  const auto gather = [&](const StoreGroup& group) -> absl::Status {
    const int64_t n = static_cast<int64_t>(group.ids.size());
    const int width = group.width;
    // Each row to its place at the stride, zeros after its width (ExpandRowsInPlace's rule): a
    // dynamic table's straight there, a fixed store's through a buffer.
    if (group.dynamic != nullptr) {
      group.dynamic->GatherAt(group.keys, group.positions.data(), row_dim_, rows, threads);
      if (width < row_dim_) {
        for (const int32_t p : group.positions) {
          std::fill_n(rows + int64_t{p} * row_dim_ + width, row_dim_ - width, 0.f);
        }
      }
      return absl::OkStatus();
    }
    g.rows.resize(n * width);
    RETURN_IF_ERROR(group.store->Gather(group.ids, g.rows.data(), nullptr, threads));
    for (int64_t j = 0; j < n; ++j) {
      float* out = rows + int64_t{group.positions[j]} * row_dim_;
      std::copy_n(g.rows.data() + j * width, width, out);
      std::fill(out + width, out + row_dim_, 0.f);
    }
    return absl::OkStatus();
  };
  return ForEachGroup(ids, store_ptrs_, dynamic_, &g, gather);
}

absl::Status LocalParams::ApplyAt(absl::Span<const int64_t> ids, const float* grads, int64_t step,
                                  int threads) {
  if (stores_.size() == 1 && dynamic_.empty()) {
    return stores_[0]->Apply(ids, grads, step, nullptr, threads);
  }
  Grouping& g = ThreadGrouping();
  // Grouped (and so checked) before anything is applied: an id outside every table applies
  // nothing.
  const auto apply = [&](const StoreGroup& group) -> absl::Status {
    // A dynamic table reads each row's first floats at its place; a fixed store's rows go
    // through a buffer at its width.
    if (group.dynamic != nullptr) {
      group.dynamic->ApplyAt(group.keys, group.positions.data(), row_dim_, grads, step, threads);
      return absl::OkStatus();
    }
    const int64_t n = static_cast<int64_t>(group.ids.size());
    const int width = group.width;
    g.rows.resize(n * width);
    for (int64_t j = 0; j < n; ++j) {
      NarrowRows(grads + int64_t{group.positions[j]} * row_dim_, 1, row_dim_, width,
                 g.rows.data() + j * width);
    }
    return group.store->Apply(group.ids, g.rows.data(), step, nullptr, threads);
  };
  return ForEachGroup(ids, store_ptrs_, dynamic_, &g, apply);
}

absl::Status LocalParams::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  RETURN_IF_ERROR(GatherAt(ids, rows, /*threads=*/0));
  if (dense != nullptr) dense_->Get(dense);
  return absl::OkStatus();
}

absl::Status LocalParams::Push(absl::Span<const int64_t> ids, const float* row_grads,
                               const float* dense_grad, int64_t step) {
  RETURN_IF_ERROR(ApplyAt(ids, row_grads, step, /*threads=*/0));
  dense_->Apply(dense_grad, step);
  return absl::OkStatus();
}

ParamsOp LocalParams::StartPush(absl::Span<const int64_t> ids, const float* row_grads,
                               const float* dense_grad, int64_t step) {
  if (!background_.joinable()) return ParamsOp(Push(ids, row_grads, dense_grad, step));
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(+[](bool* q) { return !*q; }, &queued_));
  bg_ids_.assign(ids.begin(), ids.end());
  bg_rows_.assign(row_grads, row_grads + ids.size() * row_dim());
  bg_dense_.assign(dense_grad, dense_grad + dense_size());
  bg_step_ = step;
  queued_ = true;
  return ParamsOp([this]() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(+[](bool* q) { return !*q; }, &queued_));
    return bg_status_;
  });
}

void LocalParams::EnableBackgroundPush() {
  PSTRAIN_CHECK(!background_.joinable()) << "EnableBackgroundPush called twice";
  background_ = std::thread(&LocalParams::BackgroundLoop, this);
}

void LocalParams::BackgroundLoop() {
  while (true) {
    int64_t step;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](LocalParams* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->queued_ || p->stop_; },
          this));
      if (!queued_) return;  // stopped with nothing to apply
      step = bg_step_;
    }
    absl::Status s = Push(bg_ids_, bg_rows_.data(), bg_dense_.data(), step);
    absl::MutexLock l(&mu_);
    bg_status_ = std::move(s);
    queued_ = false;
  }
}

LocalParams::~LocalParams() {
  if (!background_.joinable()) return;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  background_.join();
}

}  // namespace pstrain
