#include "cmd/worker_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"

extern char** environ;

namespace pstrain {
namespace {

std::string DescribeStatus(int status) {
  return WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                           : absl::StrCat("signal ", WTERMSIG(status));
}

}  // namespace

int WorkerSupervisor::Spawn(const std::vector<std::string>& log, std::string* error) const {
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  const std::string prefix = absl::StrCat(kRestartLogEnv, "=");
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) env_strings.push_back(*e);
  }
  if (!log.empty()) env_strings.push_back(prefix + absl::StrJoin(log, "\n"));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = opt_.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    *error = absl::StrCat("fork: ", std::strerror(errno));
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    setpgid(0, 0);
    // The host's handlers do not survive exec, but its blocked signals would.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

std::string WorkerSupervisor::NoRestart(int status, int restarts) const {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "done";
  if (opt_.stop != nullptr && opt_.stop->load()) return "the host was asked to stop";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) return "a bad flag or config";
  if (restarts >= opt_.max_restarts) {
    return absl::StrCat("no restart left (--max_restarts ", opt_.max_restarts, ")");
  }
  if (opt_.shard_zero != nullptr) {
    absl::StatusOr<InfoResponse> info = opt_.shard_zero->Info(absl::Seconds(10));
    if (!info.ok()) return absl::StrCat("shard 0 does not answer: ", info.status().message());
    if (info->job_finished() || !info->job_error().empty()) {
      return "the job is over (finished or failed)";
    }
  }
  return "";
}

WorkerSupervisor::Result WorkerSupervisor::Run() {
  Result result;
  const int w = opt_.worker;
  const char* cmd = opt_.command.c_str();
  while (true) {
    std::string error;
    const int pid = Spawn(result.restart_log, &error);
    if (pid < 0) {
      std::fprintf(stderr, "pstrain %s: cannot start worker %d: %s\n", cmd, w, error.c_str());
      return result;
    }
    if (opt_.forward_to != nullptr) *opt_.forward_to = pid;
    // A stop that came before forward_to was set is forwarded here.
    if (opt_.stop != nullptr && opt_.stop->load()) kill(pid, SIGTERM);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (opt_.forward_to != nullptr) *opt_.forward_to = 0;
    result.status = status;
    const std::string why = NoRestart(status, static_cast<int>(result.restart_log.size()));
    if (!why.empty()) {
      if (why != "done") {
        std::fprintf(stderr, "pstrain %s: worker %d failed (%s); not restarted: %s\n", cmd, w,
                     DescribeStatus(status).c_str(), why.c_str());
      }
      return result;
    }
    const int k = static_cast<int>(result.restart_log.size()) + 1;
    const std::string entry = absl::StrCat(
        opt_.command == "host" ? absl::StrCat("host ", w, ": ") : "", "worker ", w, " failed (",
        DescribeStatus(status), "); restart ", k, " of ",
        opt_.max_restarts, ": it resumes from ",
        LatestPathOr(opt_.checkpoint_dir, "the beginning"));
    std::fprintf(stderr, "pstrain %s: %s\n", cmd, entry.c_str());
    std::fflush(stderr);
    result.restart_log.push_back(entry);
  }
}

WorkerSupervisor::Result SuperviseWorker(const std::string& command, int worker,
                                         int max_restarts,
                                         const std::vector<std::string>& worker_args,
                                         const std::string& checkpoint_dir, StopSignals* signals,
                                         ShardRpc* shard_zero) {
  WorkerSupervisor::Options so;
  so.argv = {"/proc/self/exe", "worker"};
  so.argv.insert(so.argv.end(), worker_args.begin(), worker_args.end());
  so.command = command;
  so.worker = worker;
  so.max_restarts = max_restarts;
  so.checkpoint_dir = checkpoint_dir;
  so.stop = &signals->stop;
  so.forward_to = &signals->forward_to;
  so.shard_zero = shard_zero;
  return WorkerSupervisor(std::move(so)).Run();
}

bool Succeeded(const WorkerSupervisor::Result& result) {
  return result.status >= 0 && WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0;
}

}  // namespace pstrain
