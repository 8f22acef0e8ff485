#include "cmd/serving_setup.h"

#include <cstdio>

#include "checkpoint/layout.h"
#include "common/config.h"
#include "common/file.h"
#include "common/status.h"
#include "serving/export.h"
#include "worker/train/checkpoint.h"

namespace pstrain {

void AddCheckpointFlags(FlagSet* f, CheckpointFlags* o) {
  f->String("model_dir", &o->model_dir,
            "the training run's model dir (or its checkpoint.dir): LATEST and ckpt-<step>/; or "
            "an export (`pstrain export --out`: the newest version, or one version's directory)");
  f->String("checkpoint", &o->checkpoint,
            "which checkpoint: ckpt-<step> under --model_dir, `best` (the one --model_dir/BEST "
            "names: checkpoint.keep_best), or a checkpoint directory's path "
            "(default: the one LATEST names, verified, falling back like a resume)");
  f->List("config", &o->config,
          "the training config, only for checkpoints from before checkpoints recorded their model "
          "(MANIFEST version 1); for newer ones it must describe the same model");
  f->List("set", &o->set, "override one field of --config: --set features.hash_seed=7");
}

absl::StatusOr<std::unique_ptr<ServingModel>> LoadCheckpointModel(const CheckpointFlags& flags) {
  if (flags.model_dir.empty() && flags.checkpoint.empty()) {
    return absl::InvalidArgumentError("--model_dir (or --checkpoint) is required");
  }
  std::optional<ModelDescription> from_config;
  if (!flags.config.empty() || !flags.set.empty()) {
    // The config's model only: no data or training settings are needed (nor validated).
    Config config;
    for (const std::string& path : flags.config) {
      ASSIGN_OR_RETURN(Config part, LoadConfigFile(path));
      config.MergeFrom(part);
    }
    ApplyConfigDefaults(&config);
    for (const std::string& s : flags.set) RETURN_IF_ERROR(ApplyOverride(s, &config));
    ASSIGN_OR_RETURN(from_config, DescribeModel(config));
  }
  // An export (a base directory of versions, or one version) is read as such: predict scores
  // with it as `serve` would (its rows may be quantized).
  if (flags.checkpoint.empty() && !flags.model_dir.empty() &&
      !PathExists(flags.model_dir + "/" + kLatestFileName)) {
    if (ResolveExportDir(flags.model_dir).ok()) {
      // The newest version that reads (one that does not is skipped, and named in the log).
      ASSIGN_OR_RETURN(std::unique_ptr<ServingModel> model, ReadExportAt(flags.model_dir));
      if (from_config) {
        absl::Status same = CompareModelDescriptions(model->description(), *from_config,
                                                     "the export", "the config");
        if (!same.ok()) {
          return Annotate(same, model->origin().path + " was exported from another model");
        }
      }
      return model;
    }
  }
  ASSIGN_OR_RETURN(ChosenCheckpoint c,
                   ChooseCheckpointToRead(flags.model_dir, flags.checkpoint,
                                          from_config ? &*from_config : nullptr));
  return ServingModel::FromCheckpoint(c.chain, c.description);
}

}  // namespace pstrain
