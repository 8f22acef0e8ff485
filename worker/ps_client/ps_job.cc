#include "worker/ps_client/ps_job.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {

PsJob::PsJob(Options options)
    : opt_(std::move(options)),
      heartbeat_(opt_.env != nullptr ? opt_.env : Env::Default()),
      deltas_(opt_.incremental_every) {
  // Every host restored the same checkpoint (ChooseCheckpoint): a delta may build on it.
  if (opt_.restored) deltas_.Committed(opt_.restored->manifest);
  for (const std::string& a : opt_.shards) {
    shards_.push_back(std::make_unique<ShardRpc>(a, opt_.security, opt_.worker));
  }
  // Every mode: the watcher's long-poll renews this worker's lease and tells of lost workers.
  // (BOUNDED / SYNC read the job's rounds from their training pulls' answers: Requested.)
  watch_rpc_ = std::make_unique<ShardRpc>(opt_.shards[0], opt_.security, opt_.worker);
  end_rpc_ = std::make_unique<ShardRpc>(opt_.shards[0], opt_.security, opt_.worker);
  watcher_ = std::thread([this] { Watch(); });
}

std::string PsJob::DescribeWorker(int worker) const {
  if (worker >= 0 && worker < static_cast<int>(opt_.worker_hosts.size())) {
    return absl::StrCat("worker ", worker, " (host ", opt_.worker_hosts[worker], ")");
  }
  return absl::StrCat("worker ", worker);
}

std::string PsJob::failure() const {
  absl::MutexLock lock(&failure_mu_);
  return failure_;
}

void PsJob::NoteJobHealth(const InfoResponse& info) {
  std::string why;
  if (!info.job_error().empty()) {
    why = absl::StrCat("the job failed: ", info.job_error());
  } else if (info.lost_workers_size() > 0) {
    bool chief_lost = false;
    std::string who;
    for (int w : info.lost_workers()) {
      chief_lost = chief_lost || w == 0;
      absl::StrAppend(&who, who.empty() ? "" : ", ", DescribeWorker(w));
    }
    // The chief stops the job; the others go on unless the chief itself is lost.
    if (chief() || chief_lost) {
      why = absl::StrCat(who, " lost (", info.lost_detail(), ")");
    }
  }
  if (!why.empty()) Fail(why);
}

void PsJob::Fail(const std::string& why) {
  {
    absl::MutexLock lock(&failure_mu_);
    if (!failure_.empty()) return;
    failure_ = why;
  }
  failed_ = true;
  const absl::Status status = FailureStatus();
  PSTRAIN_LOG(ERROR) << status.message();
  if (opt_.on_failure) opt_.on_failure(status);
  // A trainer blocked in a pull or push (e.g. on the lost worker's shard) returns now, and so
  // does one in a checkpoint round's call (a shard's WRITE waits for the whole round's timeout):
  // Save then returns FailureStatus().
  if (opt_.client != nullptr) opt_.client->Abort(status);
  for (const std::unique_ptr<ShardRpc>& shard : shards_) shard->Cancel();
}

absl::Status PsJob::FailureStatus() const {
  return absl::FailedPreconditionError(absl::StrCat(
      "worker ", opt_.worker, " stops: ", failure(), "; last good checkpoint: ",
      LatestPathOr(opt_.dir, "none"),
      " (run the same command to resume from it, or use --max_restarts)"));
}

PsJob::~PsJob() {
  if (watcher_.joinable()) {
    watch_rpc_->Cancel();  // ends the held call at once
    watcher_.join();
  }
}

bool PsJob::LoopStuck() {
  const absl::Duration silent = heartbeat_.Silence();
  if (silent <= opt_.lease) return false;
  Fail(absl::StrCat(
      "its training loop has trained no step for ",
      absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))), " after step ",
      heartbeat_.last_step(), ", longer than the lease (", absl::FormatDuration(opt_.lease),
      "): it waits on what does not answer (a shard of a stopped or hung host, or its input), "
      "so it renews its lease no more and counts as lost"));
  return true;
}

// Shard 0 answers each call when its job state changes (or after the hold without a change). A
// failed call only delays this worker's joining a round (the chief waits for it), so one error is
// not fatal; the calls' retry policy paces the attempts to an unreachable shard 0. But the lease
// is symmetric: when shard 0 has not answered for longer than the lease (this worker is cut off,
// or shard 0 is down), shard 0 counts this worker as lost, so the worker stops too, naming shard
// 0, instead of training on or waiting for a job that has gone on without it.
void PsJob::Watch() {
  int64_t version = 0;  // the first call is answered at once
  // A third of the lease: a renewal is never further apart than that plus a round trip.
  const absl::Duration hold = std::min(absl::Seconds(10), opt_.lease / 3);
  Env* env = opt_.env != nullptr ? opt_.env : Env::Default();
  absl::Duration heard = env->MonotonicNow();
  // The lease is armed by shard 0's first answer: before it, a slow start (shard 0's host still
  // restoring, a loaded machine) is not a lost worker.
  bool answered = false;
  bool job_finished = false;  // shard 0 said so: its going away is the end of the job
  while (true) {
    // Each call renews this worker's lease: only while its training loop trains (heartbeat_).
    if (LoopStuck()) return;
    const absl::Duration limit = answered ? opt_.lease : std::max(opt_.lease, opt_.first_contact);
    absl::StatusOr<InfoResponse> info = watch_rpc_->WatchInfo(version, hold, limit);
    if (info.ok()) {
      heard = env->MonotonicNow();
      answered = true;
      version = info->job_version();
      job_finished = info->job_finished();
      NoteJobHealth(*info);
      open_round_ = info->checkpoint_round() > info->checkpoint_released_round()
                        ? info->checkpoint_round()
                        : 0;
      continue;
    }
    if (info.status().code() == absl::StatusCode::kCancelled) return;
    const absl::Duration silent = env->MonotonicNow() - heard;
    if (!job_finished && silent > limit) {
      Fail(absl::StrCat("shard 0 (", opt_.shards[0], ") not reached for ",
                        absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
                        answered ? ", longer than the lease (" : ", since this worker started (",
                        absl::FormatDuration(limit),
                        "): this worker counts as lost (cut off, or shard 0 is down): ",
                        info.status().message()));
      return;
    }
    PSTRAIN_LOG(WARNING) << "watching shard 0 for checkpoint rounds: " << info.status();
    // An error that came back at once (not a retried one) must not make this loop spin.
    if (!watch_rpc_->Pause(absl::Seconds(1))) return;
  }
}

absl::StatusOr<std::optional<std::string>> PsJob::Restore(WorkerState* state) {
  if (!opt_.restored) return std::optional<std::string>();
  const CheckpointChoice& c = *opt_.restored;
  if (c.manifest.num_workers() == opt_.num_workers) {
    RETURN_IF_ERROR(ReadWorkerState(c.dir, opt_.worker, state));
    opt_.client->ResumeAtStep(state->step());
  } else {
    // Go on counting steps where the shards are (BOUNDED / SYNC wait on step numbers).
    ASSIGN_OR_RETURN(InfoResponse info, shards_[0]->Info(opt_.timeout));
    // The job's pass and its data, as worker 0 recorded them (worker/train/data_pass.h); the
    // pass goes on from here with its data from the beginning.
    WorkerState first;
    RETURN_IF_ERROR(ReadWorkerState(c.dir, 0, &first));
    if (first.has_data_spec()) *state->mutable_data_spec() = first.data_spec();
    state->set_step(info.step());
    state->set_pass_first_step(info.step());
    state->set_pass_first_examples(0);
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

bool PsJob::lockstep() const { return opt_.consistency != ASYNC; }

int64_t PsJob::TargetAfter(int64_t step) const {
  // Every worker must still be able to reach the target without anyone paused, and must make
  // its check for the target (before training the target step, so that it does not read ahead)
  // only after the request (docs/CHECKPOINT.md "BOUNDED and SYNC").
  return step + 3 + (opt_.consistency == BOUNDED ? opt_.staleness : 0);
}

bool PsJob::OpenForMe(int64_t round, int64_t released) const {
  return round > released && round > handled_round_;
}

absl::StatusOr<InfoResponse> PsJob::OpenRound() {
  ASSIGN_OR_RETURN(InfoResponse info, shards_[0]->Info(opt_.timeout));
  if (!OpenForMe(info.checkpoint_round(), info.checkpoint_released_round())) {
    info.set_checkpoint_round(0);  // none open for this worker
  }
  return info;
}

absl::StatusOr<int64_t> PsJob::Request(bool stop, int64_t target, bool end_pass) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::REQUEST);
  req.set_worker_id(opt_.worker);
  req.set_stop(stop);
  req.set_end_pass(end_pass);
  req.set_target_step(target);
  ASSIGN_OR_RETURN(CoordinateResponse r, shards_[0]->Coordinate(req, opt_.timeout));
  return r.round();
}

bool PsJob::CheckpointRequested(int64_t step) {
  if (failed_.load()) return true;  // Save says why
  if (!lockstep()) return open_round_.load() > handled_round_;
  // Checked every step, without an RPC: a worker that learnt of the round late could run past
  // the common step and wait forever on the paused ones. Shard 0's answer to the pull of the
  // step before the target came after the requester's push that followed its request (see the
  // header), so the round is in this state by the time it matters.
  const JobState job = opt_.client->job_state();
  return OpenForMe(job.checkpoint_round(), job.checkpoint_released_round()) &&
         step >= job.checkpoint_target_step();
}

absl::StatusOr<int64_t> PsJob::StopStep(int64_t step) {
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

absl::StatusOr<bool> PsJob::EndPass(int64_t step) {
  // An open round takes the request and keeps its target; else a new round opens at the common
  // target (lockstep) or at each worker's next boundary (ASYNC).
  RETURN_IF_ERROR(Request(/*stop=*/true, lockstep() ? TargetAfter(step) : 0, /*end_pass=*/true)
                      .status());
  return true;
}

absl::StatusOr<std::string> PsJob::Save(const WorkerState& state, bool final) {
  return AsFailure(SaveOrJoin(state, final));
}

absl::StatusOr<std::string> PsJob::AsFailure(absl::StatusOr<std::string> dir) {
  // A round that shard 0 aborted because a worker was lost can end before the watcher has seen
  // that job state (both wait on the same change): ask shard 0 once, so that the error is the
  // job's failure, naming the lost worker and the last good checkpoint.
  if (!dir.ok() && !failed_.load()) {
    if (absl::StatusOr<InfoResponse> info = end_rpc_->Info(absl::Seconds(5)); info.ok()) {
      NoteJobHealth(*info);
    }
  }
  // A call that Fail() cancelled says only that: the reason is the failure.
  if (!dir.ok() && failed_.load()) return FailureStatus();
  return dir;
}

absl::StatusOr<std::string> PsJob::SaveOrJoin(const WorkerState& state, bool final) {
  if (final) {
    final_state_ = state.SerializeAsString();
    return std::string();
  }
  // The trainer saves again when it stops after a round that asked it to stop: nothing changed.
  if (stopped_) return last_saved_dir_;
  if (failed_.load()) return FailureStatus();
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
    pass_ended_ = stop_job && info.checkpoint_end_pass();
  } else {
    ASSIGN_OR_RETURN(
        InfoResponse info,
        shards_[0]->WaitForInfo(
            [round](const InfoResponse& i) { return i.checkpoint_released_round() >= round; },
            opt_.timeout, absl::StrCat("the release of checkpoint round ", round)));
    stop_job = info.checkpoint_stop() && info.checkpoint_round() == round;
    pass_ended_ = stop_job && info.checkpoint_end_pass();
    if (stop_job) {
      // Leaving the job: only once the checkpoint is safely written.
      ASSIGN_OR_RETURN(
          info, shards_[0]->WaitForInfo(
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

absl::StatusOr<std::string> PsJob::SaveFinal() {
  absl::StatusOr<int64_t> round = Request(false, 0);
  return AsFailure(round.ok() ? RunRound(*round) : round.status());
}

absl::StatusOr<std::string> PsJob::RunRound(int64_t round) {
  absl::StatusOr<std::string> dir = RunRoundSteps(round);
  // A failed round leaves no half-written directory behind (the chief is the only writer).
  if (!dir.ok()) RemoveIncompleteCheckpoints(opt_.dir);
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

absl::StatusOr<std::string> PsJob::RunRoundSteps(int64_t round) {
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
    RETURN_IF_ERROR(MarkPassEnd(opt_.dir, step, states));
    return CheckpointPath(opt_.dir, step);
  }
  ASSIGN_OR_RETURN(const std::string ckpt, PrepareCheckpointDir(opt_.dir, step));

  // Every writer is paused: the copies are one instant of the whole cluster. A COPY is a
  // copy-on-write freeze of the rows and a copy of the dense slice: milliseconds, whatever the
  // shard's size. It gets the lease at most: every worker's loop is paused in this round (a
  // bounded wait, LoopHeartbeat), so a shard that does not answer (its host stopped) is found by
  // this call's deadline, and the round fails within the lease instead of the call budget.
  const int S = static_cast<int>(shards_.size());
  const absl::Duration copy_timeout = std::min(opt_.timeout, opt_.lease);
  const std::optional<CheckpointDelta> delta = deltas_.Next();
  // The pass's end as `pstrain train` evicts at it (EvictDynamicTables) and MarkPassEnd records
  // it: every worker read its data to the end (finished, not by max_steps) and one trained. A
  // stop's round is none, so where the shards' pass ends does not depend on timing.
  bool end_pass = !states.empty();
  bool trained = false;
  for (const auto& [w, state] : states) {
    end_pass = end_pass && state.finished() && !state.max_steps_reached();
    trained = trained || state.step() > state.pass_first_step();
  }
  end_pass = end_pass && trained;
  for (int s = 0; s < S; ++s) {
    SaveShardRequest req;
    req.set_phase(SaveShardRequest::COPY);
    req.set_round(round);
    if (delta) {
      req.set_delta(true);
      req.set_delta_parent_step(delta->parent_step());
    }
    req.set_end_pass(end_pass);
    req.set_step(step);  // the pass's end happens once per step: a redone round's is skipped
    RETURN_IF_ERROR(
        Annotate(shards_[s]->SaveShard(req, copy_timeout).status(), "copying the shard"));
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
      req.set_name(CheckpointName(step));  // the shard writes under its own job directory
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
  *manifest.mutable_model() = opt_.model;
  if (delta) *manifest.mutable_delta() = *delta;
  manifest.set_created_by(absl::StrCat("pstrain PS job (", S, " shards, ", opt_.num_workers,
                                       " workers, round ", round, ")"));
  for (int s = 0; s < S; ++s) {
    RETURN_IF_ERROR(Annotate(written[s].status(), "writing the shard file"));
    auto* f = manifest.add_file();
    f->set_name(written[s]->file());
    f->set_bytes(written[s]->bytes());
  }
  ASSIGN_OR_RETURN(std::string committed, CommitCheckpoint(opt_.dir, manifest, states, opt_.keep));
  deltas_.Committed(manifest);
  RETURN_IF_ERROR(MarkPassEnd(opt_.dir, step, states));
  return committed;
}

absl::Status PsJob::ReportTrainingDone(const TrainSummary& summary,
                                       const PsClient::Staleness& staleness,
                                       const std::vector<std::string>& restart_log) {
  ReportRequest done;
  done.set_worker_id(opt_.worker);
  done.set_phase(TRAINING_DONE);
  done.set_examples(summary.examples);
  done.set_steps(summary.steps);
  done.set_training_pulls(staleness.pulls);
  done.set_staleness_max(staleness.max);
  done.set_staleness_sum(staleness.sum);
  done.set_worker_state(final_state_);
  done.set_examples_this_run(summary.examples_this_run);
  for (const std::string& line : restart_log) done.add_restart_log(line);
  return end_rpc_->Report(done, opt_.timeout);
}

absl::StatusOr<std::vector<ReportRequest>> PsJob::WaitForTrainingDone() {
  PSTRAIN_LOG(INFO) << "chief: waiting for the " << opt_.num_workers << " workers to finish";
  return end_rpc_->WaitForReports(TRAINING_DONE, opt_.num_workers, opt_.timeout);
}

absl::Status PsJob::FinishJob() {
  CoordinateRequest finish;
  finish.set_kind(CoordinateRequest::FINISH_JOB);
  return Annotate(end_rpc_->Coordinate(finish, opt_.timeout).status(),
                  "marking the job finished");
}

void PsJob::FailJob(const absl::Status& error) {
  CoordinateRequest failed;
  failed.set_kind(CoordinateRequest::FINISH_JOB);
  failed.set_error(std::string(error.message()).substr(0, 4000));
  if (absl::Status s = end_rpc_->Coordinate(failed, absl::Seconds(5)).status(); !s.ok()) {
    PSTRAIN_LOG(WARNING) << "telling the workers that the job failed: " << s;
  }
}

absl::Status AwaitJobEnd(ShardRpc& shard_zero, const HostEnd& end) {
  ReportRequest seen;
  seen.set_worker_id(end.host);
  seen.set_phase(FINISH_SEEN);
  if (end.host == 0) {
    // A refusal of its own report means the job's state disagrees with this host (a bug, or a
    // phase the chief already passed); the wait below then reports the missing acknowledgement.
    if (absl::Status s = shard_zero.Report(seen, absl::Seconds(10)); !s.ok()) {
      PSTRAIN_LOG(WARNING) << "host 0: its own FINISH_SEEN report was refused: " << s;
    }
    if (auto s = shard_zero.WaitForReports(FINISH_SEEN, end.num_hosts, absl::Seconds(60));
        !s.ok()) {
      PSTRAIN_LOG(WARNING) << s.status();
    }
    return absl::OkStatus();
  }
  if (!end.preempted) {
    absl::StatusOr<InfoResponse> finished = shard_zero.WaitForInfo(
        [](const InfoResponse& i) { return i.job_finished(); }, end.barrier_timeout,
        "the end of the job (the chief's evaluation; see --barrier_timeout_s)",
        // Shard 0 down or cut off: it counts this host as lost.
        end.lease);
    if (!finished.ok()) {
      return absl::Status(finished.status().code(),
                          absl::StrCat(finished.status().ToString(), "; last good checkpoint: ",
                                       LatestPathOr(end.checkpoint_dir, "none")));
    }
    if (!finished->job_error().empty()) {
      return absl::AbortedError(absl::StrCat("the job failed: ", finished->job_error()));
    }
  }
  if (absl::Status s = shard_zero.Report(seen, absl::Seconds(10)); !s.ok()) {
    PSTRAIN_LOG(WARNING) << "reporting FINISH_SEEN: " << s;
  }
  return absl::OkStatus();
}

}  // namespace pstrain
