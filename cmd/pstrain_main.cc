// pstrain: one binary, one subcommand per role. See `pstrain --help`.

#include <cstdio>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/sagemaker.h"
#include "cmd/stop_signal.h"
#include "common/env.h"
#include "common/malloc_tuning.h"
#include "pstrain_version.h"  // generated: cmake/version.cmake

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"train", pstrain::RunTrain, "single-process training with towers (reads the config's channels)"},
    {"datagen", pstrain::RunDatagen, "write Criteo-shaped synthetic data from a planted teacher model"},
    {"convert", pstrain::RunConvert, "convert data between formats, split into files and shuffled"},
    {"ps", pstrain::RunPs, "serve one parameter-server shard (gRPC) until SIGTERM"},
    {"host", pstrain::RunHost, "one host of an async PS job: PS shard i and worker i"},
    {"worker", pstrain::RunWorker, "one worker of a PS job whose shards run elsewhere (`ps`)"},
    {"local", pstrain::RunLocal, "async PS training on N local hosts (runs N `pstrain host`)"},
    {"allreduce", pstrain::RunAllreduce, "synchronous MPI data-parallel training (mpirun -np N)"},
    {"tune", pstrain::RunTune, "time towers x intra_op x inter_op (x batch) settings, write the best"},
    {"config", pstrain::RunConfig, "print the effective config of the training flags given"},
    {"predict", pstrain::RunPredict, "score files with a trained checkpoint (no config needed)"},
    {"export", pstrain::RunExport, "write a serving export of a checkpoint (docs/SERVING.md)"},
    {"serve", pstrain::RunServe, "serve an export over gRPC (Predict, health, hot reload)"},
};

void PrintVersion() {
  std::printf("pstrain %s (%s build for %s; runs on %s)\n", PSTRAIN_VERSION, PSTRAIN_BUILD_TYPE,
              PSTRAIN_BUILD_ISA, pstrain::Launch().Describe().c_str());
}

void PrintUsage() {
  std::printf("usage: pstrain <command> [flags]   (pstrain <command> --help for its flags; "
              "pstrain --version)\n\ncommands:\n");
  for (const auto& c : kCommands) std::printf("  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  // OMP_WAIT_POLICY=PASSIVE unless the user chose a policy (cmd/launcher.h says why).
  pstrain::ReexecWithPassiveOmpWaitPolicy(argv);
  // SIGTERM / SIGINT blocked before any thread starts, and taken by one thread (cmd/stop_signal.h).
  pstrain::InstallStopSignals();
  // Debian's abseil is built with mutex deadlock detection on, which makes every absl::Mutex
  // operation several times slower (measured ~100 ns per lock/unlock pair); pstrain's lock order
  // is fixed by design, so the detector is switched off in the binary.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  pstrain::KeepLargeBuffersInTheHeap();
  // The ISA path (PSTRAIN_ISA, else the best this CPU has), before any oneDNN primitive exists.
  if (absl::StatusOr<pstrain::LaunchEnvironment> env = pstrain::InitLaunchEnvironment(); !env.ok()) {
    std::fprintf(stderr, "pstrain: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    PrintVersion();
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // In a SageMaker container a failure's reason goes to /opt/ml/output/failure.
    auto failure = pstrain::FailureCapture::Start(pstrain::SageMakerFailureFile());
    const int code = c.run(argc, argv);
    // Background work ends before the process does: old checkpoints that retention renamed are
    // deleted (checkpoint/layout.h RemoveOldCheckpoints).
    pstrain::Env::Default()->WaitForScheduled();
    if (failure) failure->Finish(code);
    return code;
  }
  std::fprintf(stderr, "pstrain: unknown command '%s'\n\n", argv[1]);
  PrintUsage();
  return 2;
}
