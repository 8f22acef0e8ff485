#include "worker/ps_client/ps_checkpoint.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {

PsCheckpointer::PsCheckpointer(Options options) : opt_(std::move(options)) {
  for (const std::string& a : opt_.shards) shards_.push_back(std::make_unique<ShardRpc>(a));
  // BOUNDED / SYNC ask shard 0 before every step instead (Requested): no poll needed.
  if (!lockstep()) poller_ = std::thread([this] { Poll(); });
}

PsCheckpointer::~PsCheckpointer() {
  if (poller_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(poll_mu_);
      poll_quit_ = true;
    }
    poll_cv_.notify_all();
    poller_.join();
  }
}

// A missed poll only delays a worker's joining the round by one period (the chief waits for
// it), so errors are not fatal here.
void PsCheckpointer::Poll() {
  std::unique_lock<std::mutex> lock(poll_mu_);
  while (!poll_quit_) {
    lock.unlock();
    if (auto info = shards_[0]->Info(absl::Seconds(2)); info.ok()) {
      open_round_ = info->checkpoint_round() > info->checkpoint_released_round()
                        ? info->checkpoint_round()
                        : 0;
    }
    lock.lock();
    poll_cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return poll_quit_; });
  }
}

absl::StatusOr<std::optional<std::string>> PsCheckpointer::Restore(WorkerState* state) {
  if (!opt_.restored) return std::optional<std::string>();
  const CheckpointChoice& c = *opt_.restored;
  if (c.manifest.num_workers() == opt_.num_workers) {
    RETURN_IF_ERROR(ReadWorkerState(c.dir, opt_.worker, state));
    opt_.client->ResumeAtStep(state->step());
  } else {
    // Go on counting steps where the shards are (BOUNDED / SYNC wait on step numbers).
    ASSIGN_OR_RETURN(InfoResponse info, shards_[0]->Info(opt_.timeout));
    state->set_step(info.step());
    opt_.client->ResumeAtStep(info.step());
    PSTRAIN_LOG(WARNING) << c.dir << " was written by " << c.manifest.num_workers()
                         << " workers and this job has " << opt_.num_workers
                         << ": the parameters are restored (re-partitioned onto "
                         << opt_.shards.size()
                         << " shards), but the data positions cannot be mapped onto another "
                            "number of readers, so the data starts from the beginning";
    step_base_ = c.manifest.step() - opt_.num_workers * info.step();
  }
  return std::optional<std::string>(c.dir);
}

bool PsCheckpointer::lockstep() const { return opt_.consistency != ASYNC; }

int64_t PsCheckpointer::TargetAfter(int64_t step) const {
  // Every worker must still be able to reach the target without anyone paused, and must make
  // its check for the target (before training the target step, so that it does not read ahead)
  // only after the request (docs/CHECKPOINT.md "BOUNDED and SYNC").
  return step + 3 + (opt_.consistency == BOUNDED ? opt_.staleness : 0);
}

absl::StatusOr<InfoResponse> PsCheckpointer::OpenRound() {
  ASSIGN_OR_RETURN(InfoResponse info, shards_[0]->Info(opt_.timeout));
  if (info.checkpoint_round() <= info.checkpoint_released_round() ||
      info.checkpoint_round() <= handled_round_) {
    info.set_checkpoint_round(0);  // none open for this worker
  }
  return info;
}

absl::StatusOr<int64_t> PsCheckpointer::Request(bool stop, int64_t target) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::REQUEST);
  req.set_worker_id(opt_.worker);
  req.set_stop(stop);
  req.set_target_step(target);
  ASSIGN_OR_RETURN(CoordinateResponse r, shards_[0]->Coordinate(req, opt_.timeout));
  return r.round();
}

bool PsCheckpointer::Requested(int64_t step) {
  if (!lockstep()) return open_round_.load() > handled_round_;
  // A synchronous check every step: a worker that learnt of the round late could run past the
  // common step and wait forever on the paused ones.
  absl::StatusOr<InfoResponse> info = OpenRound();
  if (!info.ok()) {
    PSTRAIN_LOG(WARNING) << "checking for a checkpoint round: " << info.status();
    return false;
  }
  return info->checkpoint_round() > 0 && step >= info->checkpoint_target_step();
}

absl::StatusOr<int64_t> PsCheckpointer::StopStep(int64_t step) {
  if (!lockstep() || stopped_) return step;
  ASSIGN_OR_RETURN(InfoResponse info, OpenRound());
  if (info.checkpoint_round() > 0) {
    if (!info.checkpoint_stop()) RETURN_IF_ERROR(Request(true, 0).status());  // mark it stopping
    return std::max(step, info.checkpoint_target_step());
  }
  const int64_t target = TargetAfter(step);
  RETURN_IF_ERROR(Request(true, target).status());
  ASSIGN_OR_RETURN(info, OpenRound());  // another worker's round may have won
  return std::max(step, info.checkpoint_round() > 0 ? info.checkpoint_target_step() : target);
}

absl::StatusOr<std::string> PsCheckpointer::Save(const WorkerState& state, bool final) {
  if (final) {
    final_state_ = state.SerializeAsString();
    return std::string();
  }
  // The trainer saves again when it stops after a round that asked it to stop: nothing changed.
  if (stopped_) return last_saved_dir_;
  const bool stop = opt_.stop != nullptr && opt_.stop->load();
  if (lockstep()) {
    // Arrive only at the round's common step; the schedule's call asks for a round at a later
    // step, which Requested() then reports.
    ASSIGN_OR_RETURN(InfoResponse info, OpenRound());
    if (info.checkpoint_round() == 0) {
      RETURN_IF_ERROR(Request(stop, TargetAfter(state.step())).status());
      return std::string();
    }
    if (state.step() < info.checkpoint_target_step()) return std::string();
  }
  ASSIGN_OR_RETURN(const int64_t round, Request(stop, 0));
  handled_round_ = round;
  RETURN_IF_ERROR(Annotate(opt_.client->Flush(), "flushing the pushes before a checkpoint"));
  CoordinateRequest req;
  req.set_worker_id(opt_.worker);
  req.set_kind(CoordinateRequest::ARRIVE);
  req.set_round(round);
  req.set_worker_state(state.SerializeAsString());
  RETURN_IF_ERROR(shards_[0]->Coordinate(req, opt_.timeout).status());

  std::string dir;
  bool stop_job = false;
  if (chief()) {
    ASSIGN_OR_RETURN(dir, RunRound(round));
    ASSIGN_OR_RETURN(InfoResponse info, shards_[0]->Info(opt_.timeout));
    stop_job = info.checkpoint_stop() && info.checkpoint_round() == round;
  } else {
    ASSIGN_OR_RETURN(
        InfoResponse info,
        shards_[0]->PollInfo(
            [round](const InfoResponse& i) { return i.checkpoint_released_round() >= round; },
            opt_.timeout, absl::StrCat("the release of checkpoint round ", round)));
    stop_job = info.checkpoint_stop() && info.checkpoint_round() == round;
    if (stop_job) {
      // Leaving the job: only once the checkpoint is safely written.
      ASSIGN_OR_RETURN(
          info, shards_[0]->PollInfo(
                    [round](const InfoResponse& i) { return i.checkpoint_done_round() >= round; },
                    opt_.timeout, absl::StrCat("the write of checkpoint round ", round)));
      if (!info.checkpoint_error().empty()) {
        return absl::InternalError(
            absl::StrCat("checkpoint round ", round, " failed: ", info.checkpoint_error()));
      }
      dir = info.checkpoint_done_dir();
    }
  }
  if (stop_job) {
    if (opt_.stop != nullptr) opt_.stop->store(true);
    stopped_ = true;
  }
  last_saved_dir_ = dir;
  return dir;
}

absl::StatusOr<std::string> PsCheckpointer::SaveFinal() {
  ASSIGN_OR_RETURN(const int64_t round, Request(false, 0));
  return RunRound(round);
}

absl::StatusOr<std::string> PsCheckpointer::RunRound(int64_t round) {
  absl::StatusOr<std::string> dir = RunRoundSteps(round);
  // Whatever happened, the paused workers must learn it (they wait with a deadline).
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::COMPLETE);
  req.set_round(round);
  if (dir.ok()) {
    req.set_dir(*dir);
  } else {
    req.set_error(dir.status().ToString());
  }
  absl::Status published = shards_[0]->Coordinate(req, opt_.timeout).status();
  if (!published.ok() && dir.ok()) return Annotate(published, "publishing the checkpoint");
  return dir;
}

absl::StatusOr<std::string> PsCheckpointer::RunRoundSteps(int64_t round) {
  ShardRpc& shard0 = *shards_[0];
  ASSIGN_OR_RETURN(auto arrived, shard0.WaitForArrivals(round, opt_.num_workers, opt_.timeout));
  std::map<int, WorkerState> states;
  int64_t step = step_base_;
  for (const auto& [w, bytes] : arrived) {
    if (!states[w].ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("worker ", w, "'s state in round ", round,
                                              " is not a valid WorkerState"));
    }
    step += states[w].step();
  }
  CoordinateRequest release;
  release.set_kind(CoordinateRequest::RELEASE);
  release.set_round(round);
  if (IsCommittedCheckpoint(opt_.dir, step)) {
    // Nothing trained since the committed checkpoint of this step: it holds this state already,
    // and writing over it would leave LATEST naming an incomplete one (checkpoint/layout.h).
    RETURN_IF_ERROR(shard0.Coordinate(release, opt_.timeout).status());
    return CheckpointPath(opt_.dir, step);
  }
  ASSIGN_OR_RETURN(const std::string ckpt, PrepareCheckpointDir(opt_.dir, step));

  // Every writer is paused: the copies are one instant of the whole cluster.
  const int S = static_cast<int>(shards_.size());
  for (int s = 0; s < S; ++s) {
    SaveShardRequest req;
    req.set_phase(SaveShardRequest::COPY);
    req.set_round(round);
    RETURN_IF_ERROR(
        Annotate(shards_[s]->SaveShard(req, opt_.timeout).status(), "copying the shard"));
  }
  RETURN_IF_ERROR(shard0.Coordinate(release, opt_.timeout).status());

  // The shards write their files in parallel while training goes on.
  std::vector<absl::StatusOr<SaveShardResponse>> written(S, absl::UnknownError("not run"));
  std::vector<std::thread> writers;
  for (int s = 0; s < S; ++s) {
    writers.emplace_back([&, s] {
      SaveShardRequest req;
      req.set_phase(SaveShardRequest::WRITE);
      req.set_round(round);
      req.set_dir(ckpt);
      written[s] = shards_[s]->SaveShard(req, opt_.timeout);
    });
  }
  for (std::thread& t : writers) t.join();

  ASSIGN_OR_RETURN(InfoResponse info, shard0.Info(opt_.timeout));
  CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_num_shards(S);
  manifest.set_table_rows(info.map().rows());
  manifest.set_partitions(info.map().partitions());
  manifest.set_row_dim(info.map().row_dim());
  manifest.set_dense_size(info.map().dense_size());
  manifest.set_created_by(absl::StrCat("pstrain PS job (", S, " shards, ", opt_.num_workers,
                                       " workers, round ", round, ")"));
  for (int s = 0; s < S; ++s) {
    RETURN_IF_ERROR(Annotate(written[s].status(), "writing the shard file"));
    auto* f = manifest.add_file();
    f->set_name(written[s]->file());
    f->set_bytes(written[s]->bytes());
  }
  return CommitCheckpoint(opt_.dir, std::move(manifest), states, opt_.keep);
}

}  // namespace pstrain
