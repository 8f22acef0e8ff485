// Dynamic tables (features.table.dynamic, issue 28) in `pstrain allreduce`, with real `mpirun
// -np 2` jobs on `pstrain datagen --id_churn` data: five categorical fields share a dynamic table
// (admission after 2 sightings, a TTL in steps), checkpoints every 10 steps, every fifth one full.
// The two ranks' replicas end identical bit for bit (Finish compares checksums that cover the
// dynamic rows, their metadata, the admission sketch and the counters), every rank evicts at the
// same steps, rank 0 writes the dynamic-<table> files, summary.json has the table's counters, and
// a job stopped at step 37 (restored through deltas whose tombstones are the evictions at 20 and
// 30) and resumed ends with the uninterrupted job's replica checksum; a new day's pass evicts by
// its TTL in passes at its end on every rank.
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/optimizer.h"
#include "tests/cmd/job_files.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/dynamic_allreduce_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

// 6000 rows, 64 a rank a step: 47 steps an epoch.
const char kConfig[] = R"pb(
  features {
    field { name: "C1" table: "ids" }
    field { name: "C2" table: "ids" }
    field { name: "C3" table: "ids" }
    field { name: "C4" table: "ids" }
    field { name: "C5" table: "ids" }
    table { name: "ids" dynamic { admission: COUNT admit_count: 2 sketch_width: 4096
                                  ttl_steps: 15 } }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 16 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
  train { batch_size: 64 epochs: 2 log_every_steps: 10 }
  data { shuffle_files: false shuffle_buffer: 0 }
  threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
  checkpoint { every_steps: 10 incremental_every: 5 }
)pb";

class DynamicAllreduceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    for (const auto& [out, rows, seed] : std::vector<std::tuple<std::string, int, int>>{
             {"train", 6000, 1}, {"day1", 4000, 3}, {"test", 2000, 2}}) {
      std::string log;
      ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " datagen --rows ", rows, " --seed ", seed,
                                               " --teacher_seed 7 --max_cardinality 2000 "
                                               "--id_churn 0.2 --day ", out == "day1" ? 1 : 0,
                                               " --out ", Dir(), "/", out),
                                  60, &log),
                0)
          << log;
    }
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", kConfig).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  // mpirun -np 2 pstrain allreduce on the data above, records dealt round-robin to the ranks.
  static std::string Job(const std::string& model_dir, const std::string& extra = "",
                         const std::string& train = "train") {
    return absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np 2 ", P(),
                        " allreduce --config ", Dir(), "/config.textproto --train '", Dir(), "/",
                        train, "/*.tsv' --eval '", Dir(), "/test/*.tsv' --model_dir ", model_dir,
                        " --set 'data.train[0].shard_policy=SHARD_BY_RECORD'", extra, " 2>&1");
  }
};

// Each rank's "replica crc32c XXXXXXXX after step S" line.
std::vector<std::string> CrcLines(const std::string& log) {
  std::vector<std::string> lines;
  const std::regex re("rank ([0-9]) of 2: (replica crc32c [0-9a-f]{8} after step [0-9]+)");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    lines.push_back((*it)[2].str());
  }
  return lines;
}

// The "evicted N row(s) by TTL" counts logged (by one rank), in order, with their steps.
std::vector<std::pair<int, int>> TtlEvictions(const std::string& log) {
  std::vector<std::pair<int, int>> n;
  const std::regex re("at step ([0-9]+): evicted ([0-9]+) row\\(s\\) by TTL");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    n.emplace_back(std::stoi((*it)[1].str()), std::stoi((*it)[2].str()));
  }
  return n;
}

// The dynamic table as the newest checkpoint of `model_dir` restores it through its chain (the
// full checkpoint's file, then each delta's rows and tombstones): rank 0's files.
DynamicSnapshot RestoredTable(const std::string& model_dir) {
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << model_dir;
  if (!choice.ok() || !choice->has_value()) return {};
  auto sparse = Optimizer::Create((*choice)->manifest.model().sparse_optimizer());
  EXPECT_TRUE(sparse.ok());
  if (!sparse.ok()) return {};
  DynamicEmbeddingStore::Options o;
  o.dim = 9;
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(*sparse));
  o.admission = DynamicEmbeddingStore::Admission::kCount;
  o.admit_count = 2;
  o.sketch_width = 4096;
  auto store = DynamicEmbeddingStore::Create(o);
  EXPECT_TRUE(store.ok());
  if (!store.ok()) return {};
  for (const CheckpointLink& link : (*choice)->chain) {
    auto s = ReadDynamicFile(link.dir + "/dynamic-ids");
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) EXPECT_TRUE((*store)->Restore(s->snapshot).ok()) << link.dir;
  }
  return (*store)->Snapshot(0).value();
}

std::string Rank1Log(const std::string& model_dir) {
  return ReadFileToString(model_dir + "/rank-1/output.log").value_or("");
}

// The replicas stay identical; both ranks evict the same rows at the same steps; rank 0 writes
// the table's files; summary.json and metrics.jsonl carry the table's counters; it learns.
TEST_F(DynamicAllreduceTest, TwoRanksKeepIdenticalReplicasAndReportTheTable) {
  const std::string m = Dir() + "/straight";
  std::string out;
  ASSERT_EQ(testing::RunShell(Job(m), 240, &out), 0) << out;
  const std::vector<std::string> crc = CrcLines(out);
  ASSERT_EQ(crc.size(), 2u) << out;
  EXPECT_EQ(crc[0], crc[1]) << out;
  EXPECT_THAT(crc[0], HasSubstr("after step 94"));
  // Rank 0 logs to the terminal, rank 1 to its output.log: the same evictions, at the
  // checkpoints of every_steps and the pass's end.
  const auto e0 = TtlEvictions(out), e1 = TtlEvictions(Rank1Log(m));
  ASSERT_EQ(e0.size(), 10u) << out;  // steps 10 .. 90 and the pass's end, 94
  EXPECT_EQ(e0.back().first, 94);
  EXPECT_EQ(e0, e1) << Rank1Log(m);
  int evicted = 0;
  for (const auto& [step, n] : e0) evicted += n;
  EXPECT_GT(evicted, 0) << out;
  // Rank 0 writes the table's file into each checkpoint (full or delta) and lists it.
  EXPECT_TRUE(PathExists(m + "/ckpt-90/dynamic-ids"));
  auto manifest = ReadFileToString(m + "/ckpt-94/MANIFEST");
  ASSERT_TRUE(manifest.ok());
  EXPECT_THAT(*manifest, HasSubstr("dynamic-ids"));
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_EQ(summary.at("mode").string_value(), "allreduce");
  const auto& ids = summary.at("dynamic_tables").struct_value().fields().at("ids").struct_value();
  EXPECT_GT(ids.fields().at("rows_live").number_value(), 100);
  EXPECT_GT(ids.fields().at("rejected").number_value(), 0);  // admit_count 2
  EXPECT_EQ(ids.fields().at("evicted_ttl").number_value(), evicted);
  EXPECT_GT(ids.fields().at("bytes").number_value(), 0);
  auto jsonl = ReadFileToString(m + "/metrics.jsonl");
  ASSERT_TRUE(jsonl.ok());
  EXPECT_THAT(*jsonl, HasSubstr("\"dynamic_table\":\"ids\""));
  // It learns: the data's teacher scores about 0.8; a model that could not keep its ids, ~0.5.
  EXPECT_GT(summary.at("test_auc").number_value(), 0.62) << out;
}

// A job stopped at step 37 (its ckpt-37 a delta over the full ckpt-10 and the deltas 20 and 30,
// with the evictions at 20 and 30 as tombstones) and resumed ends with the uninterrupted job's
// replica: the same checksum of the fixed and dynamic rows, the dynamic rows' metadata, the
// sketch, the counters and the dense vector.
TEST_F(DynamicAllreduceTest, StopAndResumeEqualsTheUninterruptedRun) {
  const std::string straight = Dir() + "/resume_straight", stopped = Dir() + "/stopped";
  std::string out, stop_log, resume_log;
  ASSERT_EQ(testing::RunShell(Job(straight), 240, &out), 0) << out;
  ASSERT_EQ(testing::RunShell(Job(stopped, " --set train.max_steps=37"), 240, &stop_log), 0)
      << stop_log;
  const auto before_stop = TtlEvictions(stop_log);
  ASSERT_EQ(before_stop.size(), 3u) << stop_log;  // 10, 20, 30; none at the stop's 37
  EXPECT_GT(before_stop[1].second + before_stop[2].second, 0) << stop_log;
  ASSERT_EQ(testing::RunShell(Job(stopped), 240, &resume_log), 0) << resume_log;
  EXPECT_THAT(resume_log, HasSubstr("resumed from " + stopped + "/ckpt-37"));
  const std::vector<std::string> a = CrcLines(out), b = CrcLines(resume_log);
  ASSERT_EQ(a.size(), 2u) << out;
  ASSERT_EQ(b.size(), 2u) << resume_log;
  EXPECT_EQ(a[0], b[0]) << "the resumed replica differs from the uninterrupted one";
  EXPECT_EQ(b[0], b[1]);
  const auto sa = testing::ReadSummary(straight).fields();
  const auto sb = testing::ReadSummary(stopped).fields();
  EXPECT_EQ(sb.at("test_auc").number_value(), sa.at("test_auc").number_value());
  const auto& da = sa.at("dynamic_tables").struct_value().fields().at("ids").struct_value();
  const auto& db = sb.at("dynamic_tables").struct_value().fields().at("ids").struct_value();
  for (const char* counter : {"rows_live", "admitted", "rejected", "evicted_ttl"}) {
    EXPECT_EQ(db.fields().at(counter).number_value(), da.fields().at(counter).number_value())
        << counter;
  }
  // What rank 0 wrote: the last checkpoints' chains restore the same table (the stop's extra
  // checkpoint shifts which ones are full, so the files themselves differ).
  const DynamicSnapshot ta = RestoredTable(straight), tb = RestoredTable(stopped);
  EXPECT_GT(ta.rows(), 100);
  EXPECT_GT(ta.evicted_ttl, 0);
  EXPECT_EQ(ta.keys, tb.keys);
  EXPECT_EQ(ta.weights, tb.weights);
  EXPECT_EQ(ta.state, tb.state);
  EXPECT_EQ(ta.counts, tb.counts);
  EXPECT_EQ(ta.last_step_of, tb.last_step_of);
  EXPECT_EQ(ta.sketch, tb.sketch);
  EXPECT_EQ(ta.admitted, tb.admitted);
  EXPECT_EQ(ta.rejected, tb.rejected);
  EXPECT_EQ(ta.evicted_ttl, tb.evicted_ttl);
  EXPECT_EQ(ta.rows(), static_cast<int64_t>(da.fields().at("rows_live").number_value()));
}

// A new day is a new pass on every rank: the TTL in passes evicts, at day 1's end and there only,
// the rows day 1 did not update, the same on both ranks; nothing at the new pass's first step
// (the restored ckpt-47 is not checkpointed again, which would evict as at a pass's end).
TEST_F(DynamicAllreduceTest, TtlInPassesEvictsAtANewDaysEndOnEveryRank) {
  const std::string m = Dir() + "/days";
  const std::string passes_only =
      " --epochs 1 --set features.table[0].dynamic.ttl_steps=0"
      " --set features.table[0].dynamic.ttl_passes=1";
  std::string day0, day1;
  ASSERT_EQ(testing::RunShell(Job(m, passes_only), 240, &day0), 0) << day0;
  const auto e0 = TtlEvictions(day0);
  ASSERT_EQ(e0.size(), 5u) << day0;  // 10 .. 40 and the pass's end, 47
  for (const auto& [step, n] : e0) EXPECT_EQ(n, 0) << day0;
  ASSERT_EQ(testing::RunShell(Job(m, passes_only, "day1"), 240, &day1), 0) << day1;
  EXPECT_THAT(day1, HasSubstr("new training pass"));
  const auto e1 = TtlEvictions(day1);
  ASSERT_EQ(e1.size(), 4u) << day1;  // 50, 60, 70 and the pass's end, 79
  for (size_t i = 0; i + 1 < e1.size(); ++i) EXPECT_EQ(e1[i].second, 0) << day1;
  EXPECT_EQ(e1.back().first, 79);
  EXPECT_GT(e1.back().second, 100) << day1;
  // Rank 1's log holds both runs: the same evictions.
  std::vector<std::pair<int, int>> both = e0;
  both.insert(both.end(), e1.begin(), e1.end());
  EXPECT_EQ(TtlEvictions(Rank1Log(m)), both);
  const std::vector<std::string> crc = CrcLines(day1);
  ASSERT_EQ(crc.size(), 2u) << day1;
  EXPECT_EQ(crc[0], crc[1]);
}

// The dense buffer of sparse_as_dense has no room for rows keyed by a 64-bit hash: refused
// naming the table and the way out.
TEST_F(DynamicAllreduceTest, SparseAsDenseRefusesADynamicTable) {
  std::string out;
  ASSERT_NE(testing::RunShell(Job(Dir() + "/dense", " --set allreduce.sparse_as_dense=true"), 120,
                              &out),
            0);
  EXPECT_THAT(out, HasSubstr("allreduce.sparse_as_dense: table 'ids' is dynamic"));
}

}  // namespace
}  // namespace pstrain
