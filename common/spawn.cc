#include "common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

extern char** environ;

namespace pstrain {
namespace {

absl::Status ErrnoError(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// RAII for the descriptors Spawn opens in the parent.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  // Everything the child needs is built before the fork.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv = Pointers(args);
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  if (options.env.has_value()) {
    env_strings = *options.env;
    envp = Pointers(env_strings);
  }
  char** const child_env = options.env.has_value() ? envp.data() : environ;

  // A fresh file (common/file.h CreateFreshFile): never written through a symlink or FIFO
  // planted at the log's name.
  absl::StatusOr<int> opened =
      options.output_file.empty() ? absl::StatusOr<int>(-1) : CreateFreshFile(options.output_file);
  if (!opened.ok()) return opened.status();
  Fd output(*opened);
  const int stdout_fd = output.get() >= 0 ? output.get() : options.stdout_fd;
  const bool stderr_too = output.get() >= 0;

  int exec_pipe[2];  // the child writes errno here if exec fails; closed by a successful exec
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  Fd exec_read(exec_pipe[0]);
  Fd exec_write(exec_pipe[1]);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (options.new_process_group) setpgid(0, 0);
    if (stdout_fd >= 0) {
      dup2(stdout_fd, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy
      if (stderr_too) dup2(stdout_fd, STDERR_FILENO);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), child_env);
    const int e = errno;
    (void)!write(exec_pipe[1], &e, sizeof(e));
    _exit(127);
  }
  exec_write.Close();
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_read.get(), &exec_errno, sizeof(exec_errno));  // 0: exec succeeded
  } while (n < 0 && errno == EINTR);
  if (n == sizeof(exec_errno)) {
    waitpid(pid, nullptr, 0);
    return ErrnoError("exec " + options.argv[0], exec_errno);
  }
  return pid;
}

}  // namespace pstrain
