// Early stopping, the best checkpoint and the validation split (docs/CONFIG.md "Early stopping
// and the best checkpoint"), with real processes in every mode:
//   - `pstrain train`: the pass ends early, finished (PASS_END; the same command then has nothing
//     to do), summary.json says so;
//   - `pstrain local --hosts 2` (SYNC and ASYNC): the chief decides and every worker stops in the
//     same checkpoint round (SYNC: at one common step), each ending its pass;
//   - `mpirun -np 2 pstrain allreduce`: every rank stops after the same step;
//   - checkpoint.keep_best with a validation split: BEST names a kept, complete checkpoint beside
//     checkpoint.keep = 1, and `predict --checkpoint best` reads it;
//   - a `pstrain train` stopped by SIGTERM (or killed) after its first evaluation and resumed by
//     the same command goes on counting its patience: it stops after the same evaluation, in the
//     same checkpoint interval, with the same early-stopping state as an uninterrupted run; a
//     `pstrain local --hosts 2` (SYNC) job stopped and resumed stops at the same chief step with
//     the same best step.
// The data: `pstrain datagen` (2 files of 1000 rows), 100 records a step, 100 epochs: 2000 steps
// of one worker. Early stopping with min_delta 1 (no AUC improves by more than 1) and patience 1
// stops after the second evaluation's result, long before that. (Evaluations run beside training
// and never hold it back, so the pass must be long enough for two to finish even on a loaded
// machine: a 3-epoch pass of 60 steps could end first. The keep_best test is deterministic: each
// checkpoint waits for the previous evaluation.)
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::ProcessesLeft;
using testing::ReadSummary;

constexpr int kFullSteps = 2000;  // one worker, 100 epochs of 2000 rows, 100 a step

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/early_", getpid()); }

std::string Slurp(const std::string& path) { return ReadFileToString(path).value_or(""); }

using Result = testing::CommandResult;

class EarlyStoppingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    ASSERT_EQ(testing::Datagen(2000, 2, 1, Dir() + "/train"), 0);
    ASSERT_EQ(testing::Datagen(500, 1, 9, Dir() + "/test"), 0);
    const std::string config = std::string(testing::kOrderedCriteoChannels) + R"pb(
      features { preset: CRITEO categorical_vocab_size: 20000 }
      model { type: DEEPFM embedding_dim: 8 hidden: [ 16 ] }
      train {
        batch_size: 100
        epochs: 100
        log_every_steps: 50
        eval_every_steps: 2
        early_stopping { metric: AUC patience_evals: 1 min_delta: 1 }
      }
      threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
      checkpoint { keep: 100 every_seconds: 0 }
    )pb";
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", config).ok());
  }

  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  void SetUp() override {
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  Result Pstrain(const std::string& command, const std::string& model_dir,
                 const std::vector<std::string>& more = {},
                 const std::vector<std::string>& pre = {}) {
    std::vector<std::string> argv = pre;
    for (const std::string& a :
         {std::string(PSTRAIN_BINARY), command, std::string("--config"),
          Dir() + "/config.textproto", std::string("--train"), Dir() + "/train/part-*",
          std::string("--eval"), Dir() + "/test/part-*", std::string("--model_dir"), model_dir}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), more.begin(), more.end());
    return testing::RunCommand(argv, absl::StrCat(Dir(), "/", name_, "-", runs_++, ".log"),
                               300000);
  }

  // The checkpoint LATEST names, with every worker's state; checks that the pass ended there
  // (PASS_END) and, with `finished`, that every state says so. (A PS job's stopping round commits
  // the workers' states at the stop; its final round, at the same step, writes nothing again and
  // marks the pass's end beside them: docs/CHECKPOINT.md "Training passes".)
  static std::vector<WorkerState> FinalStates(const std::string& m, int workers,
                                              bool finished = true) {
    std::vector<WorkerState> states(workers);
    absl::StatusOr<int64_t> latest = ReadLatest(m);
    EXPECT_TRUE(latest.ok()) << latest.status();
    if (!latest.ok()) return {};
    const std::string ckpt = CheckpointPath(m, *latest);
    EXPECT_TRUE(PathExists(ckpt + "/" + kPassEndFileName)) << ckpt << " does not end the pass";
    for (int j = 0; j < workers; ++j) {
      EXPECT_TRUE(ReadWorkerState(ckpt, j, &states[j]).ok()) << ckpt << " worker " << j;
      if (finished) {
        EXPECT_TRUE(states[j].finished()) << "worker " << j;
      }
    }
    return states;
  }

  static void ExpectStoppedEarly(const std::string& m) {
    const google::protobuf::Struct s = ReadSummary(m);
    ASSERT_TRUE(s.fields().contains("stopped_early")) << Slurp(m + "/summary.json");
    EXPECT_TRUE(s.fields().at("stopped_early").bool_value());
    EXPECT_EQ(s.fields().at("best_metric").string_value(), "AUC");
    EXPECT_GT(s.fields().at("best_step").number_value(), 0);
    EXPECT_FALSE(s.fields().at("preempted").bool_value());
    EXPECT_GT(s.fields().at("test_auc").number_value(), 0);  // the final evaluation ran
  }

  // The command line of Pstrain, as one string for `sh -c` (no argument has a quote or a space).
  std::vector<std::string> ShellArgs(const std::string& command, const std::string& model_dir,
                                     const std::vector<std::string>& more) {
    std::string line = absl::StrCat("exec ", PSTRAIN_BINARY, " ", command, " --config ", Dir(),
                                    "/config.textproto --train '", Dir(), "/train/part-*' --eval '",
                                    Dir(), "/test/part-*' --model_dir ", model_dir);
    for (const std::string& a : more) absl::StrAppend(&line, " ", a);
    return {"/bin/sh", "-c", line + " 2>&1"};
  }

  // Starts `pstrain <command>` (train, local) with `flags`, waits for the report of its
  // `evals`-th periodic evaluation, sends `sig` and waits for the process to end. Returns the
  // state the newest checkpoint saved for the chief (worker 0) of the resumed job.
  WorkerState Interrupt(const std::string& command, const std::string& m,
                        const std::vector<std::string>& flags, int sig, int evals) {
    WorkerState state;
    testing::Subprocess train;
    std::string error;
    EXPECT_TRUE(train.Start(ShellArgs(command, m, flags), &error)) << error;
    for (int i = 0; i < evals; ++i) {
      EXPECT_THAT(train.ReadLineContaining("eval at step ", 120000), HasSubstr(": auc "));
    }
    EXPECT_TRUE(train.Signal(sig));
    const int status = train.WaitExit(120000);
    EXPECT_NE(status, -1) << "pstrain " << command << " did not end after signal " << sig;
    absl::StatusOr<int64_t> latest = ReadLatest(m);
    EXPECT_TRUE(latest.ok()) << latest.status();
    if (latest.ok()) {
      EXPECT_TRUE(ReadWorkerState(CheckpointPath(m, *latest), 0, &state).ok());
    }
    EXPECT_FALSE(state.finished()) << "the job ended before the signal: make it longer";
    return state;
  }

  // Runs `pstrain <command>` with `flags` in `m` (fresh or resumed) until early stopping ends
  // the pass; checks that its output has `expect`. Returns the chief's (worker 0's) state in the
  // pass's last checkpoint, of `workers`.
  WorkerState TrainToTheStop(const std::string& command, const std::string& m,
                             const std::vector<std::string>& flags, const std::string& expect,
                             int workers = 1) {
    Result r = Pstrain(command, m, flags);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("early stopping at step "));
    EXPECT_THAT(r.out, HasSubstr(expect));
    const std::vector<WorkerState> states = FinalStates(m, workers, /*finished=*/false);
    return states.empty() ? WorkerState() : states[0];
  }

  std::string name_;
  int runs_ = 0;
};

// The resume tests' flags: keep_best evaluates every checkpoint (every 4 steps) before the next
// one is written, so which evaluations a job makes is fixed by its steps, not by timing. No AUC
// improves by more than min_delta 1 after the first, so patience 30 ends the pass after the 31st
// evaluation, of checkpoint 124, at a step boundary in (124, 128] (when its result arrives).
const std::vector<std::string> kResumeFlags = {
    "--set", "train.early_stopping.patience_evals=30", "--set", "checkpoint.keep_best=true",
    "--set", "checkpoint.every_steps=4",               "--set", "checkpoint.keep=2"};

// The early-stopping state a resumed job ends with equals the uninterrupted job's: the same
// count of evaluations, the same best (the first, at step 4), and the stop in the same
// checkpoint interval. A job that forgot its patience on resume (or lost an evaluation) would
// count on from the resume and stop checkpoints later, with a later best step.
void ExpectSameEnd(const WorkerState& whole, const WorkerState& resumed) {
  const EarlyStoppingState& w = whole.early_stopping();
  const EarlyStoppingState& r = resumed.early_stopping();
  EXPECT_EQ(w.evals(), 31);
  EXPECT_EQ(w.evals_since_best(), 30);
  EXPECT_EQ(w.best_step(), 4);
  EXPECT_EQ(r.evals(), w.evals());
  EXPECT_EQ(r.evals_since_best(), w.evals_since_best());
  EXPECT_EQ(r.best_step(), w.best_step());
  for (const WorkerState* s : {&whole, &resumed}) {
    SCOPED_TRACE(s == &whole ? "uninterrupted" : "resumed");
    EXPECT_GT(s->step(), 124);
    EXPECT_LE(s->step(), 128);
  }
}

TEST_F(EarlyStoppingTest, TrainResumedAfterSigtermGoesOnCountingItsPatience) {
  const WorkerState whole = TrainToTheStop("train", Dir() + "/patience_whole", kResumeFlags, "");
  const std::string m = Dir() + "/patience_sigterm";
  const WorkerState stopped = Interrupt("train", m, kResumeFlags, SIGTERM, /*evals=*/1);
  // The stop's checkpoint holds at least the first evaluation, and the pass is not over.
  EXPECT_GE(stopped.early_stopping().evals(), 1);
  EXPECT_LT(stopped.early_stopping().evals(), 31);
  EXPECT_EQ(stopped.early_stopping().best_step(), 4);
  ExpectSameEnd(whole, TrainToTheStop("train", m, kResumeFlags, "resumed from "));
}

// Killed after the third evaluation (no stop checkpoint): the newest checkpoint was written
// before its own evaluation reported; the resumed job goes on counting from the checkpoint's
// state and runs that evaluation first, as the uninterrupted job did.
TEST_F(EarlyStoppingTest, TrainResumedAfterAKillRunsTheLostEvaluation) {
  const WorkerState whole = TrainToTheStop("train", Dir() + "/patience_whole_kill", kResumeFlags, "");
  const std::string m = Dir() + "/patience_kill";
  const WorkerState killed = Interrupt("train", m, kResumeFlags, SIGKILL, /*evals=*/3);
  EXPECT_EQ(killed.early_stopping().evaluating_step(), killed.step());
  EXPECT_GE(killed.early_stopping().evals(), 1);  // counted evaluations that must carry on
  ExpectSameEnd(whole, TrainToTheStop("train", m, kResumeFlags,
                                      "(its evaluation was not in the checkpoint)"));
}

// The same in a PS job (`pstrain local --hosts 2`, SYNC), where the chief's state is committed
// in the job's checkpoint rounds: stopped by SIGTERM after the first evaluation and resumed, it
// ends with the uninterrupted job's best step at the same chief step. (The stop's round stands
// for the scheduled round it came before, whose evaluation the resumed job runs: without that
// the resumed job evaluated one round fewer and stopped 4 steps later.) A job that forgot its
// patience would have its best after the resume and stop about 30 rounds later.
TEST_F(EarlyStoppingTest, PsResumedAfterSigtermGoesOnCountingItsPatience) {
  std::vector<std::string> flags = kResumeFlags;
  flags.insert(flags.end(), {"--hosts", "2", "--kill_timeout_s", "20", "--set",
                             "cluster.consistency=SYNC"});
  const WorkerState whole = TrainToTheStop("local", Dir() + "/ps_patience_whole", flags, "", 2);
  EXPECT_EQ(whole.early_stopping().evals(), 31);
  const std::string m = Dir() + "/ps_patience_sigterm";
  const WorkerState stopped = Interrupt("local", m, flags, SIGTERM, /*evals=*/1);
  EXPECT_LT(stopped.early_stopping().evals() + stopped.early_stopping().has_evaluating_step(),
            31);
  EXPECT_GE(stopped.early_stopping().evals() + stopped.early_stopping().has_evaluating_step(),
            1);
  const WorkerState resumed = TrainToTheStop("local", m, flags, "resumed from ", 2);
  EXPECT_EQ(resumed.early_stopping().evals(), whole.early_stopping().evals());
  EXPECT_EQ(resumed.early_stopping().evals_since_best(), whole.early_stopping().evals_since_best());
  EXPECT_EQ(resumed.early_stopping().best_step(), whole.early_stopping().best_step());
  EXPECT_EQ(resumed.step(), whole.step());
  EXPECT_EQ(ProcessesLeft(m), 0);
}

TEST_F(EarlyStoppingTest, TrainStopsEarlyAndEndsThePass) {
  const std::string m = Dir() + "/train";
  Result r = Pstrain("train", m);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("early stopping at step "));
  EXPECT_THAT(r.out, HasSubstr("has not improved by more than 1 in 1 evaluations"));
  ExpectStoppedEarly(m);
  const std::vector<WorkerState> states = FinalStates(m, 1);
  ASSERT_EQ(states.size(), 1u);
  EXPECT_GE(states[0].step(), 4);  // two evaluations, every 2 steps
  EXPECT_LT(states[0].step(), kFullSteps);
  EXPECT_EQ(ReadSummary(m).fields().at("steps").number_value(), states[0].step());
  // The pass is over: the same command trains nothing more.
  Result again = Pstrain("train", m);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_THAT(again.out, HasSubstr("nothing to train: "));
}

// PS: the chief decides; every worker stops in the chief's stopping round and ends its pass.
// SYNC: at one common step. ASYNC: in the same round, each at its next step boundary.
TEST_F(EarlyStoppingTest, PsStopsEveryWorkerInOneRound) {
  for (const char* consistency : {"SYNC", "ASYNC"}) {
    SCOPED_TRACE(consistency);
    const std::string m = Dir() + "/ps_" + consistency;
    Result r = Pstrain("local", m,
                       {"--hosts", "2", "--kill_timeout_s", "20", "--set",
                        absl::StrCat("cluster.consistency=", consistency)});
    ASSERT_EQ(r.exit_code, 0) << r.out << Slurp(m + "/host-1/output.log");
    EXPECT_THAT(r.out, HasSubstr("early stopping at step "));
    ExpectStoppedEarly(m);
    const std::vector<WorkerState> states = FinalStates(m, 2, /*finished=*/false);
    ASSERT_EQ(states.size(), 2u);
    if (std::string(consistency) == "SYNC") {
      EXPECT_EQ(states[0].step(), states[1].step());
    }
    // Each worker reads half the data: 30 steps would be the whole pass.
    EXPECT_LT(states[0].step(), kFullSteps / 2);
    EXPECT_LT(states[1].step(), kFullSteps / 2);
    EXPECT_EQ(ReadSummary(m).fields().at("steps").number_value(),
              states[0].step() + states[1].step());
    EXPECT_EQ(ProcessesLeft(m), 0);
  }
}

TEST_F(EarlyStoppingTest, AllreduceStopsEveryRankAfterOneStep) {
  const std::string m = Dir() + "/allreduce";
  Result r = Pstrain("allreduce", m, {},
                     {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("early stopping at step "));
  // Finish's replica checksums ran: every rank was there, at one step.
  EXPECT_THAT(r.out, HasSubstr("rank 0 of 2: replica crc32c"));
  EXPECT_THAT(r.out, HasSubstr("rank 1 of 2: replica crc32c"));
  ExpectStoppedEarly(m);
  const std::vector<WorkerState> states = FinalStates(m, 2);
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].step(), states[1].step());
  EXPECT_LT(states[0].step(), kFullSteps / 2);
}

// keep_best with a validation split: every checkpoint is evaluated on the held-out 20% of the
// train files; BEST names the best, kept beside checkpoint.keep = 1; predict reads it.
TEST_F(EarlyStoppingTest, KeepBestKeepsAndMarksTheBestOnTheValidationSplit) {
  const std::string m = Dir() + "/best";
  Result r = Pstrain("train", m,
                     {"--epochs", "3", "--set", "train.early_stopping.patience_evals=0", "--set",
                      "train.early_stopping.metric=LOGLOSS", "--set", "checkpoint.keep_best=true",
                      "--set", "checkpoint.keep=1", "--set", "checkpoint.every_steps=4", "--set",
                      "data.validation_fraction=0.2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("best checkpoint: "));
  absl::StatusOr<int64_t> best = ReadBest(m);
  ASSERT_TRUE(best.ok()) << best.status();
  const std::string best_dir = CheckpointPath(m, *best);
  CheckpointManifest manifest;
  EXPECT_TRUE(VerifyCheckpoint(best_dir, &manifest).ok());
  const google::protobuf::Struct s = ReadSummary(m);
  EXPECT_FALSE(s.fields().at("stopped_early").bool_value());
  EXPECT_EQ(s.fields().at("best_metric").string_value(), "LOGLOSS");
  EXPECT_EQ(s.fields().at("best_checkpoint").string_value(), best_dir);
  // 80% of 2000 rows x 3 epochs, in steps of 100: the validation rows are not trained.
  const double examples = s.fields().at("examples").number_value();
  EXPECT_GT(examples, 3 * 1500);
  EXPECT_LT(examples, 3 * 1700);
  // Retention: the final checkpoint (keep = 1) and the best, nothing else.
  std::vector<int64_t> steps;
  for (const CheckpointEntry& e : ListCheckpoints(m)) steps.push_back(e.step);
  absl::StatusOr<int64_t> latest = ReadLatest(m);
  ASSERT_TRUE(latest.ok());
  if (*latest == *best) {
    EXPECT_EQ(steps, (std::vector<int64_t>{*latest}));
  } else {
    EXPECT_EQ(steps, (std::vector<int64_t>{*latest, *best}));
  }
  // predict --checkpoint best reads the marked checkpoint.
  const Result p = testing::RunCommand(
      {PSTRAIN_BINARY, "predict", "--model_dir", m, "--checkpoint", "best", "--input",
       Dir() + "/test/part-00000.tsv", "--summary", Dir() + "/predict_best.json"},
      Dir() + "/predict_best.log", 120000);
  ASSERT_EQ(p.exit_code, 0) << p.out;
  EXPECT_THAT(Slurp(Dir() + "/predict_best.json"), HasSubstr(best_dir));
}

}  // namespace
}  // namespace pstrain
