// The list data of the command tests of lists and tables (tests/cmd/lists_test.cc, din_test.cc,
// tables_test.cc, dynamic_ps_test.cc): CSV with a header "label,item,history,user". Items have
// one of 4 topics (item % 4); a history is 1..12 items mostly of one topic, and a click is likely
// (0.8 vs 0.2) when the candidate's topic is the history's. Also the job those tests share: its
// files in a folder and the command line that trains on them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/random.h"
#include "gtest/gtest.h"

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

}  // namespace pstrain::testing
