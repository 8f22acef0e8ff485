#include "common/cgroup.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/file.h"

namespace pstrain {

absl::StatusOr<std::optional<CgroupDirs>> FindCgroupDirs(const std::string& proc_self_cgroup,
                                                         const std::string& cgroup_root,
                                                         const std::string& controller) {
  absl::StatusOr<std::string> text = ReadFileToString(proc_self_cgroup);
  if (!text.ok()) return std::optional<CgroupDirs>();  // no cgroups (or not Linux)
  std::string base, path;
  bool v2 = false, found = false;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          proc_self_cgroup, ": expected 'id:controllers:path' lines, got '", line, "'"));
    }
    if (f[1].empty() && f[0] == "0") {
      if (!found) {
        v2 = true;
        found = true;
        base = cgroup_root;
        path = std::string(f[2]);
      }
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c != controller) continue;
      v2 = false;
      found = true;
      base = cgroup_root + "/" + std::string(f[1]);
      if (!PathExists(base)) base = cgroup_root + "/" + controller;
      path = std::string(f[2]);
    }
  }
  if (!found) return std::optional<CgroupDirs>();
  CgroupDirs out;
  out.v2 = v2;
  std::string p = path;
  while (true) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    out.dirs.push_back(p == "/" || p.empty() ? base : base + p);
    if (p == "/" || p.empty()) break;
    const size_t slash = p.rfind('/');
    p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  return std::optional<CgroupDirs>(std::move(out));
}

}  // namespace pstrain
