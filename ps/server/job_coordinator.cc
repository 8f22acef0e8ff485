#include "ps/server/job_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {

JobCoordinator::JobCoordinator(int shard, Timer* timer) : shard_(shard), timer_(timer) {}

void JobCoordinator::ChangedLocked(std::vector<Watch*>* wake) {
  ++version_;
  for (auto& [id, w] : held_) {
    w->hold_id_ = 0;
    wake->push_back(w);
  }
  held_.clear();
}

void JobCoordinator::WakeAll(const std::vector<Watch*>& wake) {
  for (Watch* w : wake) w->Wake(absl::OkStatus());
}

// ---- Rounds (moved from ShardServer, ps/server/shard_checkpoint.cc) ----

int64_t JobCoordinator::RequestCheckpoint(bool stop, int64_t target_step) {
  std::vector<Watch*> wake;
  int64_t round;
  {
    absl::MutexLock lock(&mu_);
    const bool was_stop = stop_;
    bool opened = false;
    if (round_ <= released_) {  // no round open for arrivals: open the next one
      ++round_;
      arrivals_.clear();
      stop_ = false;
      target_ = target_step;
      opened = true;
    }
    stop_ = stop_ || stop;
    if (opened || stop_ != was_stop) ChangedLocked(&wake);
    round = round_;
  }
  WakeAll(wake);
  return round;
}

absl::Status JobCoordinator::ArriveCheckpoint(int64_t round, int worker, std::string state) {
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
  out->set_job_version(version_);
  return absl::OkStatus();
}

void JobCoordinator::ReleaseCheckpoint(int64_t round) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (round <= released_) return;
    released_ = round;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
}

void JobCoordinator::CompleteCheckpoint(int64_t round, const std::string& dir,
                                        const std::string& error) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    released_ = std::max(released_, round);
    done_ = std::max(done_, round);
    done_dir_ = error.empty() ? dir : "";
    error_ = error;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
}

// ---- Reports and the end of the job ----

void JobCoordinator::Report(const ReportRequest& report) {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    reports_[report.phase()][report.worker_id()] = report;
    ChangedLocked(&wake);
  }
  WakeAll(wake);
}

std::vector<ReportRequest> JobCoordinator::Reports(JobPhase phase) const {
  absl::MutexLock lock(&mu_);
  std::vector<ReportRequest> out;
  if (auto it = reports_.find(phase); it != reports_.end()) {
    for (const auto& [w, r] : it->second) out.push_back(r);
  }
  return out;
}

void JobCoordinator::FinishJob() {
  std::vector<Watch*> wake;
  {
    absl::MutexLock lock(&mu_);
    if (job_finished_) return;
    job_finished_ = true;
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
  switch (request.kind()) {
    case CoordinateRequest::REQUEST:
      response->set_round(RequestCheckpoint(request.stop(), request.target_step()));
      break;
    case CoordinateRequest::ARRIVE:
      status = ArriveCheckpoint(request.round(), request.worker_id(), request.worker_state());
      break;
    case CoordinateRequest::COLLECT:  // sets the version of what it read
      return CollectArrivals(request.round(), request.num_workers(), response);
    case CoordinateRequest::RELEASE:
      ReleaseCheckpoint(request.round());
      break;
    case CoordinateRequest::COMPLETE:
      CompleteCheckpoint(request.round(), request.dir(), request.error());
      break;
    case CoordinateRequest::REPORTS: {
      absl::MutexLock lock(&mu_);  // the reports and the version of one instant
      if (auto it = reports_.find(request.phase()); it != reports_.end()) {
        for (const auto& [w, r] : it->second) *response->add_reports() = r;
      }
      response->set_job_version(version_);
      return absl::OkStatus();
    }
    case CoordinateRequest::FINISH_JOB:
      FinishJob();
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
  s.set_checkpoint_target_step(target_);
  s.set_checkpoint_released_round(released_);
  s.set_checkpoint_done_round(done_);
  s.set_checkpoint_done_dir(done_dir_);
  s.set_checkpoint_error(error_);
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
  info->set_checkpoint_target_step(target_);
  info->set_checkpoint_released_round(released_);
  info->set_checkpoint_done_round(done_);
  info->set_checkpoint_done_dir(done_dir_);
  info->set_checkpoint_error(error_);
  info->set_restored_from(restored_from_);
  info->set_job_version(version_);
}

// ---- Long-polls ----

void JobCoordinator::Hold(Watch* watch, int64_t version, absl::Time until) {
  absl::Status now_status;  // how to wake it at once, if it is not held
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (holding_stopped_) {
      now_status = absl::UnavailableError(absl::StrCat("shard ", shard_, " is shutting down"));
    } else if (version != version_ || until <= absl::Now()) {
      // Changed already, or no time to hold: answer now.
    } else if (static_cast<int>(held_.size()) >= kMaxHeld) {
      now_status = absl::UnavailableError(
          absl::StrCat("shard ", shard_, " holds ", kMaxHeld, " calls already; retry later"));
    } else {
      id = watch->hold_id_ = ++next_hold_id_;
      held_[id] = watch;
    }
  }
  if (id == 0) return watch->Wake(std::move(now_status));
  timer_->At(until, [this, id] { Drop(id, absl::OkStatus()); });
}

void JobCoordinator::Cancel(Watch* watch) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = watch->hold_id_;
  }
  if (id != 0) Drop(id, absl::CancelledError("watch cancelled"));
}

void JobCoordinator::Drop(uint64_t id, absl::Status status) {
  Watch* watch = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;  // woken, cancelled or expired already
    watch = it->second;
    watch->hold_id_ = 0;
    held_.erase(it);
  }
  watch->Wake(std::move(status));
}

void JobCoordinator::StopHolding() {
  std::vector<Watch*> held;
  {
    absl::MutexLock lock(&mu_);
    holding_stopped_ = true;
    for (auto& [id, w] : held_) {
      w->hold_id_ = 0;
      held.push_back(w);
    }
    held_.clear();
  }
  for (Watch* w : held) {
    w->Wake(absl::UnavailableError(absl::StrCat("shard ", shard_, " is shutting down")));
  }
}

int JobCoordinator::held_watches() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(held_.size());
}

}  // namespace pstrain
