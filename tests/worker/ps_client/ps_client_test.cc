// PsClient against fake shards (ShardEndpoint): routing of ids and dense slices, the scatter of
// answers into the caller's order, push sequences and tickets, backpressure, errors, abort, and
// the versions a push names. No server, no gRPC: the shards are objects of this test. (PsClient
// with real shards, bit for bit against one local store, is tests/ps/server/shard_server_test.cc.)
#include "worker/ps_client/ps_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kDim = 3;

// The value a fake shard serves for row `id`, float `k`.
float RowValue(int64_t id, int k) { return static_cast<float>(id * 10 + k); }

std::vector<int64_t> Unpack(const std::string& bytes) {
  std::vector<int64_t> ids(bytes.size() / sizeof(int64_t));
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), bytes.size());
  return ids;
}

// A shard held by the test. Pulls answer at once with RowValue rows and the dense slice
// dense_value + index; pushes are recorded and answered at once, or held until Release().
class FakeShard : public ShardEndpoint {
 public:
  FakeShard(int shard, int64_t dense_begin, int64_t dense_size)
      : name_("shard " + std::to_string(shard) + " (fake)"),
        dense_begin_(dense_begin),
        dense_size_(dense_size) {}

  const std::string& name() const override { return name_; }

  void Pull(PullPart* part, ShardDone done) override {
    const std::vector<int64_t> ids = Unpack(part->request.ids());
    {
      absl::MutexLock lock(&mu_);
      pulls_.push_back(part->request);
    }
    part->scratch_rows.resize(ids.size() * kDim);
    for (size_t j = 0; j < ids.size(); ++j) {
      for (int k = 0; k < kDim; ++k) part->scratch_rows[j * kDim + k] = RowValue(ids[j], k);
    }
    part->rows = reinterpret_cast<const char*>(part->scratch_rows.data());
    if (answer_versions_ && part->request.step() > 0) {
      part->scratch_versions.resize(ids.size());
      for (size_t j = 0; j < ids.size(); ++j) {
        part->scratch_versions[j] = static_cast<uint32_t>(1000 + ids[j]);
      }
      part->row_versions = reinterpret_cast<const char*>(part->scratch_versions.data());
    }
    if (part->request.want_dense()) {
      for (int64_t i = 0; i < dense_size_; ++i) {
        part->dense_out[i] = static_cast<float>(dense_begin_ + i) + 0.5f;
      }
      part->dense_version = 7;
    }
    part->staleness = staleness_;
    part->incarnation = incarnation_;
    if (job_.version() > 0) part->job = &job_;
    done(pull_error_);
  }

  uint64_t ReservePush() override {
    absl::MutexLock lock(&mu_);
    return next_ticket_++;
  }

  void Push(uint64_t ticket, PushPart* part, ShardDone done) override {
    Recorded r;
    r.ticket = ticket;
    r.request = part->request;
    if (part->dense_len > 0) {
      r.dense.assign(part->dense_grad, part->dense_grad + part->dense_len);
    }
    part->incarnation = incarnation_;
    {
      absl::MutexLock lock(&mu_);
      pushes_.push_back(std::move(r));
      if (hold_pushes_) {
        held_.push_back(std::move(done));
        return;
      }
    }
    done(push_error_);
  }

  void Info(const InfoRequest*, InfoResponse*, bool, absl::Duration, ShardDone done) override {
    done(absl::UnimplementedError("not used"));
  }
  void Stats(const StatsRequest*, ShardStats*, absl::Duration, ShardDone done) override {
    done(absl::UnimplementedError("not used"));
  }
  void PushOutOfOrder(const PushRequest* request, PushResponse*, absl::Duration,
                      ShardDone done) override {
    {
      absl::MutexLock lock(&mu_);
      out_of_order_.push_back(*request);
    }
    done(absl::OkStatus());
  }
  void Abort(absl::Status reason) override {
    absl::MutexLock lock(&mu_);
    abort_ = reason;
  }
  void Shutdown() override { Release(absl::CancelledError("shutdown")); }
  ShardTraffic traffic() const override { return ShardTraffic{1, 0, 10, 20}; }

  // Answers every held push with `status`.
  void Release(absl::Status status = absl::OkStatus()) {
    std::deque<ShardDone> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (ShardDone& done : held) done(status);
  }

  struct Recorded {
    uint64_t ticket = 0;
    PushRequest request;
    std::vector<float> dense;
  };
  std::vector<PullRequest> pulls() {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }
  std::vector<Recorded> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  std::vector<PushRequest> out_of_order() {
    absl::MutexLock lock(&mu_);
    return out_of_order_;
  }
  absl::Status abort_reason() {
    absl::MutexLock lock(&mu_);
    return abort_;
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }

  // Set before the client calls.
  bool hold_pushes_ = false;
  bool answer_versions_ = false;
  absl::Status pull_error_;
  absl::Status push_error_;
  int64_t staleness_ = 0;
  uint64_t incarnation_ = 1;
  JobState job_;

 private:
  const std::string name_;
  const int64_t dense_begin_, dense_size_;
  absl::Mutex mu_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PullRequest> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<Recorded> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<PushRequest> out_of_order_ ABSL_GUARDED_BY(mu_);
  std::deque<ShardDone> held_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
};

struct Client {
  std::unique_ptr<PsClient> client;
  std::vector<FakeShard*> shards;  // owned by the client
};

// A client of S fake shards over a table of `rows` rows and a dense vector of `dense` floats.
Client MakeClient(int S, int64_t rows = 40, int64_t dense = 10, int max_pushes_in_flight = 2,
                  std::function<void(FakeShard*)> setup = nullptr) {
  PsClient::Options o;
  for (int s = 0; s < S; ++s) o.shards.push_back("fake:" + std::to_string(s));
  o.rows = rows;
  o.row_dim = kDim;
  o.dense_size = dense;
  o.worker_id = 3;
  o.max_pushes_in_flight = max_pushes_in_flight;
  const ShardRouter router(rows, NumPartitions(ClusterConfig(), S), S, dense);
  Client c;
  std::vector<std::unique_ptr<ShardEndpoint>> endpoints;
  for (int s = 0; s < S; ++s) {
    auto shard = std::make_unique<FakeShard>(s, router.dense_begin(s), router.dense_size(s));
    if (setup) setup(shard.get());
    c.shards.push_back(shard.get());
    endpoints.push_back(std::move(shard));
  }
  auto client = PsClient::Create(std::move(o), std::move(endpoints));
  EXPECT_TRUE(client.ok()) << client.status();
  c.client = *std::move(client);
  return c;
}

std::vector<int64_t> ShuffledIds(int64_t rows, uint32_t seed) {
  std::vector<int64_t> ids(rows);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

TEST(PsClientTest, PullAsksEachShardForItsOwnIdsAndScattersTheRowsIntoTheCallersOrder) {
  Client c = MakeClient(3);
  const std::vector<int64_t> ids = ShuffledIds(40, 1);
  std::vector<float> rows(ids.size() * kDim, -1.0f), dense(10, -1.0f);
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), dense.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) ASSERT_EQ(rows[i * kDim + k], RowValue(ids[i], k)) << i;
  }
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(dense[i], i + 0.5f) << "dense " << i;
  const PartitionMap& map = c.client->map();
  int64_t asked = 0;
  for (int s = 0; s < 3; ++s) {
    const std::vector<PullRequest> pulls = c.shards[s]->pulls();
    ASSERT_EQ(pulls.size(), 1u);
    EXPECT_TRUE(pulls[0].want_dense());
    EXPECT_EQ(pulls[0].worker_id(), 3);
    EXPECT_EQ(pulls[0].step(), 1);  // the first training pull
    const std::vector<int64_t> got = Unpack(pulls[0].ids());
    asked += static_cast<int64_t>(got.size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(map.ShardOf(got[j]), s) << got[j];
      // Grouped by partition: the shard handles each partition's ids in one run.
      if (j > 0) EXPECT_LE(map.PartitionOf(got[j - 1]), map.PartitionOf(got[j]));
    }
  }
  EXPECT_EQ(asked, 40);
}

TEST(PsClientTest, PullOfRowsOnlySkipsShardsWithNothingToAnswer) {
  Client c = MakeClient(3);
  const std::vector<int64_t> ids = {0};  // one row: one shard
  std::vector<float> rows(kDim);
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), nullptr).ok());
  int asked = 0;
  for (FakeShard* shard : c.shards) {
    for (const PullRequest& p : shard->pulls()) {
      ++asked;
      EXPECT_FALSE(p.want_dense());
      EXPECT_EQ(p.step(), 0);  // not a training pull
    }
  }
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(rows[1], RowValue(0, 1));
}

TEST(PsClientTest, PushSendsEachShardItsRowsGradientsAndDenseSlice) {
  Client c = MakeClient(3);
  const std::vector<int64_t> ids = ShuffledIds(40, 2);
  std::vector<float> grads(ids.size() * kDim), dense(10);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) grads[i * kDim + k] = RowValue(ids[i], k) + 0.25f;
  }
  std::iota(dense.begin(), dense.end(), 100.0f);
  ASSERT_TRUE(c.client->Push(ids, grads.data(), dense.data(), 9).ok());
  std::vector<float> dense_seen;
  for (int s = 0; s < 3; ++s) {
    const auto pushes = c.shards[s]->pushes();
    ASSERT_EQ(pushes.size(), 1u);
    const PushRequest& r = pushes[0].request;
    EXPECT_EQ(r.step(), 9);
    EXPECT_EQ(r.worker_id(), 3);
    EXPECT_EQ(r.sequence(), 1u);
    const std::vector<int64_t> got = Unpack(r.ids());
    std::vector<float> g(got.size() * kDim);
    ASSERT_EQ(r.row_grads().size(), g.size() * sizeof(float));
    std::memcpy(g.data(), r.row_grads().data(), r.row_grads().size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(c.client->map().ShardOf(got[j]), s);
      for (int k = 0; k < kDim; ++k) EXPECT_EQ(g[j * kDim + k], RowValue(got[j], k) + 0.25f);
    }
    dense_seen.insert(dense_seen.end(), pushes[0].dense.begin(), pushes[0].dense.end());
  }
  EXPECT_THAT(dense_seen, ElementsAreArray(dense));
}

// The shards apply one client's pushes in sequence order: every shard's tickets, taken as the
// sequences are given, follow the sequences, whatever threads push at once.
TEST(PsClientTest, EveryShardsTicketsFollowTheSequencesOfConcurrentPushes) {
  Client c = MakeClient(3, 40, 10, /*max_pushes_in_flight=*/4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<int64_t> ids = ShuffledIds(40, 10 + t);
      std::vector<float> grads(ids.size() * kDim, 1.0f), dense(10, 1.0f);
      for (int i = 0; i < 50; ++i) {
        EXPECT_TRUE(c.client->PushAsync(ids, grads.data(), dense.data(), i + 1)->Wait().ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(c.client->Flush().ok());
  for (FakeShard* shard : c.shards) {
    auto pushes = shard->pushes();
    ASSERT_EQ(pushes.size(), 200u);
    std::sort(pushes.begin(), pushes.end(),
              [](const auto& a, const auto& b) { return a.ticket < b.ticket; });
    for (size_t i = 0; i < pushes.size(); ++i) {
      EXPECT_EQ(pushes[i].ticket, i);
      EXPECT_EQ(pushes[i].request.sequence(), i + 1) << "ticket " << i;
    }
  }
}

TEST(PsClientTest, PushAsyncBlocksBeyondMaxPushesInFlightAndFlushWaitsForAll) {
  Client c = MakeClient(2, 40, 10, /*max_pushes_in_flight=*/2,
                        [](FakeShard* s) { s->hold_pushes_ = true; });
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> grads(ids.size() * kDim, 1.0f);
  auto f1 = c.client->PushAsync(ids, grads.data(), nullptr, 1);
  auto f2 = c.client->PushAsync(ids, grads.data(), nullptr, 2);
  absl::Notification third_started;
  std::thread third([&] {
    c.client->PushAsync(ids, grads.data(), nullptr, 3);
    third_started.Notify();
  });
  EXPECT_FALSE(third_started.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_FALSE(f1->done());
  for (FakeShard* s : c.shards) s->Release();
  EXPECT_TRUE(third_started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  third.join();
  EXPECT_TRUE(f1->Wait().ok());
  EXPECT_TRUE(f2->Wait().ok());
  for (FakeShard* s : c.shards) s->Release();
  EXPECT_TRUE(c.client->Flush().ok());
}

TEST(PsClientTest, FlushReturnsTheFirstPushErrorOnceNamingIt) {
  Client c = MakeClient(2, 40, 10, 2, [](FakeShard* s) {
    s->push_error_ = absl::InvalidArgumentError("shard says no");
  });
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> grads(ids.size() * kDim, 1.0f);
  const absl::Status st = c.client->PushAsync(ids, grads.data(), nullptr, 1)->Wait();
  EXPECT_THAT(st.message(), HasSubstr("shard says no"));
  EXPECT_THAT(c.client->Flush().message(), HasSubstr("shard says no"));
  EXPECT_TRUE(c.client->Flush().ok());  // reported once
}

TEST(PsClientTest, AbortReachesEveryShardAndIsKept) {
  Client c = MakeClient(3);
  c.client->Abort(absl::AbortedError("worker 1 lost"));
  c.client->Abort(absl::AbortedError("second reason"));
  EXPECT_EQ(c.client->aborted().message(), "worker 1 lost");
  for (FakeShard* s : c.shards) EXPECT_EQ(s->abort_reason().message(), "worker 1 lost");
}

// Per-row staleness: a push of step t names the versions its pull of step t answered for the
// same ids in the same order; a push of other ids names none.
TEST(PsClientTest, APushNamesTheRowVersionsOfThePullOfItsStep) {
  Client c = MakeClient(2, 40, 10, 2, [](FakeShard* s) { s->answer_versions_ = true; });
  const std::vector<int64_t> ids = ShuffledIds(40, 3);
  std::vector<float> rows(ids.size() * kDim), dense(10), grads(ids.size() * kDim, 1.0f);
  ASSERT_TRUE(c.client->PullAtStepAsync(ids, rows.data(), dense.data(), 5)->Wait().ok());
  ASSERT_TRUE(c.client->Push(ids, grads.data(), dense.data(), 5).ok());
  for (FakeShard* s : c.shards) {
    const PushRequest r = s->pushes().back().request;
    const std::vector<int64_t> pushed = Unpack(r.ids());
    ASSERT_EQ(r.row_versions().size(), pushed.size() * sizeof(uint32_t));
    std::vector<uint32_t> versions(pushed.size());
    std::memcpy(versions.data(), r.row_versions().data(), r.row_versions().size());
    for (size_t j = 0; j < pushed.size(); ++j) EXPECT_EQ(versions[j], 1000 + pushed[j]);
    EXPECT_EQ(r.dense_version(), 7);
  }
  // Step 6 was never pulled: no row versions; the dense gradient was computed from the latest
  // training pull of a step <= 6 (cluster.dense_sync_steps), step 5's.
  const std::vector<int64_t> other = {1, 2};
  ASSERT_TRUE(c.client->Push(other, grads.data(), dense.data(), 6).ok());
  for (FakeShard* s : c.shards) {
    EXPECT_TRUE(s->pushes().back().request.row_versions().empty());
    EXPECT_EQ(s->pushes().back().request.dense_version(), 7);
  }
}

TEST(PsClientTest, StalenessIsTheLargestShardsAndAShardRestartIsCounted) {
  Client c = MakeClient(3);
  c.shards[1]->staleness_ = 4;
  const std::vector<int64_t> ids = ShuffledIds(40, 4);
  std::vector<float> rows(ids.size() * kDim), dense(10);
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), dense.data()).ok());
  c.shards[1]->staleness_ = 2;
  c.shards[2]->incarnation_ = 99;  // restarted
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), dense.data()).ok());
  const PsClient::Staleness st = c.client->staleness();
  EXPECT_EQ(st.pulls, 2);
  EXPECT_EQ(st.max, 4);
  EXPECT_DOUBLE_EQ(st.mean(), 3.0);
  EXPECT_EQ(c.client->shard_restarts(), 1);
  EXPECT_EQ(c.client->traffic().bytes_received, 3 * 20);
}

TEST(PsClientTest, JobStateKeepsTheNewestVersionOfShardZero) {
  Client c = MakeClient(2);
  c.shards[0]->job_.set_version(5);
  const std::vector<int64_t> ids = {0, 1};
  std::vector<float> rows(ids.size() * kDim), dense(10);
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), dense.data()).ok());
  EXPECT_EQ(c.client->job_state().version(), 5);
  c.shards[0]->job_.set_version(3);  // an older answer completing late
  ASSERT_TRUE(c.client->Pull(ids, rows.data(), dense.data()).ok());
  EXPECT_EQ(c.client->job_state().version(), 5);
}

TEST(PsClientTest, AFailedShardFailsThePullNamingItAndIdsOutsideTheTableAreRefused) {
  Client c = MakeClient(2);
  c.shards[1]->pull_error_ = absl::UnavailableError("shard 1 (fake): Pull failed");
  const std::vector<int64_t> ids = ShuffledIds(40, 5);
  std::vector<float> rows(ids.size() * kDim), dense(10);
  EXPECT_THAT(c.client->Pull(ids, rows.data(), dense.data()).message(),
              HasSubstr("shard 1 (fake)"));
  const std::vector<int64_t> bad = {3, 40};
  const absl::Status st = c.client->Pull(bad, rows.data(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("row id 40 (position 1) is outside the table [0, 40)"));
}

TEST(PsClientTest, FinishTrainingFlushesThenTellsEveryShardOutsideThePushOrder) {
  Client c = MakeClient(3);
  const std::vector<int64_t> ids = {1, 2};
  std::vector<float> grads(ids.size() * kDim, 1.0f);
  c.client->PushAsync(ids, grads.data(), nullptr, 1);
  ASSERT_TRUE(c.client->FinishTraining().ok());
  for (FakeShard* s : c.shards) {
    ASSERT_EQ(s->out_of_order().size(), 1u);
    EXPECT_TRUE(s->out_of_order()[0].worker_done());
    EXPECT_EQ(s->out_of_order()[0].worker_id(), 3);
  }
}

}  // namespace
}  // namespace pstrain
