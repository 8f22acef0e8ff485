// What the end-to-end benchmark apps (bench/*_app.cc) share: their flag parsing front, the median
// and range of repeated measurements, and writing their JSON results.
#pragma once

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/flags.h"

namespace pstrain {

// Parses argv[1..) into `flags`. Returns the exit code when the app should stop here: 0 after
// printing the usage for --help, 2 after printing the error and the usage for a bad flag.
inline std::optional<int> ParseAppFlags(FlagSet& flags, int argc, char** argv) {
  absl::Status s = flags.Parse(argc, argv);
  if (s.ok() && !flags.help_requested()) return std::nullopt;
  std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
  return s.ok() ? 0 : 2;
}

// The median and range of repeated measurements (of at least one).
struct Spread {
  double median = 0, min = 0, max = 0;
};
inline Spread Summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

// Writes `json` and a newline to `path` atomically. Returns the app's exit code: 0, or 1 after
// printing the error.
inline int WriteJsonResults(const std::string& path, const std::string& json) {
  if (absl::Status s = WriteFileAtomic(path, json + "\n"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pstrain
