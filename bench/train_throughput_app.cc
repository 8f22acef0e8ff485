// Training throughput of one worker's step (dedup, pull, T towers forward+backward, gradient sum,
// push with Adagrad rows / Adam dense) on DeepFM k=16, MLP 400-400-400, 39 fields, 1024 examples
// per tower, from batches held in memory (the input pipeline is not measured), across towers x
// intra_op_threads, in f32 and bf16. In the same run: oneDNN's GEMM peak (f32, bf16) on the MLP's
// shapes, and each setting's achieved model FLOP/s as a fraction of that peak; and the roof of the
// setting's own GEMMs (M = the per-tower batch; T towers of one thread: T single-threaded GEMMs at
// once), which separates small-M efficiency and core contention from the rest of the step; and
// the roof of the model's own GEMMs (bench/model_gemms.h: every GEMM of its forward,
// backward-data and backward-weights at the tower's batch, each shape measured the same way), so
// that DCN-v2's cross layers and DLRM's bottom and top MLPs are set against their own shapes.
// --model deepfm|dcn_v2|dlrm is --config configs/<model>_criteo.textproto; --model din is
// configs/din.textproto.
// The batches are built from the config's FeatureSpec (SpecBatches): the fields the datagen
// has (the CRITEO preset's, by name) from its distribution, every other field drawn here: a list
// field gets a length uniform in [1, max_length] and ids drawn from the keys its row-sharing or
// attention-target field has in the same chunk (DIN's history: items of the candidate field), so
// that DIN's attention and the list kernels run on the config's own lists. Target attention's
// FLOPs are per list entry and per example: the app adds the batches' attended entries per
// example times AttentionFlopsPerEntry, plus AttentionFlopsPerExample, to the model's count, and
// its roof counts the attention MLP's GEMMs over the attended entries of a tower's batch, in
// the model's chunks of 1,024 rows (and the first layer's target term at M = the batch:
// bench/model_gemms.h).
// --paired_windows N adds N windows each followed at once by the model's own roof, and reports
// the median of the N per-window fractions: on a shared machine the roof measured once after all
// the windows moved 57-350 GFLOP/s between runs of the same binary, so that one run's fraction
// said as much about the load when its roof ran as about the step.
//
// --mode picks how the step is driven (worker/train/train_step.h):
//   sync      Run per step: stage, train, flush (no overlap);
//   pipelined the trainer's loop: batch t+1 is staged (dedup) while batch t computes; pulls
//             follow the previous push, so the parameters equal sync's (pstrain train);
//   pushed    pipelined, but through Pull and Push (the towers' gradients summed, then applied
//             by the stores' OpenMP teams) as remote parameters are, instead of the in-process
//             step in which the tower threads pull, sum and apply their shares (TrainStep);
//   stale     train.async_local_updates: batch t+1's pull starts while batch t computes and
//             each push is applied on a background thread while the next step computes
//             (asynchronous SGD with one step of staleness, in one process).
//
// usage: train_throughput_app [--out results.json] [--steps 20] [--windows 5]
//                             [--settings 1x1,1x2,2x1] [--precisions f32,bf16]
//                             [--mode pipelined] [--model dcn_v2 | --config C]
//                             [--paired_windows 5]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/app_util.h"
#include "bench/gemm_peak.h"
#include "bench/model_gemms.h"
#include "cmd/launcher.h"
#include "common/config.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/json_writer.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/isa.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/tools/datagen.h"
#include "worker/train/step_timing.h"
#include "worker/train/train_step.h"

namespace pstrain {
namespace {

struct Result {
  int towers, intra;
  std::string precision;
  double ex_per_sec, model_gflops, peak_gflops, tower_roof_gflops;
  // The roof of the model's own GEMMs at this setting (0: the model has none).
  double own_roof_gflops;
  // --paired_windows: each window's model GFLOP/s over the own roof measured right after it
  // (empty without the flag).
  std::vector<double> paired_fractions;
  StepProfile profile_fraction;
  double unique_rows_per_step;
};

// The step's model FLOP/s over the roof of the model's own GEMMs; 0 when it has none.
double OwnFraction(const Result& r) {
  return r.own_roof_gflops > 0 ? r.model_gflops / r.own_roof_gflops : 0.0;
}

// The median of v (the upper one of an even count); 0 when empty.
double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// `count` batches of `rows` examples each, encoded by `spec`: fields named as the datagen's
// (SyntheticData::FieldName) take its values; the others are drawn here (see the top of the
// file). *attended_entries gets the mean, over the batches' examples, of the entries of the
// fields pooled by target attention.
std::vector<Batch> SpecBatches(const SyntheticData& data, const FeatureSpec& spec, int count,
                               int rows, double* attended_entries) {
  const int F = spec.num_fields();
  std::vector<int> source(F, -1);  // the datagen field of each spec field, or -1
  for (int f = 0; f < F; ++f) {
    for (int d = 0; d < SyntheticData::kNumFields; ++d) {
      if (SyntheticData::FieldName(d) == spec.field(f).name && !spec.field(f).list) source[f] = d;
    }
  }
  const int drawn = static_cast<int>(std::count(source.begin(), source.end(), -1));
  if (drawn > 0) {
    std::string names;
    for (int f = 0; f < F; ++f) {
      if (source[f] < 0) absl::StrAppend(&names, names.empty() ? "" : ", ", spec.field(f).name);
    }
    std::printf("%d of the %d fields drawn by the app, not the datagen: %s\n", drawn, F,
                names.c_str());
  }
  std::vector<Batch> batches(count);
  RawRows raw, out;
  std::vector<float> probs;
  std::mt19937_64 rng(7);
  int64_t chunk = 0, attended = 0, examples = 0;
  for (Batch& b : batches) {
    b.Clear(F);
    while (b.size < rows) {
      const int n = std::min(4096, rows - b.size);
      data.GenerateChunk(chunk++, n, &raw, &probs);
      out.Clear(F);
      for (int r = 0; r < n; ++r) {
        out.AddRow(raw.labels[r]);
        for (int f = 0; f < F; ++f) {
          const FeatureSpec::Field& field = spec.field(f);
          if (source[f] >= 0) {
            const size_t cell = raw.Cell(r, source[f]);
            if (raw.present[cell]) {
              const size_t o = out.Cell(r, f);
              out.present[o] = 1;
              out.key[o] = raw.key[cell];
              out.value[o] = raw.value[cell];
            }
            continue;
          }
          // The field whose keys a list's ids are drawn from: the one whose rows it shares, else
          // its attention target, when the datagen has it.
          const int from =
              field.shares_rows_of >= 0 ? field.shares_rows_of : field.attention_target;
          if (!field.list) {
            if (field.kind == NUMERIC) {
              out.SetCategorical(r, f, 0, std::uniform_real_distribution<double>(0, 100)(rng));
            } else {
              out.SetCategorical(r, f, rng() % 1000000);
            }
            continue;
          }
          const int length =
              std::uniform_int_distribution<int>(1, std::max(1, field.max_length))(rng);
          out.StartList(r, f);
          for (int i = 0; i < length; ++i) {
            const int other = std::uniform_int_distribution<int>(0, n - 1)(rng);
            uint64_t key = rng() % 1000000;
            if (from >= 0 && source[from] >= 0) {
              const size_t cell = raw.Cell(other, source[from]);
              if (raw.present[cell]) key = raw.key[cell];
            }
            out.AddToList(r, f, key);
          }
          if (field.attention_target >= 0) attended += length;
        }
      }
      examples += n;
      spec.Encode(out, &b);
    }
  }
  *attended_entries = examples > 0 ? static_cast<double>(attended) / examples : 0.0;
  return batches;
}

int Main(int argc, char** argv) {
  std::string out, settings = "1x1,1x2,2x1", precisions = "f32,bf16", mode = "pipelined";
  std::string config_path = "configs/deepfm_criteo.textproto", model_name;
  int steps = 20, windows = 5, batch = 1024, pool = 16, params_threads = 0;
  FlagSet flags("train_throughput_app", "Training-step throughput across towers x intra_op_threads.");
  flags.String("out", &out, "write the results as JSON here");
  flags.Int("steps", &steps, "steps per timed window");
  flags.Int("windows", &windows, "timed windows per setting (the median is reported)");
  flags.Int("batch", &batch, "examples per tower");
  flags.Int("pool", &pool, "distinct in-memory batches cycled through");
  flags.String("settings", &settings, "towers x intra_op_threads settings, e.g. 1x1,1x2,2x1");
  flags.String("precisions", &precisions, "f32, bf16 or both");
  flags.Int("params_threads", &params_threads,
            "threads of the in-process stores' pull/push (0 = towers x intra, 1 with --mode stale)");
  flags.String("mode", &mode, "sync, pipelined, pushed or stale (see the top of the source)");
  flags.String("config", &config_path,
               "the config whose model and optimizers are measured (e.g. "
               "configs/dcn_v2_criteo.textproto); fields the datagen lacks (lists included) "
               "are drawn from their FeatureSpec");
  int paired_windows = 0;
  flags.Int("paired_windows", &paired_windows,
            "after the usual measurement, this many more windows, each followed at once by the "
            "model's own GEMM roof: the median of the per-window fractions (on a shared "
            "machine, load that comes and goes between the steps and a roof measured later "
            "moves a pair together, not one side of the fraction)");
  flags.String("model", &model_name,
               "deepfm, dcn_v2 or dlrm: --config configs/<model>_criteo.textproto; din: "
               "configs/din.textproto");
  if (std::optional<int> code = ParseAppFlags(flags, argc, argv)) return *code;
  if (!model_name.empty()) {
    if (model_name != "deepfm" && model_name != "dcn_v2" && model_name != "dlrm" &&
        model_name != "din") {
      std::fprintf(stderr, "--model must be deepfm, dcn_v2, dlrm or din, got '%s'\n",
                   model_name.c_str());
      return 2;
    }
    config_path = model_name == "din" ? "configs/din.textproto"
                                      : absl::StrCat("configs/", model_name, "_criteo.textproto");
  }
  if (mode != "sync" && mode != "pipelined" && mode != "pushed" && mode != "stale") {
    std::fprintf(stderr, "--mode must be sync, pipelined, pushed or stale, got '%s'\n",
                 mode.c_str());
    return 2;
  }
  auto env = InitLaunchEnvironment();
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  const int cores = env->cpus.cpus;
  std::printf("%s; %s\n", env->cpu_model.c_str(), env->Describe().c_str());

  // The shipped DeepFM config by default: Adagrad rows, Adam dense, 1M-row categorical fields.
  auto base = LoadConfigFile(config_path);
  if (!base.ok()) {
    std::fprintf(stderr, "run from the source root: %s\n", base.status().ToString().c_str());
    return 1;
  }
  auto spec = FeatureSpec::Create(base->features());
  auto data = SyntheticData::Create(DatagenOptions{});
  if (!spec.ok() || !data.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(),
                 (spec.ok() ? data.status() : spec.status()).ToString().c_str());
    return 1;
  }

  // Peaks first, on an idle process.
  // bf16 only where the path has it (worker/model/isa.h); said, not silently dropped.
  const absl::Status bf16_ok = CheckPrecisionSupported(BF16, env->isa);
  if (!bf16_ok.ok() && absl::StrContains(precisions, "bf16")) {
    std::printf("skipping bf16: %s\n", std::string(bf16_ok.message()).c_str());
  }
  const double peak_f32_1 = GemmPeakGflops(false, 1), peak_f32_all = GemmPeakGflops(false, cores);
  const double peak_bf16_1 = bf16_ok.ok() ? GemmPeakGflops(true, 1) : 0;
  const double peak_bf16_all = bf16_ok.ok() ? GemmPeakGflops(true, cores) : 0;
  std::printf("oneDNN GEMM peak (M=1024 K=624 N=400): f32 %.0f GFLOP/s (1 thread), %.0f (%d threads);"
              " bf16 %.0f (1 thread), %.0f (%d threads)\n",
              peak_f32_1, peak_f32_all, cores, peak_bf16_1, peak_bf16_all, cores);

  std::vector<Result> results;
  for (absl::string_view prec : absl::StrSplit(precisions, ',')) {
    if (prec == "bf16" && !bf16_ok.ok()) continue;
    for (absl::string_view setting : absl::StrSplit(settings, ',')) {
      std::vector<std::string> ti = absl::StrSplit(setting, 'x');
      int T = 0, I = 0;
      if (ti.size() != 2 || !absl::SimpleAtoi(ti[0], &T) || !absl::SimpleAtoi(ti[1], &I)) {
        std::fprintf(stderr, "bad setting '%s'\n", std::string(setting).c_str());
        return 2;
      }
      Config config = *base;
      config.mutable_model()->set_precision(prec == "bf16" ? BF16 : F32);
      auto model = Model::Create(config.model(),
                                 ModelInputsOf(*spec));
      if (!model.ok()) { std::fprintf(stderr, "%s\n", model.status().ToString().c_str()); return 1; }
      // stale: as RunTraining with train.async_local_updates (one thread for pulls and pushes).
      const bool prefetch = mode == "stale";
      const int pt = params_threads > 0 ? params_threads : prefetch ? 1 : T * I;
      auto params = LocalParams::Create(**model, std::max<int64_t>(1, spec->total_rows()),
                                        config, pt);
      auto step = TrainStep::Create(**model, T, batch, I);
      if (!params.ok() || !step.ok()) return 1;
      // Dynamic tables (features.table.dynamic) as pstrain train has them.
      if (absl::Status s = AddDynamicTablesOf(*spec, config, pt, params->get()); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      if (prefetch) (*params)->EnableBackgroundPush();

      // In-memory batches of T x batch rows from the datagen distribution.
      double entries = 0;  // attended list entries per example
      const std::vector<Batch> batches = SpecBatches(*data, *spec, pool, T * batch, &entries);
      // Target attention's FLOPs are per entry and per example (bench/model_gemms.h); 0 without
      // it.
      const double attention_flops =
          entries * AttentionFlopsPerEntry(**model) + AttentionFlopsPerExample(**model);
      const double flops_per_example = (*model)->flops_per_example() + attention_flops;
      const int64_t attention_rows = static_cast<int64_t>(entries * batch + 0.5);
      int64_t global_step = 0;
      StepTimingOptions topt;
      topt.warmup_steps = std::max(5, pool);
      topt.windows = windows;
      topt.min_steps = steps;
      topt.pipelined = mode != "sync";
      topt.prefetch_pulls = prefetch;
      ForwardingParams pull_push(params->get());  // the step of remote parameters
      ParameterAccess* access =
          mode == "pushed" ? static_cast<ParameterAccess*>(&pull_push) : params->get();
      auto timing = TimeTrainSteps(step->get(), access, CycleBatches(&batches), topt,
                                   &global_step);
      if (!timing.ok()) { std::fprintf(stderr, "%s\n", timing.status().ToString().c_str()); return 1; }
      const double elapsed = timing->seconds;
      const StepProfile& p = timing->profile;
      Result r;
      r.towers = T;
      r.intra = I;
      r.precision = std::string(prec);
      r.ex_per_sec = timing->examples_per_sec;
      r.model_gflops = r.ex_per_sec * flops_per_example * 1e-9;
      const bool bf16 = prec == "bf16";
      r.peak_gflops = (T * I >= cores) ? (bf16 ? peak_bf16_all : peak_f32_all)
                                       : (bf16 ? peak_bf16_1 : peak_f32_1) * T * I;
      // This setting's own GEMM roof, measured now (after its steps, on the same warm machine).
      r.tower_roof_gflops = I == 1 ? ConcurrentGemmPeakGflops(bf16, T, batch)
                                   : GemmPeakGflops(bf16, T * I, batch);
      // The model's own GEMMs, measured the same way, right after.
      const std::vector<std::pair<GemmShape, int>> gemms =
          ModelStepGemms(**model, batch, bf16, attention_rows);
      r.own_roof_gflops = gemms.empty() ? 0.0 : GemmsRoofGflops(gemms, [&](const GemmShape& g) {
        return I == 1 ? ConcurrentGemmShapeGflops(g, T) : GemmShapeGflops(g, T * I);
      });
      for (int w = 0; w < paired_windows && !gemms.empty(); ++w) {
        StepTimingOptions one = topt;
        one.windows = 1;
        one.warmup_steps = 1;  // the machine is warm; one step re-warms after the roof
        auto window = TimeTrainSteps(step->get(), access, CycleBatches(&batches), one,
                                     &global_step);
        if (!window.ok()) {
          std::fprintf(stderr, "%s\n", window.status().ToString().c_str());
          return 1;
        }
        const double gflops = window->examples_per_sec * flops_per_example * 1e-9;
        const double roof = GemmsRoofGflops(gemms, [&](const GemmShape& g) {
          return I == 1 ? ConcurrentGemmShapeGflops(g, T) : GemmShapeGflops(g, T * I);
        });
        if (roof > 0) r.paired_fractions.push_back(gflops / roof);
      }
      const double gemm_share =
          ModelStepGemmFlopsPerExample(**model, batch, bf16, attention_rows) / flops_per_example;
      if (entries > 0) {
        std::printf("target attention: %.1f attended entries an example (%lld a tower's batch), "
                    "%.0f of the %.0f FLOPs an example\n",
                    entries, static_cast<long long>(attention_rows),
                    attention_flops, flops_per_example);
      }
      r.profile_fraction = {p.dedup / elapsed, p.pull / elapsed, p.compute / elapsed,
                            p.reduce / elapsed, p.push / elapsed};
      r.unique_rows_per_step = timing->unique_rows_per_step;
      results.push_back(r);
      std::printf("%-5s %s towers=%d intra=%d: %8.0f ex/s (%6.0f per core), %6.1f GFLOP/s = %.2f of peak,"
                  " %.2f of its GEMMs' roof (%.0f GFLOP/s at M=%d),"
                  " %.2f of the model's own GEMMs' roof (%.0f GFLOP/s, %zu shapes, %.0f%% of its FLOPs);"
                  " dedup %.0f%% pull %.0f%% towers %.0f%% reduce %.0f%% push %.0f%%\n",
                  r.precision.c_str(), mode.c_str(), T, I, r.ex_per_sec, r.ex_per_sec / std::min(cores, T * I),
                  r.model_gflops, r.model_gflops / r.peak_gflops,
                  r.model_gflops / r.tower_roof_gflops, r.tower_roof_gflops, batch,
                  OwnFraction(r), r.own_roof_gflops, gemms.size(), 100 * gemm_share,
                  100 * r.profile_fraction.dedup, 100 * r.profile_fraction.pull,
                  100 * r.profile_fraction.compute, 100 * r.profile_fraction.reduce,
                  100 * r.profile_fraction.push);
      if (!r.paired_fractions.empty()) {
        const auto [lo, hi] =
            std::minmax_element(r.paired_fractions.begin(), r.paired_fractions.end());
        std::printf("%-5s paired windows: %.2f of the model's own GEMMs' roof, median of %zu "
                    "(range %.2f-%.2f)\n",
                    r.precision.c_str(), Median(r.paired_fractions), r.paired_fractions.size(),
                    *lo, *hi);
      }
      std::fflush(stdout);
    }
  }

  // Markdown table, ratios within this run.
  double best_f32 = 0;
  for (const auto& r : results) if (r.precision == "f32") best_f32 = std::max(best_f32, r.ex_per_sec);
  std::printf("\n| precision | towers x intra_op | ex/s | ex/s per core | model GFLOP/s | of GEMM peak | of its GEMMs' roof | of the model's own GEMMs' roof | vs best f32 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::string json = "[";
  for (const auto& r : results) {
    const int used = std::min(cores, r.towers * r.intra);
    std::printf("| %s | %d x %d | %.0f | %.0f | %.1f | %.2f | %.2f | %.2f | %.2f |\n", r.precision.c_str(),
                r.towers, r.intra, r.ex_per_sec, r.ex_per_sec / used, r.model_gflops,
                r.model_gflops / r.peak_gflops, r.model_gflops / r.tower_roof_gflops, OwnFraction(r),
                best_f32 > 0 ? r.ex_per_sec / best_f32 : 0);
    if (json.size() > 1) json += ",";
    json += JsonObject()
                .Add("precision", r.precision).Add("towers", r.towers).Add("intra_op_threads", r.intra)
                .Add("examples_per_sec", r.ex_per_sec).Add("examples_per_sec_per_core", r.ex_per_sec / used)
                .Add("model_gflops", r.model_gflops).Add("gemm_peak_gflops", r.peak_gflops)
                .Add("fraction_of_peak", r.model_gflops / r.peak_gflops)
                .Add("tower_gemm_roof_gflops", r.tower_roof_gflops)
                .Add("fraction_of_tower_gemm_roof", r.model_gflops / r.tower_roof_gflops)
                .Add("model_gemm_roof_gflops", r.own_roof_gflops)
                .Add("fraction_of_model_gemm_roof", OwnFraction(r))
                .Add("paired_fraction_of_model_gemm_roof", Median(r.paired_fractions))
                .Add("unique_rows_per_step", r.unique_rows_per_step)
                .Add("dedup", r.profile_fraction.dedup).Add("pull", r.profile_fraction.pull)
                .Add("towers_compute", r.profile_fraction.compute)
                .Add("reduce", r.profile_fraction.reduce).Add("push", r.profile_fraction.push)
                .str();
  }
  json += "]";
  if (!out.empty()) {
    const std::string doc = JsonObject()
                                .Add("cores", cores).Add("batch_per_tower", batch).Add("mode", mode)
                                .Add("isa", IsaName(env->isa)).Add("onednn_isa", OneDnnIsaName())
                                .Add("cpu_model", env->cpu_model)
                                .Add("gemm_peak_f32_1thread", peak_f32_1).Add("gemm_peak_bf16_1thread", peak_bf16_1)
                                .Add("gemm_peak_f32_all", peak_f32_all).Add("gemm_peak_bf16_all", peak_bf16_all)
                                .AddRaw("results", json).str();
    if (int code = WriteJsonResults(out, doc)) return code;
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

PSTRAIN_APP_MAIN()
