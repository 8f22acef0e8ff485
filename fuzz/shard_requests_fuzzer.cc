// libFuzzer target: the shard's request handlers (ps/server/shard_server.h) fed a sequence of
// hostile requests, two ways:
//   - directly, as the gRPC service hands them over after parsing: Pull (with the service's
//     CheckPull first), Push, Info, Report, Coordinate, SaveShard COPY / WRITE, a ConsistencyState
//     restore, and the direct push of a host's own worker, on a fresh shard per input;
//   - over gRPC (record kind 8..11): the record's bytes sent raw as a Pull, Push, Info or
//     Coordinate call to a shard served on loopback TCP with a cluster secret (started once per
//     process), so that they pass what a network caller's bytes pass: the secret's auth metadata
//     processor (common/rpc/security.cc, before the message is read; the secret sent is the right
//     one, none, or the record's first bytes), the message cap, gRPC's parse of the request, the
//     handler's own secret check and then the handler.
// The first byte picks the fresh shard's consistency mode (SYNC, ASYNC or BOUNDED with staleness
// 0..3), its workers (1 + (byte / 12) % 8) and its table (64 rows in 2 partitions; or, when the
// top bit is set, 1024 rows in two tables of 2 partitions each, the first's rows 2 floats wide,
// the second's 3 (compact table widths); row_dim 3, a dense slice of 5). Input after it: records
// of [kind byte][2-byte length][serialized request]. Nothing may crash, spin or allocate without
// bound. Seed corpus: fuzz/corpus/shard_requests/ (made by scripts/make_fuzz_corpus.sh from real
// requests).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/small_shard.h"
#include "ps/server/shard_server.h"

namespace {

std::string Dir() {
  static const std::string dir = [] {
    std::string d = pstrain::fuzz::ScratchDir("shard");
    (void)pstrain::MakeDirs(d + "/ckpt-1");
    return d;
  }();
  return dir;
}

constexpr char kSecret[] = "fuzz-cluster-secret-0123456789abcdef";

// A SYNC shard of 2 workers served on loopback with a secret, and a raw stub to it.
struct Served {
  std::unique_ptr<pstrain::ShardServer> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

Served* Serve() {
  using namespace pstrain;
  auto* s = new Served;
  ShardServer::Options o = fuzz::SmallSyncShard(SGD, ADAM);
  o.data.checkpoint_dir = Dir();
  o.security.secret = kSecret;
  o.security.max_message_bytes = 1 << 16;
  o.lease = absl::Seconds(30);
  auto created = ShardServer::Create(o);
  if (!created.ok()) fuzz::SetupFailed("shard_requests", created.status().ToString());
  const absl::Status started = (*created)->Start("127.0.0.1:0");
  if (!started.ok()) fuzz::SetupFailed("shard_requests", started.ToString());
  s->server = *std::move(created);
  RpcSecurity no_secret;  // the secret is added per call (or not), not by the channel
  no_secret.max_message_bytes = o.security.max_message_bytes;
  s->stub = std::make_unique<grpc::GenericStub>(MakeChannel(
      "127.0.0.1:" + std::to_string(s->server->port()), no_secret, grpc::ChannelArguments()));
  return s;
}

// Each raw call's deadline. A training pull of a SYNC shard is held until its round completes,
// which the served shard's second worker never makes happen, and a watch is held until its
// timeout: such a call ends at this deadline, on the server's deadline path. 100 ms is ample for
// any other call on loopback (under 1 ms each), and keeps an input of 64 held calls at 6.4 s, under
// libFuzzer's -timeout=10 (at 5 s a call, three held calls were a false "timeout" finding, and the
// inputs that held one slowed the campaign to a few executions a second while they were run).
constexpr absl::Duration kCallDeadline = absl::Milliseconds(100);

// Sends `body` raw as `method` with `secret` ("" = none), and waits for the answer (kCallDeadline
// at most).
void RawCall(grpc::GenericStub* stub, const std::string& method, const std::string& body,
             const std::string& secret) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (!secret.empty()) ctx.AddMetadata(pstrain::kSecretMetadataKey, secret);
  const grpc::Slice slice(body);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  stub->UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                  [&done](const grpc::Status&) { done.Notify(); });
  done.WaitForNotification();
}

// A record sent over gRPC: kind 8..11 picks the method; the first byte of the record picks the
// secret: the right one, none, or (printable ASCII, as gRPC's client requires) the next bytes.
void OverGrpc(int kind, const std::string& msg) {
  static Served* served = Serve();
  static const char* const kMethods[] = {
      "/pstrain.ParameterServer/Pull", "/pstrain.ParameterServer/Push",
      "/pstrain.ParameterServer/Info", "/pstrain.ParameterServer/Coordinate"};
  const uint8_t how = msg.empty() ? 0 : static_cast<uint8_t>(msg[0]);
  std::string body = msg.empty() ? msg : msg.substr(1);
  std::string secret = kSecret;
  if (how % 4 == 1) secret.clear();
  if (how % 4 == 2) {
    secret = body.substr(0, how / 4);
    for (char& c : secret) {
      if (c < 0x21 || c > 0x7e) c = '?';
    }
    body = body.substr(secret.size());
  }
  RawCall(served->stub.get(), kMethods[kind - 8], body, secret);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  if (size == 0) return 0;
  ShardServer::Options o = fuzz::SmallSyncShard(SGD, ADAM);
  const Consistency modes[] = {SYNC, ASYNC, BOUNDED};
  o.consistency = modes[data[0] % 3];
  o.staleness = (data[0] / 3) % 4;
  o.num_workers = 1 + (data[0] / 12) % 8;
  const bool large = (data[0] & 0x80) != 0;
  o.data.rows = large ? 1024 : 64;
  o.data.partitions = large ? 4 : 2;
  if (large) o.data.table_splits = {{512, 2, 2}, {512, 2, 3}};
  o.data.checkpoint_dir = Dir();
  o.security.max_message_bytes = 1 << 16;
  o.lease = absl::Seconds(30);
  auto created = ShardServer::Create(o);
  if (!created.ok()) return 0;
  ShardServer& s = **created;
  size_t at = 1;
  for (int calls = 0; calls < 64 && at + 3 <= size; ++calls) {
    const uint8_t kind = data[at];
    const size_t len = std::min<size_t>(size - at - 3, data[at + 1] | (data[at + 2] << 8));
    const std::string msg(reinterpret_cast<const char*>(data + at + 3), len);
    at += 3 + len;
    if (kind % 12 >= 8) {
      OverGrpc(kind % 12, msg);
      continue;
    }
    switch (kind % 12) {
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
