// SIGTERM / SIGINT, the stop signals, for every command: one mechanism. main() calls
// InstallStopSignals first thing, before any thread starts: it blocks the stop signals in the
// main thread, so that every thread made later (gRPC's, OpenMP's, MPI's, a pump's) inherits the
// mask and no stop signal is ever delivered to one of them, and starts one thread that takes them
// synchronously (sigwait) and acts on them. No handler runs; no thread polls. (Blocking them only
// later let a signal that arrived during set-up land on a thread made before, and kill the
// process: seen once in a full test run of `pstrain ps`.)
//
// Until a command sets `served`, a stop signal ends the process at once with the signal's default
// action, as if no one took it. Once `served` is set, the first one raises `stop`, records
// `signal`, forwards SIGTERM to `forward_to` (a supervised child), arms the grace timer
// (SetStopGrace) and wakes WaitForStop() and the `on_stop` hook: a trainer then writes a
// checkpoint of the job and stops, a server shuts down, and the process exits 0. A later one ends
// the process with its default action when `repeat_ends_process` (the user insists: no
// checkpoint), and is ignored otherwise (a server whose shutdown has its own bound).
//
// The grace timer: a stop signal always ends the process, whatever it is waiting for. With a
// grace set (SetStopGrace, `pstrain host` / `worker`), a process still running that long after
// the first served signal (blocked in a wait that needs a dead peer, a checkpoint round that
// cannot complete) says so on stderr and exits with code 124.
//
// Thread-safety: the fields are atomics, read and written from any thread; `on_stop` is set
// before `served` and not changed after.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace pstrain {

struct StopSignals {
  std::atomic<bool> stop{false};
  std::atomic<bool> served{false};
  std::atomic<bool> repeat_ends_process{true};
  std::atomic<int> signal{0};  // the first served stop signal (SIGTERM or SIGINT), 0 before
  // A supervised child (`pstrain host --max_restarts`: its worker process), > 0 while it runs:
  // the first stop signal is forwarded to it as SIGTERM.
  std::atomic<int> forward_to{0};
  // Runs on the signal thread with each served stop signal that does not end the process, after
  // the first has raised `stop` (a command that waits on something else wakes itself there).
  // May be empty.
  std::function<void(int sig)> on_stop;
  absl::Notification stopped;  // notified with `stop`

  // Blocks the calling thread until the first served stop signal; returns it.
  int WaitForStop() {
    stopped.WaitForNotification();
    return signal.load();
  }
};

// Blocks the stop signals in the calling thread and starts the thread that takes them, on the
// first call (main's, before any other thread); returns the process's StopSignals.
StopSignals& InstallStopSignals();

// The seconds between the first served stop signal and the forced exit (>= 1). Without a call,
// no grace timer is armed.
void SetStopGrace(int seconds);

// Exit code of a process that a stop signal's grace timer ended.
inline constexpr int kExitStopGraceExpired = 124;

// Ends the process with `code` `limit` from now, printing `message` on stderr, unless it ended
// before: a process that has decided to stop (its worker failed) then ends within a bound
// whatever its shutdown waits for. Each call arms its own deadline (a waiting thread).
void ExitWithin(absl::Duration limit, int code, std::string message);

// How long a PS process may take to end once its worker must stop (ExitWithin): a host whose
// worker stopped on a lost lease ends within it whatever its shard's shutdown still waits for
// (issue 25's bound: the lease plus 10 s; measured: about 1 s, HostileProcessTest).
inline constexpr absl::Duration kFailedExitLimit = absl::Seconds(10);
// ExitWithin(kFailedExitLimit, 1, ...) for `pstrain <command>` whose worker must stop: `why`.
void ExitSoonAfterFailure(const char* command, const absl::Status& why);

}  // namespace pstrain
