// DecidePass's table (worker/train/data_pass.h), case by case, and the data spec's resolution and
// description. The commands that act on it are tested with real processes in
// tests/cmd/continuous_training_test.cc.
#include "worker/train/data_pass.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

DataSpec Spec(const std::string& file) {
  DataSpec s;
  DataSpec::Channel* c = s.add_channel();
  c->set_name("train");
  c->set_format(CRITEO_TSV);
  c->add_file(file);
  return s;
}

WorkerState Saved(const std::string& file, int64_t step = 20, int64_t pass_first_step = 0) {
  WorkerState w;
  w.set_step(step);
  w.set_examples(step * 100);
  *w.mutable_data_spec() = Spec(file);
  w.set_pass_first_step(pass_first_step);
  return w;
}

TrainConfig Train(TrainConfig::OnNewData mode, int64_t max_steps = 0) {
  TrainConfig t;
  t.set_on_new_data(mode);
  t.set_max_steps(max_steps);
  return t;
}

PassEnd Ended(bool max_steps_reached = false) {
  PassEnd e;
  e.set_step(20);
  e.set_pass_examples(2000);
  e.set_max_steps_reached(max_steps_reached);
  return e;
}

PassAction Decide(const WorkerState* w, const PassEnd* e, const std::string& now,
                  const TrainConfig& t) {
  absl::StatusOr<PassDecision> d = DecidePass(w, e, "m/ckpt-20", Spec(now), t);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? d->action : PassAction::kFresh;
}

TEST(DecidePass, FreshWithoutACheckpoint) {
  for (auto mode : {TrainConfig::AUTO, TrainConfig::CONTINUE, TrainConfig::NEW_PASS}) {
    EXPECT_EQ(Decide(nullptr, nullptr, "a", Train(mode)), PassAction::kFresh);
  }
}

TEST(DecidePass, AutoFollowsTheTable) {
  const WorkerState w = Saved("day1");
  const PassEnd end = Ended();
  const TrainConfig t = Train(TrainConfig::AUTO);
  EXPECT_EQ(Decide(&w, nullptr, "day1", t), PassAction::kResume);
  EXPECT_EQ(Decide(&w, &end, "day2", t), PassAction::kNewPass);
  EXPECT_EQ(Decide(&w, &end, "day1", t), PassAction::kNothing);

  absl::StatusOr<PassDecision> refused = DecidePass(&w, nullptr, "m/ckpt-20", Spec("day2"), t);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(refused.status().message());
  EXPECT_THAT(msg, HasSubstr("m/ckpt-20 (step 20) is part of a pass over train criteo_tsv [day1]"));
  EXPECT_THAT(msg, HasSubstr("this run's data is train criteo_tsv [day2]"));
  EXPECT_THAT(msg, HasSubstr("--on_new_data=continue"));
  EXPECT_THAT(msg, HasSubstr("--on_new_data=new_pass"));
}

TEST(DecidePass, TheFlagChooses) {
  const WorkerState w = Saved("day1");
  const PassEnd end = Ended();
  const TrainConfig cont = Train(TrainConfig::CONTINUE), fresh = Train(TrainConfig::NEW_PASS);
  EXPECT_EQ(Decide(&w, nullptr, "day2", cont), PassAction::kResume);
  EXPECT_EQ(Decide(&w, &end, "day2", cont), PassAction::kNothing);
  EXPECT_EQ(Decide(&w, nullptr, "day2", fresh), PassAction::kNewPass);
  EXPECT_EQ(Decide(&w, nullptr, "day1", fresh), PassAction::kNewPass);
  EXPECT_EQ(Decide(&w, &end, "day1", fresh), PassAction::kNewPass);
}

// A pass stopped at max_steps goes on when this run allows more of its steps.
TEST(DecidePass, APassStoppedAtMaxStepsContinuesWithMoreSteps) {
  const WorkerState w = Saved("day1", /*step=*/30, /*pass_first_step=*/10);  // 20 steps in
  const PassEnd end = Ended(/*max_steps_reached=*/true);
  EXPECT_EQ(Decide(&w, &end, "day1", Train(TrainConfig::AUTO, 0)), PassAction::kResume);
  EXPECT_EQ(Decide(&w, &end, "day1", Train(TrainConfig::AUTO, 21)), PassAction::kResume);
  EXPECT_EQ(Decide(&w, &end, "day1", Train(TrainConfig::AUTO, 20)), PassAction::kNothing);
  EXPECT_EQ(Decide(&w, &end, "day2", Train(TrainConfig::AUTO, 0)), PassAction::kNewPass);
  absl::StatusOr<PassDecision> d =
      DecidePass(&w, &end, "m/ckpt-30", Spec("day1"), Train(TrainConfig::AUTO, 20));
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(d->message, HasSubstr("stopped at train.max_steps, 20 steps"));
}

// A checkpoint from before the spec was recorded resumes as it always did.
TEST(DecidePass, ACheckpointWithoutASpecResumes) {
  WorkerState old;
  old.set_step(20);
  EXPECT_EQ(Decide(&old, nullptr, "day2", Train(TrainConfig::AUTO)), PassAction::kResume);
}

TEST(DataSpec, ResolvesPathsAndDescribesThem) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/data_pass_", getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(WriteFileAtomic(absl::StrCat(dir, "/part-", i, ".tsv"), "x\n").ok());
  }
  DataConfig data;
  Channel* c = data.add_train();
  c->set_name("train");
  c->add_path(dir);
  Channel* p = data.add_train();
  p->set_name("clicks");
  p->set_format(TFRECORD);
  p->set_pipe_dir("/opt/ml/input/data");
  absl::StatusOr<DataSpec> spec = ResolveDataSpec(data);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->channel_size(), 2);
  EXPECT_EQ(spec->channel(0).file_size(), 5);
  EXPECT_EQ(spec->channel(0).file(4), dir + "/part-4.tsv");
  EXPECT_EQ(DescribeDataSpec(*spec, 2),
            absl::StrCat("train criteo_tsv [", dir, "/part-0.tsv, ", dir,
                         "/part-1.tsv, ... (5 files)]; clicks tfrecord [pipe /opt/ml/input/data]"));
  EXPECT_TRUE(SameDataSpec(*spec, *ResolveDataSpec(data)));
  c->add_path(dir + "/part-0.tsv");  // read twice: another spec
  EXPECT_FALSE(SameDataSpec(*spec, *ResolveDataSpec(data)));
  c->add_path(dir + "/missing.tsv");
  EXPECT_EQ(ResolveDataSpec(data).status().code(), absl::StatusCode::kNotFound);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
