#include "ps/store/parameter_files.h"

#include "common/status.h"

namespace pstrain {
namespace {

// The parameter files of one checkpoint of the chain; `last`: the restored one, whose dense
// slices and other blocks are read.
absl::Status LoadLink(const CheckpointLink& link, bool last,
                      absl::Span<EmbeddingStore* const> stores, DenseStore* dense,
                      ParameterLoadMode mode, const OtherBlockFn& other,
                      ParameterLoadCounts* counts) {
  for (const auto& f : link.manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    const std::string path = link.dir + "/" + f.name();
    ASSIGN_OR_RETURN(auto reader, BlockReader::Open(path));
    while (true) {
      ASSIGN_OR_RETURN(std::string tag, reader->PeekTag());
      if (tag.empty()) break;
      if (tag == kEmbeddingMetaTag) {
        RETURN_IF_ERROR(
            Annotate(LoadEmbeddingStores(reader.get(), stores, &counts->rows, mode), path));
      } else if (tag == kDenseTag && last) {
        ASSIGN_OR_RETURN(DenseSnapshot d, LoadDenseSnapshot(reader.get()));
        if (dense != nullptr && mode.dense) {
          ASSIGN_OR_RETURN(int64_t n,
                           dense->RestoreOverlap(DenseSnapshotForLoad(std::move(d), *dense, mode)));
          counts->dense_floats += n;
        }
      } else if (other && last) {
        RETURN_IF_ERROR(other(path, reader.get()));
      } else {
        Block b;
        RETURN_IF_ERROR(reader->Next(&b).status());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParameterLoadCounts> LoadParameterFiles(absl::Span<const CheckpointLink> chain,
                                                       absl::Span<EmbeddingStore* const> stores,
                                                       DenseStore* dense, ParameterLoadMode mode,
                                                       const OtherBlockFn& other) {
  if (chain.empty()) return absl::InvalidArgumentError("LoadParameterFiles: an empty chain");
  ParameterLoadCounts counts;
  for (size_t i = 0; i < chain.size(); ++i) {
    RETURN_IF_ERROR(
        LoadLink(chain[i], i + 1 == chain.size(), stores, dense, mode, other, &counts));
  }
  return counts;
}

}  // namespace pstrain
