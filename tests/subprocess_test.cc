// The test harness's child processes (tests/subprocess.h): a test that dies without running its
// destructors (an abort in gRPC, a SIGKILL) leaves no child behind to hold ctest's output pipe.
#include "tests/subprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::PidsMentioning;
using testing::ProcessesLeft;
using testing::Subprocess;

TEST(Subprocess, AChildDiesWithATestKilledBeforeItsDestructorsRun) {
  // A unique argument to find the child by: sleep for 4000 s plus this process's id in ms.
  const std::string marker = absl::StrCat("4000.", getpid() % 1000);
  const pid_t test = fork();
  ASSERT_GE(test, 0);
  if (test == 0) {
    Subprocess child;
    std::string error;
    if (!child.Start({"/bin/sleep", marker}, &error)) _exit(3);
    if (child.ReadLineContaining("never printed", 200) != "") _exit(4);
    raise(SIGKILL);  // as a test that aborts: `child`'s destructor never runs
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(test, &status, 0), test);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the test process exited with " << WEXITSTATUS(status);
  const int left = ProcessesLeft(marker);
  for (int pid : PidsMentioning(marker)) kill(pid, SIGKILL);
  EXPECT_EQ(left, 0) << "the child outlived the test that started it";
}

TEST(Subprocess, AProgramThatCannotRunIsAnErrorNamingIt) {
  Subprocess child;
  std::string error;
  EXPECT_FALSE(child.Start({"/nonexistent/pstrain_no_such_binary"}, &error));
  EXPECT_THAT(error, HasSubstr("exec /nonexistent/pstrain_no_such_binary: No such file"));
  EXPECT_EQ(child.pid(), -1);
}

TEST(Subprocess, OutputIsReadAndTheExitStatusReturned) {
  Subprocess child;
  std::string error;
  ASSERT_TRUE(child.Start({"/bin/sh", "-c", "echo first; echo second line; exit 7"}, &error))
      << error;
  EXPECT_EQ(child.ReadLineContaining("second", 10000), "second line");
  const int status = child.WaitExit(10000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

}  // namespace
}  // namespace pstrain
