// What the end-to-end benchmark apps (bench/*_app.cc) share: their main, their flag parsing
// front, the process's resident memory, the median and range of repeated measurements, and
// writing their JSON results.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cmd/launcher.h"
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

// The process's resident memory now (/proc/self/statm), in bytes; 0 where it cannot be read.
inline int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
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

// The main of a benchmark app whose work is `pstrain::Main(argc, argv)`: runs it with
// OMP_WAIT_POLICY=PASSIVE as pstrain's own main does (cmd/launcher.h), so that what is measured
// is what pstrain runs.
#define PSTRAIN_APP_MAIN()                                \
  int main(int argc, char** argv) {                       \
    pstrain::ReexecWithPassiveOmpWaitPolicy(argv);        \
    return pstrain::Main(argc, argv);                     \
  }
