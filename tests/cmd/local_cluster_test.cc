// `pstrain local --hosts N`: real processes (the launcher and N `pstrain host`) on loopback, every
// wait bounded, nothing left running.
#include <dirent.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using testing::ProcessesMentioning;
using testing::RunToExit;
using ::testing::HasSubstr;
using testing::ReadSummary;
using testing::RunLocal;
using testing::Subprocess;

constexpr int kTrainRows = 20000;

// Per process: CTest runs the tests of this file in parallel processes.
std::string Dir() { return absl::StrCat(::testing::TempDir(), "/local_cluster_", getpid()); }

class LocalClusterTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
    // 4 train files: by-file sharding gives each of 2 or 3 hosts at least one.
    ASSERT_EQ(testing::Datagen(kTrainRows, 4, 1, Dir() + "/train"), 0);
    ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
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
  // A per-tower batch (no global batch): each push is a full update batch, not a share of one,
  // and the sparse rate is the configured one.
  EXPECT_EQ(f.count("sparse_lr_factor"), 0u);
  EXPECT_THAT(f.at("checkpoint").string_value(), ::testing::StartsWith(model_dir + "/ckpt-"));
  // Hosts i > 0 keep their own logs; only the chief writes the summary.
  for (int i = 1; i < hosts; ++i) {
    const std::string host_dir = absl::StrCat(model_dir, "/host-", i);
    EXPECT_TRUE(PathExists(host_dir + "/output.log"));
    EXPECT_TRUE(PathExists(host_dir + "/metrics.jsonl"));
    EXPECT_FALSE(PathExists(host_dir + "/summary.json"));
  }
}

INSTANTIATE_TEST_SUITE_P(Hosts, LocalClusterTest, ::testing::Values(2, 3));

std::string Latest(const std::string& dir) {
  auto text = ReadFileToString(dir + "/LATEST");
  return text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : "";
}

// Spot preemption: SIGTERM makes every host join one checkpoint round and exit 0; the same
// command then resumes from it and trains exactly the records that were left: every record
// once per epoch over the two runs, none twice, none skipped. With cluster.dense_sync_steps=3,
// so that the round also flushes a partial block of dense gradients.
TEST_F(LocalClusterTest, SigtermCheckpointsAndTheResumeTrainsEveryRecordOnce) {
  const std::string model_dir = Dir() + "/model_sigterm";
  // Long enough that the signal lands mid-job: the job trains ~250k examples/s on this tiny
  // model, so 12 epochs (240k examples) could end within the second before the signal.
  const int epochs = 48;
  std::vector<std::string> args = LocalArgs(2, epochs, model_dir);
  args.insert(args.end(), {"--set", "cluster.dense_sync_steps=3"});
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(args, &error)) << error;
  // Host 0 prints this on the launcher's stdout once every shard is up and training starts.
  ASSERT_THAT(local.ReadLineContaining("host 0/2 ready", 60000), ::testing::HasSubstr("training"));
  // Let it train a little (progress goes to stderr); whenever the signal lands, the checks below
  // hold, and the examples check says if the job was already over.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(local.Signal(SIGTERM));
  const int status = local.WaitExit(120000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
  const std::string ckpt = Latest(model_dir);
  ASSERT_THAT(ckpt, ::testing::StartsWith("ckpt-"));
  for (const char* f : {"MANIFEST", "shard-0-of-2", "shard-1-of-2", "worker-0.state",
                        "worker-1.state"}) {
    EXPECT_TRUE(PathExists(model_dir + "/" + ckpt + "/" + f)) << f;
  }
  const auto stopped = ReadSummary(model_dir).fields();
  EXPECT_TRUE(stopped.at("preempted").bool_value());
  EXPECT_LT(stopped.at("examples").number_value(), kTrainRows * epochs)
      << "the job finished before the signal: make it longer";

  ASSERT_EQ(RunToExit(args, 240000), 0);
  const auto f = ReadSummary(model_dir).fields();
  EXPECT_FALSE(f.at("preempted").bool_value());
  EXPECT_EQ(f.at("examples").number_value(), kTrainRows * epochs);
  EXPECT_GT(f.at("test_auc").number_value(), 0.6);
  auto host1 = ReadFileToString(model_dir + "/host-1/output.log");
  ASSERT_TRUE(host1.ok());
  EXPECT_THAT(*host1, ::testing::HasSubstr("resumed from " + model_dir + "/" + ckpt));
}

// Checkpoints of a 3-host job restore onto 2 and onto 4 hosts (the rows re-partitioned); a
// corrupt shard file makes every host refuse that checkpoint and fall back to the one before.
TEST_F(LocalClusterTest, CheckpointsRestoreOntoOtherHostCountsAndCorruptionFallsBack) {
  const std::string model_dir = Dir() + "/model_repartition";
  std::vector<std::string> args = LocalArgs(3, 1, model_dir);
  args.insert(args.end(), {"--set", "checkpoint.every_steps=10", "--set", "checkpoint.keep=5"});
  ASSERT_EQ(RunToExit(args, 240000), 0);
  const std::string last = Latest(model_dir);
  ASSERT_THAT(last, ::testing::StartsWith("ckpt-"));
  EXPECT_TRUE(PathExists(model_dir + "/" + last + "/shard-2-of-3"));
  const double examples = ReadSummary(model_dir).fields().at("examples").number_value();
  EXPECT_EQ(examples, kTrainRows);

  // Flip one byte in the middle of a shard file of the newest checkpoint.
  const std::string victim = model_dir + "/" + last + "/shard-1-of-3";
  auto bytes = ReadFileToString(victim);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(victim, *bytes).ok());

  for (int hosts : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(hosts, " hosts"));
    const std::string dir = absl::StrCat(Dir(), "/model_restore_", hosts);
    ASSERT_EQ(std::system(absl::StrCat("rm -rf ", dir, " && cp -r ", model_dir, " ", dir).c_str()),
              0);
    std::vector<std::string> more = LocalArgs(hosts, 2, dir);  // one more epoch
    ASSERT_EQ(RunToExit(more, 240000), 0);
    auto host1 = ReadFileToString(dir + "/host-1/output.log");
    ASSERT_TRUE(host1.ok());
    EXPECT_THAT(*host1, ::testing::HasSubstr("refusing checkpoint " + dir + "/" + last));
    EXPECT_THAT(*host1, ::testing::HasSubstr(absl::StrCat("restored from ", dir, "/ckpt-")));
    EXPECT_THAT(*host1, ::testing::HasSubstr("(3 shards)"));
    // Another number of readers cannot continue the data positions: it starts the data over.
    EXPECT_THAT(*host1, ::testing::HasSubstr("the data starts from the beginning"));
    const auto f = ReadSummary(dir).fields();
    EXPECT_EQ(f.at("examples").number_value(), 2 * kTrainRows);
    EXPECT_GT(f.at("test_auc").number_value(), 0.6);
    EXPECT_THAT(Latest(dir), ::testing::StrNe(last));
  }
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
}

// Separate processes: 2 `pstrain ps` shards and 3 `pstrain worker`s (more workers than shards).
// The chief coordinates through shard 0 by RPC like every other worker; the job trains every
// record once, writes a checkpoint of both shards and all three worker states, and a second
// job resumes from it.
TEST_F(LocalClusterTest, SeparatePsAndWorkerProcesses) {
  const std::string model_dir = Dir() + "/model_separate";
  std::vector<std::string> job = LocalArgs(2, 1, model_dir);
  job.erase(job.begin() + 1, job.begin() + 4);  // "local --hosts 2"
  auto run_job = [&]() {
    std::vector<std::unique_ptr<Subprocess>> shards;
    std::vector<std::string> addresses;
    for (int s = 0; s < 2; ++s) {
      std::vector<std::string> argv = job;
      argv.insert(argv.begin() + 1, {"ps", "--shard", absl::StrCat(s), "--num_shards", "2",
                                     "--num_workers", "3", "--port", "0", "--bind",
                                     "127.0.0.1"});
      shards.push_back(std::make_unique<Subprocess>());
      std::string error;
      EXPECT_TRUE(shards.back()->Start(argv, &error)) << error;
      const std::string line = shards.back()->ReadLineContaining("listening on", 60000);
      addresses.push_back(line.substr(line.rfind(' ') + 1));
    }
    std::vector<std::unique_ptr<Subprocess>> workers;
    for (int w = 0; w < 3; ++w) {
      std::vector<std::string> argv = job;
      argv.insert(argv.begin() + 1, {"worker", "--ps", absl::StrCat(addresses[0], ",",
                                                                   addresses[1]),
                                     "--index", absl::StrCat(w), "--num_workers", "3",
                                     "--cores", "1"});
      workers.push_back(std::make_unique<Subprocess>());
      std::string error;
      EXPECT_TRUE(workers.back()->Start(argv, &error)) << error;
    }
    for (auto& w : workers) {
      const int status = w->WaitExit(240000);
      EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    for (auto& s : shards) {
      s->Signal(SIGTERM);
      const int status = s->WaitExit(30000);
      EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
  };
  run_job();
  const std::string ckpt = Latest(model_dir);
  ASSERT_THAT(ckpt, ::testing::StartsWith("ckpt-"));
  for (const char* f : {"shard-0-of-2", "shard-1-of-2", "worker-0.state", "worker-1.state",
                        "worker-2.state"}) {
    EXPECT_TRUE(PathExists(model_dir + "/" + ckpt + "/" + f)) << f;
  }
  auto f = ReadSummary(model_dir).fields();
  EXPECT_EQ(f.at("examples").number_value(), kTrainRows);
  EXPECT_EQ(f.at("examples_this_run").number_value(), kTrainRows);
  EXPECT_GT(f.at("test_auc").number_value(), 0.6);
  EXPECT_TRUE(PathExists(model_dir + "/worker-2/metrics.jsonl"));

  // The same job again: its pass over this data finished, so every worker has nothing to train
  // (worker/train/data_pass.h), and summary.json stays the finished job's.
  const auto summary = ReadFileToString(model_dir + "/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  run_job();
  EXPECT_EQ(ReadFileToString(model_dir + "/summary.json").value_or(""), *summary);
  EXPECT_EQ(Latest(model_dir), ckpt);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
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
  // Host 1 leaves at once on SIGTERM: it is still waiting for shard 0, not training.
  const int status = local.WaitExit(8000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
}

// Issue 4: SYNC mode with deterministic data matches single-process training with the same
// global batch. Record sharding without any shuffle gives worker w of 2 the records w, w + 2, ...
// in file order, so the union of the workers' step-j batches (B each) is exactly the single
// process's step-j batch (2 towers x B). The shards apply the mean of the two workers' batch
// means, which is the global batch mean; optimizer steps (Adam's bias correction, Adagrad's
// accumulators) see the same step numbers. Only the order of float sums differs (per worker vs
// per tower), hence a tolerance instead of equality.
TEST_F(LocalClusterTest, SyncMatchesSingleProcessTrainingWithTheGlobalBatch) {
  const std::string single_dir = Dir() + "/model_single";
  const std::string sync_dir = Dir() + "/model_sync";
  const std::vector<std::string> deterministic = {
      "--set", "data.shuffle_buffer=0",          "--set", "data.shuffle_files=false",
      "--set", "data.train[0].shard_policy=SHARD_BY_RECORD", "--set", "train.batch_size=250",
      "--set", "threads.intra_op_threads=1"};
  // kTrainRows / 500 = 40 full global batches.
  std::vector<std::string> single = {PSTRAIN_BINARY, "train", "--train", Dir() + "/train/part-*",
                                     "--eval", Dir() + "/test/part-*", "--epochs", "1",
                                     "--model_dir", single_dir, "--set", "model.hidden=[32]",
                                     "--set", "features.categorical_vocab_size=20000", "--set",
                                     "threads.towers=2"};
  single.insert(single.end(), deterministic.begin(), deterministic.end());
  ASSERT_EQ(RunToExit(single, 240000), 0);

  std::vector<std::string> sync = LocalArgs(2, 1, sync_dir);
  sync.insert(sync.end(), deterministic.begin(), deterministic.end());
  sync.insert(sync.end(), {"--set", "threads.towers=1", "--set", "cluster.consistency=SYNC"});
  RunLocal(sync, sync_dir);

  const auto s = ReadSummary(single_dir).fields();
  const auto p = ReadSummary(sync_dir).fields();
  ASSERT_TRUE(s.count("test_auc") && p.count("test_auc"));
  EXPECT_EQ(s.at("steps").number_value(), kTrainRows / 500);
  EXPECT_EQ(p.at("steps").number_value(), 2 * kTrainRows / 500);  // summed over the workers
  EXPECT_EQ(p.at("examples").number_value(), kTrainRows);
  EXPECT_EQ(p.at("mode").string_value(), "ps-sync");
  EXPECT_EQ(p.at("staleness_max").number_value(), 0);
  const double auc = s.at("test_auc").number_value();
  const double logloss = s.at("test_logloss").number_value();
  EXPECT_GT(auc, 0.6);  // it learned something, so the comparison means something
  // The two runs sum the same gradients in another order (two towers' sum vs the shards' mean of
  // two pushes), so they agree to rounding, not bit for bit. Tolerances from measurements
  // (docs/PERFORMANCE.md, "Tolerances that depend on summation order"):
  //   - logloss, a smooth function of the weights: relative differences of 1e-9 to 3e-9 on the
  //     avx2 and avx512 paths (AMD EPYC Zen 4), while one step fewer moves it by 3e-2. 1e-6 is
  //     300x the noise and 3e4x below that smallest real change.
  //   - AUC, a rank statistic: a rounding change flips near-tied pairs of eval scores, each worth
  //     about 1.4e-6 here (~480 x 1520 pairs). Measured: 0 on Zen 4 (both paths), 1.1e-5 relative
  //     on an AVX2-only Zen 3 (about 6 flips); one step fewer moves it by 3e-3. 1e-4 allows ~9x
  //     the worst seen and is 30x below that smallest real change.
  std::printf("relative differences: auc %.3g logloss %.3g (isa %s)\n",
              std::fabs(p.at("test_auc").number_value() - auc) / auc,
              std::fabs(p.at("test_logloss").number_value() - logloss) / logloss,
              p.at("isa").string_value().c_str());
  EXPECT_NEAR(p.at("test_auc").number_value(), auc, 1e-4 * auc);
  EXPECT_NEAR(p.at("test_logloss").number_value(), logloss, 1e-6 * logloss);
}

// Issue 4: SIGTERM mid-run in SYNC mode, then the same command: the final model equals an
// uninterrupted run's (the same test AUC and logloss to the last bit: the shards apply the same
// means in the same order), and every record is trained once. Every worker pauses at one common
// step, so the checkpoint is a state the uninterrupted run also passed through.
TEST_F(LocalClusterTest, SyncSigtermAndResumeEqualsAnUninterruptedRun) {
  const std::vector<std::string> deterministic = {
      "--set", "data.shuffle_buffer=0", "--set", "data.shuffle_files=false",
      "--set", "data.train[0].shard_policy=SHARD_BY_RECORD", "--set", "threads.towers=1",
      "--set", "threads.intra_op_threads=1", "--set", "cluster.consistency=SYNC"};
  const int epochs = 10;
  auto args = [&](const std::string& dir) {
    std::vector<std::string> a = LocalArgs(2, epochs, dir);
    a.insert(a.end(), deterministic.begin(), deterministic.end());
    return a;
  };
  const std::string whole = Dir() + "/model_sync_whole";
  RunLocal(args(whole), whole);

  // The interrupted job also checkpoints on a schedule: rounds at a common step, no deadlock.
  const std::string parts = Dir() + "/model_sync_parts";
  std::vector<std::string> scheduled = args(parts);
  scheduled.insert(scheduled.end(), {"--set", "checkpoint.every_steps=7"});
  testing::RunLocalUntilSigterm(scheduled, 1500);
  const auto stopped = ReadSummary(parts).fields();
  EXPECT_TRUE(stopped.at("preempted").bool_value());
  EXPECT_LT(stopped.at("examples").number_value(), kTrainRows * epochs)
      << "the job finished before the signal: make it longer";
  RunLocal(scheduled, parts);

  const auto w = ReadSummary(whole).fields();
  const auto p = ReadSummary(parts).fields();
  EXPECT_EQ(p.at("examples").number_value(), kTrainRows * epochs);
  EXPECT_EQ(p.at("steps").number_value(), w.at("steps").number_value());
  EXPECT_GT(w.at("test_auc").number_value(), 0.6);
  EXPECT_EQ(p.at("test_auc").number_value(), w.at("test_auc").number_value());
  EXPECT_EQ(p.at("test_logloss").number_value(), w.at("test_logloss").number_value());
}

// Uneven data: by-file sharding of 4 files over 3 hosts gives host 0 twice the records of the
// others. The workers that run out say so (worker_done), and the last one trains on alone.
void ExpectUnevenDataDoesNotHang(const std::vector<std::string>& local_args,
                                 const std::string& mode, const std::string& model_dir) {
  std::vector<std::string> args = local_args;
  args.insert(args.end(), {"--set", "threads.towers=1", "--set",
                           "cluster.consistency=" + mode, "--set", "cluster.staleness=2"});
  RunLocal(args, model_dir);
  const auto f = ReadSummary(model_dir).fields();
  EXPECT_EQ(f.at("examples").number_value(), kTrainRows);
  EXPECT_GT(f.at("test_auc").number_value(), 0.6);
  const std::string lower = mode == "SYNC" ? "ps-sync" : "ps-bounded";
  EXPECT_EQ(f.at("mode").string_value(), lower);
  // The bound holds for every training pull of every worker.
  EXPECT_LE(f.at("staleness_max").number_value(), mode == "SYNC" ? 0 : 2);
}

TEST_F(LocalClusterTest, UnevenDataDoesNotHangSync) {
  const std::string model_dir = Dir() + "/model_uneven_sync";
  ExpectUnevenDataDoesNotHang(LocalArgs(3, 1, model_dir), "SYNC", model_dir);
}

TEST_F(LocalClusterTest, UnevenDataDoesNotHangBounded) {
  const std::string model_dir = Dir() + "/model_uneven_bounded";
  ExpectUnevenDataDoesNotHang(LocalArgs(3, 1, model_dir), "BOUNDED", model_dir);
}

}  // namespace
}  // namespace pstrain
