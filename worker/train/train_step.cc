#include "worker/train/train_step.h"

#include <algorithm>
#include <atomic>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/status.h"
#include "worker/train/step_barrier.h"

namespace pstrain {
namespace {

// out[i] = (sum of the towers' bufs[u][i], in tower order) * scale for i in [b, e), into
// bufs[0]. Two towers (the usual count) in one pass: the same two operations per float as the
// sum pass then the scale pass, so the same floats, with one read and write of out less.
void SumTowers(std::vector<std::vector<float>>& bufs, int64_t b, int64_t e, float scale) {
  float* out = bufs[0].data();
  if (bufs.size() == 2) {
    const float* in = bufs[1].data();
    for (int64_t i = b; i < e; ++i) out[i] = (out[i] + in[i]) * scale;
    return;
  }
  for (size_t u = 1; u < bufs.size(); ++u) {
    const float* in = bufs[u].data();
    for (int64_t i = b; i < e; ++i) out[i] += in[i];
  }
  for (int64_t i = b; i < e; ++i) out[i] *= scale;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainStep>> TrainStep::Create(const Model& model, int towers,
                                                             int batch_per_tower,
                                                             int intra_op_threads, Env* env) {
  ASSIGN_OR_RETURN(auto pool, TowerPool::Create(model, towers, batch_per_tower, intra_op_threads));
  std::unique_ptr<TrainStep> s(
      new TrainStep(model, std::move(pool), batch_per_tower, intra_op_threads, env));
  s->row_grads_.resize(towers);
  s->dense_grads_.resize(towers);
  s->losses_.resize(towers);
  s->barrier_ = std::make_unique<StepBarrier>(towers);
  return s;
}

TrainStep::~TrainStep() {
  for (int i = 0; i < staged_count_; ++i) {
    Staged& s = staged_[(head_ + i) % 2];
    if (s.pull_started) s.pull.Wait().IgnoreError();
  }
  push_.Wait().IgnoreError();
}

absl::Status TrainStep::Stage(const Batch& batch, ParameterAccess* params, bool start_pull) {
  if (staged_count_ == 2) {
    return absl::FailedPreconditionError("TrainStep::Stage: two batches are staged already");
  }
  if (batch.size > 0 && batch.num_fields != model_.num_fields()) {
    return absl::InvalidArgumentError(absl::StrCat("batch has ", batch.num_fields,
                                                   " fields, the model expects ",
                                                   model_.num_fields()));
  }
  if (!batch.offsets.empty() &&
      (batch.offsets.size() != static_cast<size_t>(batch.size) * batch.num_fields + 1 ||
       batch.offsets.back() != static_cast<int64_t>(batch.ids.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch offsets: ", batch.offsets.size(), " offsets ending at ", batch.offsets.back(),
        " for ", batch.size, " examples x ",
        batch.num_fields, " fields and ", batch.ids.size(), " ids"));
  }
  if (batch.size > towers() * batch_per_tower_) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", batch.size, " examples exceeds ",
                                                   towers(), " towers x ", batch_per_tower_));
  }
  const double t0 = env_->MonotonicSeconds();
  Staged& s = staged_[(head_ + staged_count_) % 2];
  s.batch = &batch;
  dedup_.Run(batch.ids, &s.unique, &s.slots);
  s.rows.resize(s.unique.size() * model_.row_dim());
  s.pull_started = start_pull && batch.size > 0;
  if (s.pull_started) {
    // Every push but the one of the step computing now: a fixed staleness of one step.
    RETURN_IF_ERROR(push_.Wait());
    s.pull = StartPull(&s, params);
  }
  ++staged_count_;
  profile_.dedup += env_->MonotonicSeconds() - t0;
  return absl::OkStatus();
}

ParamsOp TrainStep::StartPull(Staged* st, ParameterAccess* params) {
  float* dense = nullptr;
  if (pulls_since_dense_ % dense_sync_steps_ == 0) {
    // The first pull, or a new block: into the buffer no step computing now reads.
    if (!dense_[0].empty()) dense_latest_ = 1 - dense_latest_;
    dense_[dense_latest_].resize(model_.dense_size());
    dense = dense_[dense_latest_].data();
    pulls_since_dense_ = 0;
  }
  ++pulls_since_dense_;
  st->dense = dense_latest_;
  return params->StartPull(st->unique, st->rows.data(), dense);
}

absl::Status TrainStep::WaitPush() {
  const double t0 = env_->MonotonicSeconds();
  absl::Status s = push_.Wait();
  push_ = ParamsOp();
  profile_.push += env_->MonotonicSeconds() - t0;
  return s;
}

absl::Status TrainStep::Flush() {
  absl::Status s = WaitPush();
  const double t0 = env_->MonotonicSeconds();
  if (s.ok() && dense_sum_steps_ > 0) {
    // A partial block: push the mean of its dense gradients now, and fetch the dense vector
    // with the next pull.
    const float scale = 1.0f / static_cast<float>(dense_sum_steps_);
    for (float& g : dense_sum_) g *= scale;
    dense_sum_steps_ = 0;
    pulls_since_dense_ = 0;
    s = last_params_->StartPush({}, nullptr, dense_sum_.data(), last_step_).Wait();
  }
  profile_.push += env_->MonotonicSeconds() - t0;
  return s;
}

absl::Status TrainStep::RunOverlap(const std::function<absl::Status()>& overlap) {
  if (!overlap) return absl::OkStatus();
  if (overlap_thread_ == nullptr) {
    try {
      overlap_thread_ = std::make_unique<OverlapThread>();
    } catch (const std::system_error& e) {
      // No thread to be had (a process at its thread limit): the caller's thread, as before.
      PSTRAIN_LOG(WARNING) << "the read-ahead runs on the trainer's thread: " << e.what();
      return overlap();
    }
  }
  overlap_thread_->Start(overlap);
  return overlap_thread_->Wait();
}

absl::StatusOr<StepResult> TrainStep::Train(int64_t step, ParameterAccess* params,
                                            const std::function<absl::Status()>& overlap) {
  if (staged_count_ == 0) {
    return absl::FailedPreconditionError("TrainStep::Train: no batch staged");
  }
  Staged& st = staged_[head_];
  head_ = (head_ + 1) % 2;
  --staged_count_;
  const Batch& batch = *st.batch;
  const int T = towers();
  const int n = batch.size;
  if (n == 0) {
    if (overlap) RETURN_IF_ERROR(overlap());
    return StepResult{};
  }
  const int D = model_.row_dim();
  const int64_t dsz = model_.dense_size();
  const int64_t U = static_cast<int64_t>(st.unique.size());

  // In-process parameters: the whole step on the tower threads (see the top of this file).
  if (InProcessParams* local = params->in_process();
      local != nullptr && !st.pull_started && dense_sync_steps_ == 1) {
    return TrainInProcess(st, step, local, overlap);
  }

  double t0 = env_->MonotonicSeconds();
  if (!st.pull_started) {
    RETURN_IF_ERROR(WaitPush());  // read-after-write: the pull sees every earlier push
    t0 = env_->MonotonicSeconds();
    st.pull = StartPull(&st, params);
  }
  RETURN_IF_ERROR(st.pull.Wait());
  double t1 = env_->MonotonicSeconds();
  profile_.pull += t1 - t0;

  const TowerFn compute = [&](int t, Tower* tower) -> absl::Status {
    return ComputeTower(t, tower, st, dense_[st.dense].data());
  };
  pool_->Start(compute);
  const absl::Status overlap_status = RunOverlap(overlap);
  RETURN_IF_ERROR(pool_->Wait());
  RETURN_IF_ERROR(overlap_status);
  double t2 = env_->MonotonicSeconds();
  profile_.compute += t2 - t1;

  // Sum the tower gradients into tower 0's buffers and average over the batch, on the trainer
  // thread's team of T x I threads. (Each tower thread summing its own slice measured about 2x
  // slower on the loaded 2-core machine, docs/PERFORMANCE.md: waking the tower threads again
  // costs more than the sum.)
  const float scale = 1.0f / static_cast<float>(n);
  auto reduce = [&](std::vector<std::vector<float>>& bufs, int64_t len) {
    ParallelFor(len, T * intra_, [&](int, int, int64_t b, int64_t e) {
      SumTowers(bufs, b, e, scale);
    });
  };
  reduce(row_grads_, U * D);
  reduce(dense_grads_, dsz);
  double t3 = env_->MonotonicSeconds();
  profile_.reduce += t3 - t2;

  // The previous push must have been accepted before this one starts (one push in flight from
  // here; the ParameterAccess may keep more in its own queue).
  RETURN_IF_ERROR(push_.Wait());
  const float* dense_grad = dense_grads_[0].data();
  if (dense_sync_steps_ > 1) {
    if (dense_sum_steps_ == 0) {
      dense_sum_.assign(dense_grads_[0].begin(), dense_grads_[0].end());
    } else {
      const float* g = dense_grads_[0].data();
      float* sum = dense_sum_.data();
#pragma omp simd
      for (int64_t i = 0; i < dsz; ++i) sum[i] += g[i];
    }
    dense_grad = nullptr;
    if (++dense_sum_steps_ == dense_sync_steps_) {
      const float scale = 1.0f / static_cast<float>(dense_sync_steps_);
      for (float& g : dense_sum_) g *= scale;
      dense_sum_steps_ = 0;
      dense_grad = dense_sum_.data();
    }
  }
  push_ = params->StartPush(st.unique, row_grads_[0].data(), dense_grad, step);
  last_step_ = step;
  last_params_ = params;
  profile_.push += env_->MonotonicSeconds() - t3;

  StepResult r;
  for (double l : losses_) r.loss_sum += l;
  r.examples = n;
  r.unique_rows = U;
  return r;
}

absl::Status TrainStep::ComputeTower(int t, Tower* tower, const Staged& st, const float* dense) {
  const Batch& batch = *st.batch;
  const int n = batch.size;
  const int F = batch.num_fields;
  const int64_t U = static_cast<int64_t>(st.unique.size());
  // Split n examples over the towers as evenly as possible (a short last batch stays balanced).
  int64_t b, e;
  Balance211(n, towers(), t, &b, &e);
  auto& rg = row_grads_[t];
  auto& dg = dense_grads_[t];
  rg.assign(U * model_.row_dim(), 0.0f);
  dg.assign(model_.dense_size(), 0.0f);
  losses_[t] = 0;
  if (b == e) return absl::OkStatus();
  Tower::Input in;
  in.n = static_cast<int>(e - b);
  // With lists the slice's entries start at offsets[b * F]; the tower rebases the offsets.
  const int64_t first = batch.offsets.empty() ? b * F : batch.offsets[b * F];
  in.slots = st.slots.data() + first;
  in.scales = batch.values.data() + first;
  in.offsets = batch.offsets.empty() ? nullptr : batch.offsets.data() + b * F;
  in.labels = batch.labels.data() + b;
  in.rows = st.rows.data();
  in.dense = dense;
  ASSIGN_OR_RETURN(losses_[t], tower->ForwardBackward(in, rg.data(), dg.data(), nullptr));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> TrainStep::TrainInProcess(
    Staged& st, int64_t step, InProcessParams* params,
    const std::function<absl::Status()>& overlap) {
  // Nothing may be in flight: the pull below reads what every earlier update wrote.
  RETURN_IF_ERROR(WaitPush());
  const int T = towers();
  const int D = model_.row_dim();
  const int n = st.batch->size;
  const int64_t dsz = model_.dense_size();
  const int64_t U = static_cast<int64_t>(st.unique.size());
  const absl::Span<const int64_t> unique(st.unique);
  dense_[0].resize(dsz);
  st.dense = dense_latest_ = 0;
  pulls_since_dense_ = 0;
  float* dense = dense_[0].data();
  // Each tower's share of the rows and of the dense vector (whole chunks, so that the update is
  // the one Push makes, to the bit).
  const int64_t chunk = params->dense_chunk();
  const int64_t chunks = (dsz + chunk - 1) / chunk;
  const float scale = 1.0f / static_cast<float>(n);
  std::atomic<bool> failed{false};
  double t_pulled = 0, t_computed = 0, t_updated = 0;

  const TowerFn fn = [&](int t, Tower* tower) -> absl::Status {
    int64_t ub, ue, cb, ce;
    Balance211(U, T, t, &ub, &ue);
    Balance211(chunks, T, t, &cb, &ce);
    const int64_t db = std::min(dsz, cb * chunk), de = std::min(dsz, ce * chunk);
    // 1. Pull this tower's share of the step's rows and of the dense vector.
    absl::Status s =
        ub < ue ? params->GatherRows(unique.subspan(ub, ue - ub), st.rows.data() + ub * D)
                : absl::OkStatus();
    if (db < de) params->CopyDense(db, de, dense);
    if (!s.ok()) failed.store(true);
    barrier_->Wait();
    if (t == 0) t_pulled = env_->MonotonicSeconds();
    // 2. This tower's examples, from the whole step's rows and dense vector.
    if (!failed.load()) s = ComputeTower(t, tower, st, dense);
    if (!s.ok()) failed.store(true);
    barrier_->Wait();
    if (t == 0) t_computed = env_->MonotonicSeconds();
    if (failed.load()) return s;
    // 3. Sum the towers' gradients of this tower's share (in tower order, as the summed step
    // does), average over the batch and apply them.
    if (ub < ue) {
      SumTowers(row_grads_, ub * D, ue * D, scale);
      s = params->ApplyRows(unique.subspan(ub, ue - ub), row_grads_[0].data() + ub * D, step);
    }
    if (db < de) {
      SumTowers(dense_grads_, db, de, scale);
      params->ApplyDense(db, de, dense_grads_[0].data());
    }
    if (t == 0) t_updated = env_->MonotonicSeconds();
    return s;
  };

  const double t0 = env_->MonotonicSeconds();
  params->BeginStep(step);
  pool_->Start(fn);
  const absl::Status overlap_status = RunOverlap(overlap);
  const absl::Status towers_status = pool_->Wait();
  // The towers either all computed and the whole dense vector was updated, or none applied it.
  params->EndStep(/*applied=*/!failed.load());
  const double t1 = env_->MonotonicSeconds();
  RETURN_IF_ERROR(towers_status);
  RETURN_IF_ERROR(overlap_status);
  profile_.pull += t_pulled - t0;
  profile_.push += t_updated - t_computed;
  profile_.compute += (t1 - t0) - (t_pulled - t0) - (t_updated - t_computed);
  last_step_ = step;
  last_params_ = nullptr;  // nothing to flush: the update is applied
  StepResult r;
  for (double l : losses_) r.loss_sum += l;
  r.examples = n;
  r.unique_rows = U;
  return r;
}

absl::StatusOr<StepResult> TrainStep::Run(const Batch& batch, int64_t step,
                                          ParameterAccess* params) {
  RETURN_IF_ERROR(Stage(batch, params, /*start_pull=*/false));
  ASSIGN_OR_RETURN(StepResult r, Train(step, params));
  RETURN_IF_ERROR(Flush());
  return r;
}

}  // namespace pstrain
