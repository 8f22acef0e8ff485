// libFuzzer target: the shard's request handlers (ps/server/shard_server.h) fed a sequence of
// hostile requests, as the gRPC service would after parsing them: Pull (with the service's
// CheckPull first), Push, Info, Report, Coordinate, SaveShard COPY / WRITE, and a ConsistencyState
// restore. Input: records of [kind byte][2-byte length][serialized request]. A fresh SYNC shard of
// 2 workers per input. Nothing may crash, spin or allocate without bound. Seed corpus:
// fuzz/corpus/shard_requests/ (made by scripts/make_fuzz_corpus.sh from real requests).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "fuzz/small_shard.h"
#include "ps/server/shard_server.h"

namespace {

std::string Dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/pstrain_fuzz_shard_", getpid());
    (void)pstrain::MakeDirs(d + "/ckpt-1");
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  ShardServer::Options o = fuzz::SmallSyncShard(SGD, ADAM);
  o.data.checkpoint_dir = Dir();
  o.security.max_message_bytes = 1 << 16;
  o.lease = absl::Seconds(30);
  auto created = ShardServer::Create(o);
  if (!created.ok()) return 0;
  ShardServer& s = **created;
  size_t at = 0;
  for (int calls = 0; calls < 64 && at + 3 <= size; ++calls) {
    const uint8_t kind = data[at];
    const size_t len = std::min<size_t>(size - at - 3, data[at + 1] | (data[at + 2] << 8));
    const std::string msg(reinterpret_cast<const char*>(data + at + 3), len);
    at += 3 + len;
    switch (kind % 8) {
      case 0: {
        PullRequest req;
        if (!req.ParseFromString(msg)) break;
        PullResponse resp;
        if (s.CheckPull(req).ok()) (void)s.Pull(req, &resp);
        break;
      }
      case 1: {
        PushRequest req;
        if (!req.ParseFromString(msg)) break;
        PushResponse resp;
        (void)s.Push(req, &resp);
        break;
      }
      case 2: {
        ReportRequest req;
        if (req.ParseFromString(msg)) (void)s.Report(req);
        break;
      }
      case 3: {
        CoordinateRequest req;
        if (!req.ParseFromString(msg)) break;
        CoordinateResponse resp;
        (void)s.Coordinate(req, &resp);
        break;
      }
      case 4: {
        SaveShardRequest req;
        if (!req.ParseFromString(msg)) break;
        if (req.phase() == SaveShardRequest::COPY) (void)s.CopyForCheckpoint(req.round());
        if (req.phase() == SaveShardRequest::WRITE) (void)s.WriteCheckpoint(req.round(), req.name());
        break;
      }
      case 5: {
        ConsistencyState state;
        if (state.ParseFromString(msg)) (void)s.consistency().Restore(state);
        s.consistency().AdvanceSync();
        break;
      }
      case 6: {
        InfoRequest req;
        if (req.ParseFromString(msg) && req.has_worker_id()) s.Heard(req.worker_id());
        (void)s.Info();
        (void)s.Stats();
        break;
      }
      default: {
        // The direct path of a host's own worker: ids and gradients from the message's bytes.
        const size_t n = std::min<size_t>(msg.size() / 8, 16);
        std::vector<int64_t> ids(n);
        std::memcpy(ids.data(), msg.data(), n * 8);
        std::vector<float> grads(n * 3, 0.5f);
        (void)s.PushDirect(0, 1, ids, grads.data(), nullptr);
        break;
      }
    }
  }
  return 0;
}
