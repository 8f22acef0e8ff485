#include "ps/server/consistency_tracker.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/rpc/wire.h"
#include "common/status.h"

namespace pstrain {

ConsistencyTracker::ConsistencyTracker(Options options, Shard* shard, Timer* timer)
    : opt_(std::move(options)),
      shard_(shard),
      held_({absl::StrCat("shard ", opt_.shard), "pulls", kMaxHeld}, &mu_, timer, opt_.env,
            [](HeldPull* pull, absl::Status status) { pull->Fail(std::move(status)); },
            [this](HeldPull* pull, absl::Duration held_for) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              // Under mu_ (the list's lock).
              return absl::DeadlineExceededError(absl::StrFormat(
                  "shard %d: worker %d's pull of step %d waited %.1f s: %s", opt_.shard,
                  pull->worker_id(), pull->step(), absl::ToDoubleSeconds(held_for),
                  WaitingForLocked(pull->step())));
            }) {
  absl::MutexLock lock(&mu_);
  pushed_.assign(opt_.num_workers, 0);
  done_.assign(opt_.num_workers, false);
}

absl::Status ConsistencyTracker::CheckWorker(int32_t worker_id, const char* what) const {
  if (Tracked(worker_id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "shard ", opt_.shard, ": ", what, " from worker ", worker_id, " (worker_id), but this ",
      Consistency_Name(opt_.consistency), " job has workers [0, ", opt_.num_workers, ")"));
}

absl::Status ConsistencyTracker::CheckPullStep(int32_t w, int64_t step) const {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": pull of step ", step, " < 0"));
  }
  if (step == 0) return absl::OkStatus();  // not a training pull: never held or counted
  RETURN_IF_ERROR(CheckWorker(w, "pull"));
  absl::MutexLock lock(&mu_);
  if (opt_.consistency == ASYNC) {
    int64_t largest = 0;
    for (int64_t p : pushed_) largest = std::max(largest, p);
    if (step > largest + kMaxAsyncStepsAhead) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": pull of step ", step, " (PullRequest.step), more than ",
          kMaxAsyncStepsAhead, " steps past the largest step pushed here (", largest,
          "): expected a step in [0, ", largest + kMaxAsyncStepsAhead, "]"));
    }
    return absl::OkStatus();
  }
  // The pull of step t follows the push of step t - 1 (or comes with it, pipelined).
  if (step > pushed_[w] + kMaxStepsAhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": worker ", w, "'s pull of step ", step, " is more than ",
        kMaxStepsAhead, " steps past its last push here (step ", pushed_[w], ")"));
  }
  return absl::OkStatus();
}

absl::Status ConsistencyTracker::CheckPushStep(int32_t w, int64_t step) const {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": push of step ", step, " < 0"));
  }
  absl::MutexLock lock(&mu_);
  if (opt_.consistency == ASYNC) {
    int64_t largest = 0;
    for (int64_t p : pushed_) largest = std::max(largest, p);
    if (step > largest + kMaxAsyncStepsAhead) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": push of step ", step, ", more than ", kMaxAsyncStepsAhead,
          " steps past the largest step pushed here (", largest, ")"));
    }
    return absl::OkStatus();
  }
  if (!Tracked(w)) return absl::OkStatus();  // CheckWorker refuses it
  if (step > pushed_[w] + kMaxStepsAhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": worker ", w, " pushed step ", step, ", more than ",
        kMaxStepsAhead, " steps past its last push here (step ", pushed_[w],
        "); a shard restarted without its checkpoint?"));
  }
  return absl::OkStatus();
}

void ConsistencyTracker::SetLost(const std::string& detail) {
  std::vector<HeldPull*> fail;
  {
    absl::MutexLock lock(&mu_);
    lost_ = detail;
    if (lost_.empty()) return;
    fail = held_.TakeAll();
  }
  for (HeldPull* pull : fail) {
    pull->Fail(absl::FailedPreconditionError(absl::StrCat(
        "shard ", opt_.shard, ": worker ", pull->worker_id(), "'s pull of step ", pull->step(),
        " cannot be answered: ", detail)));
  }
}

int64_t ConsistencyTracker::Staleness(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return StalenessLocked(step);
}

void ConsistencyTracker::NoteApplied(int32_t worker_id, int64_t step) {
  if (Tracked(worker_id)) {
    absl::MutexLock lock(&mu_);
    int64_t& pushed = pushed_[worker_id];
    pushed = std::max(pushed, step);
  }
  if (opt_.consistency == BOUNDED) ReleaseReady();
}

void ConsistencyTracker::MarkDone(int32_t worker_id) {
  if (Tracked(worker_id)) {
    absl::MutexLock lock(&mu_);
    done_[worker_id] = true;
  }
  // Steps and pulls that waited for this worker may go on without it.
  if (opt_.consistency == SYNC) {
    AdvanceSync();
  } else if (opt_.consistency == BOUNDED) {
    ReleaseReady();
  }
}

absl::Status ConsistencyTracker::KeepSyncPush(int32_t w, int64_t t, absl::Span<const int64_t> ids,
                                              absl::Span<const float> grads,
                                              absl::Span<const float> dense_grad,
                                              bool* duplicate) {
  absl::MutexLock lock(&mu_);
  if (done_[w]) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", opt_.shard, ": worker ", w,
                                                      " pushed step ", t, " after it finished"));
  }
  if (t <= pushed_[w]) {  // a repeat (sequence 0 opts out of the sequence check)
    *duplicate = true;
    return absl::OkStatus();
  }
  if (t <= applied_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", opt_.shard, ": worker ", w, " pushed step ", t, ", but SYNC step ", applied_,
        " is already applied (a restarted worker cannot rejoin a SYNC job)"));
  }
  SyncPush& p = sync_steps_[t][w];
  p.ids.assign(ids.begin(), ids.end());
  p.row_grads.assign(grads.begin(), grads.end());
  p.dense_grad.assign(dense_grad.begin(), dense_grad.end());
  pushed_[w] = t;
  return absl::OkStatus();
}

void ConsistencyTracker::AdvanceSync() {
  while (true) {
    std::map<int, SyncPush> pushes;
    int64_t t;
    {
      absl::MutexLock lock(&mu_);
      // One thread applies at a time, in step order; it loops and sees the others' pushes.
      if (applying_) return;
      t = applied_ + 1;
      const int64_t slowest = MinActivePushedLocked();
      if (sync_steps_.empty() || slowest < t) break;
      auto it = sync_steps_.begin();  // the oldest step with kept pushes
      if (it->first < t) {  // cannot happen (KeepSyncPush refuses applied steps); never loop on it
        sync_steps_.erase(it);
        continue;
      }
      if (it->first > t) {
        // No push kept for steps t .. it->first - 1: there is nothing to apply, so jump over
        // them at once, never one step per turn (a step far ahead must not make this spin).
        applied_ = std::min(slowest, it->first - 1);
        continue;
      }
      pushes = std::move(it->second);
      sync_steps_.erase(it);
      applying_ = true;
    }
    if (!pushes.empty()) ApplyMean(t, pushes);
    absl::MutexLock lock(&mu_);
    applied_ = t;
    applying_ = false;
  }
  ReleaseReady();
}

void ConsistencyTracker::ApplyMean(int64_t step, const std::map<int, SyncPush>& pushes) {
  // Sum in worker order (deterministic whatever the arrival order), then scale once.
  // Summed at the stride; each push's rows come at their tables' widths (Shard::RowFloats).
  const int dim = shard_->row_dim();
  absl::flat_hash_map<int64_t, int64_t> slot;
  std::vector<int64_t> ids;
  std::vector<float> sum, dense;
  for (const auto& [w, p] : pushes) {
    const float* in = p.row_grads.data();
    for (size_t i = 0; i < p.ids.size(); ++i) {
      auto [it, fresh] = slot.emplace(p.ids[i], static_cast<int64_t>(ids.size()));
      if (fresh) {
        ids.push_back(p.ids[i]);
        sum.resize(sum.size() + dim, 0.f);
      }
      float* out = sum.data() + it->second * dim;
      const int width = shard_->RowWidthOf(p.ids[i]);
      for (int d = 0; d < width; ++d) out[d] += in[d];
      in += width;
    }
    if (!p.dense_grad.empty()) {
      if (dense.empty()) dense.assign(p.dense_grad.size(), 0.f);
      for (size_t i = 0; i < dense.size(); ++i) dense[i] += p.dense_grad[i];
    }
  }
  const float scale = 1.0f / static_cast<float>(pushes.size());
  // Ascending ids: each partition's rows form one run.
  std::vector<int64_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> sorted(ids.size());
  std::vector<float> grads;
  grads.reserve(sum.size());
  for (size_t j = 0; j < order.size(); ++j) {
    sorted[j] = ids[order[j]];
    const int width = shard_->RowWidthOf(sorted[j]);
    for (int d = 0; d < width; ++d) grads.push_back(sum[order[j] * dim + d] * scale);
  }
  for (float& g : dense) g *= scale;
  // Every id was routed when its push came.
  const absl::Status status =
      shard_->Apply(sorted, grads.data(), dense.empty() ? nullptr : dense.data(), step);
  PSTRAIN_CHECK(status.ok()) << "shard " << opt_.shard << ": SYNC step " << step << ": " << status;
}

int64_t ConsistencyTracker::applied_step() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

int64_t ConsistencyTracker::step() const {
  absl::MutexLock lock(&mu_);
  if (opt_.consistency == SYNC) return applied_;
  int64_t step = 0;
  for (int64_t p : pushed_) step = std::max(step, p);
  return step;
}

ConsistencyState ConsistencyTracker::Save() const {
  absl::MutexLock lock(&mu_);
  ConsistencyState c;
  c.set_applied(applied_);
  for (int64_t p : pushed_) c.add_pushed(p);
  for (bool d : done_) c.add_done(d);
  for (const auto& [step, pushes] : sync_steps_) {
    for (const auto& [w, p] : pushes) {
      ConsistencyState::Pending* out = c.add_pending();
      out->set_step(step);
      out->set_worker(w);
      PackArray(p.ids.data(), p.ids.size(), out->mutable_ids());
      PackArray(p.row_grads.data(), p.row_grads.size(), out->mutable_row_grads());
      PackArray(p.dense_grad.data(), p.dense_grad.size(), out->mutable_dense_grad());
    }
  }
  return c;
}

absl::Status ConsistencyTracker::Restore(const ConsistencyState& c) {
  if (c.pushed_size() != opt_.num_workers || c.done_size() != opt_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": consistency state of ", c.pushed_size(),
                     " workers, this job has ", opt_.num_workers));
  }
  std::map<int64_t, std::map<int, SyncPush>> steps;
  for (const ConsistencyState::Pending& p : c.pending()) {
    // A kept push is applied later without another check: it gets a push's checks now (a
    // damaged or forged state must be refused here, not abort the shard when its step comes).
    if (p.worker() < 0 || p.worker() >= opt_.num_workers || p.step() <= c.applied()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": consistency state keeps a push of worker ", p.worker(),
          " for step ", p.step(), "; expected a worker in [0, ", opt_.num_workers,
          ") and a step after the applied ", c.applied()));
    }
    SyncPush& out = steps[p.step()][p.worker()];
    absl::Span<const int64_t> ids;
    absl::Span<const float> grads, dense;
    std::vector<int64_t> id_scratch;
    std::vector<float> grad_scratch, dense_scratch;
    std::vector<Shard::Run> runs;
    RETURN_IF_ERROR(UnpackArray(p.ids(), "ConsistencyState.ids", &id_scratch, &ids));
    RETURN_IF_ERROR(UnpackArray(p.row_grads(), "ConsistencyState.row_grads", &grad_scratch, &grads));
    RETURN_IF_ERROR(
        UnpackArray(p.dense_grad(), "ConsistencyState.dense_grad", &dense_scratch, &dense));
    RETURN_IF_ERROR(shard_->Check(ids, grads, dense, &runs));
    out.ids.assign(ids.begin(), ids.end());
    out.row_grads.assign(grads.begin(), grads.end());
    out.dense_grad.assign(dense.begin(), dense.end());
  }
  absl::MutexLock lock(&mu_);
  applied_ = c.applied();
  pushed_.assign(c.pushed().begin(), c.pushed().end());
  done_.assign(c.done().begin(), c.done().end());
  // A state in which every worker had finished is a job's end (its last checkpoint): a job that
  // restores it trains a new pass (continuous training) or nothing, so every worker is active
  // again. A state with some workers still training is a stop mid-pass: the finished ones stay
  // finished (their data is done; nobody waits for them).
  if (std::all_of(done_.begin(), done_.end(), [](bool d) { return d; })) {
    done_.assign(done_.size(), false);
  }
  sync_steps_ = std::move(steps);
  return absl::OkStatus();
}

void ConsistencyTracker::ResumeSteps(int64_t step) {
  absl::MutexLock lock(&mu_);
  applied_ = step;
  for (int64_t& p : pushed_) p = step;
}

int64_t ConsistencyTracker::MinActivePushedLocked() const {
  int64_t m = INT64_MAX;
  for (int w = 0; w < opt_.num_workers; ++w) {
    if (!done_[w]) m = std::min(m, pushed_[w]);
  }
  return m;
}

bool ConsistencyTracker::PullReadyLocked(int64_t step) const {
  if (step <= 0 || opt_.consistency == ASYNC) return true;
  const int64_t slowest = MinActivePushedLocked();
  if (opt_.consistency == BOUNDED) return slowest >= step - 1 - opt_.staleness;
  // SYNC; once every worker has finished no step will be applied any more.
  return applied_ >= step - 1 || slowest == INT64_MAX;
}

int64_t ConsistencyTracker::StalenessLocked(int64_t step) const {
  const int64_t slowest = MinActivePushedLocked();
  if (step <= 0 || slowest == INT64_MAX) return 0;
  return std::max<int64_t>(0, step - 1 - slowest);
}

std::string ConsistencyTracker::WaitingForLocked(int64_t step) const {
  // The active workers that have not pushed step `need` yet, with the step each is at.
  auto behind = [&](int64_t need) {
    std::string out;
    for (int w = 0; w < opt_.num_workers; ++w) {
      if (done_[w] || pushed_[w] >= need) continue;
      absl::StrAppend(&out, out.empty() ? "" : ", ", w, " (at step ", pushed_[w], ")");
    }
    return out;
  };
  if (opt_.consistency == BOUNDED) {
    const int64_t need = step - 1 - opt_.staleness;
    return absl::StrCat("BOUNDED (staleness ", opt_.staleness, "): waits for every worker to push ",
                        "step ", need, "; workers not there yet: ", behind(need));
  }
  return absl::StrCat("SYNC: waits for step ", step - 1, " to be applied (applied: ", applied_,
                      "); workers that have not pushed step ", applied_ + 1, ": ",
                      behind(applied_ + 1));
}

void ConsistencyTracker::HoldOrAnswer(HeldPull* pull, absl::Time deadline) {
  const int64_t step = pull->step();
  int64_t staleness = 0;
  uint64_t id = 0;
  bool refuse = false;
  absl::Status refusal;
  {
    absl::MutexLock lock(&mu_);
    if (PullReadyLocked(step)) {
      staleness = StalenessLocked(step);
    } else if (absl::Status can = held_.CanHold(); !can.ok()) {
      refuse = true;
      refusal = std::move(can);
    } else if (!lost_.empty()) {
      refuse = true;
      refusal = absl::FailedPreconditionError(
          absl::StrCat("shard ", opt_.shard, ": worker ", pull->worker_id(), "'s pull of step ",
                       step, " cannot be answered: ", lost_));
    } else {
      id = held_.Hold(pull);
    }
  }
  // Pulls are finished outside mu_: a reactor's OnCancel takes it.
  if (refuse) return pull->Fail(std::move(refusal));
  if (id == 0) return pull->Answer(staleness);
  // Answer a little before the client's deadline, so that its error says what was missing; a
  // call without a deadline (or a far one) is held kMaxHold at most.
  const absl::Time now = opt_.env->Now();
  const absl::Duration left = std::min(deadline - now, kMaxHold);
  held_.Arm(id, now + left - std::min(left / 10, absl::Milliseconds(500)));
}

void ConsistencyTracker::Cancel(HeldPull* pull) {
  held_.Cancel(pull, absl::CancelledError("pull cancelled"));
}

void ConsistencyTracker::StopHolding() { held_.Stop(); }

int ConsistencyTracker::held_pulls() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

void ConsistencyTracker::ReleaseReady() {
  std::vector<std::pair<HeldPull*, int64_t>> ready;
  {
    absl::MutexLock lock(&mu_);
    held_.TakeIf([&](HeldPull* pull) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const int64_t step = pull->step();
      if (!PullReadyLocked(step)) return false;
      ready.emplace_back(pull, StalenessLocked(step));
      return true;
    });
  }
  for (auto& [pull, staleness] : ready) pull->Answer(staleness);
}

}  // namespace pstrain
