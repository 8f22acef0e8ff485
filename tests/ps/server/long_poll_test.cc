// Waiting on shard 0's job state without polling (ps/server/job_coordinator.h,
// proto/pstrain/ps_service.proto): a watched Info or Coordinate call is held by the shard until
// the job state changes (and not before), answered unchanged at its server-side deadline, never
// held past the call's deadline, and finished when the client cancels it or the shard shuts down.
// ShardRpc's waits are loops of such calls; BOUNDED / SYNC workers read checkpoint rounds from
// shard 0's answers to their training pulls, with no RPC of their own.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/job_coordinator.h"
#include "ps/server/shard_server.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/fake_env.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/ps_job.h"
#include "worker/ps_client/shard_rpc.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// How long a call must stay unanswered to count as held. Only the negative checks wait this long.
constexpr absl::Duration kHeld = absl::Milliseconds(300);

// ---- JobCoordinator alone, with a fake held call and a fake clock ----

struct FakeWatch : JobCoordinator::Watch {
  void Wake(absl::Status status) override {
    EXPECT_FALSE(woken.HasBeenNotified()) << "woken twice";
    result = std::move(status);
    woken.Notify();
  }
  bool WokenWithin(absl::Duration d) { return woken.WaitForNotificationWithTimeout(d); }
  absl::Notification woken;
  absl::Status result = absl::UnknownError("not woken");
};

// A JobCoordinator on a fake clock. Its timer is joined first (running what is still pending
// against the live coordinator), as JobCoordinator requires.
struct FakeCoordinator {
  explicit FakeCoordinator(int num_workers = 4)
      : timer(std::make_unique<Timer>(&env)),
        c(0, num_workers, absl::Seconds(30), timer.get(), &env) {}
  ~FakeCoordinator() { timer.reset(); }
  FakeEnv env;
  std::unique_ptr<Timer> timer;
  JobCoordinator c;
};

TEST(JobCoordinator, AHeldWatchWakesOnTheNextChangeOnly) {
  FakeCoordinator f;
  JobCoordinator& c = f.c;
  const int64_t v = c.version();
  FakeWatch w;
  c.Hold(&w, v, f.env.Now() + absl::Seconds(30));
  EXPECT_EQ(c.held_watches(), 1);
  EXPECT_FALSE(w.woken.HasBeenNotified());  // the fake clock stands: only a change wakes it
  c.RequestCheckpoint(false, 7);
  ASSERT_TRUE(w.WokenWithin(absl::Seconds(5)));
  EXPECT_TRUE(w.result.ok()) << w.result;
  EXPECT_EQ(c.held_watches(), 0);
  EXPECT_GT(c.version(), v);
  EXPECT_EQ(c.State().checkpoint_round(), 1);
  EXPECT_EQ(c.State().checkpoint_target_step(), 7);

  // A watcher that saw an older version is answered at once.
  FakeWatch stale;
  c.Hold(&stale, v, f.env.Now() + absl::Seconds(30));
  EXPECT_TRUE(stale.woken.HasBeenNotified());
  EXPECT_TRUE(stale.result.ok());
}

TEST(JobCoordinator, EveryChangeOfTheJobStateBumpsTheVersion) {
  FakeCoordinator f;
  JobCoordinator& c = f.c;
  int64_t v = c.version();
  auto changed = [&] {
    const int64_t now = c.version();
    const bool grew = now > v;
    v = now;
    return grew;
  };
  ReportRequest r;
  r.set_worker_id(1);
  r.set_phase(TRAINING_DONE);
  ASSERT_TRUE(c.Report(r).ok());
  EXPECT_TRUE(changed());
  EXPECT_EQ(c.RequestCheckpoint(false), 1);
  EXPECT_TRUE(changed());
  EXPECT_EQ(c.RequestCheckpoint(false), 1);  // joins the open round: nothing changed
  EXPECT_FALSE(changed());
  c.RequestCheckpoint(true);  // marks it stopping
  EXPECT_TRUE(changed());
  ASSERT_TRUE(c.ArriveCheckpoint(1, 0, "s").ok());
  EXPECT_TRUE(changed());
  ASSERT_TRUE(c.ReleaseCheckpoint(1).ok());
  EXPECT_TRUE(changed());
  ASSERT_TRUE(c.ReleaseCheckpoint(1).ok());
  EXPECT_FALSE(changed());
  ASSERT_TRUE(c.CompleteCheckpoint(1, "/d", "").ok());
  EXPECT_TRUE(changed());
  c.FinishJob();
  EXPECT_TRUE(changed());
  c.SetRestoredFrom("/d");
  EXPECT_TRUE(changed());
}

TEST(JobCoordinator, AHeldWatchIsAnsweredAtItsTimeUnchanged) {
  FakeCoordinator f;
  JobCoordinator& c = f.c;
  FakeWatch w;
  const absl::Time start = f.env.Now();
  c.Hold(&w, c.version(), start + absl::Milliseconds(200));
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Milliseconds(199));
  EXPECT_FALSE(w.woken.HasBeenNotified());
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Milliseconds(200));
  ASSERT_TRUE(w.woken.HasBeenNotified());
  EXPECT_TRUE(w.result.ok());
  EXPECT_EQ(c.held_watches(), 0);
}

TEST(JobCoordinator, CancelAndStopHoldingEndEveryHeldWatchOnce) {
  FakeCoordinator f;
  JobCoordinator& c = f.c;
  FakeWatch a, b;
  c.Hold(&a, c.version(), f.env.Now() + absl::Seconds(30));
  c.Hold(&b, c.version(), f.env.Now() + absl::Seconds(30));
  EXPECT_EQ(c.held_watches(), 2);
  c.Cancel(&a);
  ASSERT_TRUE(a.woken.HasBeenNotified());
  EXPECT_EQ(a.result.code(), absl::StatusCode::kCancelled);
  c.Cancel(&a);  // a second cancellation finds nothing
  c.StopHolding();
  ASSERT_TRUE(b.woken.HasBeenNotified());
  EXPECT_EQ(b.result.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.result.message(), HasSubstr("shutting down"));
  FakeWatch late;
  c.Hold(&late, c.version(), f.env.Now() + absl::Seconds(30));
  EXPECT_EQ(late.result.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.held_watches(), 0);
}

TEST(JobCoordinator, HoldsAtMostkMaxHeldCalls) {
  FakeCoordinator f;
  JobCoordinator& c = f.c;
  std::vector<std::unique_ptr<FakeWatch>> held;
  for (int i = 0; i < JobCoordinator::kMaxHeld; ++i) {
    held.push_back(std::make_unique<FakeWatch>());
    c.Hold(held.back().get(), c.version(), f.env.Now() + absl::Seconds(30));
  }
  FakeWatch one_more;
  c.Hold(&one_more, c.version(), f.env.Now() + absl::Seconds(30));
  EXPECT_EQ(one_more.result.code(), absl::StatusCode::kUnavailable);
  c.FinishJob();  // wakes them all
  for (auto& w : held) EXPECT_TRUE(w->result.ok());
}

// Leases on the fake clock: a worker not heard of for the lease is lost (the callback and the
// job state name it), a worker heard again within it is not, and a lost worker that calls is back.
TEST(JobCoordinator, AWorkerNotHeardOfForTheLeaseIsLost) {
  FakeCoordinator f(/*num_workers=*/2);
  JobCoordinator& c = f.c;
  std::vector<std::string> lost;  // written on the timer thread, read after RunTimerUntil
  c.SetLostCallback([&lost](const std::string& detail) { lost.push_back(detail); });
  const absl::Time start = f.env.Now();
  c.Heard(0);
  c.Heard(1);
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Seconds(20));
  c.Heard(0);
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Seconds(30));
  EXPECT_EQ(c.lost_workers(), std::vector<int>{1});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0], "worker 1 lost: no call for 30.0 s (lease 30.0 s)");
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Seconds(49));
  EXPECT_EQ(c.lost_workers(), std::vector<int>{1});  // worker 0 was heard at 20 s
  RunTimerUntil(&f.env, f.timer.get(), start + absl::Seconds(50));
  EXPECT_EQ(c.lost_workers(), (std::vector<int>{0, 1}));
  c.Heard(1);
  EXPECT_EQ(c.lost_workers(), std::vector<int>{0});
  EXPECT_EQ(c.State().lost_detail(), "worker 0 lost: no call for 30.0 s (lease 30.0 s)");
  c.StopHolding();
}

// ---- Over gRPC ----

struct Shard0 : testing::LocalShards {
  explicit Shard0(Consistency mode = ASYNC, int num_shards = 1, int num_workers = 1) {
    for (int s = 0; s < num_shards; ++s) {
      ShardServer::Options o;
      o.data.shard = s;
      o.data.num_shards = num_shards;
      o.data.rows = 100;
      o.data.partitions = num_shards;
      o.data.row_dim = 2;
      o.data.dense_size = 4;
      o.consistency = mode;
      o.num_workers = num_workers;
      Add(std::move(o));
    }
    stub = ParameterServer::NewStub(
        grpc::CreateChannel(addresses[0], grpc::InsecureChannelCredentials()));
  }
  ShardServer& s0() { return *servers[0]; }

  std::unique_ptr<ParameterServer::Stub> stub;
};

// One asynchronous Info call with a watch.
struct HeldInfo {
  HeldInfo(ParameterServer::Stub* stub, int64_t version, int64_t watch_ms,
           absl::Duration deadline) {
    request.set_watch_version(version);
    request.set_watch_timeout_ms(watch_ms);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    start = absl::Now();
    stub->async()->Info(&ctx, &request, &response, [this](grpc::Status s) {
      status = s;
      took = absl::Now() - start;
      done.Notify();
    });
  }
  bool DoneWithin(absl::Duration d) { return done.WaitForNotificationWithTimeout(d); }

  grpc::ClientContext ctx;
  InfoRequest request;
  InfoResponse response;
  grpc::Status status;
  absl::Time start;
  absl::Duration took;
  absl::Notification done;
};

TEST(LongPoll, AHeldInfoIsAnsweredWhenTheJobStateChangesNotBefore) {
  Shard0 job;
  const int64_t v = job.s0().Info().job_version();
  HeldInfo call(job.stub.get(), v, /*watch_ms=*/20000, absl::Seconds(30));
  EXPECT_FALSE(call.DoneWithin(kHeld));
  EXPECT_EQ(job.s0().coordinator().held_watches(), 1);
  const absl::Time change = absl::Now();
  EXPECT_EQ(job.s0().coordinator().RequestCheckpoint(false, 12), 1);
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(5)));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_LT(call.start + call.took - change, absl::Seconds(2));
  EXPECT_GT(call.response.job_version(), v);
  EXPECT_EQ(call.response.checkpoint_round(), 1);
  EXPECT_EQ(call.response.checkpoint_target_step(), 12);
  EXPECT_EQ(job.s0().coordinator().held_watches(), 0);
}

TEST(LongPoll, AHeldInfoIsAnsweredUnchangedAtItsServerSideDeadline) {
  Shard0 job;
  const int64_t v = job.s0().Info().job_version();
  HeldInfo call(job.stub.get(), v, /*watch_ms=*/400, absl::Seconds(30));
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(10)));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_GE(call.took, absl::Milliseconds(400));
  EXPECT_EQ(call.response.job_version(), v);
  EXPECT_EQ(call.response.shard(), 0);
  // A watcher that saw another version is answered at once.
  HeldInfo old(job.stub.get(), v - 1, /*watch_ms=*/20000, absl::Seconds(30));
  ASSERT_TRUE(old.DoneWithin(absl::Seconds(5)));
  EXPECT_LT(old.took, absl::Seconds(2));
}

TEST(LongPoll, NoCallIsHeldPastItsDeadline) {
  Shard0 job;
  const int64_t v = job.s0().Info().job_version();
  // The client asks for a minute, its deadline is 4 s: the shard answers (OK, unchanged) shortly
  // before the deadline (a tenth of the time left: 400 ms, a margin a loaded machine keeps), not
  // with DEADLINE_EXCEEDED after it.
  HeldInfo call(job.stub.get(), v, /*watch_ms=*/60000, absl::Seconds(4));
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(10)));
  EXPECT_TRUE(call.status.ok()) << call.status.error_code() << " " << call.status.error_message();
  EXPECT_LT(call.took, absl::Seconds(4));
  EXPECT_GE(call.took, absl::Seconds(3));
  EXPECT_EQ(call.response.job_version(), v);

  // The same for a watched Coordinate REPORTS, over ShardRpc: it waits for its whole timeout (in
  // held calls, not polls) and then names the missing workers.
  ShardRpc rpc(job.addresses[0]);
  const absl::Time start = absl::Now();
  auto none = rpc.WaitForReports(TRAINING_DONE, 2, absl::Milliseconds(700));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("workers [0, 1] missing"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(LongPoll, AHeldCoordinateReportsIsAnsweredByTheNextReport) {
  Shard0 job;
  CoordinateRequest request;
  request.set_kind(CoordinateRequest::REPORTS);
  request.set_phase(TRAINING_DONE);
  CoordinateResponse first;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(job.stub->Coordinate(&ctx, request, &first).ok());
  }
  EXPECT_EQ(first.reports_size(), 0);
  request.set_watch_version(first.job_version());
  request.set_watch_timeout_ms(20000);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  CoordinateResponse held;
  grpc::Status status;
  absl::Notification done;
  job.stub->async()->Coordinate(&ctx, &request, &held, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(kHeld));
  EXPECT_EQ(job.s0().coordinator().held_watches(), 1);
  ReportRequest report;
  report.set_worker_id(0);
  report.set_phase(TRAINING_DONE);
  report.set_examples(5);
  ASSERT_TRUE(job.s0().Report(report).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(held.reports_size(), 1);
  EXPECT_EQ(held.reports(0).examples(), 5);
  EXPECT_GT(held.job_version(), first.job_version());
}

TEST(LongPoll, AClientCancellationFinishesTheHeldCall) {
  Shard0 job;
  HeldInfo call(job.stub.get(), job.s0().Info().job_version(), 20000, absl::Seconds(30));
  EXPECT_FALSE(call.DoneWithin(kHeld));
  call.ctx.TryCancel();
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(5)));
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::CANCELLED);
  // The shard drops it (OnCancel); a later change does not touch it (ASan / TSan would tell).
  for (int i = 0; i < 100 && job.s0().coordinator().held_watches() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(job.s0().coordinator().held_watches(), 0);
  job.s0().coordinator().FinishJob();
}

TEST(LongPoll, ShutdownFinishesHeldCalls) {
  Shard0 job;
  HeldInfo call(job.stub.get(), job.s0().Info().job_version(), 20000, absl::Seconds(30));
  EXPECT_FALSE(call.DoneWithin(kHeld));
  const absl::Time start = absl::Now();
  job.s0().Shutdown(absl::Seconds(5));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // not the grace: the held call ended first
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(5)));
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(call.status.error_message(), HasSubstr("shutting down"));
}

// BOUNDED / SYNC: shard 0 puts its job state in its answer to a training pull (the workers' way
// to learn of checkpoint rounds without an RPC); not in ASYNC, not in an evaluation pull.
TEST(LongPoll, Shard0PutsItsJobStateInBoundedAndSyncTrainingPulls) {
  for (Consistency mode : {ASYNC, BOUNDED, SYNC}) {
    SCOPED_TRACE(Consistency_Name(mode));
    Shard0 job(mode);
    job.s0().coordinator().RequestCheckpoint(false, /*target_step=*/9);
    PullRequest train;
    train.set_step(1);
    train.set_want_dense(true);
    PullResponse r;
    ASSERT_TRUE(job.s0().Pull(train, &r).ok());
    EXPECT_EQ(r.has_job(), mode != ASYNC);
    if (mode != ASYNC) {
      EXPECT_EQ(r.job().checkpoint_round(), 1);
      EXPECT_EQ(r.job().checkpoint_target_step(), 9);
      EXPECT_EQ(r.job().version(), job.s0().Info().job_version());
    }
    PullResponse e;
    ASSERT_TRUE(job.s0().Pull(PullRequest(), &e).ok());
    EXPECT_FALSE(e.has_job());
  }
}

TEST(LongPoll, ShardRpcWaitsReturnWhenTheStateChanges) {
  Shard0 job(ASYNC, 1, /*num_workers=*/2);
  ShardRpc rpc(job.addresses[0]);
  ShardServer& s0 = job.s0();
  // The chief's wait for arrivals: answered by the last arrival, not by a poll.
  const int64_t round = s0.coordinator().RequestCheckpoint(false);
  std::atomic<bool> arrived{false};
  absl::Time last_arrival;
  std::atomic<int> held_while_waiting{0};
  std::thread workers([&] {
    absl::SleepFor(kHeld);
    held_while_waiting = s0.coordinator().held_watches();  // the wait is a held call, not polls
    ASSERT_TRUE(s0.coordinator().ArriveCheckpoint(round, 1, "one").ok());
    absl::SleepFor(kHeld);
    last_arrival = absl::Now();
    arrived = true;
    ASSERT_TRUE(s0.coordinator().ArriveCheckpoint(round, 0, "zero").ok());
  });
  auto states = rpc.WaitForArrivals(round, 2, absl::Seconds(30));
  const absl::Time returned = absl::Now();
  workers.join();
  ASSERT_TRUE(states.ok()) << states.status();
  EXPECT_TRUE(arrived);
  EXPECT_EQ(held_while_waiting, 1);
  EXPECT_EQ(states->at(0), "zero");
  EXPECT_EQ(states->at(1), "one");
  EXPECT_LT(returned - last_arrival, absl::Seconds(2));

  // A non-chief's wait for the release of its round.
  std::thread chief([&] {
    absl::SleepFor(kHeld);
    EXPECT_TRUE(s0.coordinator().ReleaseCheckpoint(round).ok());
  });
  auto info = rpc.WaitForInfo(
      [round](const InfoResponse& i) { return i.checkpoint_released_round() >= round; },
      absl::Seconds(30), "the release");
  chief.join();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->checkpoint_released_round(), round);

  // A wait that does not come true ends at its timeout, naming what did not happen.
  auto never = rpc.WaitForInfo([](const InfoResponse& i) { return i.job_finished(); },
                               absl::Milliseconds(500), "the end of the job");
  EXPECT_EQ(never.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(never.status().message(), HasSubstr("the end of the job did not happen within"));
}

TEST(LongPoll, ShardRpcCancelEndsAWaitAtOnce) {
  Shard0 job;
  ShardRpc rpc(job.addresses[0]);
  absl::Status result;
  absl::Notification done;
  std::thread waiter([&] {
    result = rpc.WaitForInfo([](const InfoResponse& i) { return i.job_finished(); },
                             absl::Minutes(5), "the end of the job")
                 .status();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(kHeld));
  rpc.Cancel();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  waiter.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
}

// A wait bounded by the lease (a host waiting for the end of the job): a live shard 0 answers
// within it (its holds are shortened to a third of it), so the wait runs to its own end; a shard
// 0 that is gone ends the wait once it has been silent for longer than the lease, naming it,
// long before the wait's timeout.
TEST(LongPoll, ShardRpcWaitEndsWhenTheShardIsSilentLongerThanTheLease) {
  Shard0 job;
  ShardRpc rpc(job.addresses[0]);
  const absl::Duration lease = absl::Milliseconds(1500);
  auto live = rpc.WaitForInfo([](const InfoResponse& i) { return i.job_finished(); },
                              absl::Seconds(4), "the end of the job", lease);
  EXPECT_EQ(live.status().code(), absl::StatusCode::kDeadlineExceeded) << live.status();
  EXPECT_THAT(live.status().message(), HasSubstr("the end of the job did not happen within"));

  job.s0().Shutdown(absl::Seconds(1));
  const absl::Time start = absl::Now();
  auto gone = rpc.WaitForInfo([](const InfoResponse& i) { return i.job_finished(); },
                              absl::Seconds(120), "the end of the job", lease);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_THAT(gone.status().message(),
              HasSubstr(absl::StrCat("shard ", job.addresses[0], " not reached for ")));
  EXPECT_THAT(gone.status().message(), HasSubstr("while waiting for the end of the job"));
  EXPECT_GE(took, lease);
  EXPECT_LT(took, absl::Seconds(15));
}

// SYNC: shard 0's answer to a training pull carries its job state, also for a worker that has no
// rows and no dense slice there; PsJob::CheckpointRequested reads it, with no RPC.
TEST(LongPoll, SyncWorkersReadCheckpointRoundsFromTheirPulls) {
  Shard0 job(SYNC, /*num_shards=*/2);
  PsClient::Options o;
  o.shards = job.addresses;
  o.rows = 100;
  o.partitions = 2;
  o.row_dim = 2;
  o.dense_size = 4;
  o.worker_id = 0;
  o.consistency = SYNC;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForShards(absl::Seconds(10)).ok());
  PsClient& c = **client;
  PsJob::Options co;
  co.dir = ::testing::TempDir();
  co.worker = 0;
  co.num_workers = 1;
  co.shards = job.addresses;
  co.client = &c;
  co.consistency = SYNC;
  PsJob checkpointer(co);

  // A row of shard 1 only (partition 1 of 2), no dense vector.
  const PartitionMap& map = job.s0().map();
  const int64_t row = map.PartitionBegin(1);
  ASSERT_EQ(map.ShardOf(row), 1);
  std::vector<float> rows(2), grads(2, 0.5f);
  auto pull = [&](int64_t step) {
    return c.PullAtStepAsync({row}, rows.data(), nullptr, step)->Wait();
  };
  ASSERT_TRUE(pull(1).ok());
  ASSERT_TRUE(c.PushAsync({row}, grads.data(), nullptr, 1)->Wait().ok());
  EXPECT_EQ(c.job_state().checkpoint_round(), 0);
  EXPECT_GT(c.job_state().version(), 0);

  // Another worker asks for a round at step 4: this worker sees it only in the answer to its
  // next training pull (Requested makes no call of its own).
  job.s0().coordinator().RequestCheckpoint(false, /*target_step=*/4);
  EXPECT_FALSE(checkpointer.CheckpointRequested(4));
  ASSERT_TRUE(pull(2).ok());
  EXPECT_EQ(c.job_state().checkpoint_round(), 1);
  EXPECT_EQ(c.job_state().checkpoint_target_step(), 4);
  EXPECT_FALSE(checkpointer.CheckpointRequested(3));
  EXPECT_TRUE(checkpointer.CheckpointRequested(4));
  EXPECT_TRUE(checkpointer.CheckpointRequested(5));
  // An evaluation pull (step 0) does not carry it.
  PullResponse direct;
  PullRequest eval;
  ASSERT_TRUE(job.s0().Pull(eval, &direct).ok());
  EXPECT_FALSE(direct.has_job());
  // Once released, the round is no longer open.
  ASSERT_TRUE(job.s0().coordinator().ReleaseCheckpoint(1).ok());
  ASSERT_TRUE(c.PushAsync({row}, grads.data(), nullptr, 2)->Wait().ok());
  ASSERT_TRUE(pull(3).ok());
  EXPECT_FALSE(checkpointer.CheckpointRequested(4));
}

// ASYNC: the checkpointer's watcher thread sees a round as soon as it opens (a held Info call
// answered by the change), and its destructor ends the held call at once.
TEST(LongPoll, AsyncWatcherSeesARoundAtOnceAndStopsAtOnce) {
  Shard0 job;
  PsClient::Options o;
  o.shards = job.addresses;
  o.rows = 100;
  o.partitions = 1;
  o.row_dim = 2;
  o.dense_size = 4;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  PsJob::Options co;
  co.dir = ::testing::TempDir();
  co.worker = 1;
  co.num_workers = 2;
  co.shards = job.addresses;
  co.client = client->get();
  auto checkpointer = std::make_unique<PsJob>(co);
  EXPECT_FALSE(checkpointer->CheckpointRequested(1));
  // Wait until the watcher holds a call, so that the round is seen through a held one.
  for (int i = 0; i < 250 && job.s0().coordinator().held_watches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(job.s0().coordinator().held_watches(), 1);
  const absl::Time opened = absl::Now();
  job.s0().coordinator().RequestCheckpoint(false);
  while (!checkpointer->CheckpointRequested(1) && absl::Now() - opened < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(checkpointer->CheckpointRequested(1));
  EXPECT_LT(absl::Now() - opened, absl::Seconds(2));
  const absl::Time start = absl::Now();
  checkpointer.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace pstrain
