// `pstrain train`: single-process training with towers.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/stop_signal.h"
#include "common/flags.h"
#include "worker/train/trainer.h"

namespace pstrain {

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
    return CommandError("train", "no training data: pass --train PATH or set data.train", 2);
  }
  // The first stop signal checkpoints and stops; a second one (the user insists) ends the
  // process without the checkpoint.
  StopSignals& signals = InstallStopSignals();
  signals.served = true;
  TrainerOptions opts;
  opts.tty = isatty(STDERR_FILENO);
  opts.stop = &signals.stop;
  if (cores < 0) {
    return CommandError("train",
                        absl::StrCat("--cores: expected >= 0 (0 = the CPUs this process may use), "
                                     "got ", cores),
                        2);
  }
  opts.cores = cores > 0 ? cores : Launch().cpus.cpus;
  opts.omp_num_threads = Launch().omp_num_threads;
  auto summary = RunTraining(config, opts);
  if (!summary.ok()) return CommandError("train", summary.status().ToString(), 1);
  return 0;
}

}  // namespace pstrain
