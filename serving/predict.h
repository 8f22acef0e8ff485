// Batch scoring of files with a trained model (`pstrain predict`): the trainer's readers and
// formats (worker/data: the eval channel's pipeline, never shuffled) feed `towers` threads, each
// with its own Scorer; one score per input row is written in input order, with the label when the
// input has one, and AUC and logloss are computed over the labelled rows.
//
// Exactness: batches are cut as the trainer's evaluator cuts them (batch_size records from the
// start of the input, the same pipeline), each is scored by the evaluator's code, and the
// metrics accumulate the probabilities in input order, so with batch_size equal to the training
// run's train.eval_batch_size the scores, the AUC and the logloss equal the trainer's final
// evaluation (summary.json test_auc, test_logloss) to the bit, whatever `towers`.
//
// Bad input: a record that does not parse stops the run with its file, line or record and what
// was expected (a score per row needs every row); the output file is written to a temporary name
// and renamed only when complete, so a failed run leaves no partial output.
//
// Threads: towers x intra_op_threads scoring, reader_threads parsing (plus the pipeline's
// producer). At most 2 x towers scored batches wait for the writer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "pstrain/config.pb.h"
#include "serving/serving_model.h"

namespace pstrain {

struct PredictOptions {
  std::vector<std::string> inputs;  // files, directories, globs or .manifest files (ExpandPath)
  DataFormat format = CRITEO_TSV;
  // false: the rows have no label (criteo_tsv: the 39 feature columns only, as Kaggle's
  // test.txt; csv: no label column). Only criteo_tsv and csv can say so (INVALID_ARGUMENT else).
  bool has_labels = true;
  std::string out;  // the scores file; "-" = stdout; "" = none (metrics only)
  int batch_size = 4096;  // records per batch (the training run's train.eval_batch_size)
  int towers = 1;
  int intra_op_threads = 1;
  int reader_threads = 1;
  Env* env = Env::Default();  // the clock of PredictResult::seconds (its monotonic one)
};

struct PredictResult {
  int64_t examples = 0;
  bool has_labels = false;
  double auc = 0, logloss = 0;  // NaN without labels (or when a class is missing)
  double positive_rate = 0;
  double seconds = 0;
};

// Scores every row of options.inputs with `model`. The scores file has one line per row:
// "<probability>" or "<probability>\t<label>", the probability with 9 significant digits (it
// reads back as the same float).
absl::StatusOr<PredictResult> RunPredict(std::shared_ptr<const ServingModel> model,
                                         const PredictOptions& options);

}  // namespace pstrain
