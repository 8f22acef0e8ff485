// PsJob against a real shard on loopback: a round at the step LATEST already names
// leaves the committed checkpoint as it is (checkpoint/layout.h IsCommittedCheckpoint); the end
// of the job; the lease's watch of the training loop.
#include "worker/ps_client/ps_job.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/notification.h"
#include "ps/server/shard_server.h"
#include "tests/fake_env.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using pstrain::testing::FreshDir;
using pstrain::testing::Slurp;

// A round whose step is the committed checkpoint's (the chief's scheduled round on the last
// step, then the final round) used to rewrite that checkpoint in place, removing its MANIFEST
// first: a crash then left LATEST naming an incomplete checkpoint. Now the round releases the
// workers and returns the committed checkpoint untouched.
TEST(PsJob, ARoundAtTheCommittedStepLeavesItAsItIs) {
  ShardServer::Options so;
  so.data.rows = 100;
  so.data.partitions = 2;
  so.data.row_dim = 3;
  so.data.dense_size = 4;
  so.data.sparse_optimizer.set_type(SGD);
  so.data.dense_optimizer.set_type(SGD);
  const std::string dir = FreshDir("ps_same_step");
  so.data.checkpoint_dir = dir;  // the shard writes only under its job's checkpoint dir
  auto shard = ShardServer::Create(so);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->Start("127.0.0.1:0").ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*shard)->port());

  PsClient::Options co;
  co.shards = {address};
  co.rows = so.data.rows;
  co.partitions = so.data.partitions;
  co.row_dim = so.data.row_dim;
  co.dense_size = so.data.dense_size;
  auto client = PsClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForShards(absl::Seconds(10)).ok());

  PsJob::Options po;
  po.dir = dir;
  po.keep = 1;
  po.shards = {address};
  po.client = client->get();
  po.timeout = absl::Seconds(20);
  PsJob checkpointer(po);

  WorkerState state;
  state.set_step(4);
  auto first = checkpointer.Save(state, false);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, dir + "/ckpt-4");
  std::vector<std::string> committed;
  for (const char* f : {"MANIFEST", "shard-0-of-1", "worker-0.state"}) {
    committed.push_back(Slurp(*first + "/" + f));
  }
  state.set_examples(7);  // a rewrite would change worker-0.state and the MANIFEST
  auto same = checkpointer.Save(state, false);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, *first);
  std::vector<std::string> now;
  for (const char* f : {"MANIFEST", "shard-0-of-1", "worker-0.state"}) {
    now.push_back(Slurp(*first + "/" + f));
  }
  EXPECT_EQ(now, committed);
  // The rounds were released and completed: shard 0 says so.
  const InfoResponse info = (*shard)->Info();
  EXPECT_EQ(info.checkpoint_released_round(), info.checkpoint_round());
  EXPECT_EQ(info.checkpoint_done_round(), info.checkpoint_round());
  EXPECT_EQ(info.checkpoint_done_dir(), *first);
  (*shard)->Shutdown(absl::ZeroDuration());
  std::system(("rm -rf " + dir).c_str());
}

// A shard 0 of a 2-worker job in this process, and a PsJob per worker against it.
struct TwoWorkerJob {
  std::unique_ptr<ShardServer> shard;
  std::string address, dir;
  std::vector<std::unique_ptr<PsClient>> clients;

  explicit TwoWorkerJob(const std::string& name) {
    ShardServer::Options so;
    so.data.rows = 100;
    so.data.partitions = 2;
    so.data.row_dim = 3;
    so.data.dense_size = 4;
    so.num_workers = 2;
    dir = FreshDir(name);
    so.data.checkpoint_dir = dir;
    auto s = ShardServer::Create(so);
    EXPECT_TRUE(s.ok()) << s.status();
    shard = *std::move(s);
    EXPECT_TRUE(shard->Start("127.0.0.1:0").ok());
    address = absl::StrCat("127.0.0.1:", shard->port());
    for (int w = 0; w < 2; ++w) {
      PsClient::Options co;
      co.shards = {address};
      co.rows = 100;
      co.partitions = 2;
      co.row_dim = 3;
      co.dense_size = 4;
      co.worker_id = w;
      auto c = PsClient::Create(co);
      EXPECT_TRUE(c.ok()) << c.status();
      clients.push_back(*std::move(c));
    }
  }
  ~TwoWorkerJob() {
    shard->Shutdown(absl::ZeroDuration());
    std::system(("rm -rf " + dir).c_str());
  }
  PsJob::Options Options(int worker) const {
    PsJob::Options po;
    po.dir = dir;
    po.worker = worker;
    po.num_workers = 2;
    po.shards = {address};
    po.client = clients[worker].get();
    po.timeout = absl::Seconds(20);
    return po;
  }
};

// The end of a job: each worker's TRAINING_DONE report reaches the chief with its counts, the
// chief marks the job finished, and a host waiting for that end (AwaitJobEnd) returns then.
TEST(PsJob, TrainingDoneReportsReachTheChiefAndFinishJobEndsTheHostsWait) {
  TwoWorkerJob job("ps_job_end");
  PsJob chief(job.Options(0)), worker(job.Options(1));
  TrainSummary s0, s1;
  s0.examples = 100;
  s0.steps = 10;
  s1.examples = 70;
  s1.steps = 7;
  PsClient::Staleness st;
  st.pulls = 7;
  st.max = 2;
  ASSERT_TRUE(worker.Save(WorkerState(), /*final=*/true).ok());  // its final state, unwritten
  ASSERT_TRUE(worker.ReportTrainingDone(s1, st, {"restart 1"}).ok());
  ASSERT_TRUE(chief.ReportTrainingDone(s0, PsClient::Staleness(), {}).ok());
  auto reports = chief.WaitForTrainingDone();
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 2u);
  int64_t examples = 0;
  for (const ReportRequest& r : *reports) {
    examples += r.examples();
    if (r.worker_id() == 1) {
      EXPECT_EQ(r.steps(), 7);
      EXPECT_EQ(r.staleness_max(), 2);
      ASSERT_EQ(r.restart_log_size(), 1);
    }
  }
  EXPECT_EQ(examples, 170);

  // Host 1 waits for the end of the job until the chief marks it finished.
  ShardRpc shard_zero(job.address, RpcSecurity(), 1);
  HostEnd end;
  end.host = 1;
  end.num_hosts = 2;
  end.barrier_timeout = absl::Seconds(30);
  end.lease = absl::Seconds(30);
  end.checkpoint_dir = job.dir;
  absl::Status waited = absl::UnknownError("not returned");
  std::thread host1([&] { waited = AwaitJobEnd(shard_zero, end); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(chief.FinishJob().ok());
  host1.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(job.shard->Info().job_finished());
}

// A failed job: the chief's FailJob reaches a host waiting for the end, which returns the job's
// error instead of waiting out its barrier.
TEST(PsJob, FailJobEndsAHostsWaitWithTheJobsError) {
  TwoWorkerJob job("ps_job_fail");
  PsJob chief(job.Options(0));
  ShardRpc shard_zero(job.address, RpcSecurity(), 1);
  HostEnd end;
  end.host = 1;
  end.num_hosts = 2;
  end.barrier_timeout = absl::Seconds(60);
  end.checkpoint_dir = job.dir;
  absl::Status waited;
  const absl::Time start = absl::Now();
  std::thread host1([&] { waited = AwaitJobEnd(shard_zero, end); });
  absl::SleepFor(absl::Milliseconds(300));
  chief.FailJob(absl::InternalError("the chief's evaluation failed"));
  host1.join();
  EXPECT_FALSE(waited.ok());
  EXPECT_THAT(std::string(waited.message()),
              ::testing::HasSubstr("the job failed: the chief's evaluation failed"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A host whose shard 0 is gone stops waiting for the end of the job once shard 0 has been silent
// for longer than the lease, naming the last good checkpoint.
TEST(PsJob, AHostStopsWaitingForTheEndOnceShardZeroIsSilentLongerThanTheLease) {
  TwoWorkerJob job("ps_job_gone");
  ShardRpc shard_zero(job.address, RpcSecurity(), 1, absl::Seconds(5));
  job.shard->Shutdown(absl::ZeroDuration());
  HostEnd end;
  end.host = 1;
  end.num_hosts = 2;
  end.barrier_timeout = absl::Seconds(600);
  end.lease = absl::Seconds(2);
  end.checkpoint_dir = job.dir;
  const absl::Time start = absl::Now();
  const absl::Status waited = AwaitJobEnd(shard_zero, end);
  EXPECT_FALSE(waited.ok());
  EXPECT_THAT(std::string(waited.message()), ::testing::HasSubstr("last good checkpoint: none"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// The lease watches the training loop: a worker whose loop has trained no step for longer than
// the lease (stuck on a stopped host's shard while its own process runs) stops, naming it, and
// renews its lease no more. Start-up (before the first step) and a bounded wait (a checkpoint)
// are not stuck. The loop's clock is fake; the watcher looks at it after each long-poll (held a
// third of the lease: 1 s here), so each "not stopped" below waits 2.5 s of real time for it.
TEST(PsJob, AWorkerWhoseLoopTrainsNoStepForLongerThanTheLeaseStops) {
  TwoWorkerJob job("ps_job_stuck");
  FakeEnv env;
  PsJob::Options o = job.Options(1);
  o.lease = absl::Seconds(3);
  o.env = &env;
  absl::Notification failed;
  std::string why;
  o.on_failure = [&](const absl::Status& s) {
    why = std::string(s.message());
    failed.Notify();
  };
  PsJob worker(o);
  LoopHeartbeat* heartbeat = worker.heartbeat();
  ASSERT_NE(heartbeat, nullptr);
  env.Advance(absl::Seconds(10));  // a slow start: not watched
  EXPECT_FALSE(failed.WaitForNotificationWithTimeout(absl::Milliseconds(2500)));
  heartbeat->Beat(7);
  {
    LoopHeartbeat::BoundedWait checkpoint(heartbeat);
    env.Advance(absl::Seconds(10));  // a long checkpoint round
    EXPECT_FALSE(failed.WaitForNotificationWithTimeout(absl::Milliseconds(2500)));
  }
  EXPECT_EQ(worker.failure(), "");
  EXPECT_TRUE(worker.Failure().ok());
  env.Advance(absl::Seconds(4));  // no step for longer than the lease
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the watcher did not see the stuck loop";
  EXPECT_THAT(why, ::testing::HasSubstr("worker 1 stops: its training loop has trained no step "
                                        "for 4s after step 7, longer than the lease (3s)"));
  EXPECT_THAT(why, ::testing::HasSubstr("last good checkpoint: none"));
  EXPECT_FALSE(worker.Failure().ok());
  EXPECT_TRUE(worker.CheckpointRequested(8));  // the loop's next boundary returns the failure
}

// A loopback port that accepts connections (the kernel's backlog) and never answers: a stopped
// process's, as a gRPC client sees it. Closed by the destructor.
struct SilentPort {
  int fd = -1;
  int port = 0;
  SilentPort() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd, 16), 0);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
  }
  ~SilentPort() { close(fd); }
};

// A checkpoint round's COPY pauses every worker (each loop is in a bounded wait then, so no
// loop's lease watch can find a stopped host): the COPY gets at most the lease, and a shard that
// does not answer it fails the round within about the lease instead of the call budget (30 s)
// or the round's timeout.
TEST(PsJob, ACopyToAShardThatDoesNotAnswerFailsTheRoundWithinTheLease) {
  ShardServer::Options so;
  so.data.rows = 100;
  so.data.partitions = 2;
  so.data.row_dim = 3;
  so.data.dense_size = 4;
  so.num_workers = 1;
  const std::string dir = FreshDir("ps_job_copy");
  so.data.checkpoint_dir = dir;
  auto shard = ShardServer::Create(so);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->Start("127.0.0.1:0").ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*shard)->port());
  PsClient::Options co;
  co.shards = {address};
  co.rows = 100;
  co.partitions = 2;
  co.row_dim = 3;
  co.dense_size = 4;
  co.worker_id = 0;
  auto client = PsClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  SilentPort stopped;
  PsJob::Options po;
  po.dir = dir;
  po.worker = 0;
  po.num_workers = 1;
  po.shards = {address, absl::StrCat("127.0.0.1:", stopped.port)};
  po.client = client->get();
  po.timeout = absl::Seconds(600);  // the round's: --barrier_timeout_s
  po.lease = absl::Seconds(3);
  {
    PsJob chief(po);
    WorkerState state;
    state.set_step(10);
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::string> saved = chief.Save(state, /*final=*/false);
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(saved.ok());
    EXPECT_THAT(std::string(saved.status().message()), ::testing::HasSubstr("copying the shard"));
    // The lease (3 s) and the call's own overhead; the call budget would be 30 s.
    EXPECT_LT(took, absl::Seconds(15)) << saved.status();
    // No half-written checkpoint is left, and LATEST names none.
    EXPECT_FALSE(PathExists(dir + "/LATEST"));
  }
  (*shard)->Shutdown(absl::ZeroDuration());
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
