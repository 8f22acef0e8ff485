// Test helper: runs a shell command line with a bound on its time and captures what it prints.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace pstrain {
namespace testing {

// Runs `command` with sh within `timeout_s` seconds (timeout(1) kills it after that); returns its
// exit code (124 when it timed out, 128 + N when signal N ended sh) and sets *output to what it
// wrote on stdout and stderr.
inline int RunShell(const std::string& command, int timeout_s, std::string* output) {
  std::string quoted;
  for (char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string line =
      "timeout -k 5 " + std::to_string(timeout_s) + " sh -c '" + quoted + "' 2>&1";
  output->clear();
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace testing
}  // namespace pstrain
