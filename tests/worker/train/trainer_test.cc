// End-to-end tests of single-process training: real Criteo data must be learned, and a stopped
// and resumed run must end with exactly the parameters of an uninterrupted one.
#include "worker/train/trainer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shared_data.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"

namespace pstrain {
namespace {

// A fresh directory of this process: concurrent test runs (CI, several checkouts) never share one.
std::string FreshDir(const std::string& name) {
  std::string templ = testing::TempDir() + "/" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return testing::TempDir() + "/" + name;
  return templ;
}

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

// Writes lines [begin, end) of `src` to `dst`.
void CopyLines(const std::string& src, const std::string& dst, int begin, int end) {
  std::ifstream in(src);
  std::ofstream out(dst);
  std::string line;
  for (int i = 0; std::getline(in, line) && i < end; ++i) {
    if (i >= begin) out << line << '\n';
  }
}

Config BaseConfig(const std::string& train, const std::string& eval, const std::string& model_dir,
                  const std::string& config_file = "deepfm_criteo.textproto") {
  auto c = LoadConfigFile(std::string(PSTRAIN_SOURCE_DIR) + "/configs/" + config_file);
  EXPECT_TRUE(c.ok()) << c.status();
  Config config = *c;
  config.mutable_data()->mutable_train(0)->add_path(train);
  config.mutable_data()->mutable_eval(0)->add_path(eval);
  config.mutable_train()->set_model_dir(model_dir);
  config.mutable_train()->set_log_every_steps(1000000);
  return config;
}

// The quality bar: train on the first 8,000 rows of Kaggle's train.txt, evaluate on the
// last 2,000. A hashed logistic regression reaches about 0.747 there.
TEST(Trainer, LearnsRealKaggleCriteo) {
  ASSERT_SHARED_DATA(src, "criteo/kaggle_train_head10k.tsv");
  const std::string dir = FreshDir("trainer_kaggle");  // no checkpoint to resume from
  CopyLines(src, dir + "/train.tsv", 0, 8000);
  CopyLines(src, dir + "/test.tsv", 8000, 10000);
  Config config = BaseConfig(dir + "/train.tsv", dir + "/test.tsv", dir + "/model",
                             "criteo_kaggle_small.textproto");
  TrainerOptions opts;
  opts.cores = 2;
  auto summary = RunTraining(config, opts);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->examples, 3 * 8000);
  EXPECT_EQ(summary->eval_examples, 2000);
  EXPECT_GE(summary->test_auc, 0.73);
  EXPECT_LT(summary->test_logloss, 0.50);  // the base rate's logloss is ~0.52 here
  // summary.json carries the contract's keys.
  const std::string json = Slurp(dir + "/model/summary.json");
  for (const char* key : {"\"test_auc\"", "\"test_logloss\"", "\"examples_per_sec\"", "\"examples\"",
                          "\"steps\"", "\"wall_seconds\"", "\"mode\"", "\"towers\"",
                          "\"intra_op_threads\"", "\"inter_op_threads\"", "\"hosts\""}) {
    EXPECT_THAT(json, testing::HasSubstr(key));
  }
  EXPECT_TRUE(PathExists(dir + "/model/metrics.jsonl"));
  EXPECT_TRUE(PathExists(dir + "/model/LATEST"));
  std::system(("rm -rf " + dir).c_str());
}

// train.async_local_updates (one step stale, pushes on a background thread) still learns the
// real data, and is deterministic: two runs end with the same AUC to the last bit. The staleness
// costs AUC with this config's large steps (Adagrad lr 0.3, 32 steps an epoch): 0.719 here, where
// the synchronous run reaches 0.743.
TEST(Trainer, AsyncLocalUpdatesLearnAndAreDeterministic) {
  ASSERT_SHARED_DATA(src, "criteo/kaggle_train_head10k.tsv");
  const std::string dir = FreshDir("trainer_async");
  CopyLines(src, dir + "/train.tsv", 0, 8000);
  CopyLines(src, dir + "/test.tsv", 8000, 10000);
  double auc[2];
  for (int run = 0; run < 2; ++run) {
    Config config = BaseConfig(dir + "/train.tsv", dir + "/test.tsv",
                               dir + "/model" + std::to_string(run),
                               "criteo_kaggle_small.textproto");
    config.mutable_train()->set_async_local_updates(true);
    TrainerOptions opts;
    opts.cores = 2;
    auto summary = RunTraining(config, opts);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->examples, 3 * 8000);
    EXPECT_GE(summary->test_auc, 0.70);
    auc[run] = summary->test_auc;
  }
  EXPECT_EQ(auc[0], auc[1]);
  std::system(("rm -rf " + dir).c_str());
}

class ResumeTest : public testing::Test {
 protected:
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void SetUp() override {
    dir_ = FreshDir(std::string("trainer_resume_") +
                    testing::UnitTest::GetInstance()->current_test_info()->name());
    for (auto [name, seed, rows] : {std::tuple{"train", 1, 30000}, std::tuple{"test", 2, 3000}}) {
      const std::string cmd = std::string(PSTRAIN_BINARY) + " datagen --rows " +
                              std::to_string(rows) + " --seed " + std::to_string(seed) +
                              " --files 3 --format tfrecord --out " + dir_ + "/" + name +
                              " > /dev/null 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }

  Config MakeConfig(const std::string& model_dir) {
    Config c = BaseConfig(dir_ + "/train/part-*", dir_ + "/test/part-*", model_dir);
    for (const char* set : {"data.train[0].format=TFRECORD", "data.eval[0].format=TFRECORD",
                            "train.epochs=2", "train.batch_size=256", "threads.towers=2",
                            "threads.intra_op_threads=1", "threads.inter_op_threads=2",
                            "features.categorical_vocab_size=20000", "data.shuffle_buffer=1000",
                            "model.hidden=[64, 32]"}) {
      EXPECT_TRUE(ApplyOverride(set, &c).ok()) << set;
    }
    return c;
  }

  std::string dir_;
};

// Stop at step k (max_steps), resume from the checkpoint, finish: the final checkpoint's bytes
// (every row, every optimizer slot, the dense vector) equal those of an uninterrupted run, and
// exactly the same examples were trained.
TEST_F(ResumeTest, StopAndResumeEqualsUninterrupted) {
  TrainerOptions opts;
  opts.cores = 2;
  Config straight = MakeConfig(dir_ + "/straight");
  auto full = RunTraining(straight, opts);
  ASSERT_TRUE(full.ok()) << full.status();

  Config stopped = MakeConfig(dir_ + "/stopped");
  stopped.mutable_train()->set_max_steps(37);  // mid-epoch, with records in the shuffle buffer
  auto first = RunTraining(stopped, opts);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->steps, 37);
  stopped.mutable_train()->set_max_steps(0);
  auto second = RunTraining(stopped, opts);
  ASSERT_TRUE(second.ok()) << second.status();

  EXPECT_EQ(second->steps, full->steps);
  EXPECT_EQ(second->examples, full->examples);
  EXPECT_EQ(second->test_logloss, full->test_logloss);
  const std::string last = "/ckpt-" + std::to_string(full->steps) + "/shard-0-of-1";
  const std::string a = Slurp(dir_ + "/straight" + last), b = Slurp(dir_ + "/stopped" + last);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "final parameters differ after stop and resume";
}

// The same through a real process stopped by SIGTERM (spot preemption): it checkpoints, exits 0,
// and the resumed run ends with the uninterrupted run's parameters.
TEST_F(ResumeTest, SigtermCheckpointsExitsZeroAndResumesExactly) {
  TrainerOptions opts;
  opts.cores = 2;
  auto full = RunTraining(MakeConfig(dir_ + "/straight"), opts);
  ASSERT_TRUE(full.ok()) << full.status();

  const std::string cfg_path = dir_ + "/preempt.textproto";
  ASSERT_TRUE(WriteFileAtomic(cfg_path, ConfigToText(MakeConfig(dir_ + "/preempt"))).ok());
  const std::string log = dir_ + "/preempt.log";
  auto run = [&](bool kill_early) -> int {
    pid_t pid = fork();
    if (pid == 0) {
      FILE* f = freopen(log.c_str(), "a", stderr);
      (void)f;
      execl(PSTRAIN_BINARY, PSTRAIN_BINARY, "train", "--config", cfg_path.c_str(), nullptr);
      _exit(127);
    }
    if (kill_early) {
      // Wait (bounded) until training is under way, then preempt.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (std::chrono::steady_clock::now() < deadline) {
        if (Slurp(log).find("step ") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      kill(pid, SIGTERM);
    }
    int status = 0;
    for (int i = 0; i < 1200 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (waitpid(pid, &status, WNOHANG) == 0 && !WIFEXITED(status)) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_TRUE(WriteFileAtomic(log, "").ok());
  // Log every step so the test can see training start.
  {
    Config c = MakeConfig(dir_ + "/preempt");
    c.mutable_train()->set_log_every_steps(1);
    ASSERT_TRUE(WriteFileAtomic(cfg_path, ConfigToText(c)).ok());
  }
  EXPECT_EQ(run(true), 0) << Slurp(log);
  EXPECT_THAT(Slurp(log), testing::HasSubstr("stopped by SIGTERM"));
  EXPECT_EQ(run(false), 0) << Slurp(log);
  EXPECT_THAT(Slurp(log), testing::HasSubstr("resumed from"));
  const std::string last = "/ckpt-" + std::to_string(full->steps) + "/shard-0-of-1";
  const std::string a = Slurp(dir_ + "/straight" + last), b = Slurp(dir_ + "/preempt" + last);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "final parameters differ after SIGTERM and resume";
}

// Checkpointer of in-process parameters that asks for a checkpoint after step `request_at` (once)
// and raises the stop flag as step `stop_at` - 1 is about to train, when the trainer has already
// decided to read batch `stop_at` ahead: the stop is served after that batch.
class ScriptedCheckpointer : public Checkpointer {
 public:
  ScriptedCheckpointer(const std::string& dir, LocalParams* params, std::atomic<bool>* stop,
                       int request_at, int stop_at)
      : inner_(dir, params, 3), stop_(stop), request_at_(request_at), stop_at_(stop_at) {}
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
    return inner_.Restore(state);
  }
  bool Requested(int64_t step) override {
    if (step + 1 == stop_at_) stop_->store(true);
    if (step != request_at_ || requested_) return false;
    requested_ = true;
    return true;
  }
  absl::StatusOr<std::string> Save(const WorkerState& state, bool final) override {
    saved_steps.push_back(state.step());
    return inner_.Save(state, final);
  }
  std::vector<int64_t> saved_steps;

 private:
  LocalCheckpointer inner_;
  std::atomic<bool>* stop_;
  const int request_at_, stop_at_;
  bool requested_ = false;
};

// A checkpoint request and a stop arriving with a read-ahead batch in the pipeline: each is served
// after that batch (step k), and both checkpoints resume to exactly the uninterrupted run.
TEST_F(ResumeTest, RequestAndStopWithReadAheadResumeExactly) {
  TrainerOptions opts;
  opts.cores = 2;
  auto full = RunTraining(MakeConfig(dir_ + "/straight"), opts);
  ASSERT_TRUE(full.ok()) << full.status();

  Config c = MakeConfig(dir_ + "/scripted");
  c.mutable_checkpoint()->set_every_seconds(0);
  ThreadConfig threads = c.threads();
  ResolveThreadDefaults(2, &threads);
  auto spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(c.model(), spec->num_fields());
  ASSERT_TRUE(model.ok()) << model.status();
  auto params = LocalParams::Create(**model, spec->total_rows(), c,
                                    threads.towers() * threads.intra_op_threads());
  ASSERT_TRUE(params.ok()) << params.status();
  std::atomic<bool> stop{false};
  ScriptedCheckpointer scripted(dir_ + "/scripted", params->get(), &stop, 23, 61);
  TrainerOptions sopts = opts;
  sopts.params = params->get();
  sopts.checkpointer = &scripted;
  sopts.stop = &stop;
  auto first = RunTraining(c, sopts);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->preempted);
  EXPECT_EQ(first->steps, 61);
  EXPECT_EQ(scripted.saved_steps, (std::vector<int64_t>{23, 61}));

  // Resume from the stop's checkpoint (LATEST) and, in a copy, from the requested one.
  ASSERT_EQ(std::system(("cp -r " + dir_ + "/scripted " + dir_ + "/from23").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/from23/LATEST", "ckpt-23\n").ok());
  const std::string last = "/ckpt-" + std::to_string(full->steps) + "/shard-0-of-1";
  const std::string want = Slurp(dir_ + "/straight" + last);
  ASSERT_FALSE(want.empty());
  for (const char* name : {"/scripted", "/from23"}) {
    auto second = RunTraining(MakeConfig(dir_ + name), opts);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->steps, full->steps) << name;
    EXPECT_EQ(second->examples, full->examples) << name;
    EXPECT_TRUE(Slurp(dir_ + name + last) == want) << name << ": final parameters differ";
  }
}

// A flipped byte in the latest checkpoint is refused with a clear message and the job falls back
// to the previous checkpoint instead of crashing or starting over.
TEST_F(ResumeTest, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  TrainerOptions opts;
  opts.cores = 2;
  Config c = MakeConfig(dir_ + "/corrupt");
  c.mutable_checkpoint()->set_every_steps(20);
  c.mutable_checkpoint()->set_keep(5);
  c.mutable_train()->set_max_steps(45);
  auto first = RunTraining(c, opts);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string shard = dir_ + "/corrupt/ckpt-45/shard-0-of-1";
  std::string bytes = Slurp(shard);
  ASSERT_GT(bytes.size(), 1000u);
  bytes[bytes.size() / 2] ^= 0x10;
  { std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes; }

  c.mutable_train()->set_max_steps(50);
  testing::internal::CaptureStderr();
  auto second = RunTraining(c, opts);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(err, testing::HasSubstr("refusing checkpoint"));
  EXPECT_THAT(err, testing::HasSubstr("ckpt-45"));
  EXPECT_THAT(err, testing::HasSubstr("resumed from"));
  EXPECT_THAT(err, testing::HasSubstr("ckpt-40"));
  EXPECT_EQ(second->steps, 50);
}

}  // namespace
}  // namespace pstrain
