// Scratch directories and whole-file reads for tests.
#pragma once

#include <stdlib.h>

#include <string>

#include "common/file.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace testing {

// A fresh directory of this process under the test's temp dir: concurrent test runs (CI,
// several checkouts) never share one.
inline std::string FreshDir(const std::string& name) {
  std::string templ = ::testing::TempDir() + "/" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return ::testing::TempDir() + "/" + name;
  return templ;
}

// The whole file, or "<the error>" (which no expected content equals, and which says why).
inline std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

}  // namespace testing
}  // namespace pstrain
