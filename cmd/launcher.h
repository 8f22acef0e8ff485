// What a launcher (pstrain's main, the test main, the bench apps) reads from the process's
// environment before anything else runs. The library never reads the environment: it is given
// these values (TrainerOptions, ResolveThreadDefaults) or reads the process state they set (the
// ISA path, common/cpu.h).
//
// Thread-safety: InitLaunchEnvironment is called once, first thing in main, before other threads
// start; Launch() may then be read from any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/cpu.h"

namespace pstrain {

struct LaunchEnvironment {
  Isa isa = Isa::kAvx2;    // the ISA path taken by pstrain's kernels and oneDNN
  std::string isa_reason;  // "the best this CPU has", "PSTRAIN_ISA=avx2"
  std::string cpu_model;
  CpuBudget cpus;           // affinity mask and cgroup quota
  int omp_num_threads = 0;  // OMP_NUM_THREADS (its first level), 0 when unset: caps intra_op
  std::string Describe() const;  // "isa avx2 (PSTRAIN_ISA=avx2; oneDNN avx2), 2 CPUs (affinity 2)"
};

// libgomp reads OMP_WAIT_POLICY once, when it loads (before main). Its default lets the workers of
// an OpenMP team spin for milliseconds after each parallel region; the in-process stores' pull and
// push run such regions on the trainer thread, and on few cores the spinning workers then take the
// towers' cores (2 towers on 2 cores: 0.51-0.56 of the GEMM roof spinning, 0.91 passive;
// docs/PERFORMANCE.md). So every launcher (pstrain, the bench apps) runs itself again, once, with
// PASSIVE unless the user chose a policy. Returns only if that exec failed (the process then goes
// on with the default policy).
void ReexecWithPassiveOmpWaitPolicy(char** argv);

// Reads PSTRAIN_ISA (or else ONEDNN_MAX_CPU_ISA), OMP_NUM_THREADS and the CPU budget, and selects
// the process's ISA path (worker/model/isa.h). An error names the variable and what it expects.
absl::StatusOr<LaunchEnvironment> InitLaunchEnvironment();

// What InitLaunchEnvironment found; before it (or if it failed), the defaults of this CPU.
const LaunchEnvironment& Launch();

}  // namespace pstrain
