// libFuzzer target: a checkpoint file as the PS restore reads it (checkpoint/block_file.h's
// BlockReader, then the blocks a shard file holds: SHRD, CONS, EMBM/EMBR, DNSE, through
// ShardServer::RestoreCheckpoint), every block of the file read on its own, and the file as a
// dynamic table's snapshot (ps/store/dynamic_file.h: DYNM/DYNR/DYND/DYNS) restored into a store
// of its shape. Seed corpus: fuzz/corpus/checkpoint/ (shard, worker-state, MANIFEST and
// dynamic-table files written by pstrain).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "common/file.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/small_shard.h"
#include "ps/server/shard_server.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/optimizer.h"
#include "pstrain/state.pb.h"

namespace {

std::string Dir() {
  static const std::string dir = pstrain::fuzz::ScratchDir("ckpt");
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // Every block, whatever it holds.
  if (auto reader = BlockReader::FromString("fuzz", bytes); reader.ok()) {
    Block b;
    for (int i = 0; i < 1000; ++i) {
      auto more = (*reader)->Next(&b);
      if (!more.ok() || !*more) break;
      if (b.tag == "MANI") CheckpointManifest().ParseFromString(b.payload);
      if (b.tag == "WSTA") WorkerState().ParseFromString(b.payload);
    }
  }
  // As a dynamic table's snapshot, restored into a store of the shape it claims (small shapes
  // only: the harness's memory is not what is under test).
  if (auto reader = BlockReader::FromString("fuzz", bytes); reader.ok()) {
    auto snap = ReadDynamicSnapshot(reader->get());
    if (snap.ok() && snap->snapshot.dim >= 1 && snap->snapshot.dim <= 64 &&
        snap->snapshot.sketch_width <= 4096 && snap->snapshot.sketch_depth <= 8) {
      OptimizerConfig oc;
      oc.set_type(snap->snapshot.optimizer);
      auto optimizer = Optimizer::Create(oc);
      if (optimizer.ok()) {
        DynamicEmbeddingStore::Options o;
        o.dim = snap->snapshot.dim;
        o.optimizer = std::move(*optimizer);
        if (snap->snapshot.sketch_depth > 0) {
          o.admission = DynamicEmbeddingStore::Admission::kCount;
          o.admit_count = 2;
          o.sketch_width = snap->snapshot.sketch_width;
          o.sketch_depth = snap->snapshot.sketch_depth;
        }
        if (auto store = DynamicEmbeddingStore::Create(std::move(o)); store.ok()) {
          (void)(*store)->Restore(snap->snapshot);
        }
      }
    }
  }
  // As a shard file of a 1-shard checkpoint.
  if (!WriteFileAtomic(Dir() + "/shard-0-of-1", bytes).ok()) return 0;
  ShardServer::Options o = fuzz::SmallSyncShard(ADAM, ADAGRAD);
  auto server = ShardServer::Create(o);
  if (!server.ok()) return 0;
  CheckpointManifest manifest;
  manifest.set_table_rows(64);
  manifest.set_row_dim(3);
  manifest.set_dense_size(5);
  manifest.set_num_shards(1);
  manifest.add_file()->set_name("shard-0-of-1");
  const CheckpointLink link{Dir(), manifest};
  (void)(*server)->RestoreCheckpoint({link});
  return 0;
}
