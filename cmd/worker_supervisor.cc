#include "cmd/worker_supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/spawn.h"

extern char** environ;

namespace pstrain {
namespace {

std::string DescribeStatus(int status) {
  return WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                           : absl::StrCat("signal ", WTERMSIG(status));
}

}  // namespace

absl::StatusOr<pid_t> WorkerSupervisor::Spawn(const std::vector<std::string>& log) const {
  // The worker reads its restart log from the environment (kRestartLogEnv).
  SpawnOptions so;
  so.argv = opt_.argv;
  so.env.emplace();
  const std::string prefix = absl::StrCat(kRestartLogEnv, "=");
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) so.env->push_back(*e);
  }
  if (!log.empty()) so.env->push_back(prefix + absl::StrJoin(log, "\n"));
  so.new_process_group = true;
  return pstrain::Spawn(so);
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
    const absl::StatusOr<pid_t> spawned = Spawn(result.restart_log);
    if (!spawned.ok()) {
      std::fprintf(stderr, "pstrain %s: cannot start worker %d: %s\n", cmd, w,
                   std::string(spawned.status().message()).c_str());
      return result;
    }
    const pid_t pid = *spawned;
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
