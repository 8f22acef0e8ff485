// A run that diverges, in every command that trains (`pstrain train`, `pstrain allreduce`,
// `pstrain local`): real processes, every wait bounded, nothing left running. Each must stop
// within one step of the first non-finite loss with "training diverged at step N: loss is nan
// (last good checkpoint: ...)", exit non-zero without aborting, and leave LATEST naming a
// checkpoint written before the divergence whose parameters are all finite.
//
// The trigger: numeric field I1 in DENSE mode with NO_TRANSFORM, missing in every record but one,
// which carries I1 = 1e30. That value scales I1's embedding row (N(0, 0.01) entries, so about
// 1e28 each): the FM term's squares overflow float (3.4e38) to inf and inf - inf is NaN, whatever
// the learned parameters are, so the loss of exactly the step holding that record is NaN. Every
// other record is an ordinary synthetic Criteo row (the field's "missing" row, scale 1), and the
// data is read in order (no shuffle), so the steps before it are ordinary training and the step
// is known: record 700 with 64 records a step is in step 11.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "checkpoint/block_file.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/store/store_blocks.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessesLeft;
using testing::RunLogged;

constexpr int kRows = 2000;          // per train file
constexpr int kPoisonedRecord = 700;  // 0-based, in the first file
constexpr int kDivergedStep = 11;     // 64 records a step: records 640..703

// Per process: CTest runs the tests of this file in parallel processes.
std::string Dir() { return absl::StrCat(::testing::TempDir(), "/divergence_", getpid()); }

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "";
}

std::string Latest(const std::string& dir) {
  return std::string(absl::StripAsciiWhitespace(Slurp(dir + "/LATEST")));
}

// The ckpt-<step> directories under `dir`, by step.
std::vector<std::string> Checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      absl::string_view name(e->d_name);
      int64_t step;
      if (absl::ConsumePrefix(&name, "ckpt-") && absl::SimpleAtoi(name, &step)) {
        found.emplace_back(step, e->d_name);
      }
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

// Rows, dense floats and non-finite values (weights and optimizer state) of every shard file of
// checkpoint `ckpt` (shard-<i>-of-<n>: one for `train` and `allreduce`, one per host for PS).
struct Scan {
  int64_t rows = 0, dense = 0, non_finite = 0;
  int files = 0;
};
Scan ScanCheckpoint(const std::string& ckpt) {
  Scan scan;
  for (int n = 1; n <= 4 && scan.files == 0; ++n) {
    for (int i = 0; i < n; ++i) {
      const std::string path = absl::StrCat(ckpt, "/shard-", i, "-of-", n);
      if (!PathExists(path)) continue;
      ++scan.files;
      auto reader = BlockReader::Open(path);
      EXPECT_TRUE(reader.ok()) << reader.status();
      if (!reader.ok()) continue;
      while (true) {
        auto tag = (*reader)->PeekTag();
        EXPECT_TRUE(tag.ok()) << tag.status();
        if (!tag.ok() || tag->empty()) break;
        if (*tag == "EMBM") {
          auto meta = LoadEmbeddingRows(
              reader->get(), [&](const EmbeddingMeta& m, absl::Span<const int64_t> ids,
                                 const float* weights, const float* state) {
                scan.rows += static_cast<int64_t>(ids.size());
                for (size_t j = 0; j < ids.size() * m.dim; ++j) {
                  scan.non_finite += !std::isfinite(weights[j]);
                }
                for (size_t j = 0; j < ids.size() * m.state_floats; ++j) {
                  scan.non_finite += !std::isfinite(state[j]);
                }
                return absl::OkStatus();
              });
          EXPECT_TRUE(meta.ok()) << meta.status();
          if (!meta.ok()) break;
        } else if (*tag == "DNSE") {
          auto dense = LoadDenseSnapshot(reader->get());
          EXPECT_TRUE(dense.ok()) << dense.status();
          if (!dense.ok()) break;
          scan.dense += static_cast<int64_t>(dense->weights.size());
          for (float v : dense->weights) scan.non_finite += !std::isfinite(v);
          for (float v : dense->state) scan.non_finite += !std::isfinite(v);
        } else {
          Block block;
          auto more = (*reader)->Next(&block);
          EXPECT_TRUE(more.ok()) << more.status();
          if (!more.ok() || !*more) break;
        }
      }
    }
  }
  return scan;
}

// Every "step k ... loss X" progress line of `log`: k -> X.
std::vector<std::pair<int, double>> StepLosses(const std::string& log) {
  std::vector<std::pair<int, double>> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::ConsumePrefix(&line, "step ")) continue;
    const size_t sp = line.find(' ');
    const size_t at = line.rfind("loss ");
    int step;
    double loss;
    if (sp == absl::string_view::npos || at == absl::string_view::npos ||
        !absl::SimpleAtoi(line.substr(0, sp), &step) ||
        !absl::SimpleAtod(line.substr(at + 5), &loss)) {
      continue;
    }
    out.emplace_back(step, loss);
  }
  return out;
}

class DivergenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    ASSERT_EQ(testing::RunToExit({PSTRAIN_BINARY, "datagen", "--rows", absl::StrCat(2 * kRows),
                                  "--files", "2", "--seed", "1", "--out", Dir() + "/gen"},
                                 120000),
              0);
    ASSERT_EQ(testing::RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "500", "--seed", "2",
                                  "--out", Dir() + "/test"},
                                 120000),
              0);
    // clean/part-<f>.tsv: I1 missing everywhere; poisoned/part-0.tsv: the same with the record.
    for (int f = 0; f < 2; ++f) {
      std::ifstream in(absl::StrCat(Dir(), "/gen/part-0000", f, ".tsv"));
      std::ofstream clean(absl::StrCat(Dir(), "/clean-", f, ".tsv"));
      std::ofstream poisoned(absl::StrCat(Dir(), "/poisoned-", f, ".tsv"));
      std::string line;
      int n = 0;
      for (; std::getline(in, line); ++n) {
        std::vector<std::string> cols = absl::StrSplit(line, '\t');
        ASSERT_EQ(cols.size(), 40u) << line;
        cols[1] = "";
        clean << absl::StrJoin(cols, "\t") << '\n';
        if (f == 0 && n == kPoisonedRecord) cols[1] = "1e30";
        poisoned << absl::StrJoin(cols, "\t") << '\n';
      }
      ASSERT_EQ(n, kRows);
    }
    const std::string config = R"pb(
      data {
        train { name: "train" format: CRITEO_TSV }
        eval { name: "eval" format: CRITEO_TSV }
        shuffle_buffer: 0
        shuffle_files: false
      }
      features {
        preset: CRITEO
        categorical_vocab_size: 20000
        field { name: "I1" kind: NUMERIC numeric_mode: DENSE numeric_transform: NO_TRANSFORM }
      }
      model { type: DEEPFM embedding_dim: 16 hidden: [ 32 ] }
      sparse_optimizer { type: ADAGRAD learning_rate: 0.05 initial_accumulator: 0.0001 }
      dense_optimizer { type: ADAM learning_rate: 0.001 }
      train { batch_size: 32 epochs: 1 log_every_steps: 1 }
      threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
      checkpoint { keep: 100 }
    )pb";
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", config).ok());
  }

  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::vector<std::string> Args(const std::string& command, const std::string& train,
                                       const std::string& model_dir) {
    return {PSTRAIN_BINARY, command, "--config", Dir() + "/config.textproto", "--train", train,
            "--eval", Dir() + "/test/part-*", "--model_dir", model_dir};
  }
};

// `text` matched literally inside a regular expression.
std::string Literal(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

// The divergence message as a regular expression: the loss is "nan" or "inf" (an infinite logit
// gives inf for label 0 and inf - inf = NaN for label 1; which one depends on the record, and
// may on the ISA path).
std::string Diverged(const std::string& prefix, const std::string& steps,
                     const std::string& last_good) {
  return absl::StrCat(Literal(prefix), "FAILED_PRECONDITION: training diverged at step ", steps,
                      ": loss is (nan|inf|-inf) \\(last good checkpoint: ", Literal(last_good),
                      "\\)");
}

// `pstrain train`: the run stops at the poisoned step, exits 1, and keeps ckpt-8 (written every 4
// steps) as LATEST, with finite parameters; running the same command again resumes from it and
// diverges at the same step.
TEST_F(DivergenceTest, TrainStopsAtTheStepAndKeepsTheLastGoodCheckpoint) {
  const std::string model = Dir() + "/train";
  std::vector<std::string> args = Args("train", Dir() + "/poisoned-0.tsv", model);
  args.insert(args.end(), {"--set", "checkpoint.every_steps=4"});
  for (int run = 0; run < 2; ++run) {
    const std::string log = absl::StrCat(Dir(), "/train-", run, ".log");
    const int status = RunLogged(args, log, 300000);
    const std::string out = Slurp(log);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "no clean exit (a signal?): " << out;
    EXPECT_EQ(WEXITSTATUS(status), 1) << out;
    EXPECT_THAT(out, ContainsRegex(Diverged("pstrain train: ", absl::StrCat(kDivergedStep),
                                            model + "/ckpt-8")));
    if (run == 1) {
      EXPECT_THAT(out, HasSubstr("resumed from " + model + "/ckpt-8 at step 8"));
    }
    // Within one step: every step before it was logged with a finite loss, it was not.
    std::vector<std::pair<int, double>> losses = StepLosses(out);
    ASSERT_FALSE(losses.empty()) << out;
    EXPECT_EQ(losses.front().first, run == 0 ? 1 : 9);
    EXPECT_EQ(losses.back().first, kDivergedStep - 1) << out;
    for (const auto& [step, loss] : losses) EXPECT_TRUE(std::isfinite(loss)) << step;

    EXPECT_EQ(Latest(model), "ckpt-8");
    EXPECT_THAT(Checkpoints(model), ::testing::ElementsAre("ckpt-4", "ckpt-8"));
    EXPECT_FALSE(PathExists(model + "/summary.json"));
    const Scan scan = ScanCheckpoint(model + "/ckpt-8");
    EXPECT_EQ(scan.files, 1);
    EXPECT_GT(scan.rows, 1000);
    EXPECT_GT(scan.dense, 1000);
    EXPECT_EQ(scan.non_finite, 0);
  }
}

// `pstrain allreduce` (2 ranks, records dealt round-robin): the poisoned record is rank 0's 351st,
// in its step 11. That rank stops with the message; the command layer ends the job (MPI_Abort),
// and nothing is written after the divergence: LATEST stays ckpt-8, finite.
TEST_F(DivergenceTest, AllreduceRankStopsAndTheJobEndsKeepingTheLastGoodCheckpoint) {
  const std::string model = Dir() + "/allreduce";
  std::vector<std::string> args = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"};
  for (const std::string& a : Args("allreduce", Dir() + "/poisoned-0.tsv", model)) {
    args.push_back(a);
  }
  args.insert(args.end(), {"--set", "threads.towers=1", "--set",
                           "data.train[0].shard_policy=SHARD_BY_RECORD", "--set",
                           "checkpoint.every_steps=4"});
  const std::string log = Dir() + "/allreduce.log";
  const int status = RunLogged(args, log, 300000);  // sh finds mpirun on PATH
  const std::string out = Slurp(log);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  EXPECT_THAT(out, ContainsRegex(Diverged("pstrain allreduce: rank 0 of 2: ",
                                          absl::StrCat(kDivergedStep), model + "/ckpt-8")));
  EXPECT_THAT(out, Not(HasSubstr("exited on signal"))) << "a rank aborted";
  EXPECT_EQ(ProcessesLeft(model), 0);
  EXPECT_EQ(Latest(model), "ckpt-8");
  EXPECT_THAT(Checkpoints(model), Not(::testing::Contains(absl::StrCat("ckpt-", kDivergedStep))));
  for (const std::string& c : Checkpoints(model)) {
    int64_t step = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::string_view(c).substr(5), &step)) << c;
    EXPECT_LE(step, 8) << c << " was written after the divergence";
  }
  const Scan scan = ScanCheckpoint(model + "/ckpt-8");
  EXPECT_EQ(scan.files, 1);
  EXPECT_GT(scan.rows, 1000);
  EXPECT_EQ(scan.non_finite, 0);
}

// `pstrain local --hosts 2` (PS, ASYNC): a clean run of 10 steps per worker writes ckpt-20; the
// same job resumed with learning rates of 1e30 diverges on the hosts' first steps (each worker's
// own step 11 or, once the other's update arrived, 12). The host that sees it exits 1 with the
// message naming ckpt-20; the launcher ends the job (SIGTERM, then SIGKILL after --kill_timeout_s
// for a host blocked in a wait that needs the dead one), and LATEST still names ckpt-20, finite.
TEST_F(DivergenceTest, PsHostStopsAndTheJobEndsKeepingTheLastGoodCheckpoint) {
  const std::string model = Dir() + "/ps";
  auto args = [&](const std::vector<std::string>& more) {
    std::vector<std::string> a = Args("local", Dir() + "/clean-*", model);
    a.insert(a.end(), {"--hosts", "2", "--kill_timeout_s", "20"});
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const int clean = RunLogged(args({"--set", "train.max_steps=10"}), Dir() + "/ps-0.log", 300000);
  ASSERT_TRUE(clean >= 0 && WIFEXITED(clean) && WEXITSTATUS(clean) == 0)
      << Slurp(Dir() + "/ps-0.log");
  ASSERT_EQ(Latest(model), "ckpt-20");

  const auto t0 = std::chrono::steady_clock::now();
  const int status = RunLogged(args({"--set", "sparse_optimizer.learning_rate=1e30", "--set",
                                     "dense_optimizer.learning_rate=1e30"}),
                               Dir() + "/ps-1.log", 300000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = Slurp(Dir() + "/ps-1.log") + Slurp(model + "/host-1/output.log");
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_LT(seconds, 120) << "the job did not end within the launcher's kill timeout";
  EXPECT_THAT(out, ContainsRegex(Diverged("pstrain host: ", "1[12]", model + "/ckpt-20")));
  EXPECT_THAT(out, ContainsRegex("host [01] failed \\(exit code 1\\)"));
  EXPECT_THAT(out, Not(HasSubstr("(signal"))) << "a host died by a signal before the launcher's";
  EXPECT_EQ(ProcessesLeft(model), 0);
  EXPECT_EQ(Latest(model), "ckpt-20");
  EXPECT_THAT(Checkpoints(model), ::testing::ElementsAre("ckpt-20"));
  const Scan scan = ScanCheckpoint(model + "/ckpt-20");
  EXPECT_EQ(scan.files, 2);
  EXPECT_GT(scan.rows, 1000);
  EXPECT_EQ(scan.non_finite, 0);
}

}  // namespace
}  // namespace pstrain
