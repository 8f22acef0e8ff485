// `pstrain predict`: scores files with a trained checkpoint (serving/predict.h).
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/serving_setup.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/json_writer.h"
#include "serving/predict.h"
#include "worker/data/record_io.h"

namespace pstrain {

int RunPredict(int argc, char** argv) {
  FlagSet flags(
      "predict",
      "Scores every row of --input with a trained checkpoint, in input order, and prints AUC and\n"
      "logloss when the rows have labels. Needs no config: the checkpoint records its model.\n"
      "Reads checkpoints of `train`, `allreduce` and PS jobs of any shard count. With the\n"
      "training run's train.eval_batch_size (--batch_size) the scores, AUC and logloss equal the\n"
      "trainer's final evaluation to the bit.");
  CheckpointFlags cf;
  AddCheckpointFlags(&flags, &cf);
  std::vector<std::string> inputs;
  std::string format = "criteo_tsv", out, summary;
  bool no_label = false;
  PredictOptions po;
  int threads = 0;
  flags.List("input", &inputs, "rows to score: a file, directory, glob or .manifest (repeatable)");
  flags.String("format", &format, "format of --input: criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags.String("out", &out,
               "scores file, one line per row: probability (and a tab and the label when the "
               "rows have one); - = stdout; empty = metrics only");
  flags.Bool("no_label", &no_label,
             "the rows have no label: criteo_tsv with the 39 feature columns only (Kaggle's "
             "test.txt), csv without a label column");
  flags.Int("batch_size", &po.batch_size,
            "rows per batch: the training run's train.eval_batch_size for bit-identical scores");
  flags.Int("threads", &threads, "scoring threads, each with its own model tower (0 = the CPUs)");
  flags.Int("reader_threads", &po.reader_threads, "parser threads");
  flags.String("summary", &summary,
               "write a JSON summary (examples, auc, logloss, seconds, checkpoint) to this file");
  if (std::optional<int> code = ParseCommandFlags("predict", flags, argc, argv)) return *code;
  if (inputs.empty()) return CommandError("predict", "--input is required (see --help)", 2);
  absl::StatusOr<DataFormat> parsed = ParseDataFormat(format);
  if (!parsed.ok()) {
    return CommandError("predict", absl::StrCat("--format: ", parsed.status().message()), 2);
  }
  if (threads < 0) return CommandError("predict", "--threads must be >= 0", 2);
  absl::StatusOr<std::unique_ptr<ServingModel>> loaded = LoadCheckpointModel(cf);
  if (!loaded.ok()) {
    return CommandError("predict", loaded.status().ToString(),
                loaded.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  std::shared_ptr<const ServingModel> model(*std::move(loaded));
  po.inputs = inputs;
  po.format = *parsed;
  po.has_labels = !no_label;
  po.out = out;
  po.towers = threads > 0 ? threads : Launch().cpus.cpus;
  po.intra_op_threads = 1;
  absl::StatusOr<PredictResult> r = RunPredict(model, po);
  if (!r.ok()) return CommandError("predict", r.status().ToString(), 1);
  FILE* info = out == "-" ? stderr : stdout;
  std::string metrics;
  if (r->has_labels) {
    metrics = absl::StrFormat(": auc %.6f logloss %.6f (positive rate %.4f)", r->auc, r->logloss,
                              r->positive_rate);
  }
  absl::FPrintF(info, "pstrain predict: %d rows scored by %s (step %d) in %.2f s (%.0f rows/s, %d "
                "threads)%s%s\n",
                r->examples, model->origin().path, model->origin().step, r->seconds,
                r->examples / std::max(r->seconds, 1e-9), po.towers, metrics,
                out.empty() || out == "-" ? std::string() : absl::StrCat(" -> ", out));
  if (!summary.empty()) {
    JsonObject j;
    j.Add("examples", r->examples)
        .Add("auc", r->auc)
        .Add("logloss", r->logloss)
        .Add("positive_rate", r->positive_rate)
        .Add("seconds", r->seconds)
        .Add("examples_per_sec", r->examples / std::max(r->seconds, 1e-9))
        .Add("threads", po.towers)
        .Add("checkpoint", model->origin().path)
        .Add("step", model->origin().step);
    if (absl::Status s = WriteFileAtomic(summary, j.str() + "\n"); !s.ok()) {
      return CommandError("predict", s.ToString(), 1);
    }
  }
  return 0;
}

}  // namespace pstrain
