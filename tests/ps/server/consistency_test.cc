// BOUNDED and SYNC consistency of ShardServer, over real gRPC on loopback: two workers (PsClients,
// or a raw stub where the test needs exact control of a push's id) against two started shards.
// SGD with learning rate 1 from zero rows makes every applied update readable: row = -sum(grads).
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

constexpr int kRows = 100;
constexpr int kDim = 2;
constexpr int kDense = 4;  // 2 floats per shard
constexpr int kShards = 2;
// How long a pull must stay unanswered to count as held. Only the negative checks wait this
// long; every positive wait is bounded by the client's deadline.
constexpr absl::Duration kHeld = absl::Milliseconds(300);

struct Job : testing::LocalShards {
  Job(Consistency mode, int staleness, int workers = 2) {
    OptimizerConfig sgd;
    sgd.set_type(SGD);
    sgd.set_learning_rate(1.0f);
    for (int s = 0; s < kShards; ++s) {
      ShardServer::Options o;
      o.data.shard = s;
      o.data.num_shards = kShards;
      o.data.rows = kRows;
      o.data.partitions = kShards;
      o.data.row_dim = kDim;
      o.data.dense_size = kDense;
      o.data.sparse_optimizer = sgd;
      o.data.dense_optimizer = sgd;
      o.consistency = mode;
      o.staleness = staleness;
      o.num_workers = workers;
      Add(std::move(o));
    }
    this->mode = mode;
  }

  std::unique_ptr<PsClient> Client(int worker, int deadline_ms = 5000, int retries = 5) {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = kRows;
    o.partitions = kShards;
    o.row_dim = kDim;
    o.dense_size = kDense;
    o.worker_id = worker;
    o.consistency = mode;
    o.rpc_deadline_ms = deadline_ms;
    o.rpc_retries = retries;
    auto c = PsClient::Create(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->WaitForShards(absl::Seconds(10)).ok());
    return std::move(c).value();
  }

  // The current value of `row` and of the dense vector, read in-process (never held).
  std::vector<float> Row(int64_t row) {
    PullRequest req;
    PackArray(&row, 1, req.mutable_ids());
    PullResponse resp;
    const PartitionMap& map = servers[0]->map();
    ShardServer& owner = *servers[map.ShardOfPartition(map.PartitionOf(row))];
    EXPECT_TRUE(owner.Pull(req, &resp).ok());
    std::vector<float> out(kDim);
    std::memcpy(out.data(), resp.rows().data(), sizeof(float) * kDim);
    return out;
  }

  Consistency mode;
};

// Rows 5 (shard 0) and 60 (shard 1): one push touches both shards.
const std::vector<int64_t> kIds = {5, 60};

struct Step {
  std::vector<float> rows, dense;
  std::shared_ptr<PsFuture> pull;
  // Starts the training pull of `step` (rows of kIds and the dense vector).
  void Pull(PsClient* c, int64_t step) {
    rows.assign(kIds.size() * kDim, -1);
    dense.assign(kDense, -1);
    pull = c->PullAtStepAsync(kIds, rows.data(), dense.data(), step);
  }
};

// Both workers pull step 1 (nothing to wait for yet) and get their answers.
void BothPullStepOne(PsClient* a, PsClient* b, Step* sa, Step* sb) {
  sa->Pull(a, 1);
  sb->Pull(b, 1);
  ASSERT_TRUE(sa->pull->Wait().ok());
  ASSERT_TRUE(sb->pull->Wait().ok());
}

absl::Status PushConstant(PsClient* c, int64_t step, float g) {
  std::vector<float> grads(kIds.size() * kDim, g), dense(kDense, g);
  return c->PushAsync(kIds, grads.data(), dense.data(), step)->Wait();
}

bool HeldFor(PsFuture* f, absl::Duration d) {
  absl::SleepFor(d);
  return !f->done();
}

TEST(ConsistencyTest, BoundedHoldsAWorkerStalenessPlusOneAheadUntilTheSlowOnePushes) {
  Job job(BOUNDED, /*staleness=*/1);
  auto fast = job.Client(0);
  auto slow = job.Client(1);
  Step s;
  for (int64_t t = 1; t <= 2; ++t) {  // steps 1 and 2 need nothing from the slow worker
    s.Pull(fast.get(), t);
    ASSERT_TRUE(s.pull->Wait().ok());
    ASSERT_TRUE(PushConstant(fast.get(), t, 1.0f).ok());
  }
  // Step 3 needs every worker at step 3 - 1 - 1 = 1; the slow one has pushed nothing.
  s.Pull(fast.get(), 3);
  EXPECT_TRUE(HeldFor(s.pull.get(), kHeld));
  ASSERT_TRUE(PushConstant(slow.get(), 1, 0.5f).ok());
  ASSERT_TRUE(s.pull->Wait().ok());
  // Fast pushed 2 x 1.0, slow 1 x 0.5; BOUNDED applies every push as it comes.
  EXPECT_THAT(s.rows, ::testing::Each(-2.5f));
  EXPECT_THAT(s.dense, ::testing::Each(-2.5f));
  // Pulls 1 and 2 saw the slow worker at step 0 (staleness 0 and 1); pull 3 at step 1 (1).
  const PsClient::Staleness st = fast->staleness();
  EXPECT_EQ(st.pulls, 3);
  EXPECT_EQ(st.max, 1);
  EXPECT_DOUBLE_EQ(st.mean(), 2.0 / 3);
  // Evaluation pulls (step 0) are never held, even now that fast is 2 ahead.
  ASSERT_TRUE(PushConstant(fast.get(), 3, 1.0f).ok());
  std::vector<float> rows(kIds.size() * kDim);
  EXPECT_TRUE(fast->PullAtStepAsync(kIds, rows.data(), nullptr, 0)->Wait().ok());
  EXPECT_EQ(fast->staleness().pulls, 3);
}

TEST(ConsistencyTest, BoundedWithStalenessZeroIsLockstep) {
  Job job(BOUNDED, 0);
  auto a = job.Client(0);
  auto b = job.Client(1);
  Step sa, sb;
  ASSERT_NO_FATAL_FAILURE(BothPullStepOne(a.get(), b.get(), &sa, &sb));
  ASSERT_TRUE(PushConstant(a.get(), 1, 1.0f).ok());
  sa.Pull(a.get(), 2);
  EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  ASSERT_TRUE(PushConstant(b.get(), 1, 1.0f).ok());
  ASSERT_TRUE(sa.pull->Wait().ok());
  EXPECT_THAT(sa.rows, ::testing::Each(-2.0f));
  EXPECT_EQ(a->staleness().max, 0);
}

TEST(ConsistencyTest, SyncAppliesTheMeanOnceAfterEveryWorkerPushed) {
  Job job(SYNC, 0);
  auto a = job.Client(0);
  auto b = job.Client(1);
  Step sa, sb;
  ASSERT_NO_FATAL_FAILURE(BothPullStepOne(a.get(), b.get(), &sa, &sb));
  // Worker 0 pulls step 2 BEFORE pushing step 1 (a pipelined trainer): its push still goes
  // through, and is not applied alone.
  sa.Pull(a.get(), 2);
  std::vector<float> ga = {1, 2, 10, 20}, da = {1, 1, 1, 1};
  ASSERT_TRUE(a->PushAsync(kIds, ga.data(), da.data(), 1)->Wait().ok());
  EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  EXPECT_THAT(job.Row(5), ::testing::ElementsAre(0.0f, 0.0f));
  for (auto& s : job.servers) EXPECT_EQ(s->consistency().applied_step(), 0);

  // Worker 1 has row 5 and row 7 (which worker 0 lacks: it counts 0 there), not row 60.
  const std::vector<int64_t> ids_b = {7, 5};
  std::vector<float> gb = {4, 4, 3, 4}, db = {3, 3, 3, 3};
  ASSERT_TRUE(b->PushAsync(ids_b, gb.data(), db.data(), 1)->Wait().ok());
  ASSERT_TRUE(sa.pull->Wait().ok());
  for (auto& s : job.servers) EXPECT_EQ(s->consistency().applied_step(), 1);
  // The mean over 2 workers, applied once with lr 1.
  EXPECT_THAT(sa.rows, ::testing::ElementsAre(-2.0f, -3.0f, -5.0f, -10.0f));
  EXPECT_THAT(job.Row(7), ::testing::ElementsAre(-2.0f, -2.0f));
  EXPECT_THAT(sa.dense, ::testing::Each(-2.0f));
  EXPECT_EQ(a->staleness().max, 0);
}

TEST(ConsistencyTest, SyncCountsARetriedPushOnce) {
  Job job(SYNC, 0);
  // Raw pushes to shard 0 (row 5, its dense slice of 2 floats): the same push sent twice, as a
  // client does after a lost answer.
  auto channel = grpc::CreateChannel(job.addresses[0], grpc::InsecureChannelCredentials());
  auto stub = ParameterServer::NewStub(channel);
  auto push = [&](int worker, uint64_t sequence, float g, PushResponse* resp) {
    PushRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(77 + worker);
    req.set_sequence(sequence);
    req.set_step(1);
    const int64_t id = 5;
    const float grads[kDim] = {g, g}, dense[2] = {g, g};
    PackArray(&id, 1, req.mutable_ids());
    PackArray(grads, kDim, req.mutable_row_grads());
    PackArray(dense, 2, req.mutable_dense_grad());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Push(&ctx, req, resp);
  };
  PushResponse r;
  ASSERT_TRUE(push(0, 1, 2.0f, &r).ok());
  EXPECT_FALSE(r.duplicate());
  ASSERT_TRUE(push(0, 1, 2.0f, &r).ok());  // the retry (same sequence)
  EXPECT_TRUE(r.duplicate());
  ASSERT_TRUE(push(0, 0, 2.0f, &r).ok());  // sequence 0 opts out of sequences: the step counts
  EXPECT_TRUE(r.duplicate());
  EXPECT_EQ(job.servers[0]->consistency().applied_step(), 0);
  ASSERT_TRUE(push(1, 1, 4.0f, &r).ok());
  EXPECT_EQ(job.servers[0]->consistency().applied_step(), 1);
  EXPECT_THAT(job.Row(5), ::testing::ElementsAre(-3.0f, -3.0f));  // (2 + 4) / 2, once
  EXPECT_EQ(job.servers[0]->Stats().duplicate_pushes(), 2);
}

TEST(ConsistencyTest, SyncAFinishedWorkerReleasesTheOthers) {
  Job job(SYNC, 0);
  auto a = job.Client(0);
  auto b = job.Client(1);
  Step sa;
  ASSERT_TRUE(PushConstant(a.get(), 1, 2.0f).ok());
  ASSERT_TRUE(PushConstant(b.get(), 1, 4.0f).ok());
  // Worker 1's data ran out after step 1; worker 0 goes on alone.
  ASSERT_TRUE(PushConstant(a.get(), 2, 2.0f).ok());
  sa.Pull(a.get(), 3);
  EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  ASSERT_TRUE(b->FinishTraining().ok());
  ASSERT_TRUE(sa.pull->Wait().ok());
  // Step 1: mean (2 + 4) / 2 = 3; step 2: worker 0 alone, 2.
  EXPECT_THAT(sa.rows, ::testing::Each(-5.0f));
  ASSERT_TRUE(PushConstant(a.get(), 3, 1.0f).ok());
  sa.Pull(a.get(), 4);
  ASSERT_TRUE(sa.pull->Wait().ok());  // nobody to wait for
  EXPECT_THAT(sa.rows, ::testing::Each(-6.0f));
  // A finished worker may not push again.
  absl::Status again = PushConstant(b.get(), 2, 1.0f);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("after it finished"));
  ASSERT_TRUE(a->FinishTraining().ok());
}

// Continuous training: a job's last checkpoint has every worker finished; the job that restores
// it trains a new pass, whose pushes are taken (they were refused "after it finished") and whose
// steps wait for every worker again. A stop mid-pass keeps a finished worker finished.
TEST(ConsistencyTest, SyncARestoredEndOfJobStartsANewPass) {
  Job job(SYNC, 0);
  auto a = job.Client(0);
  auto b = job.Client(1);
  ASSERT_TRUE(PushConstant(a.get(), 1, 2.0f).ok());
  ASSERT_TRUE(PushConstant(b.get(), 1, 4.0f).ok());
  ASSERT_TRUE(a->FinishTraining().ok());
  ASSERT_TRUE(b->FinishTraining().ok());
  ConsistencyTracker& tracker = job.servers[0]->consistency();
  const ConsistencyState end_of_job = tracker.Save();
  ASSERT_TRUE(tracker.Restore(end_of_job).ok());
  for (size_t s = 1; s < job.servers.size(); ++s) {
    ASSERT_TRUE(job.servers[s]->consistency().Restore(end_of_job).ok());
  }
  ASSERT_TRUE(PushConstant(a.get(), 2, 2.0f).ok());
  EXPECT_EQ(tracker.applied_step(), 1);  // step 2 waits for worker 1 again
  ASSERT_TRUE(PushConstant(b.get(), 2, 4.0f).ok());
  EXPECT_EQ(tracker.applied_step(), 2);

  // Mid-pass: worker 1 finished, worker 0 trains on; restored, worker 1 stays finished.
  ASSERT_TRUE(b->FinishTraining().ok());
  ASSERT_TRUE(tracker.Restore(tracker.Save()).ok());
  absl::Status again = PushConstant(b.get(), 3, 1.0f);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("after it finished"));
  ASSERT_TRUE(a->FinishTraining().ok());
}

TEST(ConsistencyTest, BoundedAFinishedWorkerReleasesTheOthers) {
  Job job(BOUNDED, 0);
  auto a = job.Client(0);
  auto b = job.Client(1);
  ASSERT_TRUE(PushConstant(a.get(), 1, 1.0f).ok());
  Step sa;
  sa.Pull(a.get(), 2);
  EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  ASSERT_TRUE(b->FinishTraining().ok());
  ASSERT_TRUE(sa.pull->Wait().ok());
  EXPECT_THAT(sa.rows, ::testing::Each(-1.0f));
}

TEST(ConsistencyTest, SyncDeadWorkerFailsTheOthersWithinTheBudgetNamingIt) {
  Job job(SYNC, 0);
  // 1.5 s a try, 1 retry: the call fails within ~3 s. The shard answers 150 ms before each
  // attempt's deadline (a tenth of it), a margin that holds on a loaded machine.
  auto a = job.Client(0, /*deadline_ms=*/1500, /*retries=*/1);
  ASSERT_TRUE(PushConstant(a.get(), 1, 1.0f).ok());
  Step sa;
  const absl::Time start = absl::Now();
  sa.Pull(a.get(), 2);
  const absl::Status st = sa.pull->Wait();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("failed after 2 attempts"));
  EXPECT_THAT(st.message(), HasSubstr("pull of step 2"));
  EXPECT_THAT(st.message(), HasSubstr("SYNC: waits for step 1 to be applied"));
  EXPECT_THAT(st.message(), HasSubstr("have not pushed step 1: 1 (at step 0)"));
}

TEST(ConsistencyTest, ShutdownAnswersHeldPulls) {
  Job job(SYNC, 0);
  auto a = job.Client(0, /*deadline_ms=*/5000, /*retries=*/0);
  ASSERT_TRUE(PushConstant(a.get(), 1, 1.0f).ok());
  Step sa;
  sa.Pull(a.get(), 2);
  EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  const absl::Time start = absl::Now();
  for (auto& s : job.servers) s->Shutdown(absl::Seconds(1));
  const absl::Status st = sa.pull->Wait();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("shutting down"));
}

TEST(ConsistencyTest, ACancelledHeldPullIsDroppedOnce) {
  Job job(SYNC, 0);
  {
    auto a = job.Client(0);
    ASSERT_TRUE(PushConstant(a.get(), 1, 1.0f).ok());
    Step sa;
    sa.Pull(a.get(), 2);
    EXPECT_TRUE(HeldFor(sa.pull.get(), kHeld));
  }  // the client cancels its calls: the shards drop the held pulls (OnCancel)
  // The step completes later without touching the dropped reactor (ASan / TSan would tell).
  auto b = job.Client(1);
  ASSERT_TRUE(PushConstant(b.get(), 1, 3.0f).ok());
  EXPECT_EQ(job.servers[0]->consistency().applied_step(), 1);
  EXPECT_THAT(job.Row(5), ::testing::Each(-2.0f));
}

TEST(ConsistencyTest, OptionsAreChecked) {
  ShardServer::Options o;
  o.data.rows = 10;
  o.data.row_dim = 1;
  o.consistency = BOUNDED;
  o.staleness = -1;
  auto s = ShardServer::Create(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("staleness >= 0"));
  o.staleness = 0;
  o.num_workers = 0;
  EXPECT_EQ(ShardServer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  // A worker id outside [0, N) is refused in SYNC: by the client when it connects (the shards
  // say how many workers they serve), and by the shard if a push comes all the same.
  Job job(SYNC, 0);
  PsClient::Options co;
  co.shards = job.addresses;
  co.rows = kRows;
  co.partitions = kShards;
  co.row_dim = kDim;
  co.dense_size = kDense;
  co.worker_id = 2;
  co.consistency = SYNC;
  auto stranger = PsClient::Create(std::move(co));
  ASSERT_TRUE(stranger.ok());
  const absl::Status connect = (*stranger)->WaitForShards(absl::Seconds(10));
  EXPECT_EQ(connect.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(connect.message(), HasSubstr("--num_workers"));
  PushRequest req;
  req.set_worker_id(2);
  req.set_step(1);
  PushResponse resp;
  absl::Status st = job.servers[0]->Push(req, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("has workers [0, 2)"));
}

}  // namespace
}  // namespace pstrain
