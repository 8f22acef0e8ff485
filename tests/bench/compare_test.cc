// bench/compare.py in a tiny configuration (tiny datagen data, one repeat): the report has every
// mode, with sane numbers where the mode ran. Not a timing assertion.
#include <dirent.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using testing::RunToExit;


std::string Dir() { return absl::StrCat(::testing::TempDir(), "/compare_", getpid()); }

TEST(CompareTest, ReportsEveryModeWithSaneNumbers) {
  ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "6000", "--files", "2", "--seed", "1",
                       "--out", Dir() + "/train"},
                      60000),
            0);
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "1000", "--seed", "2", "--out",
                       Dir() + "/test"},
                      60000),
            0);
  ASSERT_TRUE(WriteFileAtomic(Dir() + "/tiny.textproto",
                              "features { categorical_vocab_size: 5000 }\n"
                              "model { hidden: [16] }\n"
                              "train { batch_size: 64 epochs: 1 eval_every_steps: 20 }\n")
                  .ok());
  ASSERT_EQ(RunToExit({"/usr/bin/python3", PSTRAIN_SOURCE_DIR "/bench/compare.py", "--binary",
                       PSTRAIN_BINARY, "--config", Dir() + "/tiny.textproto", "--train",
                       Dir() + "/train/part-*", "--eval", Dir() + "/test/part-*", "--hosts", "2",
                       "--repeats", "1", "--timeout_s", "60", "--results", Dir() + "/results",
                       "--variant", "ps-async-k2=ps-async:cluster.dense_sync_steps=2"},
                      300000),
            0);

  // results/<timestamp>/compare.{json,md}
  std::string out_dir;
  DIR* d = opendir((Dir() + "/results").c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out_dir = Dir() + "/results/" + e->d_name;
  }
  closedir(d);
  auto text = ReadFileToString(out_dir + "/compare.json");
  ASSERT_TRUE(text.ok()) << text.status();
  google::protobuf::Struct report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &report).ok());
  auto md = ReadFileToString(out_dir + "/compare.md");
  ASSERT_TRUE(md.ok()) << md.status();

  std::set<std::string> seen;
  for (const auto& v : report.fields().at("modes").list_value().values()) {
    const auto& m = v.struct_value().fields();
    const std::string mode = m.at("mode").string_value();
    seen.insert(mode);
    EXPECT_NE(md->find("| " + mode + " |"), std::string::npos) << mode;
    SCOPED_TRACE(mode);
    ASSERT_EQ(m.at("status").string_value(), "ok") << m.at("error").string_value();
    EXPECT_GT(m.at("examples_per_sec").number_value(), 0);
    EXPECT_GT(m.at("examples_per_sec_per_core").number_value(), 0);
    EXPECT_GT(m.at("ratio_to_train").number_value(), 0);
    EXPECT_GT(m.at("test_auc").number_value(), 0.5);
    EXPECT_LT(m.at("test_auc").number_value(), 1.0);
    EXPECT_GT(m.at("test_logloss").number_value(), 0);
    EXPECT_GT(m.at("cpu_utilisation").number_value(), 0);
    EXPECT_GT(m.at("cpu_us_per_example").number_value(), 0);
    EXPECT_GT(m.at("cpu_ratio_to_train").number_value(), 0);
    EXPECT_GT(m.at("peak_memory_mb").number_value(), 1);
    // Parameters and slots of the largest part (process, shard or rank), from summary.json.
    EXPECT_GT(m.at("param_memory_mb_per_host").number_value(), 0);
    for (const char* key : {"examples_per_sec", "test_auc"}) {  // [min, max] over the repeats
      const auto& range = m.at(std::string(key) + "_range").list_value();
      ASSERT_EQ(range.values_size(), 2) << key;
      EXPECT_LE(range.values(0).number_value(), m.at(key).number_value()) << key;
      EXPECT_GE(range.values(1).number_value(), m.at(key).number_value()) << key;
    }
    if (mode == "train") {
      EXPECT_EQ(m.at("ratio_to_train").number_value(), 1.0);
      EXPECT_EQ(m.at("bytes_per_example").number_value(), 0);
      // The target is 0.99 x this mode's own final AUC: reached by the final eval at the latest.
      EXPECT_GT(m.at("time_to_target_s").number_value(), 0);
    }
    if (mode != "train") {
      EXPECT_GT(m.at("bytes_per_example").number_value(), 0);
    }
    if (mode.rfind("ps-", 0) == 0) {  // one pull/push QPS pair per shard
      EXPECT_EQ(m.at("shard_qps").list_value().values_size(), 2);
    }
  }
  EXPECT_EQ(seen, (std::set<std::string>{"train", "ps-async", "ps-bounded", "ps-sync", "allreduce",
                                          "ps-async-k2"}));
  // The variant ran with its override: half the dense pulls and pushes, fewer bytes per example.
  double async_bytes = 0, k2_bytes = 0;
  for (const auto& v : report.fields().at("modes").list_value().values()) {
    const auto& m = v.struct_value().fields();
    if (m.at("mode").string_value() == "ps-async") async_bytes = m.at("bytes_per_example").number_value();
    if (m.at("mode").string_value() == "ps-async-k2") k2_bytes = m.at("bytes_per_example").number_value();
  }
  EXPECT_LT(k2_bytes, async_bytes);
  EXPECT_NE(md->find("Scaling on paper"), std::string::npos);
  const auto& scaling = report.fields().at("scaling").struct_value().fields();
  EXPECT_EQ(scaling.at("rows").list_value().values_size(), 6);  // 2, 4, 8, 16, 32, 128 hosts
  // The model's fixes: the PS's measured CPU ratio and the links' efficiencies.
  EXPECT_GT(scaling.at("ps_cpu_ratio").number_value(), 0);
  EXPECT_EQ(scaling.at("ps_link_efficiency").number_value(), 0.55);
  if (access("/usr/bin/gnuplot", X_OK) == 0) {
    EXPECT_TRUE(PathExists(out_dir + "/compare.png"));
  }
  std::system(("rm -rf " + Dir()).c_str());
}

}  // namespace
}  // namespace pstrain
