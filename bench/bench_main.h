// The main of the Google Benchmark binaries: runs with OMP_WAIT_POLICY=PASSIVE and selects the
// ISA path as pstrain does (PSTRAIN_ISA, else the best this CPU has), and records the path, with the CPU and its budget, in the benchmark's
// context (printed in the header and written into --benchmark_out JSON).
#pragma once

#include <cstdio>

#include "benchmark/benchmark.h"
#include "cmd/launcher.h"
#include "common/cpu.h"

#define PSTRAIN_BENCHMARK_MAIN()                                                          \
  int main(int argc, char** argv) {                                                       \
    pstrain::ReexecWithPassiveOmpWaitPolicy(argv);                                        \
    absl::StatusOr<pstrain::LaunchEnvironment> env = pstrain::InitLaunchEnvironment();    \
    if (!env.ok()) {                                                                      \
      std::fprintf(stderr, "%s\n", std::string(env.status().message()).c_str());          \
      return 2;                                                                           \
    }                                                                                     \
    benchmark::AddCustomContext("pstrain_isa", pstrain::IsaName(env->isa));               \
    benchmark::AddCustomContext("pstrain_environment", env->Describe());                  \
    benchmark::AddCustomContext("cpu_model", env->cpu_model);                             \
    benchmark::Initialize(&argc, argv);                                                   \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;                     \
    benchmark::RunSpecifiedBenchmarks();                                                  \
    benchmark::Shutdown();                                                                \
    return 0;                                                                             \
  }
