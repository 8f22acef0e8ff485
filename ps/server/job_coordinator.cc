#include "ps/server/job_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {

JobCoordinator::JobCoordinator(int shard, int num_workers, absl::Duration lease, Timer* timer,
                               Env* env)
    : shard_(shard),
      num_workers_(std::max(1, num_workers)),
      lease_(lease),
      timer_(timer),
      env_(env),
      heard_ns_(new std::atomic<int64_t>[num_workers_]),
      armed_(new std::atomic<bool>[num_workers_]),
      lost_flag_(new std::atomic<bool>[num_workers_]),
      held_({absl::StrCat("shard ", shard), "calls", kMaxHeld}, &mu_, timer, env,
            [](Watch* watch, absl::Status status) { watch->Wake(std::move(status)); },
            // A hold that expires is answered with the state as it is.
            [](Watch*, absl::Duration) { return absl::OkStatus(); }) {
  for (int w = 0; w < num_workers_; ++w) {
    heard_ns_[w] = 0;
    armed_[w] = false;
    lost_flag_[w] = false;
  }
}

absl::Status JobCoordinator::CheckWorker(int worker, const char* what) const {
  if (worker >= 0 && worker < num_workers_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shard ", shard_, ": ", what, " names worker ", worker, ", but this job has ",
                   "workers [0, ", num_workers_, ") (`pstrain ps --num_workers`)"));
}

// ---- Leases ----

void JobCoordinator::Heard(int worker) {
  if (worker < 0 || worker >= num_workers_) return;
  heard_ns_[worker].store(absl::ToUnixNanos(env_->Now()), std::memory_order_relaxed);
  if (lost_flag_[worker].load(std::memory_order_relaxed)) {
    std::vector<Watch*> wake;
    std::string detail;
    bool changed = false;
    {
      absl::MutexLock lock(&mu_);
      if (lost_.erase(worker) > 0) {
        lost_flag_[worker] = false;
        PSTRAIN_LOG(WARNING) << "shard " << shard_ << ": worker " << worker
                             << " is back after its lease expired";
        detail = LostDetailLocked();
        ChangedLocked(&wake);
        changed = true;
      }
    }
    WakeAll(wake);
    if (changed) NotifyLost(detail);
  }
  if (!armed_[worker].exchange(true)) {
    timer_->At(env_->Now() + lease_, [this, worker] { CheckLease(worker); });
  }
  // The job has started: a worker that has not called kConnectGrace + lease from now (it could
  // not start, or was refused) is lost too.
  if (!started_.exchange(true)) {
    started_at_ = env_->Now();
    timer_->At(started_at_ + kConnectGrace + lease_, [this] { CheckNeverCalled(); });
  }
}

void JobCoordinator::CheckNeverCalled() {
  std::vector<Watch*> wake;
  std::string detail;
  {
    absl::MutexLock lock(&mu_);
    if (held_.stopped() || job_finished_) return;
    const auto done_it = reports_.find(TRAINING_DONE);
    for (int w = 0; w < num_workers_; ++w) {
      if (heard_ns_[w].load() != 0 || lost_.count(w) > 0) continue;
      if (done_it != reports_.end() && done_it->second.count(w) > 0) continue;
      lost_[w] = started_at_;
      lost_flag_[w] = true;
    }
    detail = LostDetailLocked();
    if (detail.empty()) return;
    PSTRAIN_LOG(WARNING) << "shard " << shard_ << ": " << detail;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
  NotifyLost(detail);
}

void JobCoordinator::CheckLease(int worker) {
  std::vector<Watch*> wake;
  std::string detail;
  absl::Time rearm = absl::InfinitePast();
  {
    absl::MutexLock lock(&mu_);
    if (held_.stopped()) {  // shutting down: the timer runs what is pending at once
      armed_[worker] = false;
      return;
    }
    const absl::Time heard = absl::FromUnixNanos(heard_ns_[worker].load());
    const auto done_it = reports_.find(TRAINING_DONE);
    const bool finished = job_finished_ || (done_it != reports_.end() &&
                                            done_it->second.count(worker) > 0);
    if (finished) {
      armed_[worker] = false;  // a finished worker holds no lease
    } else if (env_->Now() - heard >= lease_) {
      armed_[worker] = false;  // Heard re-arms it
      lost_[worker] = heard;
      lost_flag_[worker] = true;
      detail = LostDetailLocked();
      PSTRAIN_LOG(WARNING) << "shard " << shard_ << ": " << detail;
      ChangedLocked(&wake);
    } else {
      rearm = heard + lease_;
    }
  }
  if (rearm != absl::InfinitePast()) {
    timer_->At(rearm, [this, worker] { CheckLease(worker); });
    return;
  }
  WakeAll(wake);
  if (!detail.empty()) NotifyLost(detail);
}

std::string JobCoordinator::LostDetailLocked() const {
  if (lost_.empty()) return "";
  std::string out;
  const absl::Time now = env_->Now();
  for (const auto& [w, heard] : lost_) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "worker ", w,
                    absl::StrFormat(" lost: no call for %.1f s (lease %.1f s)",
                                    absl::ToDoubleSeconds(now - heard),
                                    absl::ToDoubleSeconds(lease_)));
  }
  return out;
}

void JobCoordinator::NotifyLost(const std::string& detail) {
  if (on_lost_) on_lost_(detail);
}

std::vector<int> JobCoordinator::lost_workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  for (const auto& [w, heard] : lost_) out.push_back(w);
  return out;
}

void JobCoordinator::FillLostLocked(CoordinateResponse* out) const {
  for (const auto& [w, heard] : lost_) out->add_lost(w);
  out->set_lost_detail(LostDetailLocked());
}

void JobCoordinator::ChangedLocked(std::vector<Watch*>* wake) {
  ++version_;
  for (Watch* w : held_.TakeAll()) wake->push_back(w);
}

void JobCoordinator::WakeAll(const std::vector<Watch*>& wake) {
  for (Watch* w : wake) w->Wake(absl::OkStatus());
}

// ---- Rounds (moved from ShardServer, ps/server/shard_checkpoint.cc) ----

int64_t JobCoordinator::RequestCheckpoint(bool stop, int64_t target_step, bool end_pass) {
  std::vector<Watch*> wake;
  int64_t round;
  {
    absl::MutexLock lock(&mu_);
    const bool was_stop = stop_, was_end_pass = end_pass_;
    bool opened = false;
    if (round_ <= released_) {  // no round open for arrivals: open the next one
      ++round_;
      arrivals_.clear();
      stop_ = false;
      end_pass_ = false;
      target_ = target_step;
      opened = true;
    }
    stop_ = stop_ || stop;
    end_pass_ = end_pass_ || (stop && end_pass);
    if (opened || stop_ != was_stop || end_pass_ != was_end_pass) ChangedLocked(&wake);
    round = round_;
  }
  WakeAll(wake);
  return round;
}

absl::Status JobCoordinator::ArriveCheckpoint(int64_t round, int worker, std::string state) {
  RETURN_IF_ERROR(CheckWorker(worker, "ARRIVE"));
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (round != round_ || round <= released_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker, " arrived in checkpoint round ", round,
                       ", but the open round is ", round_, " (released up to ", released_, ")"));
    }
    arrivals_[worker] = std::move(state);
    ChangedLocked(&wake);
  }
  WakeAll(wake);
  return absl::OkStatus();
}

absl::Status JobCoordinator::CollectArrivals(int64_t round, int n, CoordinateResponse* out) const {
  if (n < 1 || n > num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard_, ": COLLECT of ", n,
                                                   " workers, but this job has ", num_workers_));
  }
  absl::MutexLock lock(&mu_);
  if (round != round_ || round <= released_) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint round ", round,
                                                      " is not open (open: ", round_,
                                                      ", released up to ", released_, ")"));
  }
  const auto done_it = reports_.find(TRAINING_DONE);
  for (int w = 0; w < n; ++w) {
    if (auto it = arrivals_.find(w); it != arrivals_.end()) {
      (*out->mutable_worker_states())[w] = it->second;
      continue;
    }
    // A worker that finished training takes part with its final state (its pushes are flushed).
    if (done_it != reports_.end()) {
      if (auto it = done_it->second.find(w);
          it != done_it->second.end() && !it->second.worker_state().empty()) {
        (*out->mutable_worker_states())[w] = it->second.worker_state();
        continue;
      }
    }
    out->add_missing(w);
  }
  FillLostLocked(out);
  out->set_job_version(version_);
  return absl::OkStatus();
}

absl::Status JobCoordinator::ReleaseCheckpoint(int64_t round) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (round <= released_) return absl::OkStatus();  // a retry
    if (round != round_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard_, ": RELEASE of checkpoint round ", round, ", but the open round is ",
          round_));
    }
    released_ = round;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
  return absl::OkStatus();
}

absl::Status JobCoordinator::CompleteCheckpoint(int64_t round, const std::string& dir,
                                                const std::string& error) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (round < 1 || round > round_) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard_, ": COMPLETE of checkpoint round ", round,
                       ", but the rounds opened so far are 1..", round_));
    }
    if (round <= done_) return absl::OkStatus();  // a retry, or a round completed already
    released_ = std::max(released_, round);
    done_ = std::max(done_, round);
    done_dir_ = error.empty() ? dir : "";
    error_ = error;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
  return absl::OkStatus();
}

// ---- Reports and the end of the job ----

absl::Status JobCoordinator::Report(const ReportRequest& report) {
  RETURN_IF_ERROR(CheckWorker(report.worker_id(), "Report"));
  if (report.phase() != TRAINING_DONE && report.phase() != FINISH_SEEN) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard_, ": Report of phase ",
                                                   static_cast<int>(report.phase()),
                                                   "; expected TRAINING_DONE or FINISH_SEEN"));
  }
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    reports_[report.phase()][report.worker_id()] = report;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
  return absl::OkStatus();
}

std::vector<ReportRequest> JobCoordinator::Reports(JobPhase phase) const {
  absl::MutexLock lock(&mu_);
  std::vector<ReportRequest> out;
  if (auto it = reports_.find(phase); it != reports_.end()) {
    for (const auto& [w, r] : it->second) out.push_back(r);
  }
  return out;
}

void JobCoordinator::FinishJob(const std::string& error) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (job_finished_) return;
    job_finished_ = true;
    job_error_ = error;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
}

void JobCoordinator::SetRestoredFrom(const std::string& dir) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    restored_from_ = dir;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
}

absl::Status JobCoordinator::Coordinate(const CoordinateRequest& request,
                                        CoordinateResponse* response) {
  absl::Status status;
  if (request.kind() != CoordinateRequest::COLLECT && request.kind() != CoordinateRequest::REPORTS) {
    RETURN_IF_ERROR(CheckWorker(request.worker_id(), "Coordinate"));
  }
  if (request.target_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_, ": target_step ", request.target_step(), " < 0"));
  }
  switch (request.kind()) {
    case CoordinateRequest::REQUEST:
      response->set_round(
          RequestCheckpoint(request.stop(), request.target_step(), request.end_pass()));
      break;
    case CoordinateRequest::ARRIVE:
      status = ArriveCheckpoint(request.round(), request.worker_id(), request.worker_state());
      break;
    case CoordinateRequest::COLLECT:  // sets the version of what it read
      return CollectArrivals(request.round(), request.num_workers(), response);
    case CoordinateRequest::RELEASE:
      status = ReleaseCheckpoint(request.round());
      break;
    case CoordinateRequest::COMPLETE:
      status = CompleteCheckpoint(request.round(), request.dir(), request.error());
      break;
    case CoordinateRequest::REPORTS: {
      absl::MutexLock lock(&mu_);  // the reports and the version of one instant
      if (auto it = reports_.find(request.phase()); it != reports_.end()) {
        for (const auto& [w, r] : it->second) *response->add_reports() = r;
      }
      FillLostLocked(response);
      response->set_job_version(version_);
      return absl::OkStatus();
    }
    case CoordinateRequest::FINISH_JOB:
      if (request.worker_id() != 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            "shard ", shard_, ": FINISH_JOB from worker ", request.worker_id(),
            "; only the chief (worker 0) ends the job"));
      }
      FinishJob(request.error());
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Coordinate: unknown kind ", static_cast<int>(request.kind())));
  }
  response->set_job_version(version());
  return status;
}

// ---- State ----

JobState JobCoordinator::State() const {
  absl::MutexLock lock(&mu_);
  JobState s;
  s.set_version(version_);
  s.set_job_finished(job_finished_);
  s.set_checkpoint_round(round_);
  s.set_checkpoint_stop(stop_);
  s.set_checkpoint_end_pass(end_pass_);
  s.set_checkpoint_target_step(target_);
  s.set_checkpoint_released_round(released_);
  s.set_checkpoint_done_round(done_);
  s.set_checkpoint_done_dir(done_dir_);
  s.set_checkpoint_error(error_);
  for (const auto& [w, heard] : lost_) s.add_lost_workers(w);
  s.set_lost_detail(LostDetailLocked());
  s.set_job_error(job_error_);
  return s;
}

int64_t JobCoordinator::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

void JobCoordinator::FillInfo(InfoResponse* info) const {
  absl::MutexLock lock(&mu_);
  info->set_job_finished(job_finished_);
  info->set_checkpoint_round(round_);
  info->set_checkpoint_stop(stop_);
  info->set_checkpoint_end_pass(end_pass_);
  info->set_checkpoint_target_step(target_);
  info->set_checkpoint_released_round(released_);
  info->set_checkpoint_done_round(done_);
  info->set_checkpoint_done_dir(done_dir_);
  info->set_checkpoint_error(error_);
  info->set_restored_from(restored_from_);
  info->set_job_version(version_);
  for (const auto& [w, heard] : lost_) info->add_lost_workers(w);
  info->set_lost_detail(LostDetailLocked());
  info->set_job_error(job_error_);
}

// ---- Long-polls ----

void JobCoordinator::Hold(Watch* watch, int64_t version, absl::Time until) {
  absl::Status now_status;  // how to wake it at once, if it is not held
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (held_.stopped()) {
      now_status = held_.CanHold();  // shutting down
    } else if (version != version_ || until <= env_->Now()) {
      // Changed already, or no time to hold: answer now.
    } else if (now_status = held_.CanHold(); now_status.ok()) {
      id = held_.Hold(watch);
    }
  }
  if (id == 0) return watch->Wake(std::move(now_status));
  held_.Arm(id, until);
}

void JobCoordinator::Cancel(Watch* watch) {
  held_.Cancel(watch, absl::CancelledError("watch cancelled"));
}

void JobCoordinator::StopHolding() { held_.Stop(); }

int JobCoordinator::held_watches() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

}  // namespace pstrain
