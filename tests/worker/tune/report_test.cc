// What `pstrain tune` prints and writes (worker/tune/report.h), from hand-made search results.
#include "worker/tune/report.h"

#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

MeasuredSetting M(int towers, int intra, int inter, int step, double eps) {
  return MeasuredSetting{TuneCandidate{towers, intra, inter, step}, eps};
}

// Four settings on 4 cores at global batch 512, and one per-tower size that doubles it.
TuneResult Result(bool allow_batch_change) {
  TuneResult r;
  r.space = TuneSpace{4, 4, /*search_inter=*/true, 1};
  r.global_batch = 512;
  r.budget_s = 60;
  r.allow_batch_change = allow_batch_change;
  r.measured = {M(4, 1, 1, 512, 4000), M(2, 2, 1, 512, 3000), M(1, 4, 1, 512, 1000),
                M(4, 1, 1, 1024, 5000)};
  r.not_allowed = 3;
  r.seconds = 12.4;
  r.best_fixed = r.measured[0];
  r.fastest = r.measured[3];
  r.recommended = allow_batch_change ? r.fastest : r.best_fixed;
  return r;
}

TEST(TuneReportTest, MeasuredLine) {
  EXPECT_EQ(FormatMeasured(M(4, 1, 2, 512, 51234.4)),
            "  towers=4 intra=1 inter=2 batch=128: 51234 ex/s\n");
}

TEST(TuneReportTest, TableIsFastestFirstWithRatiosAndTheVerdict) {
  const std::string text = FormatTuneReport(Result(/*allow_batch_change=*/false));
  EXPECT_EQ(text,
            "\n| towers | intra_op | inter_op | batch/tower | global batch | ex/s | ex/s per core "
            "| vs best |\n|---|---|---|---|---|---|---|---|\n"
            "| 4 | 1 | 1 | 256 | 1024 (changed) | 5000 | 1250 | 1.00 |\n"
            "| 4 | 1 | 1 | 128 | 512 | 4000 | 1000 | 0.80 |\n"
            "| 2 | 2 | 1 | 256 | 512 | 3000 | 750 | 0.60 |\n"
            "| 1 | 4 | 1 | 512 | 512 | 1000 | 250 | 0.20 |\n"
            "\nbest: towers=4 intra_op_threads=1 inter_op_threads=1 batch_size=128 (global 512): "
            "4000 ex/s\n"
            "search complete: every allowed setting was measured (4 in 12 s of the 60 s budget)\n"
            "3 combinations of the powers-of-two grid were not allowed: towers x intra_op above "
            "the 4 cores (OpenMP teams would oversubscribe them), or parser threads beyond the "
            "cores the compute leaves plus a quarter of the cores\n"
            "not chosen: batch_size=256 (global 1024) at 5000 ex/s, 1.25x the best at global "
            "512. global batch 1024 instead of 512 changes what the model learns, not only its "
            "speed; measured with configs/deepfm_criteo.textproto on datagen data: global batch "
            "1024 had -0.003 test AUC against 512 (docs/PERFORMANCE.md); check the AUC on your "
            "data before using it.\n");
}

TEST(TuneReportTest, AnAllowedBatchChangeIsSaidToBeChosen) {
  const std::string text = FormatTuneReport(Result(/*allow_batch_change=*/true));
  EXPECT_THAT(text, HasSubstr("best: towers=4 intra_op_threads=1 inter_op_threads=1 "
                              "batch_size=256 (global 1024): 5000 ex/s\n"));
  EXPECT_THAT(text, HasSubstr("chosen (--allow_batch_change): batch_size=256 (global 1024)"));
}

TEST(TuneReportTest, BudgetSpentListsWhatWasNotTried) {
  TuneResult r = Result(false);
  r.measured.pop_back();
  r.fastest = r.best_fixed;
  r.not_tried = {TuneCandidate{2, 1, 1, 512}, TuneCandidate{1, 1, 1, 512}};
  r.not_allowed = 0;
  r.space.search_inter = false;
  r.space.intra_cap = 2;
  const std::string text = FormatTuneReport(r);
  EXPECT_THAT(text, HasSubstr("budget spent: 3 settings measured in 12 s; not tried: 2x1x1@512 "
                              "1x1x1@512 (towers x intra x inter @ batch/tower)\n"));
  EXPECT_THAT(text, Not(HasSubstr("not allowed")));
  EXPECT_THAT(text, Not(HasSubstr("chosen")));
  r.not_allowed = 2;
  EXPECT_THAT(FormatTuneReport(r),
              HasSubstr("(OpenMP teams would oversubscribe them), or intra_op above "
                        "OMP_NUM_THREADS\n"));
}

TEST(TuneReportTest, BatchCostNoteQuotesTheNearestMeasuredBatches) {
  EXPECT_EQ(BatchCostNote(512, 600),
            "global batch 600 instead of 512 changes what the model learns, not only its speed; "
            "check the AUC on your data before using it");
  EXPECT_THAT(BatchCostNote(512, 8192), HasSubstr("global batch 8192 had -0.013 test AUC "
                                                  "against 512"));
  EXPECT_THAT(BatchCostNote(8192, 2048), HasSubstr("global batch 2048 had +0.009 test AUC "
                                                   "against 8192"));
}

TEST(TuneReportTest, FragmentKeepsAStatedGlobalBatch) {
  TrainConfig given;
  given.set_global_batch_size(512);
  given.set_batch_size(64);
  Config f = TunedFragment(Result(/*allow_batch_change=*/false), given);
  EXPECT_EQ(f.threads().towers(), 4);
  EXPECT_EQ(f.threads().intra_op_threads(), 1);
  EXPECT_EQ(f.threads().inter_op_threads(), 1);
  EXPECT_FALSE(f.has_train());  // the towers split the stated global batch: nothing to write
  f = TunedFragment(Result(/*allow_batch_change=*/true), given);
  EXPECT_EQ(f.train().global_batch_size(), 1024);
  EXPECT_FALSE(f.train().has_batch_size());
}

TEST(TuneReportTest, FragmentWritesThePerTowerBatchThatKeepsTheGlobalBatch) {
  TrainConfig given;
  given.set_batch_size(64);  // 8 towers x 64 = 512 on the config's machine
  Config f = TunedFragment(Result(/*allow_batch_change=*/false), given);
  EXPECT_EQ(f.train().batch_size(), 128);  // 4 towers x 128 = 512
  EXPECT_FALSE(f.train().has_global_batch_size());
  given.set_batch_size(128);
  f = TunedFragment(Result(false), given);
  EXPECT_FALSE(f.has_train());  // unchanged: not written
}

TEST(TuneReportTest, FragmentTextNamesTheSearchAndItsUse) {
  const TuneResult r = Result(false);
  const Config f = TunedFragment(r, TrainConfig());
  const std::string text =
      TunedFragmentText(f, r, "/m/tuned.textproto", absl::FromUnixSeconds(86400 * 365));
  EXPECT_THAT(text, HasSubstr("# pstrain tune, 1971-01-01 00:00:00 UTC: best of 4 measured "
                              "settings on 4 cores, 4000 ex/s.\n# Use: pstrain train --config "
                              "<base config> --config /m/tuned.textproto\n"));
  EXPECT_THAT(text, HasSubstr(ConfigToText(f)));
}

}  // namespace
}  // namespace pstrain
