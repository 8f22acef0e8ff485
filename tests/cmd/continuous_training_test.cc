// A resume is a resume; new data is a new pass (worker/train/data_pass.h), with real processes in
// every mode that checkpoints: `pstrain train`, `pstrain local` (PS) and `pstrain allreduce`.
//   - day 1, then the same command on day 2's files: day 2 is trained, as a new pass from day 1's
//     parameters, and summary.json counts only day 2;
//   - the same data after a finished job: nothing to do (exit 0, a message, nothing written);
//   - other data under an unfinished job: refused, naming both and --on_new_data, which chooses;
//   - a pass without one example: an error.
// Day d is `pstrain datagen --seed d` (2 files of 1000 rows), read in order with 100 records a
// step: 20 steps per day and worker count.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessesLeft;
using testing::RunLogged;

constexpr int kRowsPerDay = 2000;
constexpr int kStepsPerDay = 20;  // 100 records a step

// Per process: CTest runs the tests of this file in parallel processes.
std::string Dir() { return absl::StrCat(::testing::TempDir(), "/continuous_", getpid()); }

std::string Slurp(const std::string& path) { return ReadFileToString(path).value_or(""); }

// The checkpoint LATEST names ("ckpt-20").
std::string Latest(const std::string& dir) {
  return std::string(absl::StripAsciiWhitespace(Slurp(dir + "/LATEST")));
}

// An integer field of summary.json ("examples": 2000), or -1.
int64_t SummaryField(const std::string& model_dir, const std::string& key) {
  const std::string s = Slurp(model_dir + "/summary.json");
  const size_t at = s.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  const size_t begin = at + key.size() + 3;
  const size_t end = s.find_first_of(",}", begin);
  int64_t v = -1;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(s.substr(begin, end - begin)), &v)) return -1;
  return v;
}

struct Result {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out;     // stdout and stderr
};

class ContinuousTrainingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    for (int day = 1; day <= 2; ++day) {
      ASSERT_EQ(testing::RunToExit({PSTRAIN_BINARY, "datagen", "--rows", absl::StrCat(kRowsPerDay),
                                    "--files", "2", "--seed", absl::StrCat(day), "--out",
                                    absl::StrCat(Dir(), "/day", day)},
                                   120000),
                0);
    }
    ASSERT_EQ(testing::RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "500", "--seed", "9",
                                  "--out", Dir() + "/test"},
                                 120000),
              0);
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/empty.tsv", "").ok());
    const std::string config = R"pb(
      data {
        train { name: "train" format: CRITEO_TSV }
        eval { name: "eval" format: CRITEO_TSV }
        shuffle_buffer: 0
        shuffle_files: false
      }
      features { preset: CRITEO categorical_vocab_size: 20000 }
      model { type: DEEPFM embedding_dim: 8 hidden: [ 16 ] }
      train { batch_size: 100 epochs: 1 log_every_steps: 5 }
      threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
      checkpoint { keep: 100 }
    )pb";
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", config).ok());
  }

  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  void SetUp() override {
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  // `pstrain <command> --train <day> ... more`, its output in <Dir()>/<test>-<n>.log.
  Result Pstrain(const std::string& command, const std::string& train, const std::string& model_dir,
              const std::vector<std::string>& more = {}, const std::vector<std::string>& pre = {}) {
    std::vector<std::string> argv = pre;
    for (const std::string& a :
         {std::string(PSTRAIN_BINARY), command, std::string("--config"),
          Dir() + "/config.textproto", std::string("--train"), train, std::string("--eval"),
          Dir() + "/test/part-*", std::string("--model_dir"), model_dir}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), more.begin(), more.end());
    const std::string log = absl::StrCat(Dir(), "/", name_, "-", runs_++, ".log");
    const int status = RunLogged(argv, log, 300000);
    Result r;
    r.out = Slurp(log);
    if (status >= 0 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    return r;
  }

  static std::string Day(int d) { return absl::StrCat(Dir(), "/day", d, "/part-*"); }
  // How DescribeDataSpec names day d's files in messages.
  static std::string DaySpec(int d) {
    return absl::StrCat("train criteo_tsv [", Dir(), "/day", d, "/part-00000.tsv, ", Dir(), "/day",
                        d, "/part-00001.tsv]");
  }

  std::string name_;
  int runs_ = 0;
};

// The issue's command pair: the second trains day 2, as a new pass from day 1's parameters.
TEST_F(ContinuousTrainingTest, TrainDay1ThenDay2TrainsDay2) {
  const std::string m = Dir() + "/train_days";
  Result day1 = Pstrain("train", Day(1), m);
  ASSERT_EQ(day1.exit_code, 0) << day1.out;
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", kStepsPerDay));

  Result day2 = Pstrain("train", Day(2), m);
  ASSERT_EQ(day2.exit_code, 0) << day2.out;
  EXPECT_THAT(day2.out, HasSubstr(absl::StrCat(
                            "new training pass over ", DaySpec(2),
                            " from the parameters and optimizer slots of ", m, "/ckpt-",
                            kStepsPerDay, " (step ", kStepsPerDay, ", whose pass over ",
                            DaySpec(1), " finished)")));
  // summary.json counts only the new pass; the steps go on from day 1's.
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(SummaryField(m, "examples_this_run"), kRowsPerDay);
  EXPECT_EQ(SummaryField(m, "steps"), kStepsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * kStepsPerDay));
  EXPECT_TRUE(PathExists(absl::StrCat(m, "/ckpt-", 2 * kStepsPerDay, "/PASS_END")));
}

// A finished job given its own data again: nothing is trained or written, and it says so.
TEST_F(ContinuousTrainingTest, TrainSameDataAfterAFinishedJobIsANoOp) {
  const std::string m = Dir() + "/train_noop";
  ASSERT_EQ(Pstrain("train", Day(1), m).exit_code, 0);
  const std::string summary = Slurp(m + "/summary.json");
  ASSERT_FALSE(summary.empty());

  Result again = Pstrain("train", Day(1), m);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_THAT(again.out,
              HasSubstr(absl::StrCat("nothing to train: ", m, "/ckpt-", kStepsPerDay, " (step ",
                                     kStepsPerDay, ") finished its pass over ", DaySpec(1))));
  EXPECT_THAT(again.out, HasSubstr("--on_new_data=new_pass trains another pass"));
  EXPECT_THAT(again.out, Not(HasSubstr("done:")));
  EXPECT_EQ(Slurp(m + "/summary.json"), summary);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", kStepsPerDay));

  // Asked for: another pass over the same data.
  Result another = Pstrain("train", Day(1), m, {"--on_new_data=new_pass"});
  ASSERT_EQ(another.exit_code, 0) << another.out;
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * kStepsPerDay));
}

// Day 2 under a job that stopped in day 1 (LATEST names a checkpoint of step 5: as after a crash):
// refused, naming both and the flag; then each choice of the flag.
TEST_F(ContinuousTrainingTest, TrainChangedDataUnderAnUnfinishedJobIsRefused) {
  const std::string m = Dir() + "/train_refuse";
  ASSERT_EQ(Pstrain("train", Day(1), m, {"--set", "checkpoint.every_steps=5"}).exit_code, 0);
  ASSERT_TRUE(WriteFileAtomic(m + "/LATEST", "ckpt-5\n").ok());
  std::system(absl::StrCat("rm -rf ", m, "/ckpt-10 ", m, "/ckpt-15 ", m, "/ckpt-20").c_str());

  Result refused = Pstrain("train", Day(2), m);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.out,
              HasSubstr(absl::StrCat("FAILED_PRECONDITION: the training data changed under an "
                                     "unfinished job: ", m, "/ckpt-5 (step 5) is part of a pass "
                                     "over ", DaySpec(1), ", and this run's data is ",
                                     DaySpec(2))));
  EXPECT_THAT(refused.out, HasSubstr("--on_new_data=continue"));
  EXPECT_THAT(refused.out, HasSubstr("--on_new_data=new_pass"));
  EXPECT_EQ(Latest(m), "ckpt-5");

  // continue: the rest of day 1 (its pass counts from its start).
  Result cont = Pstrain("train", Day(2), m, {"--on_new_data=continue"});
  ASSERT_EQ(cont.exit_code, 0) << cont.out;
  EXPECT_THAT(cont.out, HasSubstr("--on_new_data=continue: resuming the saved pass over " +
                                  DaySpec(1)));
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(SummaryField(m, "examples_this_run"), kRowsPerDay - 500);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", kStepsPerDay));

  // new_pass from the unfinished checkpoint: day 2 from step 5.
  ASSERT_TRUE(WriteFileAtomic(m + "/LATEST", "ckpt-5\n").ok());
  Result fresh = Pstrain("train", Day(2), m, {"--on_new_data=new_pass"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.out;
  EXPECT_THAT(fresh.out, HasSubstr("abandoning its unfinished pass over " + DaySpec(1)));
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 5 + kStepsPerDay));
}

// A pass that trains nothing is an error, also when the job is run again, and after a finished
// pass the empty data starts none.
TEST_F(ContinuousTrainingTest, TrainAPassWithoutExamplesIsAnError) {
  const std::string m = Dir() + "/train_empty";
  for (int run = 0; run < 2; ++run) {
    Result r = Pstrain("train", Dir() + "/empty.tsv", m);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr("FAILED_PRECONDITION: the training pass over train criteo_tsv [" +
                                 Dir() + "/empty.tsv] trained 0 examples"));
    EXPECT_FALSE(PathExists(m + "/summary.json"));
  }
  const std::string d = Dir() + "/train_empty_after";
  ASSERT_EQ(Pstrain("train", Day(1), d).exit_code, 0);
  Result r = Pstrain("train", Dir() + "/empty.tsv", d);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("trained 0 examples"));
  // Day 1's pass is still the finished one.
  EXPECT_EQ(Latest(d), absl::StrCat("ckpt-", kStepsPerDay));
  Result again = Pstrain("train", Day(1), d);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_THAT(again.out, HasSubstr("nothing to train"));
}

// PS (`pstrain local --hosts 2`, 2 workers, ASYNC): every worker takes the same decision from the
// same checkpoint. Checkpoint steps are the sum of the workers' steps.
TEST_F(ContinuousTrainingTest, PsDay1ThenDay2ThenNoOpThenRefusal) {
  const std::string m = Dir() + "/ps";
  const std::vector<std::string> local = {"--hosts", "2", "--kill_timeout_s", "20", "--set",
                                          "checkpoint.every_steps=5"};
  Result day1 = Pstrain("local", Day(1), m, local);
  ASSERT_EQ(day1.exit_code, 0) << day1.out;
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  const std::string after_day1 = Latest(m);
  EXPECT_EQ(after_day1, absl::StrCat("ckpt-", kStepsPerDay));

  Result day2 = Pstrain("local", Day(2), m, local);
  ASSERT_EQ(day2.exit_code, 0) << day2.out;
  EXPECT_THAT(day2.out, HasSubstr("new training pass over " + DaySpec(2)));
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * kStepsPerDay));

  Result noop = Pstrain("local", Day(2), m, local);
  ASSERT_EQ(noop.exit_code, 0) << noop.out;
  EXPECT_THAT(noop.out, HasSubstr("nothing to train: "));
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * kStepsPerDay));

  // An unfinished day 2 (a checkpoint of the chief's schedule inside it), given day 1: refused
  // (by the first host that decides; the launcher then ends the other).
  std::string mid;
  for (int s = kStepsPerDay + 1; s < 2 * kStepsPerDay && mid.empty(); ++s) {
    if (PathExists(absl::StrCat(m, "/ckpt-", s, "/MANIFEST"))) mid = absl::StrCat("ckpt-", s);
  }
  ASSERT_FALSE(mid.empty()) << "no checkpoint inside day 2";
  ASSERT_TRUE(WriteFileAtomic(m + "/LATEST", mid + "\n").ok());
  Result refused = Pstrain("local", Day(1), m, local);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  const std::string out = refused.out + Slurp(m + "/host-1/output.log");
  EXPECT_THAT(out, HasSubstr(absl::StrCat("the training data changed under an unfinished job: ",
                                          m, "/", mid)));
  EXPECT_EQ(Latest(m), mid);
  EXPECT_EQ(ProcessesLeft(m), 0);
}

// Allreduce (2 ranks): day 1, day 2 as a new pass, then nothing to do.
TEST_F(ContinuousTrainingTest, AllreduceDay1ThenDay2ThenNoOp) {
  const std::string m = Dir() + "/allreduce";
  const std::vector<std::string> mpirun = {"mpirun", "--allow-run-as-root", "--oversubscribe",
                                           "-np", "2"};
  Result day1 = Pstrain("allreduce", Day(1), m, {}, mpirun);
  ASSERT_EQ(day1.exit_code, 0) << day1.out;
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  const int64_t steps1 = SummaryField(m, "steps");
  EXPECT_GT(steps1, 0);

  Result day2 = Pstrain("allreduce", Day(2), m, {}, mpirun);
  ASSERT_EQ(day2.exit_code, 0) << day2.out;
  EXPECT_THAT(day2.out, HasSubstr("new training pass over " + DaySpec(2)));
  EXPECT_EQ(SummaryField(m, "examples"), kRowsPerDay);
  EXPECT_EQ(SummaryField(m, "steps"), steps1);
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * steps1));

  Result noop = Pstrain("allreduce", Day(2), m, {}, mpirun);
  ASSERT_EQ(noop.exit_code, 0) << noop.out;
  EXPECT_THAT(noop.out, HasSubstr("nothing to train: "));
  EXPECT_EQ(Latest(m), absl::StrCat("ckpt-", 2 * steps1));
  EXPECT_EQ(ProcessesLeft(m), 0);
}

}  // namespace
}  // namespace pstrain
