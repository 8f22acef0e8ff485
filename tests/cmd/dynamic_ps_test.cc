// Dynamic tables (issue 28) in PS jobs with real processes, on the topic-history CSV of
// lists_test: the `item` table (the candidate and the history list) is dynamic, its rows keyed by
// the hash of the raw id and owned by the shards by key hash. A 2-host `pstrain local` job learns
// as the fixed-table job of tables_test does, and the shards hold the items' rows. A job stopped
// by SIGTERM and resumed from its full + delta chain ends with the uninterrupted run's dynamic
// rows, to the bit, and its test AUC and logloss. predict scores as the trainer did, from the
// checkpoint and from an export (format version 3: the live rows of the dynamic table), and
// serve scores as predict.
#include <unistd.h>

#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "cmd/ps_setup.h"
#include "common/config.h"
#include "common/dynamic_rows.h"
#include "common/file.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/dynamic_routing.h"
#include "ps/store/store_blocks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving/export.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/served_export.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/dynamic_ps_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

const std::string kConfig = std::string(testing::kTopicHistoryData) + R"pb(
  features {
    preset: NO_PRESET
    field { name: "item" table: "item" }
    field { name: "history" table: "item" list { combiner: MEAN max_length: 12 } }
    field { name: "user" table: "small" }
    table { name: "item" initializer { type: TRUNCATED_NORMAL stddev: 0.02 } dynamic {} }
    table { name: "small" dim: 4 rows: 500 fm_join: EXCLUDE }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 6 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

constexpr int kTrainRows = 2 * 6000;

struct DynamicPsJob {
  static std::string Dir() { return ::pstrain::Dir(); }
  static std::string Config() { return kConfig; }
};
class DynamicPsTest : public testing::TopicHistoryJobTest<DynamicPsJob> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_NO_FATAL_FAILURE(TopicHistoryJobTest::SetUpTestSuite());
    // The resume test's: `small` (300 users, ~128 of them a step) dynamic with a TTL of 3 steps,
    // so that the shards evict rows on their schedule between the checkpoints, and `item` fixed
    // (fixed and dynamic rows mixed; every table dynamic is all_dynamic_ps_test's).
    std::string resume = kConfig;
    auto replace = [&](const std::string& from, const std::string& to) {
      ASSERT_NE(resume.find(from), std::string::npos) << from;
      resume.replace(resume.find(from), from.size(), to);
    };
    replace(R"(table { name: "small" dim: 4 rows: 500 fm_join: EXCLUDE })",
            R"(table { name: "small" dim: 4 fm_join: EXCLUDE dynamic { ttl_steps: 3 } })");
    replace("dynamic {} }", "rows: 2000 }");
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/resume.textproto", resume).ok());
  }
};

// The topic data needs the item rows (a click follows the candidate's topic against the
// history's): a model that did not learn them scores about 0.5; tables_test's fixed `item` table
// reaches above 0.7 on the same data.
TEST_F(DynamicPsTest, TwoHostJobLearns) {
  const std::string m = Dir() + "/ps";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m),
                                           " --set cluster.consistency=SYNC"),
                              300, &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_THAT(summary.at("mode").string_value(), HasSubstr("ps-"));
  EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows);
  EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << out;
  // The chief sums the shards' dynamic tables into summary.json as `train` writes its own (no
  // eviction configured: every admitted row is live).
  ASSERT_TRUE(summary.count("dynamic_tables")) << out;
  const auto& item =
      summary.at("dynamic_tables").struct_value().fields().at("item").struct_value().fields();
  EXPECT_GT(item.at("rows_live").number_value(), 50);  // the data's 100 items, all seen
  EXPECT_EQ(item.at("admitted").number_value(), item.at("rows_live").number_value());
  EXPECT_EQ(item.at("evicted_ttl").number_value(), 0);
  EXPECT_GT(item.at("bytes").number_value(), 0);

  // predict, from the PS checkpoint (every shard file's dynamic rows) and from an export.
  const double auc = summary.at("test_auc").number_value();
  auto predict = [&](const std::string& model, const std::string& name) {
    const auto predicted = testing::PredictTopicHistory(Dir(), model, name).fields();
    ASSERT_TRUE(predicted.count("auc")) << name;
    EXPECT_EQ(predicted.at("auc").number_value(), auc) << name;
  };
  predict(m, "ckpt_scores");
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/export", &out));
  EXPECT_THAT(out, HasSubstr("dynamic item: "));
  auto dir = ResolveExportDir(Dir() + "/export");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto exported = ReadExport(*dir);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ((*exported)->dynamic_stores().size(), 1u);
  EXPECT_EQ((*exported)->dynamic_name(0), "item");
  EXPECT_EQ((*exported)->dynamic_stores()[0]->dim(), 9);  // 1 + k
  EXPECT_GE((*exported)->dynamic_rows(), 100);  // the 100 items
  predict(Dir() + "/export", "export_scores");
  testing::ServedExport served(P(), Dir() + "/export");
  served.ExpectCsvScoresAsPredicted(Dir() + "/test.csv", Dir() + "/export_scores.tsv");
}

std::vector<std::string> LocalArgs(const std::string& model_dir) {
  return {PSTRAIN_BINARY, "local", "--hosts", "2", "--config", Dir() + "/resume.textproto",
          "--train", Dir() + "/train/a.csv", "--train", Dir() + "/train/b.csv", "--eval",
          Dir() + "/test.csv", "--model_dir", model_dir, "--epochs", "8",
          "--set", "data.shuffle_buffer=0", "--set", "data.shuffle_files=false",
          "--set", "data.train[0].shard_policy=SHARD_BY_RECORD", "--set", "threads.towers=1",
          "--set", "threads.intra_op_threads=1", "--set", "cluster.consistency=SYNC",
          "--set", "checkpoint.every_seconds=0", "--set", "checkpoint.every_steps=40",
          "--set", "checkpoint.incremental_every=100"};
}

// The rows the shards evicted by TTL, summed over a run's log lines ("shard 1: small: evicted 7
// rows by TTL and 0 by capacity <why>; 93 live"), split into those at a pass's end and the others.
struct TtlEvictions {
  int64_t at_pass_end = 0;
  int64_t other = 0;
};
TtlEvictions TtlEvictionsOf(const std::string& log) {
  TtlEvictions e;
  const std::regex re("evicted ([0-9]+) rows by TTL and [0-9]+ by capacity ([^;]*);");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    const int64_t n = std::stoll((*it)[1].str());
    ((*it)[2].str().find("pass's end") != std::string::npos ? e.at_pass_end : e.other) += n;
  }
  return e;
}

// Issue 28, passes on the PS: two days (passes) of continuous training with `small` dynamic and
// a TTL of 1 pass. The shards count the passes (the chief's checkpoint at a pass's end tells
// them: SaveShardRequest.end_pass) and evict at the second pass's end the users the second day
// did not see (it sees only users u0..u149), and nothing before: not at the first pass's end,
// not at the every-40-steps schedule of the second pass (which compares with the last finished
// pass), as `pstrain train` does (dynamic_tables_test TtlInPassesEvictsAtANewDaysEnd). SYNC: its
// second pass needs the restored consistency tracker to make the finished workers active again
// (it refused "worker 0 pushed step 48 after it finished" before). The chief's metrics.jsonl and
// TensorBoard carry the table's counters summed over the shards, as `train` writes its own.
TEST_F(DynamicPsTest, TtlInPassesEvictsAtTheSecondPassesEnd) {
  std::string day1 = "label,item,history,user\n";
  const std::string all = testing::TopicHistoryCsv(3000, 7);
  for (size_t pos = all.find('\n') + 1; pos < all.size();) {
    const size_t end = all.find('\n', pos);
    const std::string line = all.substr(pos, end - pos);
    if (std::stoi(line.substr(line.rfind(",u") + 2)) < 150) absl::StrAppend(&day1, line, "\n");
    pos = end + 1;
  }
  ASSERT_TRUE(WriteFileAtomic(Dir() + "/day1.csv", day1).ok());
  const std::string m = Dir() + "/days";
  // Host 0 prints to the output, host 1 logs to host-1/output.log (each run anew).
  auto run = [&](const std::string& train, std::string* out) {
    ASSERT_EQ(testing::RunShell(
                  absl::StrCat(P(), " local --hosts 2 --config ", Dir(), "/resume.textproto",
                               train, " --eval ", Dir(), "/test.csv --model_dir ", m,
                               " --epochs 1 --set features.table[1].dynamic.ttl_steps=0",
                               " --set features.table[1].dynamic.ttl_passes=1",
                               " --set cluster.consistency=SYNC --set threads.towers=1",
                               " --set checkpoint.every_seconds=0",
                               " --set checkpoint.every_steps=40",
                               " --set train.log_every_steps=10 2>&1; cat ", m,
                               "/host-1/output.log"),
                  300, out),
              0)
        << *out;
  };
  std::string day0_log, day1_log;
  run(absl::StrCat(" --train ", Dir(), "/train/a.csv"), &day0_log);
  const TtlEvictions e0 = TtlEvictionsOf(day0_log);
  EXPECT_EQ(e0.at_pass_end, 0) << day0_log;
  EXPECT_EQ(e0.other, 0) << day0_log;
  run(absl::StrCat(" --train ", Dir(), "/day1.csv"), &day1_log);
  EXPECT_THAT(day1_log, HasSubstr("new training pass"));
  const TtlEvictions e1 = TtlEvictionsOf(day1_log);
  EXPECT_EQ(e1.other, 0) << day1_log;
  // Day 0 saw about all 300 users; day 1 only u0..u149: about 150 rows are a pass old.
  EXPECT_GT(e1.at_pass_end, 100) << day1_log;
  EXPECT_LE(e1.at_pass_end, 150);
  const auto summary = testing::ReadSummary(m).fields();
  const auto& small =
      summary.at("dynamic_tables").struct_value().fields().at("small").struct_value().fields();
  EXPECT_LE(small.at("rows_live").number_value(), 150);

  // The chief's metrics.jsonl and TensorBoard carry the shards' `small` table summed, under
  // `pstrain train`'s names, at each logged step of both days, and the last point is the
  // summary's (after the second pass's end evicted): rows_live rises on day 0, then falls.
  auto jsonl = ReadFileToString(m + "/metrics.jsonl");
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  const std::regex re("\"step\":([0-9]+),\"dynamic_table\":\"small\",\"rows_live\":([0-9]+),"
                      "\"admitted\":([0-9]+),\"rejected\":([0-9]+),\"evicted_ttl\":([0-9]+)");
  std::vector<std::vector<int64_t>> points;  // step, rows_live, admitted, rejected, evicted_ttl
  for (std::sregex_iterator it(jsonl->begin(), jsonl->end(), re), end; it != end; ++it) {
    std::vector<int64_t> p;
    for (int i = 1; i <= 5; ++i) p.push_back(std::stoll((*it)[i].str()));
    points.push_back(p);
  }
  ASSERT_GE(points.size(), 6u) << *jsonl;  // steps 10, 20, .. of each day, and each day's end
  EXPECT_EQ(points[0][0], 10);
  EXPECT_GT(points[0][1], 0);
  int64_t peak = 0;
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GE(points[i][2], points[i - 1][2]) << "admitted is cumulative";
    EXPECT_GE(points[i][4], points[i - 1][4]) << "evicted_ttl is cumulative";
    peak = std::max(peak, points[i][1]);
  }
  EXPECT_GT(peak, 200);  // about the 300 users of day 0
  EXPECT_EQ(points.back()[1], small.at("rows_live").number_value());
  EXPECT_EQ(points.back()[4], small.at("evicted_ttl").number_value());
  EXPECT_GT(points.back()[4], 100);
  std::string events;
  ASSERT_EQ(testing::RunShell(absl::StrCat("cat ", m, "/events.out.tfevents.*"), 10, &events), 0);
  EXPECT_THAT(events, HasSubstr("dynamic/small/rows_live"));
  EXPECT_THAT(events, HasSubstr("dynamic/small/evicted_ttl"));
}

// The dynamic rows of the checkpoint LATEST names in model_dir, restored onto one shard of the
// job's config (every old shard's keys): one snapshot per dynamic table.
std::vector<DynamicSnapshot> LatestDynamicRows(const std::string& model_dir,
                                               CheckpointChoice* choice_out) {
  std::vector<DynamicSnapshot> out;
  auto config = LoadConfigFile(model_dir + "/config.textproto");
  EXPECT_TRUE(config.ok()) << config.status();
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  if (!config.ok() || !choice.ok() || !choice->has_value()) return out;
  *choice_out = **choice;
  auto options = ShardOptionsForJob(*config, 0, 1);
  EXPECT_TRUE(options.ok()) << options.status();
  auto shard = Shard::Create(options->data);
  EXPECT_TRUE(shard.ok()) << shard.status();
  const absl::Status restored = (*shard)->RestoreCheckpoint((*choice)->chain).status();
  EXPECT_TRUE(restored.ok()) << restored;
  for (const auto& store : (*shard)->dynamic_stores()) out.push_back(store->Snapshot().value());
  return out;
}

// PS mode (2 hosts, SYNC, deterministic data): a job checkpointing every 40 steps with deltas,
// whose shards evict the dynamic `small` table's rows not updated in 3 steps after every 40th step (the
// checkpoints' step schedule, not the checkpoints themselves: a stop's checkpoint lands
// anywhere), stopped by SIGTERM and resumed from its chain, ends with the dynamic rows (weights,
// optimizer slots, counts, steps) of an uninterrupted run.
TEST_F(DynamicPsTest, ResumedFromDeltasEqualsAnUninterruptedRun) {
  const std::string whole = Dir() + "/whole";
  testing::RunLocal(LocalArgs(whole), whole);
  const std::string parts = Dir() + "/parts";
  testing::RunLocalUntilSigterm(LocalArgs(parts), 600);
  EXPECT_LT(testing::ReadSummary(parts).fields().at("examples").number_value(), 8 * kTrainRows)
      << "the job finished before the signal: make it longer";
  testing::RunLocal(LocalArgs(parts), parts);
  auto host1 = ReadFileToString(parts + "/host-1/output.log");
  ASSERT_TRUE(host1.ok());
  EXPECT_THAT(*host1, HasSubstr("restored from " + parts + "/ckpt-"));

  const auto w = testing::ReadSummary(whole).fields();
  const auto p = testing::ReadSummary(parts).fields();
  EXPECT_EQ(p.at("steps").number_value(), w.at("steps").number_value());
  EXPECT_EQ(p.at("test_auc").number_value(), w.at("test_auc").number_value());
  EXPECT_EQ(p.at("test_logloss").number_value(), w.at("test_logloss").number_value());
  CheckpointChoice a_choice, b_choice;
  const std::vector<DynamicSnapshot> a = LatestDynamicRows(whole, &a_choice);
  const std::vector<DynamicSnapshot> b = LatestDynamicRows(parts, &b_choice);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_GT(a[0].rows(), 100);  // most of the 300 users are live
  for (size_t t = 0; t < 1; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ(a[t].keys, b[t].keys);
    EXPECT_TRUE(a[t].weights == b[t].weights) << "dynamic rows' weights differ";
    EXPECT_TRUE(a[t].state == b[t].state) << "dynamic rows' optimizer slots differ";
    EXPECT_EQ(a[t].counts, b[t].counts);
    EXPECT_EQ(a[t].last_step_of, b[t].last_step_of);
  }
  // The shards evicted on their schedule (shard 1 logs it in host 1's log).
  auto whole1 = ReadFileToString(whole + "/host-1/output.log");
  ASSERT_TRUE(whole1.ok());
  EXPECT_THAT(*whole1, HasSubstr("rows by TTL and 0 by capacity after step 40;"));
}

// A PS job's warm start (cmd/ps_setup.cc: ShardServer::WarmStart) from a `pstrain train`
// checkpoint (one dynamic-item file): each of 2 shards keeps the keys it owns, together every
// source row with its weights and slots, the steps and the cumulative counters restarting at 0.
TEST_F(DynamicPsTest, WarmStartSplitsTheDynamicRowsAmongTheShards) {
  const std::string src = Dir() + "/warm_src";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(src),
                                           " --epochs 3 2>&1"),
                              120, &out),
            0)
      << out;
  auto config = LoadConfigFile(Dir() + "/config.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  auto choice = ChooseCheckpoint(src);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  // The source's rows, as a resume restores them.
  DynamicSnapshot source;
  {
    auto options = ShardOptionsForJob(*config, 0, 1);
    ASSERT_TRUE(options.ok()) << options.status();
    auto shard = Shard::Create(options->data);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE((*shard)->RestoreCheckpoint((*choice)->chain).ok());
    source = (*shard)->dynamic_stores()[0]->Snapshot().value();
  }
  ASSERT_GE(source.rows(), 50);  // the 100 items
  // The source's counters and steps, which the warm start restarts (a re-sharding restore
  // restarts the counters as well, so they are read from the file itself).
  auto file = ReadDynamicFile((*choice)->chain.front().dir + "/dynamic-item");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_GT(file->snapshot.admitted, 0);
  EXPECT_GT(*std::max_element(source.last_step_of.begin(), source.last_step_of.end()), 0);
  std::map<uint64_t, int64_t> row_of;
  for (int64_t r = 0; r < source.rows(); ++r) row_of[source.keys[r]] = r;
  int64_t taken = 0;
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    auto options = ShardOptionsForJob(*config, s, 2);
    ASSERT_TRUE(options.ok()) << options.status();
    auto shard = Shard::Create(options->data);
    ASSERT_TRUE(shard.ok()) << shard.status();
    const absl::Status warm =
        (*shard)
            ->RestoreCheckpoint((*choice)->chain,
                                WarmStartLoadMode(/*reset_optimizer=*/false, std::nullopt))
            .status();
    ASSERT_TRUE(warm.ok()) << warm;
    const DynamicSnapshot got = (*shard)->dynamic_stores()[0]->Snapshot().value();
    EXPECT_GT(got.rows(), 0);
    EXPECT_EQ(got.admitted, 0);  // a new job's counters
    const int dim = got.dim, sf = got.state_floats;
    ASSERT_EQ(dim, source.dim);
    ASSERT_EQ(sf, source.state_floats);
    for (int64_t r = 0; r < got.rows(); ++r) {
      const uint64_t key = got.keys[r];
      EXPECT_EQ(DynamicShardOf(DynamicRow(0, key), 2), s) << key;
      ASSERT_TRUE(row_of.count(key)) << key;
      const int64_t at = row_of[key];
      EXPECT_TRUE(std::equal(got.weights.begin() + r * dim, got.weights.begin() + (r + 1) * dim,
                             source.weights.begin() + at * dim))
          << key;
      EXPECT_TRUE(std::equal(got.state.begin() + r * sf, got.state.begin() + (r + 1) * sf,
                             source.state.begin() + at * sf))
          << key;
      EXPECT_EQ(got.last_step_of[r], 0);
    }
    taken += got.rows();
  }
  EXPECT_EQ(taken, source.rows());

  // And a real 2-host job started from it: the shards take the rows and it trains a step.
  const std::string warm = Dir() + "/warm_ps";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(warm),
                                           " --warm_start_from ", src,
                                           " --set train.max_steps=1 2>&1"),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("shard 0: warm start from " + src));
  const double source_auc = testing::ReadSummary(src).fields().at("test_auc").number_value();
  const double warm_auc = testing::ReadSummary(warm).fields().at("test_auc").number_value();
  EXPECT_NEAR(warm_auc, source_auc, 0.02) << out;
  RecordProperty("auc_source_warm", absl::StrCat(source_auc, " ", warm_auc));
}

}  // namespace
}  // namespace pstrain
