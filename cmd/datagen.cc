// `pstrain datagen`: Criteo-shaped synthetic data from a planted teacher (worker/tools/datagen.h).
#include <omp.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "common/flags.h"
#include "worker/data/record_io.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

struct DatagenFlags {
  DatagenOptions options;
  DatagenOutput out;
  std::string format = "criteo_tsv";
  std::string high_cardinality_fields;
  std::string history_item_field = "C3";
  std::string interaction = "fm";
  std::string history_pooling = "mean";
};

void AddDatagenFlags(FlagSet* flags, DatagenFlags* f) {
  DatagenOptions& options = f->options;
  DatagenOutput& out = f->out;
  flags->Int64("rows", &out.rows, "rows to write (required)");
  flags->Uint64("seed", &options.seed, "data seed: which rows");
  flags->Uint64("teacher_seed", &options.teacher_seed, "teacher seed: which model labels them");
  flags->String("format", &f->format, "criteo_tsv|csv|libsvm|tfrecord|recordio");
  flags->String("out", &out.dir,
                "output directory (required): part-NNNNN<ext> files and teacher.json");
  flags->Int("files", &out.files, "number of part files (rows split evenly, in order)");
  flags->Int("threads", &out.threads, "generation threads (the data does not depend on it)");
  flags->Uint64("max_cardinality", &options.max_cardinality,
                "cap on each categorical field's distinct values (Criteo's go up to 10,131,227)");
  flags->Double("zipf_exponent", &options.zipf_exponent, "popularity skew of categorical values");
  flags->Double("positive_rate", &options.positive_rate,
                "positive rate the teacher's bias is calibrated to (Kaggle ~0.25, 1TB ~0.03)");
  flags->Double("logit_std", &options.logit_std,
                "spread of the teacher's logit; larger is easier (1.4 gives a Bayes AUC ~0.80)");
  flags->Double("drift", &options.drift,
                "concept drift between days, in [0, 1]: the teacher of --day d is rotated from "
                "--teacher_seed's by d x acos(1 - drift), so consecutive days' teacher weights "
                "have correlation 1 - drift");
  flags->Int("day", &options.day,
             "the day of the drifting teacher and ids (0 = the plain teacher and ids)");
  flags->Double("id_churn", &options.id_churn,
                "ids that come and go, in [0, 1): on each day up to --day, each categorical id is "
                "retired with this probability and a new id takes its popularity rank "
                "(docs/DATAGEN.md \"Ids that come and go\")");
  flags->String("high_cardinality_fields", &f->high_cardinality_fields,
                "categorical fields that take --high_cardinality ids each, e.g. C3,C4,C12 "
                "(a model whose touched rows grow with the data: docs/DATAGEN.md)");
  flags->Uint64("high_cardinality", &options.high_cardinality,
                "distinct values of each --high_cardinality_fields field, up to 4294967296 "
                "(2^32; beyond --max_cardinality and Criteo's)");
  flags->Double("high_cardinality_zipf_exponent", &options.high_cardinality_zipf_exponent,
                "popularity skew of the high-cardinality fields' values (flatter than "
                "--zipf_exponent: most values are new)");
  flags->Double("history_mean_length", &options.history_mean_length,
                "a 40th field `history`: a list of ids of --history_item_field, of geometric "
                "length with this mean, pooled by the teacher (0 = no history field; "
                "docs/DATAGEN.md \"A history field\")");
  flags->Int("history_max_length", &options.history_max_length,
             "cap on a history's length (its field's list.max_length)");
  flags->String("history_item_field", &f->history_item_field,
                "the categorical field whose ids (and rows) the history shares (C1..C26)");
  flags->Double("history_importance", &options.history_importance,
                "weight of the pooled history in the teacher's first-order and FM terms");
  flags->String("history_pooling", &f->history_pooling,
                "how the teacher pools the history: mean (the default) or attention (each id "
                "weighted by its similarity to the row's item: docs/DATAGEN.md \"A history "
                "field\")");
  flags->String("interaction", &f->interaction,
                "the teacher's second-order term: fm (DeepFM-like, the default), cross (a "
                "low-rank DCN-v2 cross layer), dot (DLRM's pairwise dots, a weight per field "
                "pair), cross3 (the third-order term of two cross layers) or cross_full (one "
                "full-rank cross layer): docs/DATAGEN.md \"Teachers\"");
  flags->Double("interaction_share", &options.interaction_share,
                "the interaction term's share of the teacher logit's variance, in [0, 1) (0: "
                "the default, 0.2 for fm and 0.4 for the others; the first-order and MLP terms "
                "share the rest)");
  flags->Bool("fill_missing", &options.fill_missing,
              "write no missing values: numeric 0, categorical key 100000000 (implied by libsvm, "
              "which cannot express a missing value)");
}

}  // namespace

int RunDatagen(int argc, char** argv) {
  DatagenFlags f;
  f.out.threads = omp_get_max_threads();
  FlagSet flags(
      "datagen",
      "Writes Criteo-shaped synthetic rows whose labels come from a planted teacher model "
      "(first order + FM + MLP),\nand DIR/teacher.json with the teacher's Bayes-optimal "
      "AUC and logloss on the rows written.\nA train and a test set are two runs with "
      "different --seed and the same --teacher_seed (and the same\ngenerator flags): "
      "they share the teacher, so the test set's Bayes AUC bounds what a model can reach.");
  AddDatagenFlags(&flags, &f);
  if (std::optional<int> code = ParseCommandFlags("datagen", flags, argc, argv)) return *code;
  DatagenOptions& options = f.options;
  DatagenOutput& out = f.out;
  if (!flags.WasSet("rows") || out.dir.empty()) {
    return CommandError("datagen", "--rows and --out are required (see --help)", 2);
  }
  auto parsed = ParseDataFormat(f.format);
  if (!parsed.ok()) {
    return CommandError("datagen", absl::StrCat("--format: ", parsed.status().message()), 2);
  }
  out.format = *parsed;
  auto fields = ParseCategoricalFields(f.high_cardinality_fields);
  if (!fields.ok()) {
    return CommandError(
        "datagen", absl::StrCat("--high_cardinality_fields: ", fields.status().message()), 2);
  }
  options.high_cardinality_fields = *std::move(fields);
  auto item = ParseCategoricalFields(f.history_item_field);
  if (!item.ok() || item->size() != 1) {
    return CommandError("datagen",
                        absl::StrCat("--history_item_field: expected one of C1..C26, got '",
                                     f.history_item_field, "'"),
                        2);
  }
  options.history_item_field = item->front();
  if (f.history_pooling != "mean" && f.history_pooling != "attention") {
    return CommandError("datagen", absl::StrCat("--history_pooling: '", f.history_pooling,
                                                "', expected mean or attention"),
                        2);
  }
  options.history_attention = f.history_pooling == "attention";
  auto interaction = ParseTeacherInteraction(f.interaction);
  if (!interaction.ok()) {
    return CommandError("datagen", absl::StrCat("--interaction: ", interaction.status().message()),
                        2);
  }
  options.interaction = *interaction;
  if (out.format == LIBSVM) options.fill_missing = true;
  auto data = SyntheticData::Create(options);
  if (!data.ok()) return CommandError("datagen", data.status().message(), 2);
  Env* const env = Env::Default();
  const double start = env->MonotonicSeconds();
  auto result = WriteSyntheticData(*data, out);
  if (!result.ok()) return CommandError("datagen", result.status().ToString(), 1);
  const double secs =
      env->MonotonicSeconds() - start;
  std::printf("wrote %lld rows (%s, %d file%s, %.1f MB) to %s in %.1f s (%.0f rows/s)\n",
              static_cast<long long>(out.rows), DataFormatName(out.format).c_str(), out.files,
              out.files == 1 ? "" : "s", result->bytes / 1e6, out.dir.c_str(), secs,
              out.rows / std::max(secs, 1e-9));
  std::printf(
      "positive rate %.4f; teacher (Bayes-optimal) AUC %.4f, logloss %.4f -> %s/teacher.json\n",
      result->positive_rate, result->bayes_auc, result->bayes_logloss, out.dir.c_str());
  return 0;
}

}  // namespace pstrain
