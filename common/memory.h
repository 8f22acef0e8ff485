// How much memory this process may still take before the kernel refuses it (RLIMIT_AS) or kills
// it (a cgroup's memory limit, the machine running out): what `pstrain allreduce` compares its
// replica with before it starts (worker/allreduce/replica_memory.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace pstrain {

// The memory limit of the cgroup a process is in, in bytes, or nullopt when there is none ("max"
// in v2, v1's "unlimited" page-rounded LONG_MAX, or no memory controller). The smallest limit
// from the process's cgroup up to the root binds (common/cgroup.h: v1 memory.limit_in_bytes, v2
// memory.max). INVALID_ARGUMENT naming the file for a value that is not a number.
absl::StatusOr<std::optional<int64_t>> CgroupMemoryLimit(const std::string& proc_self_cgroup,
                                                         const std::string& cgroup_root);

struct MemoryBudget {
  // What this process may still allocate: the smallest of
  //   cgroup limit - this process's resident memory (the cgroup's other processes are not
  //                  counted: an emulated or real host runs one pstrain process per role);
  //   RLIMIT_AS    - this process's virtual size;
  //   MemAvailable of /proc/meminfo (the machine's).
  // -1 when none of them is known.
  int64_t bytes = -1;
  std::string source;  // which one bound, with its numbers, for messages
};

// The budget from the given numbers (any may be absent); pure, for tests.
MemoryBudget MakeMemoryBudget(std::optional<int64_t> cgroup_limit, int64_t rss,
                              std::optional<int64_t> rlimit_as, int64_t virtual_size,
                              std::optional<int64_t> mem_available);

// The budget of this process now, from /proc/self/cgroup under /sys/fs/cgroup, getrlimit,
// /proc/self/status and /proc/meminfo. An unreadable or malformed file is left out with a
// warning.
MemoryBudget DetectMemoryBudget();

}  // namespace pstrain
