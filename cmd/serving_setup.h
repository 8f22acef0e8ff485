// What `pstrain predict`, `export` and `serve` share: the command-line front, and (predict,
// export) reading the trained model of a model dir or an export.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "serving/serving_model.h"

namespace pstrain {

struct CheckpointFlags {
  std::string model_dir;   // --model_dir: the training run's model dir (or checkpoint.dir)
  std::string checkpoint;  // --checkpoint: "ckpt-N" under it, or a checkpoint's path; "" = LATEST
  // --config / --set: only for checkpoints that do not record their model (MANIFEST version 1);
  // given for a newer one, they must describe the same model (the comparison names the field).
  std::vector<std::string> config;
  std::vector<std::string> set;
};

void AddCheckpointFlags(FlagSet* flags, CheckpointFlags* out);

// The model of the chosen checkpoint (serving/serving_model.h ChooseCheckpointToRead), loaded;
// or, when --model_dir holds no LATEST but an export (serving/export.h ResolveExportDir), the
// export's model. Errors name the checkpoint or export and the field or file at fault.
absl::StatusOr<std::unique_ptr<ServingModel>> LoadCheckpointModel(const CheckpointFlags& flags);

}  // namespace pstrain
