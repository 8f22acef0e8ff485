#include "ps/store/parameter_files.h"

#include "checkpoint/layout.h"
#include "common/status.h"

namespace pstrain {

absl::StatusOr<ParameterLoadCounts> LoadParameterFiles(const std::string& ckpt_dir,
                                                       const CheckpointManifest& manifest,
                                                       absl::Span<EmbeddingStore* const> stores,
                                                       DenseStore* dense, ParameterLoadMode mode,
                                                       const OtherBlockFn& other) {
  ParameterLoadCounts counts;
  for (const auto& f : manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    const std::string path = ckpt_dir + "/" + f.name();
    ASSIGN_OR_RETURN(auto reader, BlockReader::Open(path));
    while (true) {
      ASSIGN_OR_RETURN(std::string tag, reader->PeekTag());
      if (tag.empty()) break;
      if (tag == kEmbeddingMetaTag) {
        RETURN_IF_ERROR(
            Annotate(LoadEmbeddingStores(reader.get(), stores, &counts.rows, mode), path));
      } else if (tag == kDenseTag) {
        ASSIGN_OR_RETURN(DenseSnapshot d, LoadDenseSnapshot(reader.get()));
        if (dense != nullptr) {
          ASSIGN_OR_RETURN(int64_t n,
                           dense->RestoreOverlap(DenseSnapshotForLoad(std::move(d), *dense, mode)));
          counts.dense_floats += n;
        }
      } else if (other) {
        RETURN_IF_ERROR(other(path, reader.get()));
      } else {
        Block b;
        RETURN_IF_ERROR(reader->Next(&b).status());
      }
    }
  }
  return counts;
}

}  // namespace pstrain
