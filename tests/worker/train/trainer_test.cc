// End-to-end tests of single-process training: real Criteo data must be learned, and a stopped
// and resumed run must end with exactly the parameters of an uninterrupted one.
#include "worker/train/trainer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shared_data.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using pstrain::testing::FreshDir;
using pstrain::testing::Slurp;

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

// The quality bar: train the shipped config (one epoch) on the first 8,000 rows of
// Kaggle's train.txt, evaluate on the last 2,000. A hashed logistic regression reaches about
// 0.747 there; this config 0.741 (docs/PERFORMANCE.md "Small real data" cross-validates it).
TEST(Trainer, LearnsRealKaggleCriteo) {
  ASSERT_SHARED_DATA(src, "criteo/kaggle_train_head10k.tsv");
  const std::string dir = FreshDir("trainer_kaggle");  // no checkpoint to resume from
  CopyLines(src, dir + "/train.tsv", 0, 8000);
  CopyLines(src, dir + "/test.tsv", 8000, 10000);
  Config config = BaseConfig(dir + "/train.tsv", dir + "/test.tsv", dir + "/model");
  TrainerOptions opts;
  opts.cores = 2;
  auto summary = RunTraining(config, opts);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->examples, 8000);
  EXPECT_EQ(summary->eval_examples, 2000);
  EXPECT_GE(summary->test_auc, 0.73);
  EXPECT_LT(summary->test_logloss, 0.50);  // the base rate's logloss is ~0.52 here
  // summary.json carries the contract's keys.
  const std::string json = Slurp(dir + "/model/summary.json");
  for (const char* key : {"\"test_auc\"", "\"test_logloss\"", "\"examples_per_sec\"", "\"examples\"",
                          "\"steps\"", "\"wall_seconds\"", "\"mode\"", "\"towers\"",
                          "\"intra_op_threads\"", "\"inter_op_threads\"", "\"hosts\""}) {
    EXPECT_THAT(json, ::testing::HasSubstr(key));
  }
  // The parameter memory of the one process: the dense vector plus whole rows, and their slots.
  ASSERT_EQ(summary->memory.size(), 1u);
  EXPECT_EQ(summary->memory_per, "process");
  const StoreMemory& m = summary->memory[0];
  const int64_t row_bytes = summary->row_dim * 4;
  EXPECT_GT(m.parameter_bytes, summary->dense_params * 4);
  EXPECT_EQ((m.parameter_bytes - summary->dense_params * 4) % row_bytes, 0) << m.parameter_bytes;
  EXPECT_GT(m.optimizer_bytes, 0);
  EXPECT_GE(m.total_bytes, m.parameter_bytes + m.optimizer_bytes);
  EXPECT_THAT(json, ::testing::HasSubstr(absl::StrCat(
                        "\"memory\":{\"per\":\"process\",\"parameter_bytes\":[", m.parameter_bytes,
                        "],\"optimizer_bytes\":[", m.optimizer_bytes, "],\"total_bytes\":[",
                        m.total_bytes, "]}")));
  EXPECT_TRUE(PathExists(dir + "/model/metrics.jsonl"));
  EXPECT_TRUE(PathExists(dir + "/model/LATEST"));
  std::system(("rm -rf " + dir).c_str());
}

// train.async_local_updates (one step stale, pushes on a background thread) still learns the
// real data, and is deterministic: two runs end with the same AUC to the last bit. With the
// shipped config's 16 steps an epoch (Adam on the MLP) one step of staleness does not converge
// here (AUC 0.674, logloss 1.30), so this trains 3 epochs of 64 steps with Adagrad on both sides
// (the settings of the retired configs/criteo_kaggle_small.textproto): 0.719, where the
// synchronous run reaches 0.743.
TEST(Trainer, AsyncLocalUpdatesLearnAndAreDeterministic) {
  ASSERT_SHARED_DATA(src, "criteo/kaggle_train_head10k.tsv");
  const std::string dir = FreshDir("trainer_async");
  CopyLines(src, dir + "/train.tsv", 0, 8000);
  CopyLines(src, dir + "/test.tsv", 8000, 10000);
  double auc[2];
  for (int run = 0; run < 2; ++run) {
    Config config = BaseConfig(dir + "/train.tsv", dir + "/test.tsv",
                               dir + "/model" + std::to_string(run));
    for (const char* set :
         {"features.categorical_vocab_size=100000", "train.global_batch_size=0",
          "train.batch_size=128", "train.epochs=3",
          "sparse_optimizer.learning_rate=0.3", "sparse_optimizer.initial_accumulator=0.1",
          "dense_optimizer.type=ADAGRAD", "dense_optimizer.learning_rate=0.05",
          "dense_optimizer.initial_accumulator=0.1"}) {
      ASSERT_TRUE(ApplyOverride(set, &config).ok()) << set;
    }
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

class ResumeTest : public ::testing::Test {
 protected:
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void SetUp() override {
    dir_ = FreshDir(std::string("trainer_resume_") +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (auto [name, seed, rows] : {std::tuple{"train", 1, 30000}, std::tuple{"test", 2, 3000}}) {
      const std::string cmd = std::string(PSTRAIN_BINARY) + " datagen --rows " +
                              std::to_string(rows) + " --seed " + std::to_string(seed) +
                              " --files 3 --format tfrecord --out " + dir_ + "/" + name +
                              " > /dev/null 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }

  void SigtermAndResume(const std::function<void(Config*)>& tweak, std::string* straight_params,
                        std::string* resumed_params);

  Config MakeConfig(const std::string& model_dir) {
    Config c = BaseConfig(dir_ + "/train/part-*", dir_ + "/test/part-*", model_dir);
    for (const char* set : {"data.train[0].format=TFRECORD", "data.eval[0].format=TFRECORD",
                            "train.epochs=2", "train.global_batch_size=512", "threads.towers=2",
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

// Runs the config of MakeConfig, changed by `tweak`, uninterrupted in this process and, in a real
// process, stopped by SIGTERM (spot preemption) and resumed: the first run checkpoints and exits
// 0, the second resumes. Sets the final checkpoints' parameter files of both.
void ResumeTest::SigtermAndResume(const std::function<void(Config*)>& tweak,
                                  std::string* straight_params, std::string* resumed_params) {
  TrainerOptions opts;
  opts.cores = 2;
  Config straight = MakeConfig(dir_ + "/straight");
  tweak(&straight);
  auto full = RunTraining(straight, opts);
  ASSERT_TRUE(full.ok()) << full.status();

  const std::string cfg_path = dir_ + "/preempt.textproto";

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
    tweak(&c);
    c.mutable_train()->set_log_every_steps(1);
    ASSERT_TRUE(WriteFileAtomic(cfg_path, ConfigToText(c)).ok());
  }
  EXPECT_EQ(run(true), 0) << Slurp(log);
  EXPECT_THAT(Slurp(log), ::testing::HasSubstr("stopped by SIGTERM"));
  EXPECT_EQ(run(false), 0) << Slurp(log);
  EXPECT_THAT(Slurp(log), ::testing::HasSubstr("resumed from"));
  const std::string last = "/ckpt-" + std::to_string(full->steps) + "/shard-0-of-1";
  *straight_params = Slurp(dir_ + "/straight" + last);
  *resumed_params = Slurp(dir_ + "/preempt" + last);
  ASSERT_FALSE(straight_params->empty());
}

// SIGTERM and resume end with the uninterrupted run's parameters, to the byte.
TEST_F(ResumeTest, SigtermCheckpointsExitsZeroAndResumesExactly) {
  std::string a, b;
  SigtermAndResume([](Config*) {}, &a, &b);
  EXPECT_TRUE(a == b) << "final parameters differ after SIGTERM and resume";
}

// The same with learning-rate schedules on both optimizers (warm-up, then cosine decay for the
// sparse one and step decay for the dense one): the schedule is a pure function of the restored
// step, so the resumed run ends with the uninterrupted run's parameters; and the schedule does
// act (the parameters differ from the run without it).
TEST_F(ResumeTest, ScheduleIsExactAcrossSigtermAndResume) {
  std::string plain, plain_resumed;
  SigtermAndResume([](Config*) {}, &plain, &plain_resumed);
  std::system(("rm -rf " + dir_ + "/straight " + dir_ + "/preempt").c_str());
  std::string a, b;
  SigtermAndResume(
      [](Config* c) {
        for (const char* set : {"sparse_optimizer.schedule.warmup_steps=20",
                                "sparse_optimizer.schedule.decay=COSINE",
                                "sparse_optimizer.schedule.decay_steps=150",
                                "sparse_optimizer.schedule.min_factor=0.1",
                                "dense_optimizer.schedule.warmup_steps=10",
                                "dense_optimizer.schedule.decay=STEP",
                                "dense_optimizer.schedule.decay_steps=40",
                                "dense_optimizer.schedule.decay_rate=0.5"}) {
          EXPECT_TRUE(ApplyOverride(set, c).ok()) << set;
        }
      },
      &a, &b);
  EXPECT_TRUE(a == b) << "final parameters differ after SIGTERM and resume with a schedule";
  EXPECT_FALSE(a == plain) << "the schedule changed nothing";
}

// Checkpointer of in-process parameters that asks for a checkpoint after step `request_at` (once)
// and raises the stop flag as step `stop_at` - 1 is about to train, when the trainer has already
// decided to read batch `stop_at` ahead: the stop is served after that batch.
class ScriptedCheckpointer : public Checkpointer, public LocalJob {
 public:
  ScriptedCheckpointer(const std::string& dir, LocalParams* params, const ModelDescription& model,
                       std::atomic<bool>* stop, int request_at, int stop_at)
      : LocalJob(stop),
        inner_(dir, params, 3, model),
        stop_(stop),
        request_at_(request_at),
        stop_at_(stop_at) {}
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
    return inner_.Restore(state);
  }
  bool CheckpointRequested(int64_t step) override {
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
  Config resolved = c;
  ResolveThreadDefaults(2, &resolved);
  const ThreadConfig& threads = resolved.threads();
  auto spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(c.model(), spec->num_fields());
  ASSERT_TRUE(model.ok()) << model.status();
  auto params = LocalParams::Create(**model, spec->total_rows(), c,
                                    threads.towers() * threads.intra_op_threads());
  ASSERT_TRUE(params.ok()) << params.status();
  std::atomic<bool> stop{false};
  ScriptedCheckpointer scripted(dir_ + "/scripted", params->get(), *DescribeModel(c), &stop, 23,
                                61);
  TrainerOptions sopts = opts;
  sopts.params = params->get();
  sopts.checkpointer = &scripted;
  sopts.job = &scripted;
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
  ::testing::internal::CaptureStderr();
  auto second = RunTraining(c, opts);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(err, ::testing::HasSubstr("refusing checkpoint"));
  EXPECT_THAT(err, ::testing::HasSubstr("ckpt-45"));
  EXPECT_THAT(err, ::testing::HasSubstr("resumed from"));
  EXPECT_THAT(err, ::testing::HasSubstr("ckpt-40"));
  EXPECT_EQ(second->steps, 50);
}

// ---- Divergence (worker/train/train_loop.h) ----

// Record 700 of the training file carries I1 = 1e30 in a DENSE, NO_TRANSFORM field that every
// other record leaves missing: that value scales I1's embedding row (entries ~1e28) and the FM
// term's squares overflow float, so the loss of exactly step 11 (records 640..703, 64 a step,
// read in order) is NaN whatever the parameters are, and the steps before are ordinary training.
// tests/cmd/divergence_test.cc runs the commands on the same trigger.
constexpr int kDivergedStep = 11;

// "nan" or "inf", as the status says: which of the two the overflow gives depends on the record
// (an infinite logit gives an infinite loss for label 0 and inf - inf = NaN for label 1), and
// both are a divergence. Anything else fails the test's match.
std::string LossWord(const absl::Status& s) {
  const std::string m(s.message());
  return m.find("loss is inf ") != std::string::npos ? "inf" : "nan";
}

// Asks for a checkpoint at the boundary after each step of `requests` (once each) and raises the
// stop flag while step `stop_before` is about to train (after the trainer decided to read the
// next batch ahead, so that the stop is served one step later). Records every Save.
class RecordingCheckpointer : public Checkpointer, public LocalJob {
 public:
  RecordingCheckpointer(const std::string& dir, LocalParams* params, const ModelDescription& model,
                        std::atomic<bool>* stop, std::vector<int64_t> requests,
                        int64_t stop_before)
      : LocalJob(stop),
        inner_(dir, params, 100, model),
        stop_(stop),
        requests_(std::move(requests)),
        stop_before_(stop_before) {}
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
    return inner_.Restore(state);
  }
  bool CheckpointRequested(int64_t step) override {
    if (stop_before_ > 0 && step == stop_before_) stop_->store(true);
    auto it = std::find(requests_.begin(), requests_.end(), step);
    if (it == requests_.end()) return false;
    requests_.erase(it);
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
  std::vector<int64_t> requests_;
  const int64_t stop_before_;
};

struct DivergenceCase {
  const char* name;
  int64_t every_steps;             // the chief's checkpoint schedule (0: off)
  std::vector<int64_t> requests;   // RecordingCheckpointer's
  int64_t stop_before;             // RecordingCheckpointer's (0: no stop)
  bool checkpointer;               // false: none (the message says "none")
};

void PrintTo(const DivergenceCase& c, std::ostream* os) { *os << c.name; }

class TrainerDivergence : public ::testing::TestWithParam<DivergenceCase> {
 protected:
  static void SetUpTestSuite() {
    dir_ = FreshDir("trainer_divergence");
    for (auto [name, seed, rows] : {std::tuple{"gen", 1, 1200}, std::tuple{"test", 2, 300}}) {
      const std::string cmd = std::string(PSTRAIN_BINARY) + " datagen --rows " +
                              std::to_string(rows) + " --seed " + std::to_string(seed) +
                              " --out " + dir_ + "/" + name + " > /dev/null 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    std::ifstream in(dir_ + "/gen/part-00000.tsv");
    std::ofstream out(dir_ + "/train.tsv");
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      // Column 1 is I1 (column 0 the label).
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      ASSERT_NE(b, std::string::npos) << line;
      out << line.substr(0, a + 1) << (i == 700 ? "1e30" : "") << line.substr(b) << '\n';
    }
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + dir_).c_str()); }

  static Config MakeConfig(const std::string& model_dir) {
    Config c = BaseConfig(dir_ + "/train.tsv", dir_ + "/test/part-*", model_dir);
    for (const char* set : {"train.epochs=1", "train.global_batch_size=64", "threads.towers=2",
                            "threads.intra_op_threads=1", "threads.inter_op_threads=1",
                            "features.categorical_vocab_size=20000", "data.shuffle_buffer=0",
                            "model.hidden=[32]", "checkpoint.every_seconds=0",
                            "checkpoint.keep=100"}) {
      EXPECT_TRUE(ApplyOverride(set, &c).ok()) << set;
    }
    FieldSpec* f = c.mutable_features()->add_field();
    f->set_name("I1");
    f->set_kind(NUMERIC);
    f->set_numeric_mode(DENSE);
    f->set_numeric_transform(NO_TRANSFORM);
    return c;
  }

  // Fresh in-process parameters for `c`.
  static std::unique_ptr<LocalParams> MakeParams(const Config& c) {
    Config resolved = c;
    ResolveThreadDefaults(2, &resolved);
    const ThreadConfig& threads = resolved.threads();
    auto spec = FeatureSpec::Create(c.features());
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto model = Model::Create(c.model(), spec->num_fields());
    EXPECT_TRUE(model.ok()) << model.status();
    auto params = LocalParams::Create(**model, spec->total_rows(), c,
                                      threads.towers() * threads.intra_op_threads());
    // The parameters initialize new rows through the model (Model::InitRow): it must outlive
    // them, so the fixture keeps every model it made until the suite ends.
    models_.push_back(std::move(*model));
    EXPECT_TRUE(params.ok()) << params.status();
    return params.ok() ? std::move(*params) : nullptr;
  }

  // Restores LATEST of `dir` into fresh parameters: its step, and the count of non-finite
  // values among every row's weights and optimizer slots and the dense weights and state.
  static void ExpectLatestFinite(const Config& c, const std::string& dir, int64_t want_step) {
    std::unique_ptr<LocalParams> p = MakeParams(c);
    ASSERT_NE(p, nullptr);
    WorkerState state;
    auto restored = RestoreLatestCheckpoint(dir, p.get(), &state, *DescribeModel(c));
    ASSERT_TRUE(restored.ok()) << restored.status();
    ASSERT_TRUE(restored->has_value());
    EXPECT_EQ(**restored, dir + "/ckpt-" + std::to_string(want_step));
    EXPECT_EQ(state.step(), want_step);
    const EmbeddingSnapshot rows = p->embedding()->Snapshot();
    const DenseSnapshot dense = p->dense()->Snapshot();
    EXPECT_GT(rows.rows(), 1000);
    int64_t non_finite = 0;
    for (const std::vector<float>* v : {&rows.weights, &rows.state, &dense.weights, &dense.state}) {
      for (float x : *v) non_finite += !std::isfinite(x);
    }
    EXPECT_EQ(non_finite, 0);
  }

  static std::string dir_;
  static std::vector<std::unique_ptr<Model>> models_;
};
std::string TrainerDivergence::dir_;
std::vector<std::unique_ptr<Model>> TrainerDivergence::models_;

// The divergence ends training within the step, with FAILED_PRECONDITION naming the step and the
// last good checkpoint, and nothing is saved after it: not the checkpoint the schedule or a
// request wants at that step's boundary, not the stop's (raised while that step was read ahead),
// not the final one. LATEST and its parameters are those of step 5.
TEST_P(TrainerDivergence, StopsAtTheStepAndSavesNothingAfterIt) {
  const DivergenceCase& t = GetParam();
  const std::string model_dir = dir_ + "/" + t.name;
  Config c = MakeConfig(model_dir);
  c.mutable_checkpoint()->set_every_steps(t.every_steps);
  std::unique_ptr<LocalParams> params = MakeParams(c);
  ASSERT_NE(params, nullptr);
  std::atomic<bool> stop{false};
  RecordingCheckpointer recording(model_dir, params.get(), *DescribeModel(c), &stop, t.requests,
                                  t.stop_before);
  TrainerOptions opts;
  opts.cores = 2;
  opts.params = params.get();
  opts.checkpointer = t.checkpointer ? &recording : nullptr;
  opts.job = &recording;
  opts.stop = &stop;
  ::testing::internal::CaptureStderr();
  auto summary = RunTraining(c, opts);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(summary.ok()) << err;
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string last = t.checkpointer ? model_dir + "/ckpt-5" : "none";
  EXPECT_THAT(std::string(summary.status().message()),
              ::testing::HasSubstr("training diverged at step " + std::to_string(kDivergedStep) +
                                 ": loss is " + LossWord(summary.status()) +
                                 " (last good checkpoint: " + last + ")"));
  EXPECT_FALSE(PathExists(model_dir + "/summary.json"));
  if (!t.checkpointer) return;
  EXPECT_EQ(recording.saved_steps, std::vector<int64_t>{5});
  EXPECT_EQ(Slurp(model_dir + "/LATEST"), "ckpt-5\n");
  EXPECT_FALSE(PathExists(model_dir + "/ckpt-" + std::to_string(kDivergedStep)));
  ExpectLatestFinite(c, model_dir, 5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainerDivergence,
    ::testing::Values(DivergenceCase{"ScheduledAtTheStep", kDivergedStep, {5}, 0, true},
                    DivergenceCase{"RequestedAtTheStep", 0, {5, kDivergedStep}, 0, true},
                    DivergenceCase{"StopWhileTheStepIsReadAhead", 0, {5}, kDivergedStep - 1, true},
                    DivergenceCase{"NoCheckpointer", 0, {}, 0, false}),
    [](const ::testing::TestParamInfo<DivergenceCase>& info) { return info.param.name; });

// train.async_local_updates (pushes on a background thread, pulls one step ahead) detects it at
// the same step; the checkpoints of the schedule before it (5, 10) stay, LATEST is ckpt-10.
TEST_F(TrainerDivergence, AsyncLocalUpdatesStopAtTheSameStep) {
  const std::string model_dir = dir_ + "/async";
  Config c = MakeConfig(model_dir);
  c.mutable_train()->set_async_local_updates(true);
  c.mutable_checkpoint()->set_every_steps(5);
  TrainerOptions opts;
  opts.cores = 2;
  auto summary = RunTraining(c, opts);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(summary.status().message()),
              ::testing::HasSubstr("training diverged at step " + std::to_string(kDivergedStep) +
                                 ": loss is " + LossWord(summary.status()) +
                                 " (last good checkpoint: " + model_dir + "/ckpt-10)"));
  EXPECT_EQ(Slurp(model_dir + "/LATEST"), "ckpt-10\n");
  ExpectLatestFinite(c, model_dir, 10);
}

}  // namespace
}  // namespace pstrain
