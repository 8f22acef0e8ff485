// Test helper: a child process with its stdout piped to the test, every wait bounded. The
// destructor kills (SIGKILL) and reaps a child that is still running, so a failing test never
// leaves a process behind.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spawn.h"

namespace pstrain {
namespace testing {

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (pid_fd_ >= 0) close(pid_fd_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts argv[0] with args; stdout goes to a pipe read by ReadLine, stderr is inherited.
  // Returns false (with *error set) if the process could not be started. The child dies with
  // this process (PR_SET_PDEATHSIG), so a test that aborts (its destructors never run) leaves no
  // child behind holding ctest's output pipe. Start must be called from a thread that lives as
  // long as the child (the death signal follows the thread that forked): the test's own thread.
  bool Start(const std::vector<std::string>& argv, std::string* error) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Fail("pipe2", error);
    SpawnOptions so;
    so.argv = argv;
    so.stdout_fd = fds[1];
    const absl::StatusOr<pid_t> pid = Spawn(so);
    close(fds[1]);
    out_fd_ = fds[0];
    if (!pid.ok()) {
      *error = std::string(pid.status().message());
      return false;
    }
    pid_ = *pid;
    pid_fd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pid_fd_ < 0) return Fail("pidfd_open", error);
    return true;
  }

  // Reads stdout until a line containing `needle` arrives (returned without the newline), EOF, or
  // `timeout_ms` passes (then returns "" and sets *timed_out when given).
  std::string ReadLineContaining(const std::string& needle, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.find(needle) != std::string::npos) return line;
      }
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            end - std::chrono::steady_clock::now())
                                            .count());
      if (left <= 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n <= 0) return "";  // EOF: the child closed stdout (exited)
      buffer_.append(buf, n);
    }
  }

  bool Signal(int sig) { return pid_ > 0 && kill(pid_, sig) == 0; }

  // Waits up to timeout_ms for the child to exit; returns its wait status, or -1 on timeout.
  int WaitExit(int timeout_ms) {
    if (pid_ <= 0) return exit_status_;
    pollfd p{pid_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    exit_status_ = status;
    return status;
  }

  int pid() const { return pid_; }

 private:
  static bool Fail(const std::string& what, std::string* error) {
    *error = what + ": " + strerror(errno);
    return false;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int pid_fd_ = -1;
  int exit_status_ = -1;
  std::string buffer_;
};

// Runs argv to its end within timeout_ms (a child still running then is killed). Its stdout is not
// read, so it must stay under a pipe buffer (64 KiB); stderr is inherited. Returns the exit code,
// or -1 (with the reason on stderr) if it could not start, timed out or died by a signal.
inline int RunToExit(const std::vector<std::string>& argv, int timeout_ms) {
  Subprocess p;
  std::string error;
  if (!p.Start(argv, &error)) {
    fprintf(stderr, "RunToExit: %s\n", error.c_str());
    return -1;
  }
  const int status = p.WaitExit(timeout_ms);
  if (status < 0 || !WIFEXITED(status)) {
    fprintf(stderr, "RunToExit: %s %s\n", argv[0].c_str(),
            status < 0 ? "timed out" : "died by a signal");
    return -1;
  }
  return WEXITSTATUS(status);
}

// Runs argv through sh with stdout and stderr into the file `log`, to its end within
// `timeout_ms`. Returns the wait status (-1 if it could not start or timed out: the child is
// killed). Arguments must not contain a single quote.
inline int RunLogged(const std::vector<std::string>& argv, const std::string& log,
                     int timeout_ms) {
  std::string cmd = "exec";
  for (const std::string& a : argv) cmd += " '" + a + "'";
  cmd += " > '" + log + "' 2>&1";
  Subprocess p;
  std::string error;
  if (!p.Start({"/bin/sh", "-c", cmd}, &error)) {
    fprintf(stderr, "RunLogged: %s\n", error.c_str());
    return -1;
  }
  return p.WaitExit(timeout_ms);
}

// Processes (/proc) whose command line mentions `needle`, e.g. a test's unique model dir.
inline std::vector<int> PidsMentioning(const std::string& needle) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline");
    std::stringstream cmdline;
    cmdline << in.rdbuf();
    std::string text = cmdline.str();
    for (char& c : text) c = c == '\0' ? ' ' : c;
    if (text.find(needle) != std::string::npos) pids.push_back(atoi(e->d_name));
  }
  closedir(proc);
  return pids;
}
inline int ProcessesMentioning(const std::string& needle) {
  return static_cast<int>(PidsMentioning(needle).size());
}

// One line per process whose command line mentions `needle`: its pid, parent, state (R, S, D,
// Z, ... from /proc/<pid>/stat) and command line, for a test's message about processes left.
inline std::string DescribeProcessesMentioning(const std::string& needle) {
  std::string out;
  for (int pid : PidsMentioning(needle)) {
    std::ifstream stat_in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_in)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": the fields after the last ')'.
    const size_t close = stat.rfind(')');
    std::istringstream fields(close == std::string::npos ? "" : stat.substr(close + 1));
    std::string state = "?", ppid = "?";
    fields >> state >> ppid;
    std::ifstream cmd_in("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmd_in)), std::istreambuf_iterator<char>());
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    out += "pid " + std::to_string(pid) + " (parent " + ppid + ", state " + state + "): " +
           cmdline + "\n";
  }
  return out;
}

// Waits (10 s at most) until no process mentions `needle`; returns how many are left.
inline int ProcessesLeft(const std::string& needle) {
  for (int i = 0; i < 100 && ProcessesMentioning(needle) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return ProcessesMentioning(needle);
}

}  // namespace testing
}  // namespace pstrain
