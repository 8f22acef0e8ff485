#include "common/memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cgroup.h"
#include "common/file.h"
#include "common/logging.h"

namespace pstrain {
namespace {

// cgroup v1 writes "no limit" as LONG_MAX rounded down to a page; anything this large is none.
constexpr int64_t kNoLimit = int64_t{1} << 62;

// The limit in one directory, nullopt when it sets none; NOT_FOUND when it has no such file.
absl::StatusOr<std::optional<int64_t>> LimitAt(const std::string& dir, bool v2) {
  const std::string path = dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes");
  if (!PathExists(path)) return absl::NotFoundError(path);
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  const absl::string_view v = absl::StripAsciiWhitespace(*text);
  if (v == "max") return std::optional<int64_t>();
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(v, &bytes) || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": expected a number of bytes", v2 ? " or 'max'" : "", ", got '", *text, "'"));
  }
  if (bytes >= kNoLimit) return std::optional<int64_t>();
  return std::optional<int64_t>(bytes);
}

// A "Key:   N kB" line of a /proc file, in bytes.
std::optional<int64_t> KbField(const std::string& path, absl::string_view key) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(line, &kb)) return kb * 1024;
  }
  return std::nullopt;
}

std::string Mb(int64_t bytes) { return absl::StrFormat("%.0f MB", bytes / 1048576.0); }

}  // namespace

absl::StatusOr<std::optional<int64_t>> CgroupMemoryLimit(const std::string& proc_self_cgroup,
                                                         const std::string& cgroup_root) {
  return SmallestCgroupLimit<int64_t>(proc_self_cgroup, cgroup_root, "memory", LimitAt);
}

MemoryBudget MakeMemoryBudget(std::optional<int64_t> cgroup_limit, int64_t rss,
                              std::optional<int64_t> rlimit_as, int64_t virtual_size,
                              std::optional<int64_t> mem_available) {
  MemoryBudget b;
  auto consider = [&b](int64_t bytes, std::string source) {
    bytes = std::max<int64_t>(0, bytes);
    if (b.bytes < 0 || bytes < b.bytes) {
      b.bytes = bytes;
      b.source = std::move(source);
    }
  };
  if (cgroup_limit) {
    consider(*cgroup_limit - rss, absl::StrCat("the cgroup memory limit ", Mb(*cgroup_limit),
                                               " less this process's ", Mb(rss), " resident"));
  }
  if (rlimit_as) {
    consider(*rlimit_as - virtual_size,
             absl::StrCat("RLIMIT_AS ", Mb(*rlimit_as), " less this process's ",
                          Mb(virtual_size), " of address space"));
  }
  if (mem_available) {
    consider(*mem_available, absl::StrCat("the machine's MemAvailable ", Mb(*mem_available)));
  }
  return b;
}

MemoryBudget DetectMemoryBudget() {
  absl::StatusOr<std::optional<int64_t>> cgroup =
      CgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup");
  if (!cgroup.ok()) {
    PSTRAIN_LOG(WARNING) << "ignoring the cgroup memory limit: " << cgroup.status().message();
    cgroup = std::optional<int64_t>();
  }
  std::optional<int64_t> rlimit;
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    rlimit = static_cast<int64_t>(rl.rlim_cur);
  }
  return MakeMemoryBudget(*cgroup, KbField("/proc/self/status", "VmRSS").value_or(0), rlimit,
                          KbField("/proc/self/status", "VmSize").value_or(0),
                          KbField("/proc/meminfo", "MemAvailable"));
}

}  // namespace pstrain
