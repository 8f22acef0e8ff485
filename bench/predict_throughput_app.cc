// `pstrain predict` against `pstrain train` in one run: examples per second per core of training
// (RunTraining, from the files, the config's towers on the process's cores) and of batch scoring
// (RunPredict of the trained checkpoint over the same files, one scoring thread per core), both
// reading and parsing their input as the commands do. The target: predict >= 2.5x train per core.
//
// --repeats rounds (after one warm-up round) each train from scratch (--train_steps steps) and
// then predict every row of --input with the checkpoint just trained; reported: the medians and
// ranges of both rates and of the per-round ratio (both halves of a round see the same load).
//
// usage: predict_throughput_app --config configs/deepfm_criteo.textproto --input 'DIR/part-*'
//                               [--format criteo_tsv] [--train_steps 300] [--repeats 3]
//                               [--out results.json]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/app_util.h"
#include "cmd/launcher.h"
#include "common/config.h"
#include "common/cpu.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/json_writer.h"
#include "serving/predict.h"
#include "serving/serving_model.h"
#include "worker/data/record_io.h"
#include "worker/model/isa.h"
#include "worker/train/trainer.h"

namespace pstrain {
namespace {

int Main(int argc, char** argv) {
  std::string config_path, input, format = "criteo_tsv", out, work = "/tmp/predict_throughput";
  int train_steps = 300, repeats = 3;
  FlagSet flags("predict_throughput_app",
                "Examples/s per core of pstrain predict against pstrain train, in one run.");
  flags.String("config", &config_path, "the training config (required)");
  flags.String("input", &input, "the rows: trained on, then scored (required)");
  flags.String("format", &format, "format of --input");
  flags.Int("train_steps", &train_steps, "training steps per training run");
  flags.Int("repeats", &repeats, "runs of each");
  flags.String("work", &work, "scratch directory (model dirs)");
  flags.String("out", &out, "write the results as JSON here");
  if (std::optional<int> code = ParseAppFlags(flags, argc, argv)) return *code;
  auto env = InitLaunchEnvironment();
  if (!env.ok() || config_path.empty() || input.empty() || repeats < 1) {
    std::fprintf(stderr, "--config and --input are required (%s)\n",
                 env.ok() ? "" : std::string(env.status().message()).c_str());
    return 2;
  }
  const int cores = env->cpus.cpus;
  auto parsed = ParseDataFormat(format);
  auto loaded = LoadConfigFile(config_path);
  if (!parsed.ok() || !loaded.ok()) {
    std::fprintf(stderr, "%s %s\n", parsed.status().ToString().c_str(),
                 loaded.status().ToString().c_str());
    return 2;
  }
  Config config = *loaded;
  ApplyConfigDefaults(&config);
  Channel* train = config.mutable_data()->mutable_train(0);
  train->clear_path();
  train->add_path(input);
  train->set_format(*parsed);
  config.mutable_data()->clear_eval();
  config.mutable_train()->set_max_steps(train_steps);
  config.mutable_train()->set_log_every_steps(1000000);
  config.mutable_checkpoint()->set_every_seconds(0);
  config.mutable_checkpoint()->set_keep(1);

  // Train and predict alternate, so that both see the same load on a shared machine; predict
  // scores the checkpoint its round trained. Round 0 warms up (page cache, oneDNN plans) and is
  // not counted.
  std::vector<double> train_rate, predict_rate, ratio;
  int64_t trained = 0, scored = 0;
  PredictOptions po;
  po.inputs = {input};
  po.format = *parsed;
  po.towers = cores;
  for (int r = 0; r <= repeats; ++r) {
    const std::string model_dir = absl::StrCat(work, "/model-", r);
    std::system(("rm -rf " + model_dir).c_str());
    config.mutable_train()->set_model_dir(model_dir);
    TrainerOptions opts;
    opts.cores = cores;
    opts.omp_num_threads = env->omp_num_threads;
    auto summary = RunTraining(config, opts);
    if (!summary.ok()) {
      std::fprintf(stderr, "training: %s\n", summary.status().ToString().c_str());
      return 1;
    }
    trained = summary->examples;
    auto chosen = ChooseCheckpointToRead(model_dir, "", nullptr);
    if (!chosen.ok()) {
      std::fprintf(stderr, "%s\n", chosen.status().ToString().c_str());
      return 1;
    }
    auto model = ServingModel::FromCheckpoint(chosen->chain, chosen->description);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      return 1;
    }
    auto result = RunPredict(std::shared_ptr<const ServingModel>(*std::move(model)), po);
    if (!result.ok()) {
      std::fprintf(stderr, "predict: %s\n", result.status().ToString().c_str());
      return 1;
    }
    scored = result->examples;
    const double rate = result->examples / result->seconds;
    std::printf("round %d%s: train %lld examples at %.0f ex/s; predict %lld rows at %.0f rows/s\n",
                r, r == 0 ? " (warm-up)" : "", static_cast<long long>(trained),
                summary->examples_per_sec, static_cast<long long>(scored), rate);
    if (r == 0) continue;
    train_rate.push_back(summary->examples_per_sec);
    predict_rate.push_back(rate);
    ratio.push_back(rate / summary->examples_per_sec);
  }
  const Spread t = Summarize(train_rate), p = Summarize(predict_rate), q = Summarize(ratio);
  absl::PrintF(
      "\n%s, %d cores, isa %s\n"
      "train:   %.0f ex/s (range %.0f-%.0f), %.0f per core\n"
      "predict: %.0f ex/s (range %.0f-%.0f), %.0f per core\n"
      "predict / train per core, per round: %.2f (range %.2f-%.2f; target >= 2.5)\n",
      env->cpu_model, cores, IsaName(env->isa), t.median, t.min, t.max, t.median / cores,
      p.median, p.min, p.max, p.median / cores, q.median, q.min, q.max);
  if (!out.empty()) {
    JsonObject j;
    j.Add("cpu_model", env->cpu_model)
        .Add("cores", cores)
        .Add("isa", IsaName(env->isa))
        .Add("train_examples_per_run", trained)
        .Add("predict_rows_per_run", scored)
        .Add("train_ex_per_sec_median", t.median)
        .Add("train_ex_per_sec_min", t.min)
        .Add("train_ex_per_sec_max", t.max)
        .Add("predict_ex_per_sec_median", p.median)
        .Add("predict_ex_per_sec_min", p.min)
        .Add("predict_ex_per_sec_max", p.max)
        .Add("ratio_per_core_median", q.median)
        .Add("ratio_per_core_min", q.min)
        .Add("ratio_per_core_max", q.max);
    if (int code = WriteJsonResults(out, j.str())) return code;
  }
  std::system(("rm -rf " + work).c_str());
  return 0;
}

}  // namespace
}  // namespace pstrain

PSTRAIN_APP_MAIN()
