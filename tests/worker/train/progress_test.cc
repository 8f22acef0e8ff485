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

// Dynamic tables (issue 28): a metrics.jsonl line per table, TensorBoard scalars and Prometheus
// gauges labelled by table, which follow the latest values.
TEST(ProgressReporter, DynamicTableMetricsAreExported) {
  const std::string dir = Dir("dynamic");
  auto p = ProgressReporter::Create(dir, false, 10, /*worker=*/4);
  ASSERT_TRUE(p.ok());
  DynamicTableMetrics a;
  a.table = "users";
  a.rows_live = 100;
  a.admitted = 120;
  a.rejected = 7;
  a.evicted_ttl = 20;
  a.new_ids_last_step = 3;
  a.bytes = 4096;
  DynamicTableMetrics b;
  b.table = "items";
  b.rows_live = 5;
  b.evicted_capacity = 2;
  (*p)->DynamicTables(10, {a, b});
  a.rows_live = 150;
  (*p)->DynamicTables(20, {a, b});
  (*p)->Flush();
  std::vector<testing::Sample> s;
  const std::string text = ScrapeText();
  ASSERT_EQ(testing::CheckExposition(text, &s), "") << text;
  const std::string users = "table=\"users\",worker=\"4\"";
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_rows_live", users), 150);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_admitted", users), 120);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_rejected", users), 7);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_evicted_ttl", users), 20);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_new_ids_last_step", users), 3);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_bytes", users), 4096);
  EXPECT_EQ(testing::SampleValue(s, "pstrain_worker_dynamic_evicted_capacity",
                                 "table=\"items\",worker=\"4\""),
            2);
  auto jsonl = ReadFileToString(dir + "/metrics.jsonl");
  ASSERT_TRUE(jsonl.ok());
  EXPECT_EQ(Lines(dir + "/metrics.jsonl"), 4);
  EXPECT_THAT(*jsonl, ::testing::HasSubstr(
                          "\"step\":20,\"dynamic_table\":\"users\",\"rows_live\":150,"
                          "\"admitted\":120,\"rejected\":7,\"evicted_ttl\":20,"
                          "\"evicted_capacity\":0,\"new_ids_last_step\":3,\"bytes\":4096}"));
}

}  // namespace
}  // namespace pstrain
