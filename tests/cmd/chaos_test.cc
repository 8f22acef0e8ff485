// Dying processes: `pstrain local --hosts 3 --max_restarts 5` while a helper SIGKILLs a random
// host (its worker and its shard) three times at random moments. The job finishes by itself,
// restarted from its last checkpoint each time; it trains every record exactly as often as an
// uninterrupted run (no record twice after the checkpoint it resumed from: SYNC with a fixed
// data order is deterministic, so the steps, examples and the model's test metrics equal the
// uninterrupted run's); summary.json counts the restarts; no process is left.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::Cmdline;
using testing::ProcessesMentioning;
using testing::RunToExit;
using testing::ReadSummary;
using testing::Subprocess;

constexpr int kTrainRows = 20000;
constexpr int kEpochs = 12;
constexpr int kKills = 3;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/chaos_", getpid()); }

// The `pstrain host` processes of the job in `model_dir` (not the launcher).
std::vector<int> Hosts(const std::string& model_dir) {
  return testing::JobProcesses(model_dir, " host ");
}

std::string Latest(const std::string& dir) {
  auto text = ReadFileToString(dir + "/LATEST");
  return text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : "";
}

class ChaosTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
    ASSERT_EQ(testing::Datagen(kTrainRows, 3, 1, Dir() + "/train"), 0);
    ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::vector<std::string> Args(const std::string& model_dir) {
    return {PSTRAIN_BINARY, "local", "--hosts", "3", "--train", Dir() + "/train/part-*",
            "--eval", Dir() + "/test/part-*", "--epochs", absl::StrCat(kEpochs), "--model_dir",
            model_dir, "--kill_timeout_s", "30",
            // Deterministic: SYNC, records in a fixed order, one tower, no shuffle.
            "--set", "model.hidden=[32]", "--set", "features.categorical_vocab_size=20000",
            "--set", "train.batch_size=128", "--set", "data.shuffle_buffer=0", "--set",
            "data.shuffle_files=false", "--set", "data.train[0].shard_policy=SHARD_BY_RECORD",
            "--set", "threads.towers=1", "--set", "threads.intra_op_threads=1", "--set",
            "cluster.consistency=SYNC", "--set", "checkpoint.every_steps=20",
            // Peers' deaths are found in seconds.
            "--set", "cluster.lease_ms=3000", "--set", "cluster.rpc_deadline_ms=2000", "--set",
            "cluster.rpc_retries=2"};
  }
};

TEST_F(ChaosTest, KilledHostsAreRestartedAndTheJobEqualsAnUninterruptedRun) {
  const std::string whole = Dir() + "/whole";
  {
    Subprocess local;
    std::string error;
    ASSERT_TRUE(local.Start(Args(whole), &error)) << error;
    EXPECT_THAT(local.ReadLineContaining("pstrain local: done", 300000), HasSubstr("test AUC"));
    const int status = local.WaitExit(60000);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  const std::string chaos = Dir() + "/chaos";
  std::vector<std::string> args = Args(chaos);
  args.insert(args.begin() + 2, {"--max_restarts", "5"});
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(args, &error)) << error;
  // The launcher's stdout is read on its own thread, so that the pipe never fills.
  std::string done;
  std::thread reader([&] { done = local.ReadLineContaining("pstrain local: done", 600000); });

  std::mt19937 rng(static_cast<unsigned>(getpid()));
  std::vector<std::string> killed;
  std::string after = "";  // a kill waits for a checkpoint newer than this one
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(8);
  while (static_cast<int>(killed.size()) < kKills &&
         std::chrono::steady_clock::now() < deadline) {
    // Progress first: a checkpoint committed since the last kill (so that the job gains ground),
    // with every host of this incarnation up.
    const std::string latest = Latest(chaos);
    const std::vector<int> hosts = Hosts(chaos);
    if (latest.empty() || latest == after || hosts.size() != 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
    const int victim = hosts[rng() % hosts.size()];
    const std::string cmd = Cmdline(victim);
    if (cmd.empty()) continue;  // it ended meanwhile (the job may be over)
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    killed.push_back(cmd.substr(cmd.find("--index=")).substr(0, 9));
    after = Latest(chaos);
    // Wait for this incarnation's hosts to be gone before looking for the next one's.
    while (std::chrono::steady_clock::now() < deadline) {
      bool alive = false;
      for (int pid : hosts) alive = alive || kill(pid, 0) == 0;
      if (!alive) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  reader.join();
  const int status = local.WaitExit(120000);
  ASSERT_EQ(static_cast<int>(killed.size()), kKills)
      << "the job ended before " << kKills << " kills: make it longer";
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(done, HasSubstr("test AUC"));
  EXPECT_EQ(ProcessesMentioning(chaos), 0);
  std::fprintf(stderr, "killed: %s\n", absl::StrJoin(killed, ", ").c_str());

  const auto w = ReadSummary(whole).fields();
  const auto c = ReadSummary(chaos).fields();
  EXPECT_EQ(c.at("restarts").number_value(), kKills);
  ASSERT_EQ(c.at("restart_log").list_value().values_size(), kKills);
  EXPECT_THAT(c.at("restart_log").list_value().values(0).string_value(),
              HasSubstr("failed (signal 9)"));
  // Every record once per epoch, none twice after a resume: the same steps and examples, and
  // (SYNC, fixed order) the same model.
  EXPECT_EQ(c.at("examples").number_value(), kTrainRows * kEpochs);
  EXPECT_EQ(c.at("steps").number_value(), w.at("steps").number_value());
  EXPECT_GT(w.at("test_auc").number_value(), 0.6);
  EXPECT_NEAR(c.at("test_auc").number_value(), w.at("test_auc").number_value(), 0.002);
  EXPECT_NEAR(c.at("test_logloss").number_value(), w.at("test_logloss").number_value(), 0.002);
}

}  // namespace
}  // namespace pstrain
