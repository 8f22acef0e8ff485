// WorkerSupervisor: runs a host's worker as a child process and restarts it when it dies, as
// torchrun's agent does (`pstrain host --max_restarts N`, ASYNC; docs/PS.md "Recovery"). The
// host's shard stays up in the parent meanwhile, so the other workers train on; the new worker
// process restores this worker's state (data position, step) from the job's last committed
// checkpoint and rejoins: its calls renew the worker's lease on shard 0 before the lease of the
// dead one runs out.
//
// A child is restarted when it died (a signal) or exited with an error other than 2 (a bad flag
// or config), unless the host was asked to stop, the job is over (shard 0 says it finished or
// failed, or cannot be asked), or N restarts were used. Each restart is logged on stderr
// ("pstrain host: worker 1 failed (signal 9); restart 1 of 3: it resumes from /m/ckpt-40") and
// handed to the next child in kRestartLogEnv (one line per restart), which the worker reports
// with TRAINING_DONE so that the chief counts it in summary.json.
//
// A child runs in its own process group (a terminal's Ctrl-C reaches the host only, which
// forwards one SIGTERM through StopSignals::forward_to) and dies with the host
// (PR_SET_PDEATHSIG). Only one incarnation of the worker runs at a time: the next starts after
// the last was reaped.
//
// Thread-safety: Run() blocks the calling thread until the worker is done; one call at a time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cmd/stop_signal.h"
#include "worker/ps_client/shard_rpc.h"

namespace pstrain {

// The environment variable that carries the restarts so far to a supervised worker.
inline constexpr char kRestartLogEnv[] = "PSTRAIN_WORKER_RESTART_LOG";

class WorkerSupervisor {
 public:
  struct Options {
    std::vector<std::string> argv;  // the worker's command line, argv[0] the binary
    std::string command = "host";   // for messages: "pstrain <command>: worker <worker> ..."
    int worker = 0;
    int max_restarts = 0;
    std::string checkpoint_dir;        // the job's: a restart resumes from its LATEST
    std::atomic<bool>* stop = nullptr;  // the host's stop flag (no restart after a stop)
    std::atomic<int>* forward_to = nullptr;  // set to the running child's pid (StopSignals)
    // Asked before a restart whether the job is over (finished or failed); not restarted either
    // when it does not answer (the job is failing). Not owned.
    ShardRpc* shard_zero = nullptr;
  };
  struct Result {
    int status = -1;  // the last child's wait status (-1: it could not be started)
    std::vector<std::string> restart_log;
  };

  explicit WorkerSupervisor(Options options) : opt_(std::move(options)) {}
  Result Run();

 private:
  // Starts a child with `log` in its environment, in its own process group.
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& log) const;
  // Why a child that ended with `status` is not restarted, or "" to restart it.
  std::string NoRestart(int status, int restarts) const;

  const Options opt_;
};

// Supervises `pstrain worker <worker_args>` (this binary) as worker `worker` for `pstrain
// <command>`, with this process's stop signals forwarded to it; see WorkerSupervisor.
WorkerSupervisor::Result SuperviseWorker(const std::string& command, int worker,
                                         int max_restarts,
                                         const std::vector<std::string>& worker_args,
                                         const std::string& checkpoint_dir, StopSignals* signals,
                                         ShardRpc* shard_zero);
// Whether the last worker process of `result` exited 0.
bool Succeeded(const WorkerSupervisor::Result& result);

}  // namespace pstrain
