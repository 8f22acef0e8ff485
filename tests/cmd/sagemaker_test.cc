// SageMaker's container contract (cmd/sagemaker.h) with the real binary in fake /opt/ml trees
// (PSTRAIN_SAGEMAKER_ROOT): a 2-host PS job end to end, the model in SM_MODEL_DIR, channels and
// hyperparameters from the tree, spot checkpoints in /opt/ml/checkpoints, and the failure file.
#include "cmd/sagemaker.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/metrics/http_scrape.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RunShell;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/sagemaker_", getpid()); }
const std::string kBin = PSTRAIN_BINARY;

TEST(HyperparametersTest, MapToFlagsAndSets) {
  SageMakerContract c;
  ASSERT_TRUE(ParseHyperparameters(
                  R"({"train.batch_size": "64", "data.train[0].weight": "2", "epochs": "3",)"
                  R"( "format": "tfrecord", "config": "/a.textproto,/b.textproto",)"
                  R"( "sagemaker_program": "x", "_tuning_objective_metric": "auc"})",
                  "hp.json", &c)
                  .ok());
  EXPECT_THAT(c.sets, ElementsAre("data.train[0].weight=2", "train.batch_size=64"));
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.format, "tfrecord");
  EXPECT_THAT(c.config_files, ElementsAre("/a.textproto", "/b.textproto"));
}

TEST(HyperparametersTest, HostileInputIsNamed) {
  SageMakerContract c;
  EXPECT_THAT(ParseHyperparameters("[1]", "hp.json", &c).message(),
              HasSubstr("hp.json: expected a JSON object"));
  EXPECT_THAT(ParseHyperparameters("{", "hp.json", &c).message(), HasSubstr("valid JSON"));
  EXPECT_THAT(ParseHyperparameters(R"({"train.batch_size": 64})", "hp.json", &c).message(),
              HasSubstr("hp.json \"train.batch_size\": expected a string value"));
  EXPECT_THAT(ParseHyperparameters(R"({"learning_rate": "0.1"})", "hp.json", &c).message(),
              HasSubstr("hp.json \"learning_rate\": expected \"config\", \"format\", \"epochs\" "
                        "or a config field path"));
  EXPECT_THAT(ParseHyperparameters(R"({"epochs": "-1"})", "hp.json", &c).message(),
              HasSubstr("a positive integer, got '-1'"));
}

using testing::FreePort;

// One SageMaker instance's /opt/ml: resourceconfig.json, hyperparameters.json, inputdataconfig.json
// and its own copy of the train and eval channels (FullyReplicated).
void MakeTree(const std::string& root, const std::string& current, const std::string& hosts,
              const std::string& hyperparameters) {
  std::string out;
  ASSERT_TRUE(MakeDirs(root + "/opt/ml/input/config").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/opt/ml/input/config/resourceconfig.json",
                              absl::StrCat(R"({"current_host": ")", current, R"(", "hosts": )",
                                           hosts, R"(, "network_interface_name": "eth0"})"))
                  .ok());
  ASSERT_TRUE(
      WriteFileAtomic(root + "/opt/ml/input/config/hyperparameters.json", hyperparameters).ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/opt/ml/input/config/inputdataconfig.json",
                              R"({"train": {"TrainingInputMode": "File", "S3DistributionType": )"
                              R"("FullyReplicated"}, "validation": {"TrainingInputMode": "File"}})")
                  .ok());
  ASSERT_EQ(RunShell("mkdir -p " + root + "/opt/ml/input/data && cp -r " + Dir() + "/train " +
                         root + "/opt/ml/input/data/train && cp -r " + Dir() + "/test " + root +
                         "/opt/ml/input/data/validation",
                     30, &out),
            0)
      << out;
}

const char kHyperparameters[] =
    R"({"features.categorical_vocab_size": "2000", "model.hidden": "[8]",)"
    R"( "train.batch_size": "64", "threads.towers": "1", "threads.intra_op_threads": "1",)"
    R"( "threads.inter_op_threads": "1", "epochs": "1", "format": "criteo_tsv",)"
    R"( "sagemaker_program": "unused", "sagemaker_submit_directory": "unused"})";

class SageMakerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string out;
    ASSERT_EQ(RunShell("rm -rf " + Dir(), 30, &out), 0);
    ASSERT_EQ(RunShell(kBin + " datagen --rows 1000 --files 2 --seed 1 --out " + Dir() + "/train",
                       120, &out),
              0)
        << out;
    ASSERT_EQ(RunShell(kBin + " datagen --rows 300 --seed 2 --out " + Dir() + "/test", 120, &out), 0)
        << out;
  }
  static void TearDownTestSuite() {
    std::string out;
    RunShell("rm -rf " + Dir(), 30, &out);
  }
};

// Two instances, each with its own /opt/ml (their host names are loopback addresses so that both
// run here), `pstrain host` and nothing else on the command line but the port and the bind
// address: hosts, channels, hyperparameters and the model dir come from the trees. Checkpoints go
// to a shared directory, as a multi-host PS job on SageMaker needs (FSx / EFS; docs/DEPLOY.md).
TEST_F(SageMakerTest, TwoHostJobRunsFromTheOptMlTreesAlone) {
  const std::string hosts = R"(["127.0.0.1", "127.0.0.2"])";
  const std::string a = Dir() + "/algo-1", b = Dir() + "/algo-2";
  MakeTree(a, "127.0.0.1", hosts, kHyperparameters);
  MakeTree(b, "127.0.0.2", hosts, kHyperparameters);
  const int port = FreePort();
  const std::string shared = Dir() + "/fsx/checkpoints";
  auto host = [&](const std::string& root, const std::string& ip) {
    return absl::StrCat("PSTRAIN_SAGEMAKER_ROOT=", root, " ", kBin, " host --default_port ", port,
                        " --bind ", ip, " --set checkpoint.dir=", shared);
  };
  std::string out;
  const int code = RunShell("(" + host(b, "127.0.0.2") + " > " + Dir() + "/algo-2.log 2>&1 &) ; " +
                                host(a, "127.0.0.1") + "; rc=$?; wait; exit $rc",
                            300, &out);
  std::string log2;
  RunShell("cat " + Dir() + "/algo-2.log", 10, &log2);
  ASSERT_EQ(code, 0) << out << "\n--- algo-2:\n" << log2;
  EXPECT_THAT(out, HasSubstr("cluster from /opt/ml/input/config/resourceconfig.json"));

  // The chief's model, summary and effective config are in its /opt/ml/model (uploaded by
  // SageMaker), with the hyperparameters applied.
  auto summary = ReadFileToString(a + "/opt/ml/model/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status() << out;
  EXPECT_THAT(*summary, HasSubstr("\"examples\":1000"));
  EXPECT_THAT(*summary, HasSubstr("\"hosts\":2"));
  EXPECT_THAT(*summary, ::testing::Not(HasSubstr("\"test_auc\":nan")));
  auto config = LoadConfigFile(a + "/opt/ml/model/config.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->train().batch_size(), 64);
  EXPECT_EQ(config->model().hidden(0), 8);
  EXPECT_EQ(config->data().train(0).path(0), a + "/opt/ml/input/data/train");
  EXPECT_EQ(config->data().eval(0).name(), "validation");
  EXPECT_EQ(config->checkpoint().dir(), shared);
  EXPECT_FALSE(PathExists(a + "/opt/ml/output/failure"));
  EXPECT_FALSE(PathExists(b + "/opt/ml/output/failure"));
}

// Spot training: /opt/ml/checkpoints exists when the job has a checkpoint S3 URI; a single-host
// job checkpoints there (SageMaker syncs it) and resumes from it on restart.
TEST_F(SageMakerTest, SpotCheckpointsGoToOptMlCheckpoints) {
  const std::string root = Dir() + "/spot";
  MakeTree(root, "algo-1", R"(["algo-1"])", kHyperparameters);
  ASSERT_TRUE(MakeDirs(root + "/opt/ml/checkpoints").ok());
  std::string out;
  ASSERT_EQ(RunShell("PSTRAIN_SAGEMAKER_ROOT=" + root + " SM_MODEL_DIR=" + root +
                         "/sm_model " + kBin + " train",
                     300, &out),
            0)
      << out;
  EXPECT_TRUE(PathExists(root + "/opt/ml/checkpoints/LATEST")) << out;
  EXPECT_TRUE(PathExists(root + "/sm_model/summary.json")) << out;  // SM_MODEL_DIR wins
  const auto first_summary = ReadFileToString(root + "/sm_model/summary.json");
  ASSERT_TRUE(first_summary.ok());
  // The restarted job finds the checkpoint of its finished pass: nothing is trained twice, and
  // the summary stays the finished job's (worker/train/data_pass.h).
  ASSERT_EQ(RunShell("PSTRAIN_SAGEMAKER_ROOT=" + root + " SM_MODEL_DIR=" + root +
                         "/sm_model " + kBin + " train",
                     300, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("nothing to train: " + root + "/opt/ml/checkpoints/ckpt-"));
  auto summary = ReadFileToString(root + "/sm_model/summary.json");
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(*summary, *first_summary);
}

// A failure's reason reaches /opt/ml/output/failure (SageMaker's FailureReason).
TEST_F(SageMakerTest, FailuresWriteTheReasonToTheFailureFile) {
  const std::string root = Dir() + "/bad";
  MakeTree(root, "algo-1", R"(["algo-1"])", R"({"learning_rate": "0.1"})");
  std::string out;
  EXPECT_EQ(RunShell("PSTRAIN_SAGEMAKER_ROOT=" + root + " " + kBin + " train", 60, &out), 2);
  auto failure = ReadFileToString(root + "/opt/ml/output/failure");
  ASSERT_TRUE(failure.ok()) << failure.status() << out;
  EXPECT_THAT(*failure, HasSubstr("pstrain train: "));
  EXPECT_THAT(*failure, HasSubstr("hyperparameters.json \"learning_rate\""));
  EXPECT_THAT(*failure, HasSubstr("(exit code 2)"));
  // The message still reached stderr.
  EXPECT_THAT(out, HasSubstr("\"learning_rate\""));

  // `pstrain train` (SageMaker's default `train` argument) in a 2-host job says what to run.
  const std::string two = Dir() + "/two";
  MakeTree(two, "algo-1", R"(["algo-1", "algo-2"])", kHyperparameters);
  EXPECT_EQ(RunShell("PSTRAIN_SAGEMAKER_ROOT=" + two + " " + kBin + " train", 60, &out), 2);
  failure = ReadFileToString(two + "/opt/ml/output/failure");
  ASSERT_TRUE(failure.ok()) << out;
  EXPECT_THAT(*failure, HasSubstr("run `pstrain host` on every host"));
}

}  // namespace
}  // namespace pstrain
