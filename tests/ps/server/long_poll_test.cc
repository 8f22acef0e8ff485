// Waiting on shard 0's job state without polling (ps/server/job_coordinator.h,
// proto/pstrain/ps_service.proto): a watched Info or Coordinate call is held by the shard until
// the job state changes (and not before), answered unchanged at its server-side deadline, never
// held past the call's deadline, and finished when the client cancels it or the shard shuts down.
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

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// How long a call must stay unanswered to count as held. Only the negative checks wait this long.
constexpr absl::Duration kHeld = absl::Milliseconds(300);

// ---- JobCoordinator alone, with a fake held call ----

struct FakeWatch : JobCoordinator::Watch {
  void Wake(absl::Status status) override {
    EXPECT_FALSE(woken.HasBeenNotified()) << "woken twice";
    result = std::move(status);
    when = absl::Now();
    woken.Notify();
  }
  bool WokenWithin(absl::Duration d) { return woken.WaitForNotificationWithTimeout(d); }
  absl::Notification woken;
  absl::Status result = absl::UnknownError("not woken");
  absl::Time when;
};

TEST(JobCoordinator, AHeldWatchWakesOnTheNextChangeOnly) {
  Timer timer;
  JobCoordinator c(0, &timer);
  const int64_t v = c.version();
  FakeWatch w;
  c.Hold(&w, v, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(c.held_watches(), 1);
  EXPECT_FALSE(w.WokenWithin(kHeld));
  c.RequestCheckpoint(false, 7);
  ASSERT_TRUE(w.WokenWithin(absl::Seconds(5)));
  EXPECT_TRUE(w.result.ok()) << w.result;
  EXPECT_EQ(c.held_watches(), 0);
  EXPECT_GT(c.version(), v);
  EXPECT_EQ(c.State().checkpoint_round(), 1);
  EXPECT_EQ(c.State().checkpoint_target_step(), 7);

  // A watcher that saw an older version is answered at once.
  FakeWatch stale;
  c.Hold(&stale, v, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(stale.woken.HasBeenNotified());
  EXPECT_TRUE(stale.result.ok());
}

TEST(JobCoordinator, EveryChangeOfTheJobStateBumpsTheVersion) {
  Timer timer;
  JobCoordinator c(0, &timer);
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
  c.Report(r);
  EXPECT_TRUE(changed());
  EXPECT_EQ(c.RequestCheckpoint(false), 1);
  EXPECT_TRUE(changed());
  EXPECT_EQ(c.RequestCheckpoint(false), 1);  // joins the open round: nothing changed
  EXPECT_FALSE(changed());
  c.RequestCheckpoint(true);  // marks it stopping
  EXPECT_TRUE(changed());
  ASSERT_TRUE(c.ArriveCheckpoint(1, 0, "s").ok());
  EXPECT_TRUE(changed());
  c.ReleaseCheckpoint(1);
  EXPECT_TRUE(changed());
  c.ReleaseCheckpoint(1);
  EXPECT_FALSE(changed());
  c.CompleteCheckpoint(1, "/d", "");
  EXPECT_TRUE(changed());
  c.FinishJob();
  EXPECT_TRUE(changed());
  c.SetRestoredFrom("/d");
  EXPECT_TRUE(changed());
}

TEST(JobCoordinator, AHeldWatchIsAnsweredAtItsTimeUnchanged) {
  Timer timer;
  JobCoordinator c(0, &timer);
  FakeWatch w;
  const absl::Time start = absl::Now();
  c.Hold(&w, c.version(), start + absl::Milliseconds(200));
  ASSERT_TRUE(w.WokenWithin(absl::Seconds(10)));
  EXPECT_TRUE(w.result.ok());
  EXPECT_GE(w.when - start, absl::Milliseconds(200));
  EXPECT_EQ(c.held_watches(), 0);
}

TEST(JobCoordinator, CancelAndStopHoldingEndEveryHeldWatchOnce) {
  Timer timer;
  JobCoordinator c(0, &timer);
  FakeWatch a, b;
  c.Hold(&a, c.version(), absl::Now() + absl::Seconds(30));
  c.Hold(&b, c.version(), absl::Now() + absl::Seconds(30));
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
  c.Hold(&late, c.version(), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(late.result.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.held_watches(), 0);
}

TEST(JobCoordinator, HoldsAtMostkMaxHeldCalls) {
  Timer timer;
  JobCoordinator c(0, &timer);
  std::vector<std::unique_ptr<FakeWatch>> held;
  for (int i = 0; i < JobCoordinator::kMaxHeld; ++i) {
    held.push_back(std::make_unique<FakeWatch>());
    c.Hold(held.back().get(), c.version(), absl::Now() + absl::Seconds(30));
  }
  FakeWatch one_more;
  c.Hold(&one_more, c.version(), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(one_more.result.code(), absl::StatusCode::kUnavailable);
  c.FinishJob();  // wakes them all
  for (auto& w : held) EXPECT_TRUE(w->result.ok());
}

// ---- Over gRPC ----

struct Shard0 {
  explicit Shard0(Consistency mode = ASYNC, int num_shards = 1) {
    for (int s = 0; s < num_shards; ++s) {
      ShardServer::Options o;
      o.shard = s;
      o.num_shards = num_shards;
      o.rows = 100;
      o.partitions = num_shards;
      o.row_dim = 2;
      o.dense_size = 4;
      o.consistency = mode;
      o.num_workers = 1;
      auto server = ShardServer::Create(std::move(o));
      EXPECT_TRUE(server.ok()) << server.status();
      EXPECT_TRUE((*server)->Start("127.0.0.1:0").ok());
      addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers.push_back(std::move(server).value());
    }
    stub = ParameterServer::NewStub(
        grpc::CreateChannel(addresses[0], grpc::InsecureChannelCredentials()));
  }
  ShardServer& s0() { return *servers[0]; }

  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> addresses;
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
  // The client asks for a minute, its deadline is 1 s: the shard answers (OK, unchanged) shortly
  // before the deadline (a tenth of the time left), not with DEADLINE_EXCEEDED after it.
  HeldInfo call(job.stub.get(), v, /*watch_ms=*/60000, absl::Seconds(1));
  ASSERT_TRUE(call.DoneWithin(absl::Seconds(10)));
  EXPECT_TRUE(call.status.ok()) << call.status.error_code() << " " << call.status.error_message();
  EXPECT_LT(call.took, absl::Seconds(1));
  EXPECT_GE(call.took, absl::Milliseconds(600));
  EXPECT_EQ(call.response.job_version(), v);
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

}  // namespace
}  // namespace pstrain
