// libFuzzer target: what a worker's PS client (worker/ps_client/) does with its shards' answers.
// Two fake shards, each a ParameterServer service on an in-process gRPC server (no network),
// answer every call with the next answer the input scripts for them: a status code and a
// PullResponse, PushResponse or InfoResponse parsed from the input's bytes (so any field may be
// anything: row bytes of the wrong size, a dense slice at the wrong offset, versions, staleness,
// incarnations, job states). The client is the real one: PsClient over RemoteShard endpoints
// (MakeRemoteShard: the answer checks, retries, then the scatter into the caller's order, the
// versions and incarnation bookkeeping), driven through WaitForShards, pulls, pushes, flushes and
// FinishTraining, in the consistency mode the first byte picks. Nothing may crash, hang (every
// call has a 2 s budget) or write outside the caller's buffers (AddressSanitizer).
// Input: [mode byte] then operations [op byte][count byte][per shard: status byte, 2-byte length,
// the answer's bytes]: op % 4: 0 pull (count ids, with the dense vector when count is odd),
// 1 push, 2 flush, 3 WaitForShards (Info answers). FinishTraining at the end.
// Seed corpus: fuzz/corpus/ps_client_answers/ (well-formed answers, by make_fuzz_corpus.sh).
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/rpc/timer.h"
#include "fuzz/fuzz_util.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_endpoint.h"
#include "worker/ps_client/shard_router.h"

namespace {

using namespace pstrain;

constexpr int kShards = 2;
constexpr int64_t kRows = 64;
constexpr int kRowDim = 3;
constexpr int64_t kDense = 5;

// One scripted answer: a status code (0 = OK) and the response's serialized bytes.
struct Answer {
  int code = 0;
  std::string bytes;
};

// A shard that answers from its script; an exhausted script answers UNAVAILABLE.
class ScriptedShard final : public ParameterServer::CallbackService {
 public:
  void Script(std::deque<Answer> answers) {
    absl::MutexLock lock(&mu_);
    answers_ = std::move(answers);
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest*,
                                 PullResponse* response) override {
    return Reply(ctx, response);
  }
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const PushRequest*,
                                 PushResponse* response) override {
    return Reply(ctx, response);
  }
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const InfoRequest*,
                                 InfoResponse* response) override {
    return Reply(ctx, response);
  }

 private:
  template <typename Resp>
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, Resp* response) {
    Answer a{grpc::StatusCode::UNAVAILABLE, ""};
    {
      absl::MutexLock lock(&mu_);
      if (!answers_.empty()) {
        a = std::move(answers_.front());
        answers_.pop_front();
      }
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (a.code != 0) {
      reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(a.code), "scripted"));
    } else if (!response->ParseFromString(a.bytes)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "scripted bytes do not parse"));
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  absl::Mutex mu_;
  std::deque<Answer> answers_ ABSL_GUARDED_BY(mu_);
};

struct Shards {
  ScriptedShard service[kShards];
  std::unique_ptr<grpc::Server> server[kShards];
  std::shared_ptr<grpc::Channel> channel[kShards];
  Timer timer;
};

Shards* StartShards() {
  auto* s = new Shards;
  for (int i = 0; i < kShards; ++i) {
    grpc::ServerBuilder b;
    b.RegisterService(&s->service[i]);
    s->server[i] = b.BuildAndStart();
    if (s->server[i] == nullptr) fuzz::SetupFailed("ps_client_answers", "an in-process server");
    s->channel[i] = s->server[i]->InProcessChannel(grpc::ChannelArguments());
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Shards* shards = StartShards();
  fuzz::InputReader in(data, size);
  const Consistency modes[] = {ASYNC, BOUNDED, SYNC};
  const Consistency mode = modes[in.Byte() % 3];

  // Read the whole script first: each operation's answers, per shard.
  struct Op {
    int kind = 0, count = 0;
  };
  std::vector<Op> ops;
  std::deque<Answer> script[kShards];
  for (int n = 0; n < 32 && in.left() > 0; ++n) {
    Op op{in.Byte() % 4, in.Byte() % 33};
    for (int s = 0; s < kShards; ++s) {
      const uint8_t status = in.Byte();
      // Mostly OK; otherwise a code in 1..16 (UNAVAILABLE and DEADLINE_EXCEEDED are retried once).
      script[s].push_back(Answer{status < 192 ? 0 : status % 16 + 1, in.Piece(1 << 16)});
    }
    ops.push_back(op);
  }
  for (int s = 0; s < kShards; ++s) shards->service[s].Script(std::move(script[s]));

  PsClient::Options o;
  for (int s = 0; s < kShards; ++s) o.shards.push_back("scripted:" + std::to_string(s));
  o.rows = kRows;
  o.row_dim = kRowDim;
  o.dense_size = kDense;
  o.worker_id = 1;
  o.consistency = mode;
  o.max_pushes_in_flight = 2;
  const ShardRouter router(kRows, NumPartitions(ClusterConfig(), kShards), kShards, kDense);
  std::vector<std::unique_ptr<ShardEndpoint>> endpoints;
  for (int s = 0; s < kShards; ++s) {
    RemoteShardOptions r;
    r.shard = s;
    r.address = o.shards[s];
    r.channel = shards->channel[s];
    r.row_dim = kRowDim;
    r.dense_begin = router.dense_begin(s);
    r.dense_size = router.dense_size(s);
    r.policy.attempt_timeout = absl::Seconds(2);
    r.policy.budget = absl::Seconds(2);
    r.policy.max_attempts = 2;
    r.policy.initial_backoff = absl::Milliseconds(1);
    r.policy.max_backoff = absl::Milliseconds(1);
    r.timer = &shards->timer;
    r.env = Env::Default();
    r.seed = s;
    endpoints.push_back(MakeRemoteShard(std::move(r)));
  }
  auto client = PsClient::Create(std::move(o), std::move(endpoints));
  if (!client.ok()) fuzz::SetupFailed("ps_client_answers", client.status().ToString());
  PsClient& c = **client;

  int64_t step = 0;
  for (const Op& op : ops) {
    std::vector<int64_t> ids(op.count);
    for (int i = 0; i < op.count; ++i) ids[i] = (i * 7 + op.count) % kRows;
    switch (op.kind) {
      case 0: {
        std::vector<float> rows(ids.size() * kRowDim), dense(kDense);
        (void)c.PullAtStepAsync(ids, rows.data(), op.count % 2 == 1 ? dense.data() : nullptr,
                                ++step)
            ->Wait();
        break;
      }
      case 1: {
        std::vector<float> grads(ids.size() * kRowDim, 0.25f), dense(kDense, 0.5f);
        (void)c.PushAsync(ids, grads.data(), dense.data(), step)->Wait();
        break;
      }
      case 2:
        (void)c.Flush();
        break;
      default:
        (void)c.WaitForShards(absl::Milliseconds(50));
        break;
    }
  }
  (void)c.FinishTraining();
  return 0;
}
