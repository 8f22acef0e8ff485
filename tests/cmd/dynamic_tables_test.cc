// Dynamic tables (features.table.dynamic, issue 28) in `pstrain train`, with real processes on
// `pstrain datagen --id_churn` data: five categorical fields share a dynamic table (admission
// after 2 sightings) with a TTL in steps, checkpoints every 10 steps, every fifth one full; a job
// stopped at step 37 (restored from the full ckpt-10 and the deltas 20, 30 and 37, whose
// tombstones are the evictions at 20 and 30) and resumed ends with the uninterrupted job's
// parameters, dynamic rows, their metadata and the counters included, and learns; the TTL in
// passes evicts at the end of a new day's pass the rows of ids the day did not see; `pstrain
// config` shows the table and refuses rows for it.
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "checkpoint/layout.h"
#include "ps/store/dense_store.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/embedding_store.h"
#include "ps/store/parameter_files.h"
#include "ps/store/store_blocks.h"
#include "tests/cmd/job_files.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/dynamic_tables_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

const char kConfig[] = R"pb(
  features {
    field { name: "C1" table: "ids" }
    field { name: "C2" table: "ids" }
    field { name: "C3" table: "ids" }
    field { name: "C4" table: "ids" }
    field { name: "C5" table: "ids" }
    table { name: "ids" dynamic { admission: COUNT admit_count: 2 sketch_width: 4096
                                  ttl_steps: 15 ttl_passes: 1 } }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
  train { batch_size: 256 epochs: 1 log_every_steps: 100000 }
  threads { towers: 1 intra_op_threads: 2 inter_op_threads: 1 }
  checkpoint { every_steps: 10 incremental_every: 5 }
)pb";

class DynamicTablesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    // Two days of drifting ids (20% new a day) and day 0's test set, 2000 ids a field at most.
    for (const auto& [out, rows, seed, day] :
         std::vector<std::tuple<std::string, int, int, int>>{
             {"day0", 12000, 1, 0}, {"day1", 8000, 3, 1}, {"test", 4000, 2, 0}}) {
      std::string log;
      ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " datagen --rows ", rows, " --seed ", seed,
                                               " --teacher_seed 7 --max_cardinality 2000 "
                                               "--id_churn 0.2 --day ", day, " --out ", Dir(),
                                               "/", out),
                                  60, &log),
                0)
          << log;
    }
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", kConfig).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::string Args(const std::string& model_dir, const std::string& day = "day0") {
    return absl::StrCat("--config ", Dir(), "/config.textproto --train '", Dir(), "/", day,
                        "/*.tsv' --eval '", Dir(), "/test/*.tsv' --model_dir ", model_dir);
  }
};

// The "evicted N row(s) by TTL" counts the trainer logs, in order.
std::vector<int> TtlEvictions(const std::string& log) {
  std::vector<int> n;
  const std::regex re("evicted ([0-9]+) row\\(s\\) by TTL");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    n.push_back(std::stoi((*it)[1].str()));
  }
  return n;
}

// What the newest checkpoint of `model_dir` restores, through its chain (the full checkpoint and
// its deltas): the fixed rows, the dense vector and the dynamic table, as bytes to compare.
std::string RestoredState(const std::string& model_dir, DynamicSnapshot* dynamic) {
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << model_dir;
  if (!choice.ok() || !choice->has_value()) return "";
  const CheckpointManifest& m = (*choice)->manifest;
  auto sparse = Optimizer::Create(m.model().sparse_optimizer());
  auto dense_opt = Optimizer::Create(m.model().dense_optimizer());
  EXPECT_TRUE(sparse.ok() && dense_opt.ok());
  EmbeddingStore::Options eo;
  eo.end = m.table_rows();
  eo.dim = m.row_dim();
  eo.optimizer = std::shared_ptr<const Optimizer>(std::move(*sparse));
  auto rows = EmbeddingStore::Create(eo);
  DenseStore::Options dso;
  dso.size = m.dense_size();
  dso.optimizer = std::shared_ptr<const Optimizer>(std::move(*dense_opt));
  auto dense = DenseStore::Create(dso);
  EXPECT_TRUE(rows.ok() && dense.ok());
  EmbeddingStore* stores[] = {rows->get()};
  EXPECT_TRUE(LoadParameterFiles((*choice)->chain, stores, dense->get(), ParameterLoadMode()).ok());
  // The dynamic table: the full snapshot of the chain's base, then each delta.
  DynamicEmbeddingStore::Options o;
  o.dim = 9;
  o.optimizer = eo.optimizer;
  o.admission = DynamicEmbeddingStore::Admission::kCount;
  o.admit_count = 2;
  o.sketch_width = 4096;
  auto dyn = DynamicEmbeddingStore::Create(o);
  EXPECT_TRUE(dyn.ok());
  for (const CheckpointLink& link : (*choice)->chain) {
    auto s = ReadDynamicFile(link.dir + "/dynamic-ids");
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) EXPECT_TRUE((*dyn)->Restore(s->snapshot).ok()) << link.dir;
  }
  *dynamic = (*dyn)->Snapshot(0).value();
  std::string bytes;
  auto w = BlockWriter::ToString(&bytes);
  EXPECT_TRUE(SaveEmbeddingStore((*rows)->Snapshot(), w.get()).ok());
  EXPECT_TRUE(SaveDenseStore((*dense)->Snapshot(), w.get()).ok());
  EXPECT_TRUE(WriteDynamicSnapshot("ids", *dynamic, w.get()).ok());
  EXPECT_TRUE(w->Finish().ok());
  return bytes;
}

// As tests/cmd/job_files.h ExpectStopAndResumeEqualsUninterrupted, but the final states are
// compared as their chains restore them: the stopped job's extra checkpoint shifts which
// checkpoints are full, so the last files of the two jobs are a full and a delta.
TEST_F(DynamicTablesTest, StopAndResumeEqualsUninterrupted) {
  const std::string straight = Dir() + "/straight", stopped = Dir() + "/stopped";
  const std::string train = absl::StrCat(P(), " train ");
  std::string out, stop_log;
  ASSERT_EQ(testing::RunShell(absl::StrCat(train, Args(straight), " --epochs 2 2>&1"), 300, &out),
            0)
      << out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(train, Args(stopped),
                                           " --epochs 2 --set train.max_steps=37 2>&1"),
                              300, &stop_log),
            0)
      << stop_log;
  ASSERT_EQ(testing::RunShell(absl::StrCat(train, Args(stopped), " --epochs 2 2>&1"), 300, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("resumed from " + stopped + "/ckpt-37"));
  // Evictions at 20 and 30 (deltas): the restore went through their tombstones.
  const std::vector<int> before_stop = TtlEvictions(stop_log);
  ASSERT_GE(before_stop.size(), 3u) << stop_log;
  EXPECT_GT(before_stop[1], 0) << stop_log;
  const auto a = testing::ReadSummary(straight).fields();
  const auto b = testing::ReadSummary(stopped).fields();
  EXPECT_EQ(b.at("examples").number_value(), a.at("examples").number_value());
  EXPECT_EQ(b.at("test_auc").number_value(), a.at("test_auc").number_value());
  // It learns: the data's teacher scores 0.8; a model that could not keep its ids, ~0.5.
  EXPECT_GT(a.at("test_auc").number_value(), 0.65);
  DynamicSnapshot da, db;
  const std::string sa = RestoredState(straight, &da);
  const std::string sb = RestoredState(stopped, &db);
  EXPECT_FALSE(sa.empty());
  EXPECT_TRUE(sa == sb) << "the restored parameters differ after stop and resume";
  // The test means something only if rows were admitted, rejected and evicted on the way.
  EXPECT_GT(da.admitted, 1000);
  EXPECT_GT(da.rejected, 0);
  EXPECT_GT(da.evicted_ttl, 0);
  EXPECT_EQ(da.rows(), db.rows());
}

// A new day is a new pass: the rows of ids day 1 did not see (the retired ones, the rare ones)
// are evicted at its end by the TTL of one pass; day 0's end evicts none by passes.
TEST_F(DynamicTablesTest, TtlInPassesEvictsAtANewDaysEnd) {
  const std::string m = Dir() + "/days";
  // The TTL in passes alone.
  const std::string no_steps = " --set features.table[0].dynamic.ttl_steps=0 2>&1";
  std::string day0, day1;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m), no_steps), 120, &day0), 0)
      << day0;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m, "day1"), no_steps), 120, &day1),
            0)
      << day1;
  EXPECT_THAT(day1, HasSubstr("new training pass"));
  const std::vector<int> e0 = TtlEvictions(day0), e1 = TtlEvictions(day1);
  ASSERT_EQ(e0.size(), 5u) << day0;  // steps 10, 20, 30, 40 and the pass's end, 47
  for (int n : e0) EXPECT_EQ(n, 0) << day0;
  ASSERT_EQ(e1.size(), 4u) << day1;  // steps 50, 60, 70 and the pass's end, 79
  for (size_t i = 0; i + 1 < e1.size(); ++i) EXPECT_EQ(e1[i], 0) << day1;
  // At day 1's end: every row day 1 did not update (day 0 made thousands; day 1 sees the
  // frequent ones again).
  EXPECT_GT(e1.back(), 300) << day1;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_GT(summary.at("test_auc").number_value(), 0.6);
}

// The per-table counters reach metrics.jsonl at each logged step, TensorBoard and summary.json,
// and move: rows are created and then evicted by the TTL.
TEST_F(DynamicTablesTest, MetricsAppearAndMove) {
  const std::string m = Dir() + "/metrics";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m),
                                           " --set train.log_every_steps=10 2>&1"),
                              120, &out),
            0)
      << out;
  auto jsonl = ReadFileToString(m + "/metrics.jsonl");
  ASSERT_TRUE(jsonl.ok());
  const std::regex re("\"step\":([0-9]+),\"dynamic_table\":\"ids\",\"rows_live\":([0-9]+),"
                      "\"admitted\":([0-9]+),\"rejected\":([0-9]+),\"evicted_ttl\":([0-9]+)");
  std::vector<std::vector<int64_t>> points;
  for (std::sregex_iterator it(jsonl->begin(), jsonl->end(), re), end; it != end; ++it) {
    std::vector<int64_t> p;
    for (int i = 1; i <= 5; ++i) p.push_back(std::stoll((*it)[i].str()));
    points.push_back(p);
  }
  ASSERT_GE(points.size(), 5u) << *jsonl;  // steps 10 .. 40, and the end
  EXPECT_EQ(points[0][0], 10);
  EXPECT_GT(points[0][1], 0);
  EXPECT_GT(points[0][3], 0);  // admit_count 2: first sightings are rejected
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GE(points[i][2], points[i - 1][2]);  // admitted, cumulative
    EXPECT_GE(points[i][4], points[i - 1][4]);  // evicted, cumulative
  }
  EXPECT_GT(points.back()[4], 0);
  EXPECT_GT(points.back()[2], points[0][2]);
  const auto summary = testing::ReadSummary(m).fields();
  const auto& ids = summary.at("dynamic_tables").struct_value().fields().at("ids").struct_value();
  EXPECT_EQ(ids.fields().at("rows_live").number_value(), points.back()[1]);
  EXPECT_EQ(ids.fields().at("evicted_ttl").number_value(), points.back()[4]);
  EXPECT_GT(ids.fields().at("bytes").number_value(), 0);
  std::string events;
  ASSERT_EQ(testing::RunShell(absl::StrCat("cat ", m, "/events.out.tfevents.*"), 10, &events), 0);
  EXPECT_THAT(events, HasSubstr("dynamic/ids/rows_live"));
  EXPECT_THAT(events, HasSubstr("dynamic/ids/evicted_ttl"));
}

// Warm start (docs/CHECKPOINT.md "Warm start"): a fresh model dir takes the source's dynamic rows
// by table name; one step from them scores about as the source, one step from scratch near
// chance. A kind change (fixed <-> dynamic) or a dim change is refused naming the table and why.
TEST_F(DynamicTablesTest, WarmStartTakesTheDynamicRowsAndRefusesNamingWhy) {
  const std::string src = Dir() + "/warm_src";
  const std::string one_step = " --set train.max_steps=1 2>&1";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(src), " 2>&1"), 120, &out), 0)
      << out;
  const double source_auc = testing::ReadSummary(src).fields().at("test_auc").number_value();
  ASSERT_GT(source_auc, 0.65) << out;
  const std::string warm = Dir() + "/warm";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(warm), " --warm_start_from ", src,
                                           one_step),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("warm start from .* [1-9][0-9]* dynamic rows"));
  const double warm_auc = testing::ReadSummary(warm).fields().at("test_auc").number_value();
  EXPECT_NEAR(warm_auc, source_auc, 0.03) << out;
  const std::string scratch = Dir() + "/scratch";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(scratch), one_step), 120, &out),
            0)
      << out;
  const double scratch_auc = testing::ReadSummary(scratch).fields().at("test_auc").number_value();
  EXPECT_LT(scratch_auc, source_auc - 0.08) << out;
  RecordProperty("auc_source_warm_scratch",
                 absl::StrCat(source_auc, " ", warm_auc, " ", scratch_auc));

  // A changed admission rule is the same table: taken (the lifetime settings may change).
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(Dir() + "/warm_admit"),
                                           " --warm_start_from ", src,
                                           " --set features.table[0].dynamic.admit_count=3",
                                           one_step),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("warm start from .* [1-9][0-9]* dynamic rows"));
  // A dim change: refused naming the table and both dims.
  ASSERT_NE(testing::RunShell(absl::StrCat(P(), " train ", Args(Dir() + "/warm_dim"),
                                           " --warm_start_from ", src,
                                           " --set features.table[0].dim=4",
                                           " --set features.table[0].fm_join=EXCLUDE",
                                           one_step),
                              120, &out),
            0);
  EXPECT_THAT(out, HasSubstr("table 'ids': dim 8 in the warm-start checkpoint, 4 in the config"));
  // Dynamic -> fixed: refused naming both kinds.
  std::string fixed = kConfig;
  const std::string dyn = "dynamic { admission: COUNT admit_count: 2 sketch_width: 4096\n"
                          "                                  ttl_steps: 15 ttl_passes: 1 }";
  ASSERT_NE(fixed.find(dyn), std::string::npos);
  fixed.replace(fixed.find(dyn), dyn.size(), "rows: 4000");
  ASSERT_TRUE(WriteFileAtomic(Dir() + "/fixed.textproto", fixed).ok());
  auto fixed_args = [&](const std::string& model_dir) {
    return absl::StrCat("--config ", Dir(), "/fixed.textproto --train '", Dir(),
                        "/day0/*.tsv' --eval '", Dir(), "/test/*.tsv' --model_dir ", model_dir);
  };
  ASSERT_NE(testing::RunShell(absl::StrCat(P(), " train ", fixed_args(Dir() + "/warm_fixed"),
                                           " --warm_start_from ", src, one_step),
                              120, &out),
            0);
  EXPECT_THAT(out, HasSubstr("table 'ids': dynamic (a row per 64-bit hash of one raw id) in the "
                             "warm-start checkpoint, fixed (a row per hash bucket of many raw "
                             "ids) in the config"));
  // Fixed -> dynamic: the same refusal the other way round.
  const std::string fixed_src = Dir() + "/fixed_src";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", fixed_args(fixed_src), one_step), 120,
                              &out),
            0)
      << out;
  ASSERT_NE(testing::RunShell(absl::StrCat(P(), " train ", Args(Dir() + "/warm_dynamic"),
                                           " --warm_start_from ", fixed_src, one_step),
                              120, &out),
            0);
  EXPECT_THAT(out, HasSubstr("table 'ids': fixed (a row per hash bucket of many raw ids) in the "
                             "warm-start checkpoint, dynamic (a row per 64-bit hash of one raw "
                             "id) in the config"));
}

TEST_F(DynamicTablesTest, ConfigShowsItAndRefusesRows) {
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " config ", Args(Dir() + "/c")), 60, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("#   ids: dim 8, dynamic (rows keyed by the id's hash, index 0), "
                             "fields C1, C2, C3, C4, C5"));
  // A dynamic table with rows: refused naming the field.
  ASSERT_NE(testing::RunShell(absl::StrCat(P(), " config ", Args(Dir() + "/c"),
                                           " --set features.table[0].rows=100"),
                              60, &out),
            0);
  EXPECT_THAT(out, HasSubstr("features.table[0] ('ids').rows: a dynamic table has no rows"));
  // PS jobs and allreduce train dynamic tables: tests/cmd/dynamic_ps_test.cc,
  // tests/cmd/dynamic_allreduce_test.cc.
}

}  // namespace
}  // namespace pstrain
