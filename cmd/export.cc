// `pstrain export`: a serving export of a trained checkpoint (serving/export.h, docs/SERVING.md).
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/serving_setup.h"
#include "common/flags.h"
#include "serving/export.h"

namespace pstrain {

int RunExport(int argc, char** argv) {
  FlagSet flags(
      "export",
      "Writes a serving export of a trained checkpoint: OUT/<version>/MODEL, one checksummed file\n"
      "with the trained rows (an id -> row map, no optimizer state), the dense weights and the\n"
      "model's description (docs/SERVING.md). `pstrain serve --model OUT` serves the newest\n"
      "version and loads newer ones as they appear; python/pstrain_checkpoint.py reads it.");
  CheckpointFlags cf;
  AddCheckpointFlags(&flags, &cf);
  std::string out, rows = "f32";
  ExportOptions eo;
  flags.String("out", &out, "the export's base directory (required): versions go under it");
  flags.Int64("version", &eo.version, "the version's number (default: the checkpoint's step)");
  flags.String("rows", &rows,
               "row encoding: f32 (exact), bf16 (half the size) or int8 (w exact, the "
               "embedding scaled per row: about a quarter)");
  if (std::optional<int> code = ParseCommandFlags("export", flags, argc, argv)) return *code;
  if (out.empty()) return CommandError("export", "--out is required (see --help)", 2);
  absl::StatusOr<RowEncoding> encoding = ParseRowEncoding(rows);
  if (!encoding.ok()) {
    return CommandError("export", absl::StrCat("--rows: ", encoding.status().message()), 2);
  }
  eo.encoding = *encoding;
  Env* const env = Env::Default();
  const double start = env->MonotonicSeconds();
  absl::StatusOr<std::unique_ptr<ServingModel>> model = LoadCheckpointModel(cf);
  if (!model.ok()) {
    return CommandError("export", model.status().ToString(),
                model.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  const double read_s =
      env->MonotonicSeconds() - start;
  absl::StatusOr<ExportInfo> info = WriteExport(**model, out, eo);
  if (!info.ok()) return CommandError("export", info.status().ToString(), 1);
  const double total_s =
      env->MonotonicSeconds() - start;
  // With tables (format version 2), each table's row width: what its rows cost in the file.
  std::string tables;
  if ((*model)->spec().has_named_tables()) {
    for (const ServingModel::RowTable& t : (*model)->row_tables()) {
      absl::StrAppend(&tables, tables.empty() ? "; floats a row: " : ", ",
                      t.name.empty() ? "default table" : t.name, " ", t.width);
    }
  }
  // Dynamic tables (format version 3): their live rows, at 1 + dim floats.
  for (size_t d = 0; d < (*model)->dynamic_stores().size(); ++d) {
    const DynamicEmbeddingStore& store = *(*model)->dynamic_stores()[d];
    absl::StrAppend(&tables, "; dynamic ", (*model)->dynamic_name(static_cast<int>(d)), ": ",
                    store.metrics().rows_live, " live rows of ", store.dim(), " floats");
  }
  absl::PrintF("pstrain export: version %d of %s (step %d): %d rows (%s%s), %d bytes, read %.2f s "
               "+ written %.2f s -> %s\n",
               info->version, (*model)->origin().path, (*model)->origin().step, info->rows,
               RowEncodingName(eo.encoding), tables, info->bytes, read_s, total_s - read_s,
               info->dir);
  return 0;
}

}  // namespace pstrain
