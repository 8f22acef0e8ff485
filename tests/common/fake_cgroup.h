// Test fixture: a fake /proc/self/cgroup and /sys/fs/cgroup tree in a fresh directory, for the
// cgroup readers of common/cpu.h and common/memory.h.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/file.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace testing {

class FakeCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pstrain_cgroup_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + root_ + "'").c_str()); }
  // Writes `text` to root/rel, creating its directories.
  void Write(const std::string& rel, const std::string& text) {
    const std::string path = root_ + "/" + rel;
    ASSERT_TRUE(MakeDirs(DirName(path)).ok());
    std::ofstream(path) << text;
  }
  std::string proc_self_cgroup() const { return root_ + "/proc_self_cgroup"; }
  std::string cgroup_root() const { return root_ + "/sys"; }

  std::string root_;
};

}  // namespace testing
}  // namespace pstrain
