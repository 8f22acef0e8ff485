#include "common/spawn.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// Reaps pid (bounded by the commands the tests run, which end by themselves) and returns its exit code.
int ExitCode(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/spawn_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(Spawn, AMissingBinaryIsAnErrorNamingIt) {
  SpawnOptions so;
  so.argv = {"/nonexistent/pstrain_no_such_binary", "x"};
  absl::StatusOr<pid_t> pid = Spawn(so);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(),
              HasSubstr("exec /nonexistent/pstrain_no_such_binary: No such file"));
}

TEST(Spawn, AnEmptyArgvIsRefused) {
  EXPECT_FALSE(Spawn(SpawnOptions()).ok());
}

TEST(Spawn, AnOutputFileThatCannotBeOpenedIsAnErrorNamingIt) {
  SpawnOptions so;
  so.argv = {"/bin/true"};
  so.output_file = "/nonexistent/dir/out.log";
  absl::StatusOr<pid_t> pid = Spawn(so);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr("create /nonexistent/dir/out.log"));
}

TEST(Spawn, OutputFileTakesStdoutAndStderr) {
  const std::string out = TempPath("out.log");
  SpawnOptions so;
  so.argv = {"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"};
  so.output_file = out;
  absl::StatusOr<pid_t> pid = Spawn(so);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(ExitCode(*pid), 3);
  EXPECT_EQ(Slurp(out), "to-stdout\nto-stderr\n");
  unlink(out.c_str());
}

TEST(Spawn, TheGivenEnvironmentReplacesThisProcesssOne) {
  const std::string out = TempPath("env.log");
  setenv("PSTRAIN_SPAWN_TEST_PARENT_ONLY", "1", 1);
  SpawnOptions so;
  so.argv = {"/bin/sh", "-c", "echo \"[$PSTRAIN_SPAWN_TEST_CHILD][$PSTRAIN_SPAWN_TEST_PARENT_ONLY]\""};
  so.env = std::vector<std::string>{"PSTRAIN_SPAWN_TEST_CHILD=yes"};
  so.output_file = out;
  absl::StatusOr<pid_t> pid = Spawn(so);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(ExitCode(*pid), 0);
  EXPECT_EQ(Slurp(out), "[yes][]\n");
  unsetenv("PSTRAIN_SPAWN_TEST_PARENT_ONLY");
  unlink(out.c_str());
}

TEST(Spawn, TheChildStartsWithNoSignalBlockedAndInItsOwnGroupWhenAsked) {
  const std::string out = TempPath("mask.log");
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  SpawnOptions so;
  // SigBlk is the blocked mask in hex; the shell's own pgid against its pid.
  so.argv = {"/bin/sh", "-c",
             "grep SigBlk /proc/self/status | tr -d '\\t'; "
             "[ \"$(ps -o pgid= -p $$ | tr -d ' ')\" = \"$$\" ] && echo own-group"};
  so.output_file = out;
  so.new_process_group = true;
  absl::StatusOr<pid_t> pid = Spawn(so);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(ExitCode(*pid), 0);
  EXPECT_EQ(Slurp(out), "SigBlk:0000000000000000\nown-group\n");
  unlink(out.c_str());
}

}  // namespace
}  // namespace pstrain
