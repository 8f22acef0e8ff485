// `pstrain tune [training flags] [--budget_s S] [--batch_sizes 256,1024] [--out FILE]`: short timed
// runs of the real training step over towers x intra_op_threads x inter_op_threads (and batch
// sizes when asked), within a time budget; prints a table and writes the best setting as a config
// fragment for a later --config. The search, its budget and ranking, and the report are
// worker/tune/ (search.h, tuner.h, report.h); this file is the command line, the process's
// environment and the fragment's file.
//
// The global batch (what one step, and so one update, trains on) is kept fixed: --batch_sizes
// measures other per-tower sizes at the best threads; a different global batch is written to the
// fragment only with --allow_batch_change, and its known AUC cost is printed either way.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "common/env.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/tune/report.h"
#include "worker/tune/tuner.h"

namespace pstrain {
namespace {

struct TuneFlags {
  bool allow_batch_change = false;
  double budget_s = 60, window_s = 1.0;
  int windows = 3, warmup_steps = 3, cores = 0;
  std::string batch_sizes, out;
};

void AddTuneFlags(FlagSet* flags, TuneFlags* f) {
  flags->Double("budget_s", &f->budget_s,
                "stop trying candidates when this many seconds are spent");
  flags->String("batch_sizes", &f->batch_sizes,
                "also measure these per-tower batch sizes (e.g. 256,1024) at the best threads; "
                "a size that changes the global batch is written only with --allow_batch_change");
  flags->Bool("allow_batch_change", &f->allow_batch_change,
              "let the fragment change the global batch (towers x batch_size), which changes "
              "what the model learns; by default the towers change and the global batch stays");
  flags->Int("windows", &f->windows, "timed windows per candidate (the median is reported)");
  flags->Double("window_s", &f->window_s, "seconds per timed window (at least one step)");
  flags->Int("warmup_steps", &f->warmup_steps, "untimed steps per candidate before the windows");
  flags->Int("cores", &f->cores,
             "cores to tune for (0 = the CPUs this process may use: its affinity mask capped by "
             "the cgroup CPU quota)");
  flags->String("out", &f->out,
                "config fragment to write (default <model_dir or cwd>/tuned.textproto)");
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& list, const char* flag) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": expected a comma-separated list of positive integers, got '",
                       list, "'"));
    }
    out.push_back(v);
  }
  return out;
}

// The tuner's options from the flags and the launch environment (the cores, OMP_NUM_THREADS).
absl::StatusOr<TunerOptions> TunerOptionsFromFlags(const TuneFlags& f) {
  TunerOptions o;
  ASSIGN_OR_RETURN(o.batch_sizes, ParseInts(f.batch_sizes, "batch_sizes"));
  if (f.windows < 1 || f.window_s < 0 || f.warmup_steps < 0 || f.budget_s <= 0 || f.cores < 0) {
    return absl::InvalidArgumentError(
        "--windows must be >= 1, --budget_s > 0, --window_s, --warmup_steps and --cores >= 0");
  }
  o.cores = f.cores > 0 ? f.cores : Launch().cpus.cpus;
  o.omp_num_threads = Launch().omp_num_threads;
  o.allow_batch_change = f.allow_batch_change;
  o.budget_s = f.budget_s;
  o.timing.warmup_steps = f.warmup_steps;
  o.timing.windows = f.windows;
  o.timing.min_seconds = f.window_s;
  o.print = [](const std::string& line) {
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  };
  return o;
}

std::string EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "unset" : absl::StrCat("'", v, "'");
}

// The environment users know from TF, reported before the search.
void PrintEnvironment(int cores) {
  std::string env;
  for (const char* name : {"OMP_NUM_THREADS", "KMP_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES"}) {
    absl::StrAppend(&env, env.empty() ? "" : "  ", name, "=", EnvValue(name));
  }
  std::printf("pstrain tune: %d cores; %s; environment: %s\n", cores, Launch().Describe().c_str(),
              env.c_str());
}

// --out, or <model_dir or cwd>/tuned.textproto (the directory made).
absl::StatusOr<std::string> FragmentPath(const std::string& out, const Config& config) {
  if (!out.empty()) return out;
  std::string dir = config.train().has_model_dir() ? config.train().model_dir() : "";
  if (dir.empty()) {
    char cwd[4096];
    dir = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : ".";
  }
  RETURN_IF_ERROR(MakeDirs(dir));
  return dir + "/tuned.textproto";
}

// Writes the recommended setting's fragment; returns its path.
absl::StatusOr<std::string> WriteFragment(const TuneResult& result, const Config& config,
                                          const std::string& out_flag) {
  ASSIGN_OR_RETURN(const std::string out, FragmentPath(out_flag, config));
  const std::string text = TunedFragmentText(TunedFragment(result, config.train()), result, out,
                                             Env::Default()->Now());
  if (const size_t slash = out.rfind('/'); slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(MakeDirs(out.substr(0, slash)));
  }
  RETURN_IF_ERROR(WriteFileAtomic(out, text));
  return out;
}

// A failure before or after the measurements: 2 for a bad flag or config, else 1.
int TuneError(const absl::Status& s) {
  return CommandError("tune", s.message(), s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
}

}  // namespace

int RunTune(int argc, char** argv) {
  FlagSet flags("tune",
                "Times the training step over towers x intra_op_threads x inter_op_threads (and "
                "--batch_sizes) within --budget_s, prints a table and writes the best setting as a "
                "config fragment: pstrain train --config base.textproto --config tuned.textproto");
  TrainingFlags tf;
  tf.train_only = true;  // tune never evaluates: a config's eval channel needs no path here
  AddTrainingFlags(&flags, &tf);
  TuneFlags f;
  AddTuneFlags(&flags, &f);
  Config config;
  if (auto code = ParseTrainingCommand("tune", argc, argv, &flags, tf, &config)) return *code;
  absl::StatusOr<TunerOptions> options = TunerOptionsFromFlags(f);
  if (!options.ok()) return TuneError(options.status());
  PrintEnvironment(options->cores);
  absl::StatusOr<std::unique_ptr<Tuner>> tuner = Tuner::Create(config, *std::move(options));
  if (!tuner.ok()) return TuneError(tuner.status());
  absl::StatusOr<TuneResult> result = (*tuner)->Run();
  // A candidate's measurement failed ("<candidate>: <why>").
  if (!result.ok()) return CommandError("tune", result.status().message(), 1);
  std::fputs(FormatTuneReport(*result).c_str(), stdout);
  absl::StatusOr<std::string> written = WriteFragment(*result, config, f.out);
  if (!written.ok()) return TuneError(written.status());
  std::printf("wrote %s\n", written->c_str());
  return 0;
}

}  // namespace pstrain
