// `pstrain train`: single-process training with towers.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "common/flags.h"
#include "worker/train/trainer.h"

namespace pstrain {
namespace {

std::atomic<bool> g_stop{false};

void OnStopSignal(int sig) {
  if (g_stop.exchange(true)) {
    // A second signal: the user insists. Leave without the checkpoint.
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

int RunTrain(int argc, char** argv) {
  FlagSet flags("train",
                "Trains a model in one process with T towers, evaluates it on the eval channel and "
                "writes <model_dir>/summary.json.\nSIGTERM or Ctrl-C writes a checkpoint and exits "
                "0; the next run with the same --model_dir resumes exactly where it stopped.");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  int cores = 0;
  flags.Int("cores", &cores,
            "cores the automatic thread settings divide (0 = the CPUs this process may use: its "
            "affinity mask capped by the cgroup CPU quota); another machine's count reproduces "
            "its defaults, and so its arithmetic, here");
  Config config;
  if (auto code = ParseTrainingCommand("train", argc, argv, &flags, tf, &config)) return *code;
  if (config.data().train_size() == 0) {
    std::fprintf(stderr, "pstrain train: no training data: pass --train PATH or set data.train\n");
    return 2;
  }
  signal(SIGTERM, OnStopSignal);
  signal(SIGINT, OnStopSignal);
  TrainerOptions opts;
  opts.tty = isatty(STDERR_FILENO);
  opts.stop = &g_stop;
  if (cores < 0) {
    std::fprintf(stderr, "pstrain train: --cores: expected >= 0 (0 = the CPUs this process may "
                         "use), got %d\n", cores);
    return 2;
  }
  opts.cores = cores > 0 ? cores : Launch().cpus.cpus;
  opts.omp_num_threads = Launch().omp_num_threads;
  auto summary = RunTraining(config, opts);
  if (!summary.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pstrain
