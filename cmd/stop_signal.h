// SIGTERM / SIGINT for the PS commands (`pstrain host`, `pstrain worker`). While `served` is set
// (the process's shard serves, or its worker trains), the first signal raises `stop`: the trainer
// then writes a checkpoint of the job and stops, and the process exits 0. Otherwise, and on a
// second signal, the process ends at once with the signal's default action.
//
// A stop signal always ends the process, whatever it is waiting for: the first one also arms a
// grace timer (SetStopGrace, default 300 s), and a process still running when it fires (blocked
// in a wait that needs a dead peer, a checkpoint round that cannot complete) says so on stderr
// and exits with code 124.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pstrain {

struct StopSignals {
  std::atomic<bool> stop{false};
  std::atomic<bool> served{false};
  // A supervised child (`pstrain host --max_restarts`: its worker process), > 0 while it runs:
  // the first stop signal is forwarded to it as SIGTERM.
  std::atomic<int> forward_to{0};
};

// The process's flags, with the handlers installed on first use.
StopSignals& InstallStopSignals();

// The seconds between the first stop signal and the forced exit (>= 1).
void SetStopGrace(int seconds);

// Exit code of a process that a stop signal's grace timer ended.
inline constexpr int kExitStopGraceExpired = 124;

// Ends the process with `code` `limit` from now, printing `message` on stderr, unless it ended
// before: a process that has decided to stop (its worker failed) then ends within a bound
// whatever its shutdown waits for. Each call arms its own deadline (a waiting thread).
void ExitWithin(absl::Duration limit, int code, std::string message);

// How long a PS process may take to end once its worker must stop (ExitWithin).
inline constexpr absl::Duration kFailedExitLimit = absl::Seconds(20);
// ExitWithin(kFailedExitLimit, 1, ...) for `pstrain <command>` whose worker must stop: `why`.
void ExitSoonAfterFailure(const char* command, const absl::Status& why);

}  // namespace pstrain
