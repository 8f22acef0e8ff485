// libFuzzer target: a checkpoint file as the PS restore reads it (checkpoint/block_file.h's
// BlockReader, then the blocks a shard file holds: SHRD, CONS, EMBM/EMBR, DNSE, through
// ShardServer::RestoreCheckpoint), and every block of the file read on its own. Seed corpus:
// fuzz/corpus/checkpoint/ (shard, worker-state and MANIFEST files written by pstrain).
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
