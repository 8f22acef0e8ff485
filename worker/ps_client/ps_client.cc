#include "worker/ps_client/ps_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/rpc/callback_queue.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/retry.h"
#include "common/rpc/security.h"
#include "common/rpc/timer.h"
#include "common/rpc/wire.h"
#include "common/status.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

absl::Status PsFuture::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool PsFuture::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void PsFuture::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
}

namespace {

std::shared_ptr<PsFuture> CompletedFuture(absl::Status status) {
  auto f = std::make_shared<PsFuture>();
  f->Complete(std::move(status));
  return f;
}

}  // namespace

// One logical RPC to one shard under the client's RetryPolicy (common/rpc/retry.h): attempts
// until success, a non-retryable error, the attempt limit or the budget; then `done` runs once.
// The backoff between attempts is a Timer entry: no thread waits.
class PsClient::Call : public std::enable_shared_from_this<Call> {
 public:
  using Issue = std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>;

  Call(PsClient* client, int shard, const char* method, bool wait_for_ready, absl::Duration budget,
       int64_t request_bytes, Issue issue, std::function<void(absl::Status)> done)
      : client_(client),
        shard_(shard),
        method_(method),
        wait_for_ready_(wait_for_ready),
        request_bytes_(request_bytes),
        issue_(std::move(issue)),
        done_(std::move(done)),
        schedule_(client->Policy(budget), absl::Now(),
                  SplitMix64(client->incarnation_ ^ client->next_call_id_.fetch_add(1))) {}

  void Start() {
    {
      absl::MutexLock lock(&client_->mu_);
      client_->calls_.push_back(this);
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
  void Attempt() {
    grpc::ClientContext* ctx = nullptr;
    {
      // Under mu_, so that Cancel() either sees this context or prevents it.
      absl::MutexLock lock(&mu_);
      if (!cancelled_ && !client_->shutting_down_.load() && !client_->aborting_.load()) {
        ctx_ = std::make_unique<grpc::ClientContext>();
        ctx_->set_deadline(absl::ToChronoTime(schedule_.BeginAttempt(absl::Now())));
        ctx_->set_wait_for_ready(wait_for_ready_);
        ctx = ctx_.get();
      }
    }
    if (ctx == nullptr) {
      if (absl::Status aborted = client_->aborted(); !aborted.ok()) {
        return Finish(absl::Status(aborted.code(), absl::StrCat(Where(), ": ", method_, ": ",
                                                                aborted.message())));
      }
      return Finish(absl::CancelledError(
          absl::StrCat(Where(), ": ", method_, " cancelled: the PS client is shutting down")));
    }
    client_->rpcs_.fetch_add(1, std::memory_order_relaxed);
    if (schedule_.attempts() > 1) client_->retries_.fetch_add(1, std::memory_order_relaxed);
    client_->bytes_sent_.fetch_add(request_bytes_, std::memory_order_relaxed);
    issue_(ctx, [self = shared_from_this()](grpc::Status s) { self->OnResult(s); });
  }

  void OnResult(const grpc::Status& s) {
    if (s.ok()) return Finish(absl::OkStatus());
    if (absl::Status aborted = client_->aborted(); !aborted.ok()) {
      return Finish(absl::Status(aborted.code(), absl::StrCat(Where(), ": ", method_, ": ",
                                                              aborted.message())));
    }
    const absl::Time now = absl::Now();
    const absl::Status st = FromGrpcStatus(s);
    // While the client shuts down the retry still goes through the timer, which then runs it at
    // once, and Attempt() reports CANCELLED.
    if (const std::optional<absl::Time> next = schedule_.NextAttempt(st.code(), now)) {
      client_->timer_->At(*next, [self = shared_from_this()] { self->Attempt(); });
      return;
    }
    const int attempts = schedule_.attempts();
    std::string msg =
        attempts > 1
            ? absl::StrFormat("%s: %s failed after %d attempts over %.1f s: %s: %s", Where(),
                              method_, attempts, absl::ToDoubleSeconds(now - schedule_.start()),
                              absl::StatusCodeToString(st.code()), st.message())
            : absl::StrFormat("%s: %s failed: %s: %s", Where(), method_,
                              absl::StatusCodeToString(st.code()), st.message());
    Finish(absl::Status(st.code(), msg));
  }

  void Finish(absl::Status status) {
    // The context holds a reference to the channel. Drop it before `done_` can let ~PsClient
    // release the channels, so that the channel's last reference does not go here, on a gRPC
    // callback thread: gRPC 1.51 then tore down and freed the callback queue this thread polls
    // (abort "ref_counted.h:183 assertion failed: prior > 0" in cq_next; 1 in ~300 runs of
    // PsProcess.KilledShard... without this order). HoldCallbackQueue (Create) now keeps that
    // queue for the process's life whatever the order; this order stays as a second guard.
    std::unique_ptr<grpc::ClientContext> ctx;
    {
      absl::MutexLock lock(&mu_);
      ctx = std::move(ctx_);
    }
    ctx.reset();
    {
      absl::MutexLock lock(&client_->mu_);
      auto& calls = client_->calls_;
      calls.erase(std::find(calls.begin(), calls.end(), this));
    }
    done_(std::move(status));
  }

  std::string Where() const {
    return absl::StrCat("shard ", shard_, " (", client_->opt_.shards[shard_], ")");
  }

  PsClient* const client_;
  const int shard_;
  const char* const method_;
  const bool wait_for_ready_;
  const int64_t request_bytes_;
  const Issue issue_;
  const std::function<void(absl::Status)> done_;
  RetrySchedule schedule_;  // touched by one attempt (or its callback) at a time
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);
};

struct PsClient::Shard {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ParameterServer::Stub> stub;
  std::atomic<uint64_t> incarnation{0};  // last seen; 0 = none yet
  // This client's pushes to the shard go one at a time, in sequence order (the shard's
  // idempotence needs it). Guarded by PsClient::mu_.
  bool push_busy = false;
  std::deque<std::shared_ptr<PushPart>> push_queue;
};

// The parts of one pull or push (one per shard) and the first error among them.
struct PsClient::Parts {
  std::atomic<int> remaining{0};
  absl::Mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);

  // Notes one part's outcome. True for the last part, with the operation's status in *final.
  bool Done(absl::Status st, absl::Status* final) {
    if (!st.ok()) {
      absl::MutexLock lock(&mu);
      if (status.ok()) status = std::move(st);
    }
    if (remaining.fetch_sub(1) != 1) return false;
    absl::MutexLock lock(&mu);
    *final = status;
    return true;
  }
};

struct PsClient::PullOp : Parts {
  struct Part {
    int shard = 0;
    std::vector<int32_t> positions;  // index in the caller's ids of each requested row
    PullRequest request;
    PullResponse response;
  };
  std::shared_ptr<PsFuture> future = std::make_shared<PsFuture>();
  float* rows = nullptr;
  float* dense = nullptr;
  int64_t step = 0;
  std::atomic<int64_t> staleness{0};  // max over the parts
  std::vector<std::unique_ptr<Part>> parts;
};

struct PsClient::PushOp : Parts {
  std::shared_ptr<PsFuture> future = std::make_shared<PsFuture>();
};

struct PsClient::PushPart {
  std::shared_ptr<PushOp> op;
  int shard = 0;
  PushRequest request;
  PushResponse response;
};

PsClient::Options PsClient::OptionsFromConfig(const ClusterConfig& cluster, int64_t rows,
                                              int row_dim, int64_t dense_size) {
  Options o;
  o.shards.assign(cluster.ps().begin(), cluster.ps().end());
  o.rows = rows;
  o.partitions = NumPartitions(cluster, cluster.ps_size());
  o.row_dim = row_dim;
  o.dense_size = dense_size;
  o.worker_id = cluster.index();
  o.rpc_deadline_ms = cluster.rpc_deadline_ms();
  o.rpc_retries = cluster.rpc_retries();
  o.call_deadline_ms = cluster.rpc_call_deadline_ms();
  o.initial_backoff_ms = cluster.rpc_backoff_ms();
  o.max_backoff_ms = cluster.rpc_max_backoff_ms();
  o.max_pushes_in_flight = cluster.max_pushes_in_flight();
  o.consistency = cluster.consistency();
  return o;
}

namespace {

int DefaultPartitions(const PsClient::Options& o) {
  return o.partitions > 0 ? o.partitions
                          : NumPartitions(ClusterConfig(), static_cast<int>(o.shards.size()));
}

uint64_t RandomIncarnation() {
  std::random_device rd;
  return SplitMix64((uint64_t{rd()} << 32 ^ rd()) ^
                    static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
}

}  // namespace

PsClient::PsClient(Options options)
    : opt_(std::move(options)),
      map_(opt_.rows, DefaultPartitions(opt_), static_cast<int>(opt_.shards.size())),
      dense_map_(opt_.dense_size, static_cast<int>(opt_.shards.size()),
                 static_cast<int>(opt_.shards.size())),
      incarnation_(RandomIncarnation()),
      direct_shard_(opt_.local_server != nullptr && opt_.consistency == ASYNC ? opt_.local_shard
                                                                               : -1),
      pull_versions_(static_cast<int>(opt_.shards.size())) {
  const int S = num_shards();
  partition_rank_.resize(map_.partitions());
  int rank = 0;
  for (int s = 0; s < S; ++s) {
    shard_rank_begin_.push_back(rank);
    for (int p : map_.PartitionsOfShard(s)) partition_rank_[p] = rank++;
  }
  shard_rank_begin_.push_back(rank);
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(Options o) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("PsClient options: ", what));
  };
  if (o.shards.empty()) return bad("no shard addresses");
  if (o.rows < 1) return bad(absl::StrCat("rows must be > 0, got ", o.rows));
  if (o.partitions < 0) return bad(absl::StrCat("partitions must be >= 0, got ", o.partitions));
  if (o.row_dim < 1) return bad(absl::StrCat("row_dim must be > 0, got ", o.row_dim));
  if (o.dense_size < 0) return bad(absl::StrCat("dense_size must be >= 0, got ", o.dense_size));
  if (o.rpc_deadline_ms < 1 || o.rpc_retries < 0 || o.call_deadline_ms < 0 ||
      o.initial_backoff_ms < 1 || o.max_backoff_ms < o.initial_backoff_ms) {
    return bad(absl::StrCat("need rpc_deadline_ms > 0 (", o.rpc_deadline_ms,
                            "), rpc_retries >= 0 (", o.rpc_retries, "), call_deadline_ms >= 0 (",
                            o.call_deadline_ms, "), 0 < initial_backoff_ms (", o.initial_backoff_ms,
                            ") <= max_backoff_ms (", o.max_backoff_ms, ")"));
  }
  if (o.local_shard >= static_cast<int>(o.shards.size()) ||
      (o.local_shard >= 0) != (o.local_server != nullptr)) {
    return bad(absl::StrCat("local_shard ", o.local_shard, " needs a local_server and must name ",
                            "one of the ", o.shards.size(), " shards"));
  }
  if (absl::Status s = ValidateRpcSecurity(o.security); !s.ok()) return s;
  if (o.max_pushes_in_flight < 1) {
    return bad(absl::StrCat("max_pushes_in_flight must be >= 1, got ", o.max_pushes_in_flight));
  }
  // The calls' completions run on gRPC's callback queue; it must outlive every channel whatever
  // thread releases the last one (common/rpc/callback_queue.h).
  HoldCallbackQueue();
  std::unique_ptr<PsClient> c(new PsClient(std::move(o)));
  grpc::ChannelArguments args;
  // A restarted shard should be reached again within our retry schedule, not gRPC's default
  // reconnect backoff (1 s growing to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, c->opt_.initial_backoff_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, c->opt_.initial_backoff_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, c->opt_.max_backoff_ms);
  // Each client gets its own connections (clients in one process would share them otherwise).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const std::string& address : c->opt_.shards) {
    auto shard = std::make_unique<Shard>();
    shard->address = address;
    shard->channel = static_cast<int>(c->shards_.size()) == c->opt_.local_shard
                         ? c->opt_.local_server->InProcessChannel()
                         : MakeChannel(address, c->opt_.security, args);
    if (shard->channel == nullptr) return bad("local_server is not started");
    shard->stub = ParameterServer::NewStub(shard->channel);
    c->shards_.push_back(std::move(shard));
  }
  c->timer_ = std::make_unique<Timer>();
  return c;
}

PsClient::~PsClient() {
  shutting_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }
  CancelCalls();
  timer_->Stop();
  {
    absl::MutexLock lock(&mu_);
    while (ops_in_flight_ > 0) cv_.Wait(&mu_);
  }
  timer_.reset();
}

RetryPolicy PsClient::Policy(absl::Duration budget) const {
  RetryPolicy p;
  p.attempt_timeout = absl::Milliseconds(opt_.rpc_deadline_ms);
  p.budget = budget;
  p.max_attempts = opt_.rpc_retries + 1;
  p.initial_backoff = absl::Milliseconds(opt_.initial_backoff_ms);
  p.max_backoff = absl::Milliseconds(opt_.max_backoff_ms);
  p.jitter = 0.5;  // backoffs in [50%, 100%], so that workers retrying together spread
  return p;
}

absl::Duration PsClient::CallBudget() const {
  return absl::Milliseconds(opt_.call_deadline_ms > 0
                                ? opt_.call_deadline_ms
                                : int64_t{opt_.rpc_retries + 1} * opt_.rpc_deadline_ms);
}

void PsClient::OpStarted() {
  absl::MutexLock lock(&mu_);
  ++ops_in_flight_;
}

void PsClient::OpFinished() {
  // The last touch of `this` by an operation: the destructor may proceed once it returns.
  absl::MutexLock lock(&mu_);
  if (--ops_in_flight_ == 0) cv_.SignalAll();
}

template <typename Req, typename Resp, typename Issue>
void PsClient::StartCall(int shard, const char* method, const Req* request, Resp* response,
                         bool wait_for_ready, absl::Duration budget, Issue issue,
                         std::function<void(absl::Status)> done) {
  auto call = std::make_shared<Call>(
      this, shard, method, wait_for_ready, budget, static_cast<int64_t>(request->ByteSizeLong()),
      [stub = shards_[shard]->stub.get(), issue, request, response](
          grpc::ClientContext* ctx, std::function<void(grpc::Status)> cb) {
        issue(stub, ctx, request, response, std::move(cb));
      },
      [this, response, done = std::move(done)](absl::Status s) {
        if (s.ok()) bytes_received_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
        done(std::move(s));
      });
  call->Start();
}

template <typename Req, typename Resp, typename Issue>
absl::Status PsClient::CallAllShards(const char* method, const Req& request, bool wait_for_ready,
                                     absl::Duration budget, Issue issue,
                                     std::vector<Resp>* responses) {
  const int S = num_shards();
  struct State {
    std::vector<Req> requests;
    std::atomic<int> remaining{0};
    absl::Mutex mu;
    absl::Status status;
    PsFuture future;
  };
  auto state = std::make_shared<State>();
  state->requests.assign(S, request);
  state->remaining = S;
  responses->assign(S, Resp());
  OpStarted();
  for (int s = 0; s < S; ++s) {
    StartCall(s, method, &state->requests[s], &(*responses)[s], wait_for_ready, budget, issue,
              [state](absl::Status st) {
                if (!st.ok()) {
                  absl::MutexLock lock(&state->mu);
                  if (state->status.ok()) state->status = st;
                }
                if (state->remaining.fetch_sub(1) == 1) {
                  absl::MutexLock lock(&state->mu);
                  state->future.Complete(state->status);
                }
              });
  }
  const absl::Status status = state->future.Wait();
  OpFinished();
  return status;
}

void PsClient::Abort(absl::Status reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (!abort_.ok()) return;
    abort_ = std::move(reason);
  }
  aborting_ = true;
  CancelCalls();
}

void PsClient::CancelCalls() {
  // Cancelled outside mu_: a cancelled call may complete inline, on this thread, and its
  // completion takes mu_ (Call::Finish). A call in calls_ is alive (its completion holds it and
  // takes it off the list under mu_ first), so taking a reference under mu_ keeps it alive.
  std::vector<std::shared_ptr<Call>> live;
  {
    absl::MutexLock lock(&mu_);
    live.reserve(calls_.size());
    for (Call* call : calls_) live.push_back(call->shared_from_this());
  }
  for (const std::shared_ptr<Call>& call : live) call->Cancel();
}

absl::Status PsClient::aborted() const {
  if (!aborting_.load()) return absl::OkStatus();
  absl::MutexLock lock(&abort_mu_);
  return abort_;
}

absl::Status PsClient::WaitForShards(absl::Duration timeout) {
  std::vector<InfoResponse> infos;
  InfoRequest request;
  request.set_worker_id(opt_.worker_id);
  RETURN_IF_ERROR((CallAllShards<InfoRequest, InfoResponse>(
      "Info", request, /*wait_for_ready=*/true, timeout,
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const InfoRequest* req,
         InfoResponse* resp, std::function<void(grpc::Status)> cb) {
        stub->async()->Info(ctx, req, resp, std::move(cb));
      },
      &infos)));
  for (int s = 0; s < num_shards(); ++s) {
    const InfoResponse& info = infos[s];
    const ShardMap& m = info.map();
    if (info.shard() != s || m.shards() != num_shards() || m.rows() != map_.rows() ||
        m.partitions() != map_.partitions() || m.row_dim() != opt_.row_dim ||
        m.dense_size() != opt_.dense_size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s serves shard %d of %d with rows=%d partitions=%d row_dim=%d dense_size=%d, but "
          "this worker expects shard %d of %d with rows=%d partitions=%d row_dim=%d "
          "dense_size=%d: check the cluster spec and the config",
          shards_[s]->address, info.shard(), m.shards(), m.rows(), m.partitions(), m.row_dim(),
          m.dense_size(), s, num_shards(), map_.rows(), map_.partitions(), opt_.row_dim,
          opt_.dense_size));
    }
    if (info.num_workers() > 0 && opt_.worker_id >= info.num_workers()) {
      return absl::FailedPreconditionError(absl::StrCat(
          shards_[s]->address, " serves a job of ", info.num_workers(),
          " workers, but this is worker ", opt_.worker_id,
          ": start every `pstrain ps` with --num_workers set to the job's workers"));
    }
    if (!info.ready()) {
      return absl::UnavailableError(
          absl::StrCat("shard ", s, " (", shards_[s]->address, ") is not ready"));
    }
    NoteIncarnation(s, info.incarnation());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ShardStats>> PsClient::GetStats() {
  std::vector<ShardStats> stats;
  RETURN_IF_ERROR((CallAllShards<StatsRequest, ShardStats>(
      "Stats", StatsRequest(), /*wait_for_ready=*/false, CallBudget(),
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const StatsRequest* req,
         ShardStats* resp, std::function<void(grpc::Status)> cb) {
        stub->async()->Stats(ctx, req, resp, std::move(cb));
      },
      &stats)));
  return stats;
}

void PsClient::NoteIncarnation(int shard, uint64_t incarnation) {
  const uint64_t before = shards_[shard]->incarnation.exchange(incarnation);
  if (before != 0 && before != incarnation) {
    shard_restarts_.fetch_add(1);
    PSTRAIN_LOG(WARNING) << "shard " << shard << " (" << shards_[shard]->address
                         << ") restarted: unless it restored a checkpoint, its rows and dense "
                            "slice are back at their initial values";
  }
}

absl::Status PsClient::GroupByShard(absl::Span<const int64_t> ids, std::vector<int32_t>* order,
                                    std::vector<int64_t>* bounds) const {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("too many ids in one call: ", n));
  }
  // Counting sort by partition rank: shards come out in order, each shard's ids grouped by
  // partition so that the shard handles each partition's ids in one run.
  const int R = map_.partitions();
  std::vector<int32_t> rank(n);
  std::vector<int64_t> start(R + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= map_.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row id ", id, " (position ", i, ") is outside the table [0, ", map_.rows(), ")"));
    }
    rank[i] = partition_rank_[map_.PartitionOf(id)];
    ++start[rank[i] + 1];
  }
  for (int r = 0; r < R; ++r) start[r + 1] += start[r];
  bounds->resize(num_shards() + 1);
  for (int s = 0; s <= num_shards(); ++s) (*bounds)[s] = start[shard_rank_begin_[s]];
  order->resize(n);
  for (int64_t i = 0; i < n; ++i) (*order)[start[rank[i]]++] = static_cast<int32_t>(i);
  return absl::OkStatus();
}

absl::Status PsClient::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  return PullAsync(ids, rows, dense)->Wait();
}

absl::Status PsClient::Push(absl::Span<const int64_t> ids, const float* row_grads,
                            const float* dense_grad, int64_t step) {
  return PushAsync(ids, row_grads, dense_grad, step)->Wait();
}

std::shared_ptr<PsFuture> PsClient::PullAsync(absl::Span<const int64_t> ids, float* rows,
                                              float* dense) {
  const int64_t step = !ids.empty() && dense != nullptr ? training_pulls_.fetch_add(1) + 1 : 0;
  return PullAtStepAsync(ids, rows, dense, step);
}

std::shared_ptr<PsFuture> PsClient::PullAtStepAsync(absl::Span<const int64_t> ids, float* rows,
                                                    float* dense, int64_t step) {
  std::vector<int32_t> order;
  std::vector<int64_t> bounds;
  absl::Status grouped = GroupByShard(ids, &order, &bounds);
  if (!grouped.ok()) return CompletedFuture(Annotate(grouped, "Pull"));
  auto op = std::make_shared<PullOp>();
  op->rows = rows;
  op->dense = dense;
  op->step = step;
  bool direct = false;  // a part for the local shard, answered by PullDirect below
  for (int s = 0; s < num_shards(); ++s) {
    const bool want_dense = dense != nullptr && dense_map_.PartitionSize(s) > 0;
    // BOUNDED / SYNC: every training pull asks shard 0, whose answer carries the job state
    // (checkpoint rounds: PsCheckpointer::Requested reads it instead of asking every step).
    const bool for_job = s == 0 && step > 0 && opt_.consistency != ASYNC;
    if (bounds[s] == bounds[s + 1] && !want_dense && !for_job) continue;
    if (s == direct_shard_) {
      direct = true;
      continue;
    }
    auto part = std::make_unique<PullOp::Part>();
    part->shard = s;
    part->positions.assign(order.begin() + bounds[s], order.begin() + bounds[s + 1]);
    std::string* packed = part->request.mutable_ids();
    packed->resize(part->positions.size() * sizeof(int64_t));
    char* out = &(*packed)[0];
    for (size_t j = 0; j < part->positions.size(); ++j) {
      std::memcpy(out + j * sizeof(int64_t), &ids[part->positions[j]], sizeof(int64_t));
    }
    part->request.set_want_dense(want_dense);
    part->request.set_worker_id(opt_.worker_id);
    part->request.set_step(step);
    op->parts.push_back(std::move(part));
  }
  if (op->parts.empty() && !direct) return CompletedFuture(absl::OkStatus());
  op->remaining = static_cast<int>(op->parts.size()) + (direct ? 1 : 0);
  OpStarted();
  for (const auto& part_ptr : op->parts) {
    PullOp::Part* part = part_ptr.get();
    StartCall(
        part->shard, "Pull", &part->request, &part->response, false, CallBudget(),
        [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const PullRequest* req,
           PullResponse* resp, std::function<void(grpc::Status)> cb) {
          stub->async()->Pull(ctx, req, resp, std::move(cb));
        },
        [this, op, part](absl::Status st) {
          const int dim = opt_.row_dim;
          const PullResponse& r = part->response;
          const std::string where =
              absl::StrCat("shard ", part->shard, " (", shards_[part->shard]->address, ")");
          const int64_t slice = dense_map_.PartitionSize(part->shard);
          if (st.ok() && r.rows().size() != part->positions.size() * dim * sizeof(float)) {
            st = absl::InternalError(absl::StrCat(where, ": Pull answered ", r.rows().size(),
                                                  " row bytes for ", part->positions.size(),
                                                  " rows of ", dim, " floats"));
          }
          if (st.ok() && !r.row_versions().empty() &&
              r.row_versions().size() != part->positions.size() * sizeof(uint32_t)) {
            st = absl::InternalError(absl::StrCat(where, ": Pull answered ",
                                                  r.row_versions().size(), " row version bytes for ",
                                                  part->positions.size(), " rows"));
          }
          if (st.ok() && part->request.want_dense() &&
              (r.dense().size() != slice * sizeof(float) ||
               r.dense_begin() != dense_map_.PartitionBegin(part->shard))) {
            st = absl::InternalError(absl::StrCat(where, ": Pull answered a dense slice of ",
                                                  r.dense().size() / sizeof(float), " floats at ",
                                                  r.dense_begin(), ", expected ", slice, " at ",
                                                  dense_map_.PartitionBegin(part->shard)));
          }
          if (st.ok()) {
            NoteIncarnation(part->shard, r.incarnation());
            if (r.has_job()) NoteJobState(r.incarnation(), r.job());
            const char* src = r.rows().data();
            const size_t row_bytes = dim * sizeof(float);
            for (size_t j = 0; j < part->positions.size(); ++j) {
              std::memcpy(op->rows + int64_t{part->positions[j]} * dim, src + j * row_bytes,
                          row_bytes);
            }
            if (part->request.want_dense()) {
              std::memcpy(op->dense + r.dense_begin(), r.dense().data(), r.dense().size());
              if (op->step > 0) pull_versions_.PulledDense(part->shard, op->step, r.dense_version());
            }
            if (op->step > 0 && !r.row_versions().empty()) {
              const std::string& packed = part->request.ids();
              uint64_t fingerprint = 0;
              for (size_t j = 0; j < part->positions.size(); ++j) {
                int64_t id;
                std::memcpy(&id, packed.data() + j * sizeof(int64_t), sizeof(id));
                fingerprint = PullVersions::Fingerprint(fingerprint, id);
              }
              std::vector<uint32_t> versions(part->positions.size());
              std::memcpy(versions.data(), r.row_versions().data(), r.row_versions().size());
              pull_versions_.PulledRows(part->shard, op->step, fingerprint, std::move(versions));
            }
          }
          const int64_t staleness = r.staleness();
          // Free the payloads early: the op lives until its last part is done.
          part->response.Clear();
          part->request.Clear();
          PullPartDone(op.get(), staleness, std::move(st));
        });
  }
  if (direct) {
    // The local shard's part, on this thread while the remote calls are in flight: its rows
    // through a scratch buffer (they go to the caller's positions), the dense slice in place.
    const int s = direct_shard_, dim = opt_.row_dim;
    const int64_t n = bounds[s + 1] - bounds[s];
    std::vector<int64_t> local_ids(n);
    std::vector<float> local_rows(n * dim);
    for (int64_t j = 0; j < n; ++j) local_ids[j] = ids[order[bounds[s] + j]];
    int64_t staleness = 0, dense_version = -1;
    const bool want_dense = dense != nullptr && dense_map_.PartitionSize(s) > 0;
    std::vector<uint32_t> versions(step > 0 && opt_.local_server->row_versions() ? n : 0);
    absl::Status st = Annotate(
        opt_.local_server->PullDirect(local_ids, step, local_rows.data(),
                                      want_dense ? dense + dense_map_.PartitionBegin(s) : nullptr,
                                      &staleness, &dense_version,
                                      versions.empty() ? nullptr : versions.data()),
        absl::StrCat("shard ", s, " (in this process)"));
    if (st.ok() && want_dense && step > 0) pull_versions_.PulledDense(s, step, dense_version);
    if (st.ok() && !versions.empty()) {
      uint64_t fingerprint = 0;
      for (int64_t id : local_ids) fingerprint = PullVersions::Fingerprint(fingerprint, id);
      pull_versions_.PulledRows(s, step, fingerprint, std::move(versions));
    }
    if (st.ok()) {
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(rows + int64_t{order[bounds[s] + j]} * dim, &local_rows[j * dim],
                    dim * sizeof(float));
      }
    }
    PullPartDone(op.get(), staleness, std::move(st));
  }
  return op->future;
}

void PsClient::PullPartDone(PullOp* op, int64_t staleness, absl::Status st) {
  if (st.ok()) {
    int64_t seen = op->staleness.load();
    while (staleness > seen && !op->staleness.compare_exchange_weak(seen, staleness)) {
    }
  }
  absl::Status status;
  if (!op->Done(std::move(st), &status)) return;
  if (status.ok() && op->step > 0) {
    absl::MutexLock lock(&staleness_mu_);
    const int64_t v = op->staleness.load();
    ++staleness_.pulls;
    staleness_.max = std::max(staleness_.max, v);
    staleness_.sum += static_cast<double>(v);
  }
  op->future->Complete(status);
  OpFinished();
}

std::shared_ptr<PsFuture> PsClient::PushAsync(absl::Span<const int64_t> ids, const float* row_grads,
                                              const float* dense_grad, int64_t step) {
  std::vector<int32_t> order;
  std::vector<int64_t> bounds;
  absl::Status grouped = GroupByShard(ids, &order, &bounds);
  if (!grouped.ok()) return CompletedFuture(Annotate(grouped, "Push"));
  auto op = std::make_shared<PushOp>();
  std::vector<std::shared_ptr<PushPart>> parts;
  const int dim = opt_.row_dim;
  bool direct = false;  // a part for the local shard, applied by PushDirect below
  for (int s = 0; s < num_shards(); ++s) {
    const int64_t slice = dense_grad != nullptr ? dense_map_.PartitionSize(s) : 0;
    const int64_t n = bounds[s + 1] - bounds[s];
    // BOUNDED / SYNC shards count every worker's every step: push to each, empty or not.
    if (n == 0 && slice == 0 && opt_.consistency == ASYNC) continue;
    if (s == direct_shard_) {
      direct = true;
      continue;
    }
    auto part = std::make_shared<PushPart>();
    part->op = op;
    part->shard = s;
    PushRequest& req = part->request;
    req.set_worker_id(opt_.worker_id);
    req.set_incarnation(incarnation_);
    req.set_step(step);
    std::string* packed_ids = req.mutable_ids();
    std::string* packed_grads = req.mutable_row_grads();
    packed_ids->resize(n * sizeof(int64_t));
    packed_grads->resize(n * dim * sizeof(float));
    char* id_out = &(*packed_ids)[0];
    char* grad_out = &(*packed_grads)[0];
    const size_t row_bytes = dim * sizeof(float);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t pos = order[bounds[s] + j];
      std::memcpy(id_out + j * sizeof(int64_t), &ids[pos], sizeof(int64_t));
      std::memcpy(grad_out + j * row_bytes, row_grads + int64_t{pos} * dim, row_bytes);
    }
    const std::vector<uint32_t> versions = RowVersionsForPush(s, step, ids, order, bounds);
    if (!versions.empty()) PackArray(versions.data(), n, req.mutable_row_versions());
    if (slice > 0) {
      PackArray(dense_grad + dense_map_.PartitionBegin(s), slice, req.mutable_dense_grad());
      if (const int64_t v = pull_versions_.DenseForPush(s, step); v >= 0) req.set_dense_version(v);
    }
    parts.push_back(std::move(part));
  }
  if (parts.empty() && !direct) return CompletedFuture(absl::OkStatus());
  op->remaining = static_cast<int>(parts.size()) + (direct ? 1 : 0);

  std::vector<std::shared_ptr<PushPart>> to_start;
  {
    absl::MutexLock lock(&mu_);
    while (pushes_in_flight_ >= opt_.max_pushes_in_flight && !shutting_down_) cv_.Wait(&mu_);
    if (shutting_down_) {
      return CompletedFuture(absl::CancelledError("Push: the PS client is shutting down"));
    }
    ++pushes_in_flight_;
    ++ops_in_flight_;
    const uint64_t sequence = ++next_sequence_;
    for (auto& part : parts) {
      part->request.set_sequence(sequence);
      Shard& shard = *shards_[part->shard];
      if (shard.push_busy) {
        shard.push_queue.push_back(std::move(part));
      } else {
        shard.push_busy = true;
        to_start.push_back(std::move(part));
      }
    }
  }
  for (auto& part : to_start) StartPushPart(std::move(part));
  if (direct) {
    // The local shard's part, applied on this thread while the remote pushes are in flight (in
    // call order, as the queue keeps them for the other shards).
    const int s = direct_shard_;
    const int64_t n = bounds[s + 1] - bounds[s];
    std::vector<int64_t> local_ids(n);
    std::vector<float> local_grads(n * dim);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t pos = order[bounds[s] + j];
      local_ids[j] = ids[pos];
      std::memcpy(&local_grads[j * dim], row_grads + int64_t{pos} * dim, dim * sizeof(float));
    }
    const std::vector<uint32_t> row_versions = RowVersionsForPush(s, step, ids, order, bounds);
    const float* local_dense = dense_grad != nullptr && dense_map_.PartitionSize(s) > 0
                                   ? dense_grad + dense_map_.PartitionBegin(s)
                                   : nullptr;
    const int64_t dense_version =
        local_dense != nullptr ? pull_versions_.DenseForPush(s, step) : -1;
    PushOpPartDone(op.get(),
                   Annotate(opt_.local_server->PushDirect(
                                opt_.worker_id, step, local_ids, local_grads.data(), local_dense,
                                dense_version, row_versions.empty() ? nullptr : row_versions.data()),
                            absl::StrCat("shard ", s, " (in this process)")));
  }
  return op->future;
}

std::vector<uint32_t> PsClient::RowVersionsForPush(int shard, int64_t step,
                                                   absl::Span<const int64_t> ids,
                                                   const std::vector<int32_t>& order,
                                                   const std::vector<int64_t>& bounds) {
  if (!pull_versions_.rows_seen() || bounds[shard] == bounds[shard + 1]) return {};
  uint64_t fingerprint = 0;
  for (int64_t j = bounds[shard]; j < bounds[shard + 1]; ++j) {
    fingerprint = PullVersions::Fingerprint(fingerprint, ids[order[j]]);
  }
  return pull_versions_.RowsForPush(shard, step, fingerprint);
}

void PsClient::PushOpPartDone(PushOp* op, absl::Status st) {
  absl::Status status;
  if (!op->Done(std::move(st), &status)) return;
  // Complete before Flush can return: a flushed push's future is done.
  op->future->Complete(status);
  {
    absl::MutexLock lock(&mu_);
    --pushes_in_flight_;
    if (!status.ok() && push_error_.ok()) push_error_ = status;
    cv_.SignalAll();
  }
  OpFinished();
}

void PsClient::StartPushPart(std::shared_ptr<PushPart> part) {
  PushPart* p = part.get();
  StartCall(
      p->shard, "Push", &p->request, &p->response, false, CallBudget(),
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const PushRequest* req,
         PushResponse* resp, std::function<void(grpc::Status)> cb) {
        stub->async()->Push(ctx, req, resp, std::move(cb));
      },
      [this, part = std::move(part)](absl::Status st) {
        if (st.ok()) NoteIncarnation(part->shard, part->response.incarnation());
        part->request.Clear();
        PushPartDone(part->shard);
        PushOpPartDone(part->op.get(), std::move(st));
      });
}

void PsClient::PushPartDone(int shard) {
  std::shared_ptr<PushPart> next;
  {
    absl::MutexLock lock(&mu_);
    Shard& s = *shards_[shard];
    if (s.push_queue.empty()) {
      s.push_busy = false;
      return;
    }
    next = std::move(s.push_queue.front());
    s.push_queue.pop_front();
  }
  StartPushPart(std::move(next));
}

absl::Status PsClient::Flush() {
  absl::MutexLock lock(&mu_);
  while (pushes_in_flight_ > 0) cv_.Wait(&mu_);
  return std::exchange(push_error_, absl::OkStatus());
}

absl::Status PsClient::FinishTraining() {
  RETURN_IF_ERROR(Flush());
  PushRequest done;
  done.set_worker_id(opt_.worker_id);
  done.set_incarnation(incarnation_);
  done.set_worker_done(true);
  std::vector<PushResponse> responses;
  return CallAllShards<PushRequest, PushResponse>(
      "Push(worker_done)", done, /*wait_for_ready=*/false, CallBudget(),
      [](ParameterServer::Stub* stub, grpc::ClientContext* ctx, const PushRequest* req,
         PushResponse* resp, std::function<void(grpc::Status)> cb) {
        stub->async()->Push(ctx, req, resp, std::move(cb));
      },
      &responses);
}

void PsClient::NoteJobState(uint64_t incarnation, const JobState& job) {
  absl::MutexLock lock(&job_mu_);
  // Answers may complete out of order: keep the newest (versions grow within one incarnation of
  // shard 0; a restarted shard 0 starts over).
  if (incarnation != job_incarnation_ || job.version() > job_.version()) {
    job_incarnation_ = incarnation;
    job_ = job;
  }
}

JobState PsClient::job_state() const {
  absl::MutexLock lock(&job_mu_);
  return job_;
}

PsClient::Staleness PsClient::staleness() const {
  absl::MutexLock lock(&staleness_mu_);
  return staleness_;
}

PsClient::Traffic PsClient::traffic() const {
  Traffic t;
  t.rpcs = rpcs_.load();
  t.retries = retries_.load();
  t.bytes_sent = bytes_sent_.load();
  t.bytes_received = bytes_received_.load();
  return t;
}

std::string FormatShardBalance(const std::vector<ShardStats>& stats) {
  std::string out =
      absl::StrFormat("%-6s %12s %12s %10s %10s %10s %10s %10s %14s %14s", "shard",
                      "rows_owned", "rows_trained", "memory_MB", "pull_qps", "push_qps", "in_MB",
                      "out_MB", "dense_tau_avg", "row_tau_avg");
  // Staleness columns: mean (max) over the pushes that named their versions, "-" for none.
  auto tau = [](int64_t n, double mean, int64_t max) {
    return n > 0 ? absl::StrFormat("%.2f (max %d)", mean, max) : std::string("-");
  };
  for (const ShardStats& s : stats) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "\n%-6d %12d %12d %10.1f %10.1f %10.1f %10.1f %10.1f %14s %14s", s.shard(),
                  s.rows_owned(), s.rows_initialized(), s.bytes() / 1e6, s.pull_qps(),
                  s.push_qps(), s.bytes_in() / 1e6, s.bytes_out() / 1e6,
                  tau(s.dense_versioned_pushes(), s.dense_staleness_mean(), s.dense_staleness_max()),
                  tau(s.row_versioned_updates(), s.row_staleness_mean(), s.row_staleness_max())));
  }
  // max/mean: 1.0 is perfect balance; S means one shard does everything.
  auto imbalance = [&](auto field) {
    double max = 0, sum = 0;
    for (const ShardStats& s : stats) {
      const double v = static_cast<double>(field(s));
      max = std::max(max, v);
      sum += v;
    }
    return sum > 0 ? max * stats.size() / sum : 1.0;
  };
  absl::StrAppend(
      &out,
      absl::StrFormat("\nmax/mean imbalance: rows_owned %.3f  rows_trained %.3f  memory %.3f  "
                      "pulled_rows %.3f  bytes_in %.3f  bytes_out %.3f",
                      imbalance([](const ShardStats& s) { return s.rows_owned(); }),
                      imbalance([](const ShardStats& s) { return s.rows_initialized(); }),
                      imbalance([](const ShardStats& s) { return s.bytes(); }),
                      imbalance([](const ShardStats& s) { return s.pull_rows(); }),
                      imbalance([](const ShardStats& s) { return s.bytes_in(); }),
                      imbalance([](const ShardStats& s) { return s.bytes_out(); })));
  return out;
}

}  // namespace pstrain
