// `pstrain tune [training flags] [--budget_s S] [--batch_sizes 256,1024] [--out FILE]`: short timed
// runs of the real training step (TrainStep against in-process LocalParams) over towers x
// intra_op_threads x inter_op_threads (and batch sizes when asked), within a time budget; prints
// a table and writes the best setting as a config fragment for a later --config.
//
// Input: with training data configured, each candidate is fed by a live Pipeline over the train
// channels with inter_op_threads parser threads (repeating the data), so the parser threads
// compete for the cores exactly as in `pstrain train` and inter_op_threads is measured. Without
// data, batches come from datagen and are held in memory; inter_op_threads is then not
// exercised and stays at its default.
//
// The global batch (what one step, and so one update, trains on: train.global_batch_size, or
// towers x batch_size when that is 0) is kept fixed: a candidate with T towers splits it over
// them, so the towers change how fast the model trains but not what it learns. --batch_sizes
// measures other per-tower sizes at the best threads; a different global batch is written to the
// fragment only with --allow_batch_change, and its known AUC cost is printed either way.
//
// Search: compute threads (towers x intra_op) must fit the cores (OpenMP teams spin, so
// oversubscribing them only loses); parser threads block when the prefetch queue is full, so
// they may overlap the compute threads by a quarter of the cores (at least one). First every
// allowed setting whose values are powers of two (or the core count), fullest first; then the
// neighbours (+-1 in each dimension) of the best; then the batch sizes at the best threads. The
// budget stops the search before a candidate that would not fit in it; what was not tried is
// listed.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "common/config.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/tools/datagen.h"
#include "worker/train/step_timing.h"
#include "worker/train/train_step.h"

namespace pstrain {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Candidate {
  int towers, intra, inter;
  int step;  // examples a step (the global batch: one update)
  // Examples per tower: the largest share of the step.
  int batch() const { return std::max(1, (step + towers - 1) / std::max(1, towers)); }
  bool operator<(const Candidate& o) const {
    return std::tie(towers, intra, inter, step) < std::tie(o.towers, o.intra, o.inter, o.step);
  }
  std::string Name() const { return absl::StrFormat("%dx%dx%d@%d", towers, intra, inter, step); }
};

struct Measured {
  Candidate c;
  double examples_per_sec;
};

struct Space {
  int cores;
  int intra_cap;   // cores, or OMP_NUM_THREADS when set
  bool search_inter;
  int default_inter;
  bool Allowed(const Candidate& c) const {
    if (c.towers < 1 || c.intra < 1 || c.inter < 1 || c.intra > intra_cap) return false;
    const int compute = c.towers * c.intra;
    if (compute > cores) return false;
    if (!search_inter) return c.inter == default_inter;
    return c.inter <= std::min(cores, std::max(1, cores - compute + std::max(1, cores / 4)));
  }
};

// 1, 2, 4, ... up to n, and n itself.
std::vector<int> PowersOfTwo(int n) {
  std::vector<int> v;
  for (int p = 1; p <= n; p *= 2) v.push_back(p);
  if (v.back() != n) v.push_back(n);
  return v;
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

// One candidate's median examples/s over timed windows after a warm-up, on fresh parameters.
absl::StatusOr<double> Measure(const Candidate& c, const Config& base, const FeatureSpec& spec,
                               const Model& model, const SyntheticData* datagen,
                               const StepTimingOptions& timing) {
  Config config = base;
  config.mutable_threads()->set_towers(c.towers);
  config.mutable_threads()->set_intra_op_threads(c.intra);
  config.mutable_threads()->set_inter_op_threads(c.inter);
  config.mutable_train()->set_batch_size(c.batch());
  ASSIGN_OR_RETURN(auto params,
                   LocalParams::Create(model, spec.total_rows(), config, c.towers * c.intra));
  ASSIGN_OR_RETURN(auto step, TrainStep::Create(model, c.towers, c.batch(), c.intra));
  int64_t global_step = 0;
  absl::StatusOr<StepTiming> t;
  if (datagen != nullptr) {
    const std::vector<Batch> pool = DatagenBatches(*datagen, spec, 8, c.step);
    t = TimeTrainSteps(step.get(), params.get(), CycleBatches(&pool), timing, &global_step);
  } else {
    PipelineOptions po = OptionsFromConfig(config.data(), /*train=*/true, c.step,
                                           /*shard_index=*/0, /*num_shards=*/1, /*epochs=*/0);
    po.reader_threads = c.inter;
    ASSIGN_OR_RETURN(auto pipeline, Pipeline::Create(std::move(po), spec));
    Batch batch;
    auto next = [&]() -> absl::StatusOr<const Batch*> {
      int64_t epoch;
      ASSIGN_OR_RETURN(bool got, pipeline->Next(&batch, &epoch));
      if (!got || batch.size == 0) return absl::FailedPreconditionError("the training data is empty");
      return &batch;
    };
    t = TimeTrainSteps(step.get(), params.get(), next, timing, &global_step);
  }
  if (!t.ok()) return t.status();
  return t->examples_per_sec;
}

std::string EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "unset" : absl::StrCat("'", v, "'");
}

// The test-AUC cost of a larger global batch, measured with configs/deepfm_criteo.textproto on
// datagen data (2M rows, Bayes AUC 0.803; docs/PERFORMANCE.md "What the tuning found"), relative
// to global batch 512.
struct BatchCost {
  int global_batch;
  double auc_delta;
};
constexpr BatchCost kMeasuredBatchCost[] = {{512, 0.0}, {1024, -0.003}, {2048, -0.004},
                                            {8192, -0.013}};

// What the measurements say about training with global batch `to` instead of `from`.
std::string BatchCostNote(int from, int to) {
  auto nearest = [](int g) {
    const BatchCost* best = &kMeasuredBatchCost[0];
    for (const BatchCost& c : kMeasuredBatchCost) {
      if (std::abs(std::log2(static_cast<double>(c.global_batch) / g)) <
          std::abs(std::log2(static_cast<double>(best->global_batch) / g))) {
        best = &c;
      }
    }
    return *best;
  };
  const BatchCost a = nearest(from), b = nearest(to);
  std::string note = absl::StrFormat(
      "global batch %d instead of %d changes what the model learns, not only its speed", to, from);
  if (a.global_batch != b.global_batch) {
    absl::StrAppendFormat(&note,
                          "; measured with configs/deepfm_criteo.textproto on datagen data: "
                          "global batch %d had %+.3f test AUC against %d (docs/PERFORMANCE.md)",
                          b.global_batch, b.auc_delta - a.auc_delta, a.global_batch);
  }
  return note + "; check the AUC on your data before using it";
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
  bool allow_batch_change = false;
  double budget_s = 60, window_s = 1.0;
  int windows = 3, warmup_steps = 3, cores = 0;
  std::string batch_sizes_flag, out;
  flags.Double("budget_s", &budget_s, "stop trying candidates when this many seconds are spent");
  flags.String("batch_sizes", &batch_sizes_flag,
               "also measure these per-tower batch sizes (e.g. 256,1024) at the best threads; "
               "a size that changes the global batch is written only with --allow_batch_change");
  flags.Bool("allow_batch_change", &allow_batch_change,
             "let the fragment change the global batch (towers x batch_size), which changes what "
             "the model learns; by default the towers change and the global batch stays");
  flags.Int("windows", &windows, "timed windows per candidate (the median is reported)");
  flags.Double("window_s", &window_s, "seconds per timed window (at least one step)");
  flags.Int("warmup_steps", &warmup_steps, "untimed steps per candidate before the windows");
  flags.Int("cores", &cores,
            "cores to tune for (0 = the CPUs this process may use: its affinity mask capped by "
            "the cgroup CPU quota)");
  flags.String("out", &out, "config fragment to write (default <model_dir or cwd>/tuned.textproto)");
  Config config;
  if (auto code = ParseTrainingCommand("tune", argc, argv, &flags, tf, &config)) return *code;
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "pstrain tune: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  absl::StatusOr<std::vector<int>> batch_sizes = ParseInts(batch_sizes_flag, "batch_sizes");
  if (!batch_sizes.ok()) return fail(batch_sizes.status());
  if (windows < 1 || window_s < 0 || warmup_steps < 0 || budget_s <= 0 || cores < 0) {
    return fail(absl::InvalidArgumentError(
        "--windows must be >= 1, --budget_s > 0, --window_s, --warmup_steps and --cores >= 0"));
  }

  // The environment users know from TF: reported, and OMP_NUM_THREADS caps intra_op_threads
  // (each tower sets its OpenMP team to intra_op_threads, which would otherwise override it).
  if (cores == 0) cores = Launch().cpus.cpus;
  bool have_data = false;
  for (const Channel& c : config.data().train()) have_data |= c.path_size() > 0;
  Space space{cores, cores, have_data, 0};
  std::string env;
  for (const char* name : {"OMP_NUM_THREADS", "KMP_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES"}) {
    absl::StrAppend(&env, env.empty() ? "" : "  ", name, "=", EnvValue(name));
  }
  std::printf("pstrain tune: %d cores; %s; environment: %s\n", cores, Launch().Describe().c_str(),
              env.c_str());
  if (const int n = Launch().omp_num_threads; n > 0) {
    space.intra_cap = std::min(cores, n);
    std::printf("OMP_NUM_THREADS=%d caps intra_op_threads at %d\n", n, space.intra_cap);
  }
  Config defaults;
  ResolveThreadDefaults(cores, &defaults, Launch().omp_num_threads);
  space.default_inter = defaults.threads().inter_op_threads();

  auto spec = FeatureSpec::Create(config.features());
  if (!spec.ok()) return fail(spec.status());
  auto model = Model::Create(config.model(), spec->num_fields());
  if (!model.ok()) return fail(model.status());
  std::optional<SyntheticData> datagen;
  if (space.search_inter) {
    std::printf("input: the train channels through the pipeline (inter_op_threads parser threads), "
                "repeated as needed\n");
  } else {
    auto d = SyntheticData::Create(DatagenOptions{});
    if (!d.ok()) return fail(d.status());
    datagen.emplace(*std::move(d));
    std::printf("input: no training data given: datagen batches held in memory; inter_op_threads "
                "(parser threads) is not exercised and stays at the default %d\n",
                space.default_inter);
  }

  // The global batch of the config as given (its towers resolved for these cores) stays fixed.
  Config resolved = config;
  ResolveThreadDefaults(cores, &resolved, Launch().omp_num_threads);
  const bool global_set = config.train().global_batch_size() > 0;
  const int global_batch = static_cast<int>(StepBatch(resolved.train(), resolved.threads()));
  if (global_set) {
    std::printf("global batch %d (train.global_batch_size) is kept: a candidate with T towers "
                "splits it over them\n",
                global_batch);
  } else {
    std::printf("global batch %d (threads.towers %d x train.batch_size %d, resolved for %d cores) "
                "is kept: a candidate with T towers runs %d / T a tower. Set "
                "train.global_batch_size to state it once, whatever the cores\n",
                global_batch, resolved.threads().towers(), config.train().batch_size(), cores,
                global_batch);
  }
  std::vector<Candidate> coarse;
  int skipped = 0;
  const std::vector<int> inter_values =
      space.search_inter ? PowersOfTwo(cores) : std::vector<int>{space.default_inter};
  for (int t : PowersOfTwo(cores)) {
    for (int i : PowersOfTwo(cores)) {
      for (int j : inter_values) {
        const Candidate c{t, i, j, global_batch};
        if (space.Allowed(c)) {
          coarse.push_back(c);
        } else {
          ++skipped;
        }
      }
    }
  }
  // Fullest compute first, then more towers (they overlap each other's serial parts), then fewer
  // parser threads: the likely winners are measured before the budget runs out.
  std::sort(coarse.begin(), coarse.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(-a.towers * a.intra, -a.towers, a.inter) <
           std::make_tuple(-b.towers * b.intra, -b.towers, b.inter);
  });

  StepTimingOptions timing;
  timing.warmup_steps = warmup_steps;
  timing.windows = windows;
  timing.min_seconds = window_s;
  std::vector<Measured> results;
  std::set<Candidate> seen;
  std::vector<std::string> not_tried;
  const double start = Now();
  double spent_on_candidates = 0;
  auto best = [&]() {
    return *std::max_element(results.begin(), results.end(), [](const Measured& a, const Measured& b) {
      return a.examples_per_sec < b.examples_per_sec;
    });
  };
  // Measures the candidates not measured yet, in order, while the budget allows. Returns false
  // on an error (printed).
  auto run = [&](const std::vector<Candidate>& candidates) -> bool {
    for (const Candidate& c : candidates) {
      if (!seen.insert(c).second) continue;
      const double estimate = results.empty() ? 0 : spent_on_candidates / results.size();
      if (!results.empty() && Now() - start + estimate > budget_s) {
        not_tried.push_back(c.Name());
        continue;
      }
      const double t0 = Now();
      absl::StatusOr<double> eps = Measure(c, config, *spec, **model,
                                           datagen ? &*datagen : nullptr, timing);
      if (!eps.ok()) {
        std::fprintf(stderr, "pstrain tune: %s: %s\n", c.Name().c_str(),
                     std::string(eps.status().message()).c_str());
        return false;
      }
      spent_on_candidates += Now() - t0;
      results.push_back({c, *eps});
      std::printf("  towers=%d intra=%d inter=%d batch=%d: %.0f ex/s\n", c.towers, c.intra, c.inter,
                  c.batch(), *eps);
      std::fflush(stdout);
    }
    return true;
  };

  if (!run(coarse)) return 1;
  // Fine: the neighbours of the best coarse setting.
  {
    const Candidate b = best().c;
    std::vector<Candidate> fine;
    for (int dt : {-1, 0, 1}) {
      for (int di : {-1, 0, 1}) {
        for (int dj : {-1, 0, 1}) {
          const Candidate c{b.towers + dt, b.intra + di, b.inter + dj, global_batch};
          if (space.Allowed(c)) fine.push_back(c);
        }
      }
    }
    if (!run(fine)) return 1;
  }
  // The best setting at the fixed global batch, before any --batch_sizes candidate.
  const Measured best_fixed = best();
  if (!batch_sizes->empty()) {
    const Candidate b = best_fixed.c;
    std::vector<Candidate> by_batch;
    for (int size : *batch_sizes) {
      by_batch.push_back(Candidate{b.towers, b.intra, b.inter, std::min(kMaxBatch, b.towers * size)});
    }
    if (!run(by_batch)) return 1;
  }

  // The table, ratios within this run.
  const Measured fastest = best();
  const bool batch_changes = fastest.c.step != global_batch;
  const Measured top = batch_changes && !allow_batch_change ? best_fixed : fastest;
  std::sort(results.begin(), results.end(), [](const Measured& a, const Measured& b) {
    return a.examples_per_sec > b.examples_per_sec;
  });
  std::printf("\n| towers | intra_op | inter_op | batch/tower | global batch | ex/s | ex/s per core "
              "| vs best |\n|---|---|---|---|---|---|---|---|\n");
  for (const Measured& m : results) {
    const int used = std::min(cores, m.c.towers * m.c.intra);
    std::printf("| %d | %d | %d | %d | %d%s | %.0f | %.0f | %.2f |\n", m.c.towers, m.c.intra,
                m.c.inter, m.c.batch(), m.c.step,
                m.c.step != global_batch ? " (changed)" : "", m.examples_per_sec,
                m.examples_per_sec / used, m.examples_per_sec / fastest.examples_per_sec);
  }
  std::printf("\nbest: towers=%d intra_op_threads=%d inter_op_threads=%d batch_size=%d (global "
              "%d): %.0f ex/s\n",
              top.c.towers, top.c.intra, top.c.inter, top.c.batch(), top.c.step,
              top.examples_per_sec);
  // Why the search ended where it did, and what it did not run.
  if (not_tried.empty()) {
    std::printf("search complete: every allowed setting was measured (%zu in %.0f s of the %.0f s "
                "budget)\n",
                results.size(), Now() - start, budget_s);
  } else {
    std::printf("budget spent: %zu settings measured in %.0f s; not tried: %s (towers x intra x "
                "inter @ batch/tower)\n",
                results.size(), Now() - start, absl::StrJoin(not_tried, " ").c_str());
  }
  if (skipped > 0) {
    std::printf("%d combinations of the powers-of-two grid were not allowed: towers x intra_op "
                "above the %d cores (OpenMP teams would oversubscribe them)%s%s\n",
                skipped, cores,
                space.search_inter ? ", or parser threads beyond the cores the compute leaves "
                                     "plus a quarter of the cores"
                                   : "",
                space.intra_cap < cores ? ", or intra_op above OMP_NUM_THREADS" : "");
  }
  if (batch_changes) {
    const int g = fastest.c.step;
    std::printf("%s: batch_size=%d (global %d) at %.0f ex/s, %.2fx the best at global %d. %s.\n",
                allow_batch_change ? "chosen (--allow_batch_change)" : "not chosen",
                fastest.c.batch(), g, fastest.examples_per_sec,
                fastest.examples_per_sec / best_fixed.examples_per_sec, global_batch,
                BatchCostNote(global_batch, g).c_str());
  }

  Config fragment;
  fragment.mutable_threads()->set_towers(top.c.towers);
  fragment.mutable_threads()->set_intra_op_threads(top.c.intra);
  fragment.mutable_threads()->set_inter_op_threads(top.c.inter);
  // With train.global_batch_size the towers split it: only a changed global batch
  // (--allow_batch_change) is written. Without, the towers changed the per-tower batch that keeps
  // the global batch (or --allow_batch_change chose another one): write it whenever it differs
  // from the config's.
  if (global_set) {
    if (top.c.step != global_batch) fragment.mutable_train()->set_global_batch_size(top.c.step);
  } else if (top.c.batch() != config.train().batch_size()) {
    fragment.mutable_train()->set_batch_size(top.c.batch());
  }
  if (out.empty()) {
    std::string dir = config.train().has_model_dir() ? config.train().model_dir() : "";
    if (dir.empty()) {
      char cwd[4096];
      dir = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : ".";
    }
    if (absl::Status s = MakeDirs(dir); !s.ok()) return fail(s);
    out = dir + "/tuned.textproto";
  }
  const std::string text = absl::StrCat(
      "# pstrain tune, ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()),
      ": best of ", results.size(), " measured settings on ", cores, " cores, ",
      absl::StrFormat("%.0f", top.examples_per_sec), " ex/s.\n# Use: pstrain train --config "
      "<base config> --config ", out, "\n", ConfigToText(fragment));
  if (const size_t slash = out.rfind('/'); slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(out.substr(0, slash)); !s.ok()) return fail(s);
  }
  if (absl::Status s = WriteFileAtomic(out, text); !s.ok()) return fail(s);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace pstrain
