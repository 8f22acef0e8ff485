// A resume is a resume; new data is a new pass (worker/train/data_pass.h), with real processes in
// every mode that checkpoints: `pstrain train`, `pstrain local` (PS) and `pstrain allreduce`.
//   - day 1, then the same command on day 2's files: day 2 is trained, as a new pass from day 1's
//     parameters, and summary.json counts only day 2;
//   - the same data after a finished job: nothing to do (exit 0, a message, nothing written);
//   - other data under an unfinished job: refused, naming both and --on_new_data, which chooses;
//   - a pass without one example: an error.
// And --warm_start_from (docs/CHECKPOINT.md "Warm start"): a fresh model dir from another's
// checkpoint, single -> PS -> single and into allreduce; a changed model, a missing or corrupt
// source refused; a model dir with its own checkpoint resumes it.
// Day d is `pstrain datagen --seed d` (2 files of 1000 rows), read in order with 100 records a
// step: 20 steps per day and worker count.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
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

// A number field of summary.json as written ("test_logloss": "0.5351..."), or "".
std::string SummaryText(const std::string& model_dir, const std::string& key) {
  const std::string s = Slurp(model_dir + "/summary.json");
  const size_t at = s.find("\"" + key + "\":");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 3;
  const size_t end = s.find_first_of(",}", begin);
  return std::string(absl::StripAsciiWhitespace(s.substr(begin, end - begin)));
}

// An integer field of summary.json ("examples": 2000), or -1.
int64_t SummaryField(const std::string& model_dir, const std::string& key) {
  int64_t v = -1;
  if (!absl::SimpleAtoi(SummaryText(model_dir, key), &v)) return -1;
  return v;
}

// A floating-point field of summary.json, or NaN.
double SummaryDouble(const std::string& model_dir, const std::string& key) {
  double v = std::nan("");
  if (!absl::SimpleAtod(SummaryText(model_dir, key), &v)) return std::nan("");
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

// ---- Warm start ----

// Learning rates so small that training changes no evaluated digit that matters: a job then
// evaluates the parameters it started from.
const std::vector<std::string> kFrozen = {"--set", "sparse_optimizer.learning_rate=1e-9", "--set",
                                          "dense_optimizer.learning_rate=1e-9"};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `train` from a warm start equals a new pass in the source's own dir (the same parameters and
// optimizer slots, to the bit), but starts at step 0 in its fresh dir.
TEST_F(ContinuousTrainingTest, TrainWarmStartEqualsANewPassOfTheSource) {
  const std::string src = Dir() + "/ws_train_src", warm = Dir() + "/ws_train_warm";
  ASSERT_EQ(Pstrain("train", Day(1), src).exit_code, 0);
  Result w = Pstrain("train", Day(2), warm, {"--warm_start_from", src});
  ASSERT_EQ(w.exit_code, 0) << w.out;
  EXPECT_THAT(w.out, HasSubstr(absl::StrCat("warm start from ", src, "/ckpt-", kStepsPerDay,
                                            " (1 shard(s))")));
  EXPECT_THAT(w.out, HasSubstr("with their optimizer slots"));
  EXPECT_EQ(Latest(warm), absl::StrCat("ckpt-", kStepsPerDay));  // its own steps from 0
  EXPECT_EQ(SummaryField(warm, "examples"), kRowsPerDay);
  Result cont = Pstrain("train", Day(2), src);  // day 2 as a new pass in the source's dir
  ASSERT_EQ(cont.exit_code, 0) << cont.out;
  EXPECT_EQ(Latest(src), absl::StrCat("ckpt-", 2 * kStepsPerDay));
  ASSERT_FALSE(SummaryText(warm, "test_logloss").empty());
  EXPECT_EQ(SummaryText(warm, "test_logloss"), SummaryText(src, "test_logloss"));
  EXPECT_EQ(SummaryText(warm, "test_auc"), SummaryText(src, "test_auc"));

  // Starting the optimizer slots fresh is another trajectory (and accepts another optimizer).
  const std::string reset = Dir() + "/ws_train_reset";
  Result r = Pstrain("train", Day(2), reset,
                     {"--warm_start_from", src + "/ckpt-20", "--reset_optimizer"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("optimizer slots reset"));
  EXPECT_NE(SummaryText(reset, "test_logloss"), SummaryText(warm, "test_logloss"));

  // A model dir with a checkpoint of its own resumes it and says that the warm start is ignored.
  Result again = Pstrain("train", Day(1), warm, {"--warm_start_from", src});
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_THAT(again.out, HasSubstr(absl::StrCat("resuming ", warm, "/ckpt-", kStepsPerDay,
                                                "; --warm_start_from ", src, " is ignored")));
  EXPECT_THAT(again.out, HasSubstr("new training pass over " + DaySpec(1)));
}

// single -> PS (2 hosts, each shard takes its rows of the one-shard file) -> single: with frozen
// learning rates every job evaluates what it started from, so the test logloss carries over
// (while a cold start's is the initial model's).
TEST_F(ContinuousTrainingTest, WarmStartSingleToPsAndBack) {
  const std::string src = Dir() + "/ws_single", ps = Dir() + "/ws_ps", cold = Dir() + "/ws_cold",
                    back = Dir() + "/ws_back";
  ASSERT_EQ(Pstrain("train", Day(1), src).exit_code, 0);
  const double trained = SummaryDouble(src, "test_logloss");
  const std::vector<std::string> local = {"--hosts", "2", "--kill_timeout_s", "20"};

  Result w = Pstrain("local", Day(2), ps, Concat(Concat(local, kFrozen), {"--warm_start_from", src}));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  const std::string logs = w.out + Slurp(ps + "/host-1/output.log");
  for (int shard : {0, 1}) {
    EXPECT_THAT(logs, HasSubstr(absl::StrCat("shard ", shard, ": warm start from ", src,
                                             "/ckpt-", kStepsPerDay, " (1 shard(s))")));
  }
  EXPECT_EQ(Latest(ps), absl::StrCat("ckpt-", kStepsPerDay));
  EXPECT_NEAR(SummaryDouble(ps, "test_logloss"), trained, 1e-5);

  Result c = Pstrain("local", Day(2), cold, Concat(local, kFrozen));
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_GT(std::fabs(SummaryDouble(cold, "test_logloss") - trained), 0.05);

  Result b = Pstrain("train", Day(1), back,
                     Concat(kFrozen, {"--warm_start_from", ps + "/ckpt-20"}));
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_THAT(b.out, HasSubstr(absl::StrCat("warm start from ", ps, "/ckpt-20 (2 shard(s))")));
  EXPECT_NEAR(SummaryDouble(back, "test_logloss"), trained, 1e-5);
  EXPECT_EQ(ProcessesLeft(ps), 0);
  EXPECT_EQ(ProcessesLeft(cold), 0);
}

// Allreduce (2 ranks): every rank warm-starts its replica from a single-process checkpoint.
TEST_F(ContinuousTrainingTest, AllreduceWarmStartFromASingleCheckpoint) {
  const std::string src = Dir() + "/ws_ar_src", m = Dir() + "/ws_ar";
  ASSERT_EQ(Pstrain("train", Day(1), src).exit_code, 0);
  const std::vector<std::string> mpirun = {"mpirun", "--allow-run-as-root", "--oversubscribe",
                                           "-np", "2"};
  Result w = Pstrain("allreduce", Day(2), m, Concat(kFrozen, {"--warm_start_from", src}), mpirun);
  ASSERT_EQ(w.exit_code, 0) << w.out;
  EXPECT_THAT(w.out, HasSubstr(absl::StrCat("warm start from ", src, "/ckpt-", kStepsPerDay)));
  EXPECT_NEAR(SummaryDouble(m, "test_logloss"), SummaryDouble(src, "test_logloss"), 1e-5);
  EXPECT_EQ(ProcessesLeft(m), 0);
}

// What a warm start refuses, naming why, before anything is written to the new model dir.
TEST_F(ContinuousTrainingTest, WarmStartRefusals) {
  const std::string src = Dir() + "/ws_refuse_src";
  ASSERT_EQ(Pstrain("train", Day(1), src).exit_code, 0);
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::string corrupt = Dir() + "/ws_corrupt";
  ASSERT_EQ(std::system(("cp -r " + src + " " + corrupt).c_str()), 0);
  {  // one flipped byte inside the first EMBR block's rows
    const std::string file = corrupt + "/ckpt-20/shard-0-of-1";
    std::string bytes = Slurp(file);
    ASSERT_GT(bytes.size(), 300u);
    bytes[200] ^= 0x5a;
    ASSERT_TRUE(WriteFileAtomic(file, bytes).ok());
  }
  ASSERT_EQ(std::system(("mkdir -p " + Dir() + "/ws_empty").c_str()), 0);
  const std::vector<Case> cases = {
      {{"--set", "model.embedding_dim=4"},
       "model.embedding_dim: 8 in the warm-start checkpoint, 4 in the config"},
      {{"--set", "features.categorical_vocab_size=10000"},
       "features.field[13] 'C1'.vocab_size: 20000 in the warm-start checkpoint, 10000 in the "
       "config"},
      {{"--set", "sparse_optimizer.type=FTRL"},
       "sparse_optimizer.type: ADAGRAD in the warm-start checkpoint, FTRL in the config; "
       "--reset_optimizer"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string m = absl::StrCat(Dir(), "/ws_refused_", n++);
    Result r = Pstrain("train", Day(2), m, Concat({"--warm_start_from", src}, c.flags));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("FAILED_PRECONDITION: warm start from ", src,
                                              "/ckpt-20: ", c.expected)));
    EXPECT_FALSE(PathExists(m + "/LATEST"));
  }
  // Another optimizer with --reset_optimizer is accepted.
  Result ftrl = Pstrain("train", Day(2), Dir() + "/ws_ftrl",
                        {"--warm_start_from", src, "--set", "sparse_optimizer.type=FTRL",
                         "--reset_optimizer"});
  EXPECT_EQ(ftrl.exit_code, 0) << ftrl.out;

  const std::vector<Case> sources = {
      {{"--warm_start_from", Dir() + "/nowhere"},
       "NOT_FOUND: warm start from " + Dir() + "/nowhere: no such directory"},
      {{"--warm_start_from", Dir() + "/ws_empty"},
       "NOT_FOUND: warm start from " + Dir() + "/ws_empty: no checkpoint there (no LATEST file)"},
      {{"--warm_start_from", corrupt + "/ckpt-20"},
       "DATA_LOSS: warm start from " + corrupt + "/ckpt-20: " + corrupt +
           "/ckpt-20/shard-0-of-1: block 1 ('EMBR') at offset 84: checksum mismatch"},
      {{"--warm_start_from", corrupt},
       "DATA_LOSS: warm start from " + corrupt + ": no usable checkpoint there (every one "
       "refused"},
  };
  for (const Case& c : sources) {
    const std::string m = absl::StrCat(Dir(), "/ws_refused_", n++);
    Result r = Pstrain("train", Day(2), m, c.flags);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.expected));
    EXPECT_FALSE(PathExists(m + "/LATEST"));
  }

  // --reset_optimizer without a source: a config error (exit 2), nothing trained.
  {
    const std::string m = Dir() + "/ws_reset_alone";
    Result r = Pstrain("train", Day(2), m, {"--reset_optimizer"});
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr("config train.warm_start.from: must name a model dir"));
    EXPECT_FALSE(PathExists(m + "/LATEST"));
  }

  // In a PS job the shards refuse it the same way.
  const std::string m = Dir() + "/ws_refused_ps";
  Result r = Pstrain("local", Day(2), m,
                     {"--hosts", "2", "--kill_timeout_s", "20", "--warm_start_from", src, "--set",
                      "model.embedding_dim=4"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out + Slurp(m + "/host-1/output.log"),
              HasSubstr("model.embedding_dim: 8 in the warm-start checkpoint, 4 in the config"));
  EXPECT_FALSE(PathExists(m + "/LATEST"));
  EXPECT_EQ(ProcessesLeft(m), 0);
}

}  // namespace
}  // namespace pstrain
