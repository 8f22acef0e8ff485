// The list data of the command tests of lists and tables (tests/cmd/lists_test.cc, din_test.cc,
// tables_test.cc, dynamic_ps_test.cc): CSV with a header "label,item,history,user". Items have
// one of 4 topics (item % 4); a history is 1..12 items mostly of one topic, and a click is likely
// (0.8 vs 0.2) when the candidate's topic is the history's. Also the job those tests share: its
// files in a folder, the command line that trains on them, the fixture that writes them once a
// suite, and `pstrain predict` of its test rows.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/shell.h"

namespace pstrain::testing {

inline std::string TopicHistoryCsv(int rows, uint64_t seed) {
  Rng rng(seed);
  std::string text = "label,item,history,user\n";
  for (int r = 0; r < rows; ++r) {
    const uint64_t topic = rng.Uniform(4), item = rng.Uniform(100);
    const bool match = item % 4 == topic;
    absl::StrAppend(&text, rng.UniformDouble() < (match ? 0.8 : 0.2) ? "1" : "0", ",i",
                    item, ",");
    const int len = 1 + static_cast<int>(rng.Uniform(12));
    for (int i = 0; i < len; ++i) {
      const uint64_t t = rng.Uniform(5) == 0 ? rng.Uniform(4) : topic;
      absl::StrAppend(&text, i ? "|" : "", "i", 4 * rng.Uniform(25) + t);
    }
    absl::StrAppend(&text, ",u", rng.Uniform(300), "\n");
  }
  return text;
}

// The config's data section of the job below: CSV, train and eval files named by the flags.
inline constexpr char kTopicHistoryData[] = R"pb(
  data {
    train { name: "train" format: CSV }
    eval { name: "eval" format: CSV }
    shuffle_buffer: 1000
  }
)pb";

// The topic-history job's files, in `dir` made afresh: two train files (train/a.csv and b.csv,
// 6,000 rows each, seeds 1 and 2: by-file sharding gives each of 2 hosts one), test.csv (2,000
// rows, seed 3) and config.textproto = `config`. A fatal failure on error (for
// ASSERT_NO_FATAL_FAILURE).
inline void WriteTopicHistoryJob(const std::string& dir, const std::string& config) {
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/train").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(dir + "/train/a.csv", TopicHistoryCsv(6000, 1)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/train/b.csv", TopicHistoryCsv(6000, 2)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/test.csv", TopicHistoryCsv(2000, 3)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.textproto", config).ok());
}

// The flags of `pstrain train` (and config, local, allreduce) for the job in `dir`, checkpoints
// into `model_dir`.
inline std::string TopicHistoryArgs(const std::string& dir, const std::string& model_dir) {
  return absl::StrCat("--config ", dir, "/config.textproto --train '", dir,
                      "/train/*.csv' --eval ", dir, "/test.csv --model_dir ", model_dir);
}

// The fixture of a suite over one topic-history job: its folder Dir() (`Job::Dir()`) written
// once before the suite's tests with `Job::Config()`, removed after them; Args(model_dir) is
// TopicHistoryArgs. A suite that needs more files overrides SetUpTestSuite and calls this one's
// first.
template <typename Job>
class TopicHistoryJobTest : public ::testing::Test {
 protected:
  static std::string Dir() { return Job::Dir(); }

  static void SetUpTestSuite() {
    ASSERT_NO_FATAL_FAILURE(WriteTopicHistoryJob(Job::Dir(), Job::Config()));
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Job::Dir()).c_str()); }

  static std::string Args(const std::string& model_dir) {
    return TopicHistoryArgs(Job::Dir(), model_dir);
  }
};

// `pstrain predict` of `dir`/test.csv (CSV, batches of 500) with the model at `model` (a model
// dir or an export): the scores into `dir`/<name>.tsv, the summary into `dir`/<name>.json, which
// it returns (empty, with a test failure, when predict fails; its output then in the failure).
inline google::protobuf::Struct PredictTopicHistory(const std::string& dir,
                                                    const std::string& model,
                                                    const std::string& name) {
  std::string out;
  const int rc = RunShell(absl::StrCat(PSTRAIN_BINARY, " predict --model_dir ", model, " --input ",
                                       dir, "/test.csv --format csv --out ", dir, "/", name,
                                       ".tsv --summary ", dir, "/", name,
                                       ".json --batch_size 500 --threads 2 2>&1"),
                          300, &out);
  EXPECT_EQ(rc, 0) << out;
  if (rc != 0) return {};
  return ReadJsonFile(absl::StrCat(dir, "/", name, ".json"));
}

}  // namespace pstrain::testing
