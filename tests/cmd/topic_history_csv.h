// The list data of the command tests of lists (tests/cmd/lists_test.cc, din_test.cc): CSV with a
// header "label,item,history,user". Items have one of 4 topics (item % 4); a history is 1..12
// items mostly of one topic, and a click is likely (0.8 vs 0.2) when the candidate's topic is
// the history's.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/random.h"

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

}  // namespace pstrain::testing
