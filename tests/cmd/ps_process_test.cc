// Real `pstrain ps` processes on loopback driven by a PsClient: many pipelined pull/push rounds
// match a local twin bit for bit, SIGTERM stops a shard cleanly (exit 0), a SIGKILLed shard makes
// the next call fail within its budget with a message naming the shard, and a shard restarted on
// the same port is reached again through retries (with fresh rows: no checkpoint restore yet).
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "tests/subprocess.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_balance.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 100003;
constexpr int kPartitions = 8;
constexpr int kRowDim = 17;
constexpr int64_t kDenseSize = 1001;
constexpr int kStartMs = 60000;  // the machine may be loaded: starting a process is slow
constexpr int kStopMs = 15000;

// One `pstrain ps` process.
class PsProcess {
 public:
  // Starts shard `shard` of `shards` on `port` (0 = any) and waits for its "listening" line.
  void Start(int shard, int shards, int port) {
    std::string error;
    ASSERT_TRUE(
        proc_.Start({PSTRAIN_BINARY, "ps", "--shard", absl::StrCat(shard), "--num_shards",
                     absl::StrCat(shards), "--port", absl::StrCat(port), "--bind", "127.0.0.1",
                     "--rows", absl::StrCat(kRows), "--partitions", absl::StrCat(kPartitions),
                     "--row_dim", absl::StrCat(kRowDim), "--dense_size", absl::StrCat(kDenseSize)},
                    &error))
        << error;
    const std::string line = proc_.ReadLineContaining("listening on", kStartMs);
    const std::string prefix =
        absl::StrCat("pstrain ps: shard ", shard, "/", shards, " listening on 127.0.0.1:");
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << "got: '" << line << "'";
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(prefix.size()), &port_)) << line;
    ASSERT_TRUE(port == 0 || port_ == port);
  }
  // SIGTERM, then expects exit code 0 within kStopMs.
  void StopCleanly() {
    ASSERT_TRUE(proc_.Signal(SIGTERM));
    const int status = proc_.WaitExit(kStopMs);
    ASSERT_NE(status, -1) << "shard did not exit within " << kStopMs << " ms of SIGTERM";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  }
  void Kill() {
    ASSERT_TRUE(proc_.Signal(SIGKILL));
    ASSERT_NE(proc_.WaitExit(kStopMs), -1);
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  testing::Subprocess proc_;
  int port_ = 0;
};

PsClient::Options ClientOptions(const std::vector<std::string>& shards) {
  PsClient::Options o;
  o.shards = shards;
  o.rows = kRows;
  o.partitions = kPartitions;
  o.row_dim = kRowDim;
  o.dense_size = kDenseSize;
  o.rpc_deadline_ms = 5000;
  o.rpc_retries = 3;
  o.initial_backoff_ms = 20;
  o.max_backoff_ms = 200;
  return o;
}

std::unique_ptr<PsClient> MakeClient(const PsClient::Options& o) {
  auto c = PsClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  const absl::Status ready = (*c)->WaitForShards(absl::Seconds(30));
  EXPECT_TRUE(ready.ok()) << ready;
  return std::move(c).value();
}

std::vector<int64_t> UniqueIds(Rng* rng, int n) {
  std::set<int64_t> s;
  while (static_cast<int>(s.size()) < n) s.insert(static_cast<int64_t>(rng->Uniform(kRows)));
  std::vector<int64_t> ids(s.begin(), s.end());
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng->Uniform(i)]);
  return ids;
}

std::vector<float> RandomValues(Rng* rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return v;
}

TEST(PsProcess, PipelinedRoundsMatchLocalTwinAndSigtermExitsCleanly) {
  PsProcess shards[2];
  for (int s = 0; s < 2; ++s) ASSERT_NO_FATAL_FAILURE(shards[s].Start(s, 2, 0));
  auto client = MakeClient(ClientOptions({shards[0].address(), shards[1].address()}));
  ASSERT_NE(client, nullptr);

  // The twin starts from the shards' own initial values (pulled), with the default optimizers
  // of `pstrain ps` (ApplyConfigDefaults: Adam for the dense vector).
  Rng rng(2024);
  const std::vector<int64_t> universe = UniqueIds(&rng, 3000);
  std::vector<float> init(universe.size() * kRowDim), dense_init(kDenseSize);
  ASSERT_TRUE(client->Pull(universe, init.data(), dense_init.data()).ok());
  std::shared_ptr<const Optimizer> opt = Optimizer::Create(OptimizerConfig()).value();
  EmbeddingStore::Options eo;
  eo.begin = 0;
  eo.end = kRows;
  eo.dim = kRowDim;
  eo.optimizer = opt;
  auto twin = EmbeddingStore::Create(eo).value();
  ASSERT_TRUE(twin->RestoreRows(universe, init.data(), nullptr).ok());
  DenseStore::Options dopt;
  dopt.size = kDenseSize;
  Config defaults;
  ApplyConfigDefaults(&defaults);
  dopt.optimizer = Optimizer::Create(defaults.dense_optimizer()).value();
  auto twin_dense = DenseStore::Create(dopt).value();
  twin_dense->Set(dense_init.data());

  // Pull of step t+1 overlaps the push of step t.
  std::vector<float> rows(1000 * kRowDim), dense(kDenseSize);
  std::vector<int64_t> ids(universe.begin(), universe.begin() + 1000);
  std::shared_ptr<PsFuture> pull = client->PullAsync(ids, rows.data(), dense.data());
  for (int step = 1; step <= 40; ++step) {
    ASSERT_TRUE(pull->Wait().ok());
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    const std::vector<float> dense_grad = RandomValues(&rng, kDenseSize);
    client->PushAsync(ids, grads.data(), dense_grad.data(), step);
    ASSERT_TRUE(twin->Apply(ids, grads.data(), step).ok());
    twin_dense->Apply(dense_grad.data(), step);
    for (auto& id : ids) id = universe[rng.Uniform(universe.size())];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    pull = client->PullAsync(ids, rows.data(), dense.data());
  }
  ASSERT_TRUE(pull->Wait().ok());
  ASSERT_TRUE(client->Flush().ok());

  std::vector<float> got(universe.size() * kRowDim), want(universe.size() * kRowDim);
  std::vector<float> got_dense(kDenseSize), want_dense(kDenseSize);
  ASSERT_TRUE(client->Pull(universe, got.data(), got_dense.data()).ok());
  ASSERT_TRUE(twin->Gather(universe, want.data()).ok());
  twin_dense->Get(want_dense.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(got_dense.data(), want_dense.data(), kDenseSize * sizeof(float)));
  EXPECT_NE(0, std::memcmp(got.data(), init.data(), got.size() * sizeof(float)));

  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const ShardStats& s : *stats) EXPECT_EQ(s.push_requests(), 40);
  std::printf("%s\n", FormatShardBalance(*stats).c_str());

  client.reset();
  for (auto& s : shards) ASSERT_NO_FATAL_FAILURE(s.StopCleanly());
}

TEST(PsProcess, KilledShardFailsFastAndRestartedShardIsReachedThroughRetries) {
  PsProcess shards[2];
  for (int s = 0; s < 2; ++s) ASSERT_NO_FATAL_FAILURE(shards[s].Start(s, 2, 0));
  const std::vector<std::string> addresses = {shards[0].address(), shards[1].address()};
  // fast: a short budget, to see the failure. patient: retries long enough to outlive a restart.
  PsClient::Options fast_options = ClientOptions(addresses);
  fast_options.rpc_deadline_ms = 500;
  auto fast = MakeClient(fast_options);
  PsClient::Options patient_options = ClientOptions(addresses);
  patient_options.rpc_retries = 100000;
  patient_options.call_deadline_ms = kStartMs;
  auto patient = MakeClient(patient_options);
  ASSERT_TRUE(fast != nullptr && patient != nullptr);

  Rng rng(9);
  const std::vector<int64_t> probe = UniqueIds(&rng, 2000);
  const size_t n = probe.size() * kRowDim;
  std::vector<float> fresh(n), trained(n), got(n);
  ASSERT_TRUE(fast->Pull(probe, fresh.data(), nullptr).ok());
  for (int step = 1; step <= 5; ++step) {
    const std::vector<float> grads = RandomValues(&rng, n);
    ASSERT_TRUE(fast->Push(probe, grads.data(), nullptr, step).ok());
  }
  ASSERT_TRUE(fast->Pull(probe, trained.data(), nullptr).ok());

  ASSERT_NO_FATAL_FAILURE(shards[1].Kill());
  const absl::Time start = absl::Now();
  const absl::Status s = fast->Pull(probe, got.data(), nullptr);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("shard 1 (", addresses[1],
                                                               "): Pull failed after 4 attempts")));
  EXPECT_LT(took, absl::Seconds(4 * 0.5 + 2));  // 4 attempts of 500 ms at most, plus slack
  const std::vector<float> grads = RandomValues(&rng, n);
  const absl::Status push = fast->Push(probe, grads.data(), nullptr, 6);
  EXPECT_THAT(std::string(push.message()),
              HasSubstr("shard 1 (" + addresses[1] + "): Push failed"));
  EXPECT_FALSE(fast->Flush().ok());

  // A pull started while the shard is down completes once it is back on the same port.
  std::shared_ptr<PsFuture> pending = patient->PullAsync(probe, got.data(), nullptr);
  ASSERT_NO_FATAL_FAILURE(shards[1].Start(1, 2, shards[1].port()));
  const absl::Status recovered = pending->Wait();
  ASSERT_TRUE(recovered.ok()) << recovered;
  EXPECT_GE(patient->traffic().retries, 1);
  // Rows on the restarted shard are fresh again (no checkpoint restore yet); shard 0 kept its
  // training. The failed push of step 6 reached shard 0 only.
  const PartitionMap map(kRows, kPartitions, 2);
  int on_shard1 = 0;
  for (size_t i = 0; i < probe.size(); ++i) {
    const float* row = got.data() + i * kRowDim;
    if (map.ShardOf(probe[i]) == 1) {
      ++on_shard1;
      EXPECT_EQ(0, std::memcmp(row, fresh.data() + i * kRowDim, kRowDim * sizeof(float)));
    } else {
      EXPECT_NE(0, std::memcmp(row, fresh.data() + i * kRowDim, kRowDim * sizeof(float)));
    }
  }
  EXPECT_GT(on_shard1, 500);

  // The fast client recovers too, and notices the restart.
  ASSERT_TRUE(fast->WaitForShards(absl::Seconds(30)).ok());
  ASSERT_TRUE(fast->Pull(probe, got.data(), nullptr).ok());
  EXPECT_EQ(fast->shard_restarts(), 1);
  ASSERT_TRUE(fast->Push(probe, grads.data(), nullptr, 7).ok());

  fast.reset();
  patient.reset();
  for (auto& sh : shards) ASSERT_NO_FATAL_FAILURE(sh.StopCleanly());
}

}  // namespace
}  // namespace pstrain
