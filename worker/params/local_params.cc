#include "worker/params/local_params.h"

#include <vector>

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

absl::Status LocalParams::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  RETURN_IF_ERROR(rows_->Gather(ids, rows));
  if (dense != nullptr) dense_->Get(dense);
  return absl::OkStatus();
}

absl::Status LocalParams::Push(absl::Span<const int64_t> ids, const float* row_grads,
                               const float* dense_grad, int64_t step) {
  RETURN_IF_ERROR(rows_->Apply(ids, row_grads, step));
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
