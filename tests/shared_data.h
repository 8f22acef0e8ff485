// The real-data files that some tests read from the shared folder beside the repository
// (../shared/data: the Criteo samples). They are never copied into the repository. When one is
// missing, the test that needs it fails at its first line with the full path and how to get it;
// it never aborts, crashes or passes on empty input.
//
// The folder is the CMake cache variable PSTRAIN_SHARED_DATA_DIR (default <repo>/../shared/data),
// overridden at run time by the environment variable of the same name.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace pstrain {

inline std::string SharedDataDir() {
  const char* env = std::getenv("PSTRAIN_SHARED_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : PSTRAIN_SHARED_DATA_DIR;
}

// Sets *path to <SharedDataDir()>/<rel>; fails when that is not a non-empty regular file.
inline ::testing::AssertionResult SharedDataFile(const std::string& rel, std::string* path) {
  *path = SharedDataDir() + "/" + rel;
  struct stat st;
  if (::stat(path->c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "shared test data missing: " << *path
         << (::stat(path->c_str(), &st) == 0 ? " is empty or not a file" : " does not exist")
         << ". The tests read the Criteo samples from the shared folder beside the repository "
            "(../shared/data/criteo/: kaggle_train_head10k.tsv, criteo_sample.txt, "
            "criteo_sample.{tr,te}.tfrecords); put them there, or point "
            "PSTRAIN_SHARED_DATA_DIR (environment or CMake cache) at a folder that has them.";
}

}  // namespace pstrain

// Declares `std::string var` = the shared file `rel`, or fails the test (from its body) when the
// file is missing.
#define ASSERT_SHARED_DATA(var, rel) \
  std::string var;                   \
  ASSERT_TRUE(::pstrain::SharedDataFile(rel, &var))
