#include "checkpoint/warm_start.h"

#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

// "a/b/ckpt-7/" -> "ckpt-7".
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status Prefixed(const absl::Status& s, const std::string& from) {
  return absl::Status(s.code(), absl::StrCat("warm start from ", from, ": ", s.message()));
}

}  // namespace

absl::StatusOr<CheckpointChoice> ChooseWarmStartCheckpoint(const WarmStart& warm_start,
                                                           const ModelDescription& wanted,
                                                           Env* env) {
  const std::string& from = warm_start.from();
  if (!env->IsDirectory(from)) {
    return absl::NotFoundError(absl::StrCat(
        "warm start from ", from, ": no such directory (--warm_start_from takes a model dir or "
        "one of its ckpt-<step> directories)"));
  }
  CheckpointChoice c;
  if (ParseCheckpointName(BaseName(from)).has_value()) {
    c.dir = from;
    absl::StatusOr<std::vector<CheckpointLink>> chain = VerifyCheckpointChain(c.dir);
    if (!chain.ok()) return Prefixed(chain.status(), from);
    c.chain = *std::move(chain);
    c.manifest = c.chain.back().manifest;
  } else {
    absl::StatusOr<std::optional<CheckpointChoice>> chosen = ChooseCheckpoint(from);
    if (absl::IsDataLoss(chosen.status())) {  // ChooseCheckpoint's advice is for a resume
      return absl::DataLossError(absl::StrCat("warm start from ", from, ": no usable checkpoint "
                                              "there (every one refused, see the errors above)"));
    }
    if (!chosen.ok()) return Prefixed(chosen.status(), from);
    if (!*chosen) {
      return absl::NotFoundError(absl::StrCat("warm start from ", from,
                                              ": no checkpoint there (no LATEST file)"));
    }
    c = **std::move(chosen);
  }
  if (!c.manifest.has_model()) {
    PSTRAIN_LOG(WARNING) << "warm start from " << c.dir << ": its MANIFEST (version 1) does not "
                         << "describe the model; accepted if the shapes match (rows, row size, "
                         << "dense size), but a changed feature hashing or field order would go "
                         << "unnoticed";
    return c;
  }
  const ModelDescription& saved = c.manifest.model();
  absl::Status s = CompareModelDescriptions(saved, wanted, "the warm-start checkpoint");
  if (s.ok() && !warm_start.reset_optimizer()) {
    for (const auto& [name, a, b] :
         {std::make_tuple("sparse_optimizer.type", saved.sparse_optimizer().type(),
                          wanted.sparse_optimizer().type()),
          std::make_tuple("dense_optimizer.type", saved.dense_optimizer().type(),
                          wanted.dense_optimizer().type())}) {
      if (a != b) {
        s = absl::FailedPreconditionError(absl::StrCat(
            name, ": ", OptimizerType_Name(a), " in the warm-start checkpoint, ",
            OptimizerType_Name(b), " in the config; --reset_optimizer copies the parameters "
            "only and starts the optimizer slots fresh"));
        break;
      }
    }
  }
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("warm start from ", c.dir, ": ", s.message()));
  }
  return c;
}

}  // namespace pstrain
