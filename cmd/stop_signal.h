// SIGTERM / SIGINT for the PS commands (`pstrain host`, `pstrain worker`). While `served` is set
// (the process's shard serves, or its worker trains), the first signal raises `stop`: the trainer
// then writes a checkpoint of the job and stops, and the process exits 0. Otherwise, and on a
// second signal, the process ends at once with the signal's default action.
#pragma once

#include <atomic>

namespace pstrain {

struct StopSignals {
  std::atomic<bool> stop{false};
  std::atomic<bool> served{false};
};

// The process's flags, with the handlers installed on first use.
StopSignals& InstallStopSignals();

}  // namespace pstrain
