// ProgressReporter: training points reach metrics.jsonl at the flush interval without an
// evaluation (so a run without periodic evaluation can be watched), and the worker's Prometheus
// families carry the loss, examples, step phases and the last evaluation.
#include "worker/train/progress.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/metrics/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/metrics/exposition.h"

namespace pstrain {
namespace {

std::string Dir(const char* name) {
  return absl::StrCat(::testing::TempDir(), "/progress_", getpid(), "_", name);
}

int Lines(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return -1;
  return static_cast<int>(std::count(text->begin(), text->end(), '\n'));
}

TEST(ProgressReporter, TrainingPointsAreFlushedAtTheInterval) {
  const std::string every = Dir("every"), never = Dir("never");
  auto a = ProgressReporter::Create(every, false, /*flush_seconds=*/0, /*worker=*/11);
  auto b = ProgressReporter::Create(never, false, /*flush_seconds=*/3600, /*worker=*/12);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->Train(10, 0, 0.5, 1000, 100, 1.0);
  (*b)->Train(10, 0, 0.5, 1000, 100, 1.0);
  // Interval 0: on disk at once. One hour: still buffered (no evaluation, no end yet).
  EXPECT_EQ(Lines(every + "/metrics.jsonl"), 1);
  EXPECT_EQ(Lines(never + "/metrics.jsonl"), 0);
  (*b)->Flush();
  EXPECT_EQ(Lines(never + "/metrics.jsonl"), 1);
}

TEST(ProgressReporter, WorkerMetricsAreExported) {
  auto p = ProgressReporter::Create(Dir("metrics"), false, 10, /*worker=*/3);
  ASSERT_TRUE(p.ok());
  (*p)->Train(20, 0, 0.4375, 2500, 100, 2.0);
  (*p)->Examples(640);
  (*p)->StepPhases(0.1, 0.2, 1.5, 0.05, 0.25);
  (*p)->StepPhases(0.1, 0.3, 2.5, 0.05, 0.25);
  (*p)->Eval(20, 0.75, 0.5, 1000, false);
  std::vector<testing::Sample> s;
  const std::string text = ScrapeText();
  ASSERT_EQ(testing::CheckExposition(text, &s), "") << text;
  const std::string w = "worker=\"3\"";
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_loss", w), 0.4375);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_examples_per_second", w), 2500);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_step", w), 20);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_examples_total", w), 640);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_eval_auc", w), 0.75);
  EXPECT_DOUBLE_EQ(
      testing::SampleValue(s, "pstrain_worker_step_phase_seconds_total", "phase=\"compute\"," + w),
      2.5);
  EXPECT_DOUBLE_EQ(
      testing::SampleValue(s, "pstrain_worker_step_phase_seconds_total", "phase=\"pull\"," + w), 0.3);
}

}  // namespace
}  // namespace pstrain
