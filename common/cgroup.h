// Where a controller's files are for this process's cgroup, cgroup v1 or v2: the one walk that
// the CPU quota (common/cpu.h) and the memory limit (common/memory.h) share.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pstrain {

struct CgroupDirs {
  bool v2 = false;
  // From the process's own cgroup up to the hierarchy's root (the smallest limit on the way
  // binds). The directories need not exist: not every level has the controller's files.
  std::vector<std::string> dirs;
};

// Reads `proc_self_cgroup` (the format of /proc/self/cgroup) and returns the directories of
// `controller` ("cpu", "memory") under `cgroup_root` (normally /sys/fs/cgroup):
//   - a v1 line naming the controller wins (hybrid hierarchies): its mount is named after the
//     line's controller list (cpu,cpuacct), or after the controller alone;
//   - else the v2 line "0::<path>", under cgroup_root itself.
// Inside a container the cgroup namespace makes the path "/", so the root is the only level.
// nullopt when the file is missing (not Linux) or names neither; INVALID_ARGUMENT naming the
// file for a line that is not "id:controllers:path".
absl::StatusOr<std::optional<CgroupDirs>> FindCgroupDirs(const std::string& proc_self_cgroup,
                                                         const std::string& cgroup_root,
                                                         const std::string& controller);

// The limit of `controller` that binds this process: the smallest over its cgroup directories
// (FindCgroupDirs). at(dir, v2) returns one directory's limit (nullopt: it sets none), NOT_FOUND
// when the directory has no such file (skipped), or another error (returned). nullopt when no
// directory sets one, or the process has no such cgroup.
template <typename T, typename At>
absl::StatusOr<std::optional<T>> SmallestCgroupLimit(const std::string& proc_self_cgroup,
                                                     const std::string& cgroup_root,
                                                     const std::string& controller, At at) {
  absl::StatusOr<std::optional<CgroupDirs>> cgroup =
      FindCgroupDirs(proc_self_cgroup, cgroup_root, controller);
  if (!cgroup.ok()) return cgroup.status();
  std::optional<T> smallest;
  if (!cgroup->has_value()) return smallest;
  for (const std::string& dir : (*cgroup)->dirs) {
    absl::StatusOr<std::optional<T>> l = at(dir, (*cgroup)->v2);
    if (l.ok()) {
      if (l->has_value() && (!smallest || **l < *smallest)) smallest = **l;
    } else if (!absl::IsNotFound(l.status())) {
      return l.status();
    }
  }
  return smallest;
}

}  // namespace pstrain
