// Starting a child process that cannot outlive its parent: the one fork + exec of pstrain's
// launchers (`pstrain local`'s hosts, the worker supervisor's worker) and of the test harness.
//
// The child gets PR_SET_PDEATHSIG(SIGKILL) before exec, so it dies with the thread that spawned it
// (the death signal follows the forking thread, not the process: spawn from a thread that lives as
// long as the child). A parent that died between fork and prctl is detected and the child exits.
// Between fork and exec the child makes only async-signal-safe calls; everything it needs (argv,
// the environment, the output file) is prepared before the fork, so a bad path or an exec that
// fails is an error of Spawn, not an exit code of the child.
//
// Thread-safety: Spawn may be called from any thread; the caller owns the returned pid (reaps it).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the path executed (no PATH search); not empty
  // The child's environment; nullopt: this process's.
  std::optional<std::vector<std::string>> env;
  // When set, the child's stdout and stderr go to this file, created afresh with mode 0644
  // (common/file.h CreateFreshFile: what the name held is replaced, never written through).
  std::string output_file;
  // When >= 0 (and output_file is empty), the child's stdout is this descriptor (dup2'd; the
  // caller keeps and closes its own copy). Otherwise stdout and stderr are inherited.
  int stdout_fd = -1;
  bool new_process_group = false;  // setpgid(0, 0): a signal to the parent's group skips it
};

// Starts the child and returns its pid once exec has succeeded. The child starts with no signal
// blocked (exec keeps a blocked mask; handlers are reset by exec anyway). Errors name the step
// (create of output_file, pipe, fork, exec of argv[0]) and the errno text.
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

}  // namespace pstrain
