// RemoteShard: a ShardEndpoint over a gRPC channel (worker/ps_client/shard_endpoint.h).
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/random.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/timer.h"
#include "common/rpc/wire.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "worker/ps_client/shard_endpoint.h"

namespace pstrain {
namespace {

class RemoteShard final : public ShardEndpoint {
 public:
  explicit RemoteShard(RemoteShardOptions o)
      : opt_(std::move(o)),
        name_(absl::StrCat("shard ", opt_.shard, " (", opt_.address, ")")),
        stub_(ParameterServer::NewStub(opt_.channel)) {}

  const std::string& name() const override { return name_; }

  void Pull(PullPart* part, ShardDone done) override {
    StartCall("Pull", &part->request, &part->response, false, opt_.policy.budget,
              [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const PullRequest* req,
                 PullResponse* resp, std::function<void(grpc::Status)> cb) {
                stub->async()->Pull(ctx, req, resp, std::move(cb));
              },
              [this, part, done = std::move(done)](absl::Status st) {
                if (st.ok()) st = TakeAnswer(part);
                done(std::move(st));
              });
  }

  uint64_t ReservePush() override { return next_ticket_.fetch_add(1); }

  void Push(uint64_t ticket, PushPart* part, ShardDone done) override {
    if (part->dense_len > 0) {
      PackArray(part->dense_grad, part->dense_len, part->request.mutable_dense_grad());
    }
    part->dense_grad = nullptr;  // read during this call only
    QueuedPush next;
    {
      absl::MutexLock lock(&mu_);
      pushes_[ticket] = QueuedPush{part, std::move(done)};
      if (!TakeNextPush(&next)) return;
    }
    SendPush(std::move(next));
  }

  void Info(const InfoRequest* request, InfoResponse* response, bool wait_for_ready,
            absl::Duration budget, ShardDone done) override {
    StartCall("Info", request, response, wait_for_ready, budget,
              [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const InfoRequest* req,
                 InfoResponse* resp, std::function<void(grpc::Status)> cb) {
                stub->async()->Info(ctx, req, resp, std::move(cb));
              },
              std::move(done));
  }

  void Stats(const StatsRequest* request, ShardStats* response, absl::Duration budget,
             ShardDone done) override {
    StartCall("Stats", request, response, false, budget,
              [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const StatsRequest* req,
                 ShardStats* resp, std::function<void(grpc::Status)> cb) {
                stub->async()->Stats(ctx, req, resp, std::move(cb));
              },
              std::move(done));
  }

  void PushOutOfOrder(const PushRequest* request, PushResponse* response, absl::Duration budget,
                      ShardDone done) override {
    StartCall("Push(worker_done)", request, response, false, budget, IssuePush,
              std::move(done));
  }

  void Abort(absl::Status reason) override {
    {
      absl::MutexLock lock(&mu_);
      if (!abort_.ok()) return;
      abort_ = std::move(reason);
    }
    aborting_ = true;
    CancelCalls();
  }

  void Shutdown() override {
    shutting_down_ = true;
    CancelCalls();
  }

  ShardTraffic traffic() const override {
    ShardTraffic t;
    t.rpcs = rpcs_.load();
    t.retries = retries_.load();
    t.bytes_sent = bytes_sent_.load();
    t.bytes_received = bytes_received_.load();
    return t;
  }

 private:
  class Call;
  struct QueuedPush {
    PushPart* part = nullptr;
    ShardDone done;
  };

  static void IssuePush(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                        const PushRequest* req, PushResponse* resp,
                        std::function<void(grpc::Status)> cb) {
    stub->async()->Push(ctx, req, resp, std::move(cb));
  }

  // Starts one call of `method`, retried under the policy with `budget`; `done` runs once.
  template <typename Req, typename Resp, typename Issue>
  void StartCall(const char* method, const Req* request, Resp* response, bool wait_for_ready,
                 absl::Duration budget, Issue issue, ShardDone done);

  // Checks a pull's answer against its request and points the part's answer fields at it; the
  // dense slice goes to part->dense_out.
  absl::Status TakeAnswer(PullPart* part) const {
    const PullResponse& r = part->response;
    const size_t n = part->request.ids().size() / sizeof(int64_t);
    // Each row at its table's width, at most row_dim floats (PsClient checks the exact size).
    if (r.rows().size() > n * opt_.row_dim * sizeof(float) || r.rows().size() % sizeof(float)) {
      return absl::InternalError(absl::StrCat(name_, ": Pull answered ", r.rows().size(),
                                              " row bytes for ", n, " rows of at most ",
                                              opt_.row_dim, " floats"));
    }
    if (!r.row_versions().empty() && r.row_versions().size() != n * sizeof(uint32_t)) {
      return absl::InternalError(absl::StrCat(name_, ": Pull answered ", r.row_versions().size(),
                                              " row version bytes for ", n, " rows"));
    }
    if (part->request.want_dense()) {
      if (r.dense().size() != opt_.dense_size * sizeof(float) ||
          r.dense_begin() != opt_.dense_begin) {
        return absl::InternalError(absl::StrCat(
            name_, ": Pull answered a dense slice of ", r.dense().size() / sizeof(float),
            " floats at ", r.dense_begin(), ", expected ", opt_.dense_size, " at ",
            opt_.dense_begin));
      }
      std::memcpy(part->dense_out, r.dense().data(), r.dense().size());
      part->dense_version = r.dense_version();
    }
    part->rows = r.rows().data();
    part->rows_bytes = static_cast<int64_t>(r.rows().size());
    part->row_versions = r.row_versions().empty() ? nullptr : r.row_versions().data();
    part->staleness = r.staleness();
    part->incarnation = r.incarnation();
    part->job = r.has_job() ? &r.job() : nullptr;
    return absl::OkStatus();
  }

  // Takes the push of the next ticket if it is queued and no push is in flight.
  bool TakeNextPush(QueuedPush* next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (push_busy_) return false;
    auto it = pushes_.find(next_push_);
    if (it == pushes_.end()) return false;
    *next = std::move(it->second);
    pushes_.erase(it);
    push_busy_ = true;
    return true;
  }

  // Sends a push taken by TakeNextPush; when it is done, sends the next ticket's, if queued.
  void SendPush(QueuedPush push) {
    PushPart* part = push.part;
    StartCall("Push", &part->request, &part->response, false, opt_.policy.budget, IssuePush,
              [this, part, done = std::move(push.done)](absl::Status st) {
                if (st.ok()) part->incarnation = part->response.incarnation();
                part->request.Clear();  // free the payload early
                QueuedPush next;
                bool send_next;
                {
                  absl::MutexLock lock(&mu_);
                  push_busy_ = false;
                  ++next_push_;
                  send_next = TakeNextPush(&next);
                }
                if (send_next) SendPush(std::move(next));
                done(std::move(st));
              });
  }

  absl::Status aborted() const {
    if (!aborting_.load()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return abort_;
  }

  // Cancels every attempt in progress (Abort, Shutdown), outside mu_: a cancelled call may
  // complete inline, on this thread, and its completion takes mu_ (Call::Finish). A call in
  // calls_ is alive (its completion takes it off the list under mu_ first), so a reference taken
  // under mu_ keeps it alive.
  void CancelCalls();

  const RemoteShardOptions opt_;
  const std::string name_;
  const std::unique_ptr<ParameterServer::Stub> stub_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> aborting_{false};  // abort_ is set
  std::atomic<uint64_t> next_call_{0};
  std::atomic<uint64_t> next_ticket_{0};
  std::atomic<int64_t> rpcs_{0}, retries_{0}, bytes_sent_{0}, bytes_received_{0};

  mutable absl::Mutex mu_;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  std::vector<Call*> calls_ ABSL_GUARDED_BY(mu_);  // attempts in progress, for cancellation
  std::map<uint64_t, QueuedPush> pushes_ ABSL_GUARDED_BY(mu_);  // by ticket
  uint64_t next_push_ ABSL_GUARDED_BY(mu_) = 0;                 // the next ticket to send
  bool push_busy_ ABSL_GUARDED_BY(mu_) = false;
};


// One logical RPC under the policy (common/rpc/retry.h): attempts until success, a non-retryable
// error, the attempt limit or the budget; then `done` runs once. The backoff between attempts is
// a Timer entry: no thread waits.
class RemoteShard::Call : public std::enable_shared_from_this<Call> {
 public:
  using Issue = std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>;

  Call(RemoteShard* shard, const char* method, bool wait_for_ready, absl::Duration budget,
       int64_t request_bytes, Issue issue, ShardDone done)
      : shard_(shard),
        method_(method),
        wait_for_ready_(wait_for_ready),
        request_bytes_(request_bytes),
        issue_(std::move(issue)),
        done_(std::move(done)),
        schedule_(WithBudget(shard->opt_.policy, budget), shard->opt_.env->Now(),
                  SplitMix64(shard->opt_.seed ^ shard->next_call_.fetch_add(1))) {}

  void Start() {
    {
      absl::MutexLock lock(&shard_->mu_);
      shard_->calls_.push_back(this);
    }
    Attempt();
  }

  // Cancels the attempt in progress and any later one.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }

 private:
  static RetryPolicy WithBudget(RetryPolicy p, absl::Duration budget) {
    p.budget = budget;
    return p;
  }

  void Attempt() {
    grpc::ClientContext* ctx = nullptr;
    const absl::Status aborted = shard_->aborted();
    {
      // Under mu_, so that Cancel() either sees this context or prevents it.
      absl::MutexLock lock(&mu_);
      if (!cancelled_ && !shard_->shutting_down_.load() && aborted.ok()) {
        ctx_ = std::make_unique<grpc::ClientContext>();
        ctx_->set_deadline(absl::ToChronoTime(schedule_.BeginAttempt(shard_->opt_.env->Now())));
        ctx_->set_wait_for_ready(wait_for_ready_);
        ctx = ctx_.get();
      }
    }
    if (ctx == nullptr) {
      if (!aborted.ok()) return FinishAborted(aborted);
      return Finish(absl::CancelledError(absl::StrCat(
          shard_->name_, ": ", method_, " cancelled: the PS client is shutting down")));
    }
    shard_->rpcs_.fetch_add(1, std::memory_order_relaxed);
    if (schedule_.attempts() > 1) shard_->retries_.fetch_add(1, std::memory_order_relaxed);
    shard_->bytes_sent_.fetch_add(request_bytes_, std::memory_order_relaxed);
    issue_(ctx, [self = shared_from_this()](grpc::Status s) { self->OnResult(s); });
  }

  void OnResult(const grpc::Status& s) {
    if (s.ok()) return Finish(absl::OkStatus());
    if (absl::Status aborted = shard_->aborted(); !aborted.ok()) return FinishAborted(aborted);
    const absl::Time now = shard_->opt_.env->Now();
    const absl::Status st = FromGrpcStatus(s);
    // While the client shuts down the retry still goes through the timer, which then runs it at
    // once, and Attempt() reports CANCELLED.
    if (const std::optional<absl::Time> next = schedule_.NextAttempt(st.code(), now)) {
      shard_->opt_.timer->At(*next, [self = shared_from_this()] { self->Attempt(); });
      return;
    }
    const int attempts = schedule_.attempts();
    std::string msg =
        attempts > 1
            ? absl::StrFormat("%s: %s failed after %d attempts over %.1f s: %s: %s", shard_->name_,
                              method_, attempts, absl::ToDoubleSeconds(now - schedule_.start()),
                              absl::StatusCodeToString(st.code()), st.message())
            : absl::StrFormat("%s: %s failed: %s: %s", shard_->name_, method_,
                              absl::StatusCodeToString(st.code()), st.message());
    Finish(absl::Status(st.code(), msg));
  }

  void FinishAborted(const absl::Status& aborted) {
    Finish(absl::Status(aborted.code(),
                        absl::StrCat(shard_->name_, ": ", method_, ": ", aborted.message())));
  }

  void Finish(absl::Status status) {
    // The context holds a reference to the channel. Drop it before `done_` can let the client
    // release the channels, so that the channel's last reference does not go here, on a gRPC
    // callback thread: gRPC 1.51 then tore down and freed the callback queue this thread polls
    // (abort "ref_counted.h:183 assertion failed: prior > 0" in cq_next; 1 in ~300 runs of
    // PsProcess.KilledShard... without this order). HoldCallbackQueue (PsClient::Create) now
    // keeps that queue for the process's life whatever the order; this order stays as a second
    // guard.
    std::unique_ptr<grpc::ClientContext> ctx;
    {
      absl::MutexLock lock(&mu_);
      ctx = std::move(ctx_);
    }
    ctx.reset();
    {
      absl::MutexLock lock(&shard_->mu_);
      auto& calls = shard_->calls_;
      calls.erase(std::find(calls.begin(), calls.end(), this));
    }
    done_(std::move(status));
  }

  RemoteShard* const shard_;
  const char* const method_;
  const bool wait_for_ready_;
  const int64_t request_bytes_;
  const Issue issue_;
  const ShardDone done_;
  RetrySchedule schedule_;  // touched by one attempt (or its callback) at a time
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);
};

template <typename Req, typename Resp, typename Issue>
void RemoteShard::StartCall(const char* method, const Req* request, Resp* response,
                            bool wait_for_ready, absl::Duration budget, Issue issue,
                            ShardDone done) {
  auto call = std::make_shared<Call>(
      this, method, wait_for_ready, budget, static_cast<int64_t>(request->ByteSizeLong()),
      [stub = stub_.get(), issue, request, response](grpc::ClientContext* ctx,
                                                    std::function<void(grpc::Status)> cb) {
        issue(stub, ctx, request, response, std::move(cb));
      },
      [this, response, done = std::move(done)](absl::Status s) {
        if (s.ok()) bytes_received_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
        done(std::move(s));
      });
  call->Start();
}

void RemoteShard::CancelCalls() {
  std::vector<std::shared_ptr<Call>> live;
  {
    absl::MutexLock lock(&mu_);
    live.reserve(calls_.size());
    for (Call* call : calls_) live.push_back(call->shared_from_this());
  }
  for (const std::shared_ptr<Call>& call : live) call->Cancel();
}

}  // namespace

std::unique_ptr<ShardEndpoint> MakeRemoteShard(RemoteShardOptions options) {
  return std::make_unique<RemoteShard>(std::move(options));
}

absl::StatusOr<std::vector<std::unique_ptr<ShardEndpoint>>> ConnectShards(
    const ShardConnections& c) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(c.policy.initial_backoff)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(c.policy.initial_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(c.policy.max_backoff)));
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<std::unique_ptr<ShardEndpoint>> shards;
  for (int s = 0; s < static_cast<int>(c.addresses.size()); ++s) {
    RemoteShardOptions r;
    r.shard = s;
    r.address = c.addresses[s];
    r.channel = s == c.local_shard ? c.local->InProcessChannel()
                                   : MakeChannel(r.address, c.security, args);
    if (r.channel == nullptr) {
      return absl::InvalidArgumentError("PsClient options: local_server is not started");
    }
    r.row_dim = c.row_dim;
    r.dense_begin = c.router->dense_begin(s);
    r.dense_size = c.router->dense_size(s);
    r.policy = c.policy;
    r.timer = c.timer;
    r.env = c.env;
    r.seed = SplitMix64(c.seed + s);
    std::unique_ptr<ShardEndpoint> shard = MakeRemoteShard(std::move(r));
    if (s == c.local_shard && c.direct) {
      shard = MakeInProcessShard(s, c.local, c.row_dim, std::move(shard));
    }
    shards.push_back(std::move(shard));
  }
  return shards;
}

}  // namespace pstrain
