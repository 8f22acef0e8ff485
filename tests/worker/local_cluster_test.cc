// `pstrain local --hosts N`: real processes (the launcher and N `pstrain host`) on loopback, every
// wait bounded, nothing left running.
#include <dirent.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using testing::ProcessesMentioning;
using testing::Subprocess;

constexpr int kTrainRows = 20000;

// Per process: CTest runs the tests of this file in parallel processes.
std::string Dir() { return absl::StrCat(::testing::TempDir(), "/local_cluster_", getpid()); }

int RunToExit(const std::vector<std::string>& argv, int timeout_ms) {
  std::string error;
  const int code = testing::RunToExit(argv, timeout_ms, &error);
  if (code < 0) ADD_FAILURE() << error;
  return code;
}

class LocalClusterTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
    // 4 train files: by-file sharding gives each of 2 or 3 hosts at least one.
    ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", absl::StrCat(kTrainRows), "--files", "4",
                   "--seed", "1", "--out", Dir() + "/train"},
                  120000),
              0);
    ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "2000", "--seed", "2", "--out",
                   Dir() + "/test"},
                  120000),
              0);
  }

  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  std::vector<std::string> LocalArgs(int hosts, int epochs, const std::string& model_dir) {
    return {PSTRAIN_BINARY, "local", "--hosts", absl::StrCat(hosts), "--train",
            Dir() + "/train/part-*", "--eval", Dir() + "/test/part-*", "--epochs",
            absl::StrCat(epochs), "--model_dir", model_dir, "--set", "model.hidden=[32]", "--set",
            "features.categorical_vocab_size=20000", "--set", "train.batch_size=256"};
  }
};

TEST_P(LocalClusterTest, TrainsEveryRecordOnceAndLearns) {
  const int hosts = GetParam();
  const int epochs = 2;
  const std::string model_dir = absl::StrCat(Dir(), "/model_", hosts);
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(LocalArgs(hosts, epochs, model_dir), &error)) << error;
  const std::string done = local.ReadLineContaining("pstrain local: done", 240000);
  EXPECT_THAT(done, ::testing::HasSubstr("test AUC"));
  const int status = local.WaitExit(60000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);

  auto text = ReadFileToString(model_dir + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status();
  google::protobuf::Struct summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &summary).ok()) << *text;
  const auto& f = summary.fields();
  EXPECT_EQ(f.at("mode").string_value(), "ps-async");
  EXPECT_EQ(f.at("hosts").number_value(), hosts);
  EXPECT_EQ(f.at("examples").number_value(), kTrainRows * epochs);  // every record, once per epoch
  EXPECT_EQ(f.at("eval_examples").number_value(), 2000);
  EXPECT_GT(f.at("test_auc").number_value(), 0.6);
  EXPECT_EQ(f.at("checkpoint").string_value(), "");
  // Hosts i > 0 keep their own logs; only the chief writes the summary.
  for (int i = 1; i < hosts; ++i) {
    const std::string host_dir = absl::StrCat(model_dir, "/host-", i);
    EXPECT_TRUE(PathExists(host_dir + "/output.log"));
    EXPECT_TRUE(PathExists(host_dir + "/metrics.jsonl"));
    EXPECT_FALSE(PathExists(host_dir + "/summary.json"));
  }
}

INSTANTIATE_TEST_SUITE_P(Hosts, LocalClusterTest, ::testing::Values(2, 3));

TEST_F(LocalClusterTest, SigtermStopsEveryHost) {
  const std::string model_dir = Dir() + "/model_sigterm";
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(LocalArgs(2, 1000, model_dir), &error)) << error;
  // Host 0 prints this on the launcher's stdout once every shard is up and training starts.
  ASSERT_THAT(local.ReadLineContaining("host 0/2 ready", 60000), ::testing::HasSubstr("training"));
  ASSERT_TRUE(local.Signal(SIGTERM));
  const int status = local.WaitExit(60000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
  // The chief may have written a summary of the stopped run: it must say so.
  if (auto text = ReadFileToString(model_dir + "/summary.json"); text.ok()) {
    EXPECT_THAT(*text, ::testing::HasSubstr("\"preempted\":true"));
  }
}

TEST_F(LocalClusterTest, AFailingHostStopsTheOthers) {
  // An eval path that does not exist fails host 0 (the chief); the launcher must stop host 1,
  // which is waiting for shard 0 (or for the end of the job) and would otherwise wait minutes.
  const std::string model_dir = Dir() + "/model_fail";
  std::vector<std::string> args = LocalArgs(2, 1, model_dir);
  args[7] = Dir() + "/no_such_test/part-*";
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(args, &error)) << error;
  // Well within the launcher's 10 s SIGTERM -> SIGKILL grace: host 1 leaves at once on SIGTERM.
  const int status = local.WaitExit(8000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
}

}  // namespace
}  // namespace pstrain
