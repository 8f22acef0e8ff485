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
  EmbeddingStore::Options eo;
  eo.begin = 0;
  eo.end = total_rows;
  eo.dim = model.row_dim();
  eo.optimizer = sparse_opt;
  eo.row_init = tables.row_init ? std::move(tables.row_init)
                                : [&model, seed](int64_t row, float* out) {
                                    model.InitRow(row, seed, out);
                                  };
  eo.range_optimizers = std::move(tables.optimizers);
  eo.threads = threads;
  ASSIGN_OR_RETURN(p->rows_, EmbeddingStore::Create(std::move(eo)));
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

absl::Status LocalParams::Route(absl::Span<const int64_t> ids, Routed* r) const {
  r->keys.assign(dynamic_.size(), {});
  r->at.assign(dynamic_.size(), {});
  r->fixed.reserve(ids.size());
  r->fixed_at.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (!IsDynamicRow(id)) {
      r->fixed.push_back(id);
      r->fixed_at.push_back(i);
      continue;
    }
    const int d = DynamicTableOf(id);
    if (d >= static_cast<int>(dynamic_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("row id ", id, " is of dynamic table ", d,
                                                     "; this job has ", dynamic_.size()));
    }
    r->keys[d].push_back(DynamicKeyOf(id));
    r->at[d].push_back(i);
  }
  return absl::OkStatus();
}

absl::Status LocalParams::GatherAll(absl::Span<const int64_t> ids, float* rows, int threads) {
  if (dynamic_.empty()) return rows_->Gather(ids, rows, /*versions=*/nullptr, threads);
  Routed r;
  RETURN_IF_ERROR(Route(ids, &r));
  const size_t D = static_cast<size_t>(row_dim());
  std::vector<float> tmp;
  if (r.fixed.size() == ids.size()) {
    RETURN_IF_ERROR(rows_->Gather(ids, rows, nullptr, threads));
  } else if (!r.fixed.empty()) {
    tmp.resize(r.fixed.size() * D);
    RETURN_IF_ERROR(rows_->Gather(r.fixed, tmp.data(), nullptr, threads));
    for (size_t j = 0; j < r.fixed.size(); ++j) {
      std::memcpy(rows + r.fixed_at[j] * D, tmp.data() + j * D, D * sizeof(float));
    }
  }
  for (size_t d = 0; d < dynamic_.size(); ++d) {
    if (r.keys[d].empty()) continue;
    const DynamicEmbeddingStore& s = *dynamic_[d].store;
    const size_t w = static_cast<size_t>(s.dim());
    tmp.resize(r.keys[d].size() * w);
    s.Gather(r.keys[d], tmp.data(), threads);
    for (size_t j = 0; j < r.keys[d].size(); ++j) {
      float* out = rows + r.at[d][j] * D;
      std::memcpy(out, tmp.data() + j * w, w * sizeof(float));
      std::fill(out + w, out + D, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status LocalParams::ApplyAll(absl::Span<const int64_t> ids, const float* grads,
                                   int64_t step, int threads) {
  if (dynamic_.empty()) return rows_->Apply(ids, grads, step, nullptr, threads);
  Routed r;
  RETURN_IF_ERROR(Route(ids, &r));
  const size_t D = static_cast<size_t>(row_dim());
  std::vector<float> tmp;
  if (r.fixed.size() == ids.size()) {
    RETURN_IF_ERROR(rows_->Apply(ids, grads, step, nullptr, threads));
  } else if (!r.fixed.empty()) {
    tmp.resize(r.fixed.size() * D);
    for (size_t j = 0; j < r.fixed.size(); ++j) {
      std::memcpy(tmp.data() + j * D, grads + r.fixed_at[j] * D, D * sizeof(float));
    }
    RETURN_IF_ERROR(rows_->Apply(r.fixed, tmp.data(), step, nullptr, threads));
  }
  for (size_t d = 0; d < dynamic_.size(); ++d) {
    if (r.keys[d].empty()) continue;
    DynamicEmbeddingStore& s = *dynamic_[d].store;
    const size_t w = static_cast<size_t>(s.dim());
    tmp.resize(r.keys[d].size() * w);
    for (size_t j = 0; j < r.keys[d].size(); ++j) {
      std::memcpy(tmp.data() + j * w, grads + r.at[d][j] * D, w * sizeof(float));
    }
    s.Apply(r.keys[d], tmp.data(), step, threads);
  }
  return absl::OkStatus();
}

absl::Status LocalParams::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  RETURN_IF_ERROR(GatherAll(ids, rows, /*threads=*/0));
  if (dense != nullptr) dense_->Get(dense);
  return absl::OkStatus();
}

absl::Status LocalParams::Push(absl::Span<const int64_t> ids, const float* row_grads,
                               const float* dense_grad, int64_t step) {
  RETURN_IF_ERROR(ApplyAll(ids, row_grads, step, /*threads=*/0));
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
