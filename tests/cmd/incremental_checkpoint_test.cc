// checkpoint.incremental_every with real processes: `pstrain train` and `pstrain local --hosts 2`
// write deltas between full checkpoints, a job resumes from a delta chain, and the final
// parameters equal an uninterrupted run's to the bit (read back through the one parameter loader,
// ServingModel::FromCheckpoint over each checkpoint's chain). Every wait is bounded, nothing is
// left running.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving/serving_model.h"
#include "tests/cmd/job_files.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::ProcessesMentioning;
using testing::ReadSummary;
using testing::RunLocal;
using testing::RunToExit;
using testing::Subprocess;

constexpr int kTrainRows = 20000;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/incremental_", getpid()); }

class IncrementalCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
    ASSERT_EQ(testing::Datagen(kTrainRows, 4, 1, Dir() + "/train"), 0);
    ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }
};

// The model of the checkpoint LATEST names in `model_dir`, read with its chain.
std::unique_ptr<ServingModel> ReadLatestModel(const std::string& model_dir,
                                              CheckpointChoice* choice_out = nullptr) {
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  if (!choice.ok() || !choice->has_value()) return nullptr;
  auto model = ServingModel::FromCheckpoint((*choice)->chain, (*choice)->manifest.model());
  EXPECT_TRUE(model.ok()) << model.status();
  if (choice_out != nullptr) *choice_out = **choice;
  return model.ok() ? *std::move(model) : nullptr;
}

// Every trained row (ids and weights) and the dense vector agree to the bit.
void ExpectSameParameters(const ServingModel& a, const ServingModel& b) {
  const EmbeddingSnapshot ra = a.StoredRows(0, a.table_rows());
  const EmbeddingSnapshot rb = b.StoredRows(0, b.table_rows());
  EXPECT_GT(ra.rows(), 1000);  // it trained: the comparison means something
  EXPECT_EQ(ra.ids, rb.ids);
  EXPECT_TRUE(ra.weights == rb.weights) << "row weights differ";
  EXPECT_TRUE(a.dense() == b.dense()) << "dense weights differ";
}

// Every kept checkpoint restores: its chain is whole (retention kept every link).
int DeltasKept(const std::string& model_dir) {
  int deltas = 0;
  for (const CheckpointEntry& e : ListCheckpoints(model_dir)) {
    auto chain = VerifyCheckpointChain(e.path);
    EXPECT_TRUE(chain.ok()) << chain.status();
    if (chain.ok() && chain->size() > 1) ++deltas;
  }
  return deltas;
}

std::vector<std::string> TrainArgs(const std::string& model_dir, int max_steps) {
  return {PSTRAIN_BINARY, "train", "--train", Dir() + "/train/part-*", "--model_dir", model_dir,
          "--set", "model.hidden=[32]", "--set", "features.categorical_vocab_size=20000", "--set",
          "train.batch_size=128", "--set", absl::StrCat("train.max_steps=", max_steps), "--set",
          "threads.towers=1", "--set", "checkpoint.every_seconds=0"};
}

// `pstrain train`: a job stopped at max_steps 21 after a full checkpoint and deltas every 2
// steps, then continued to 60 from its delta chain, ends with the parameters of an uninterrupted
// 60-step run that wrote no scheduled checkpoint: every row and the dense vector, to the bit.
TEST_F(IncrementalCheckpointTest, TrainResumedFromDeltasEqualsAnUninterruptedRun) {
  const std::string whole = Dir() + "/train_whole";
  ASSERT_EQ(RunToExit(TrainArgs(whole, 60), 240000), 0);

  const std::string parts = Dir() + "/train_parts";
  const std::vector<std::string> incremental = {"--set", "checkpoint.every_steps=2", "--set",
                                                "checkpoint.incremental_every=11", "--set",
                                                "checkpoint.keep=2"};
  std::vector<std::string> first = TrainArgs(parts, 21);
  first.insert(first.end(), incremental.begin(), incremental.end());
  ASSERT_EQ(RunToExit(first, 240000), 0);
  CheckpointChoice stopped;
  ASSERT_NE(ReadLatestModel(parts, &stopped), nullptr);
  EXPECT_EQ(stopped.manifest.step(), 21);
  ASSERT_TRUE(stopped.manifest.has_delta());  // 2 (full), 4 .. 20 (9 deltas), the final 21
  EXPECT_EQ(stopped.manifest.delta().base_step(), 2);
  EXPECT_EQ(stopped.manifest.delta().depth(), 10);
  EXPECT_EQ(stopped.chain.size(), 11u);
  std::vector<std::string> second = TrainArgs(parts, 60);
  second.insert(second.end(), incremental.begin(), incremental.end());
  ASSERT_EQ(RunToExit(second, 240000), 0);

  CheckpointChoice final_choice;
  auto a = ReadLatestModel(whole);
  auto b = ReadLatestModel(parts, &final_choice);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(final_choice.manifest.step(), 60);
  EXPECT_GT(final_choice.chain.size(), 1u);  // the final checkpoint is a delta
  ExpectSameParameters(*a, *b);
  EXPECT_GE(DeltasKept(parts), 2);
}

// `mpirun -np 2 pstrain allreduce`: rank 0 writes its replica's deltas; a job stopped at
// max_steps 11 (ckpt-2 full, ckpt-4 .. ckpt-10 and the final ckpt-11 deltas) and continued to 30
// from that chain ends with the parameters of an uninterrupted 30-step run, to the bit.
TEST_F(IncrementalCheckpointTest, AllreduceResumedFromDeltasEqualsAnUninterruptedRun) {
  auto args = [&](const std::string& model_dir, int max_steps, bool incremental) {
    std::vector<std::string> a = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"};
    std::vector<std::string> train = TrainArgs(model_dir, max_steps);
    train[1] = "allreduce";
    a.insert(a.end(), train.begin(), train.end());
    if (incremental) {
      a.insert(a.end(), {"--set", "checkpoint.every_steps=2", "--set",
                         "checkpoint.incremental_every=11"});
    }
    return a;
  };
  // Through sh (RunLogged), which finds mpirun on the PATH; its output goes to a log.
  auto run = [](const std::vector<std::string>& argv, const std::string& log) {
    const int status = testing::RunLogged(argv, log, 240000);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << ReadFileToString(log).value_or("(no log)");
  };
  const std::string whole = Dir() + "/allreduce_whole";
  run(args(whole, 30, false), Dir() + "/allreduce_whole.log");
  const std::string parts = Dir() + "/allreduce_parts";
  run(args(parts, 11, true), Dir() + "/allreduce_parts_1.log");
  CheckpointChoice stopped;
  ASSERT_NE(ReadLatestModel(parts, &stopped), nullptr);
  EXPECT_EQ(stopped.manifest.step(), 11);
  std::string links;
  for (const CheckpointLink& l : stopped.chain) links += " " + l.dir;
  // ckpt-2 (full), 4, 6, 8, 10, 11: no ckpt-0 (the step schedule skips a fresh job's step 0).
  EXPECT_EQ(stopped.chain.size(), 6u) << links;
  run(args(parts, 30, true), Dir() + "/allreduce_parts_2.log");
  CheckpointChoice final_choice;
  auto a = ReadLatestModel(whole);
  auto b = ReadLatestModel(parts, &final_choice);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(final_choice.manifest.step(), 30);
  EXPECT_GT(final_choice.chain.size(), 1u);
  ExpectSameParameters(*a, *b);
  EXPECT_EQ(ProcessesMentioning(parts), 0);
}

std::vector<std::string> LocalArgs(const std::string& model_dir, int epochs) {
  return {PSTRAIN_BINARY, "local", "--hosts", "2", "--train", Dir() + "/train/part-*", "--eval",
          Dir() + "/test/part-*", "--epochs", absl::StrCat(epochs), "--model_dir", model_dir,
          "--set", "model.hidden=[32]", "--set", "features.categorical_vocab_size=20000",
          "--set", "train.batch_size=256", "--set", "data.shuffle_buffer=0", "--set",
          "data.shuffle_files=false", "--set", "data.train[0].shard_policy=SHARD_BY_RECORD",
          "--set", "threads.towers=1", "--set", "threads.intra_op_threads=1", "--set",
          "cluster.consistency=SYNC", "--set", "checkpoint.every_seconds=0"};
}

// PS mode (2 hosts, SYNC, deterministic data): a job checkpointing every 3 steps with deltas
// (incremental_every 100: a full one, then deltas; the resumed run reaches the 100th and writes a
// full one again), stopped by SIGTERM and resumed from its delta chain, ends with the
// parameters of an uninterrupted run, to the bit, and the same test AUC and logloss. Every kept
// checkpoint's chain is whole; a corrupt newest checkpoint makes the choice fall back to the one
// before it.
TEST_F(IncrementalCheckpointTest, PsResumedFromDeltasEqualsAnUninterruptedRun) {
  const int epochs = 10;
  const std::string whole = Dir() + "/ps_whole";
  RunLocal(LocalArgs(whole, epochs), whole);

  const std::string parts = Dir() + "/ps_parts";
  std::vector<std::string> scheduled = LocalArgs(parts, epochs);
  scheduled.insert(scheduled.end(), {"--set", "checkpoint.every_steps=3", "--set",
                                     "checkpoint.incremental_every=100", "--set",
                                     "checkpoint.keep=2"});
  testing::RunLocalUntilSigterm(scheduled, 1500);
  EXPECT_LT(ReadSummary(parts).fields().at("examples").number_value(), kTrainRows * epochs)
      << "the job finished before the signal: make it longer";
  EXPECT_GE(DeltasKept(parts), 1);
  CheckpointChoice stopped;
  ASSERT_NE(ReadLatestModel(parts, &stopped), nullptr);
  EXPECT_GT(stopped.chain.size(), 2u) << "the stop's checkpoint is a delta of a chain";
  RunLocal(scheduled, parts);
  auto host1 = ReadFileToString(parts + "/host-1/output.log");
  ASSERT_TRUE(host1.ok());
  EXPECT_THAT(*host1, HasSubstr("delta(s))"));  // the restore read a chain

  const auto w = ReadSummary(whole).fields();
  const auto p = ReadSummary(parts).fields();
  EXPECT_EQ(p.at("steps").number_value(), w.at("steps").number_value());
  EXPECT_EQ(p.at("test_auc").number_value(), w.at("test_auc").number_value());
  EXPECT_EQ(p.at("test_logloss").number_value(), w.at("test_logloss").number_value());
  CheckpointChoice final_choice;
  auto a = ReadLatestModel(whole);
  auto b = ReadLatestModel(parts, &final_choice);
  ASSERT_TRUE(a && b);
  ExpectSameParameters(*a, *b);
  EXPECT_GE(DeltasKept(parts), 1);

  // A flipped byte in a shard file of the newest checkpoint: the choice falls back to the next
  // older one (a delta of a whole chain, or the full one).
  const std::string victim = final_choice.dir + "/shard-1-of-2";
  auto bytes = ReadFileToString(victim);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(victim, *bytes).ok());
  const std::vector<CheckpointEntry> kept = ListCheckpoints(parts);
  ASSERT_GE(kept.size(), 2u);
  ASSERT_EQ(kept[0].path, final_choice.dir);
  auto choice = ChooseCheckpoint(parts);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->dir, kept[1].path);
}

}  // namespace
}  // namespace pstrain
