#include "worker/ps_client/ps_client.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/rpc/callback_queue.h"
#include "common/rpc/security.h"
#include "common/rpc/timer.h"
#include "common/rpc/wire.h"
#include "common/status.h"

namespace pstrain {

// The parts of one pull or push (one per shard) and the first error among them.
struct PsClient::Parts {
  std::shared_ptr<PsFuture> future = std::make_shared<PsFuture>();
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
  float* rows = nullptr;
  int64_t step = 0;
  std::atomic<int64_t> staleness{0};  // max over the parts
  std::vector<int> shards;            // the shard of each part
  std::vector<std::vector<int32_t>> positions;  // per part: the caller's index of each row
  std::vector<PullPart> parts;
};

struct PsClient::PushOp : Parts {
  std::vector<int> shards;  // the shard of each part
  std::vector<PushPart> parts;
};

namespace {

int DefaultPartitions(const PsClient::Options& o) {
  return o.partitions > 0 ? o.partitions
                          : NumPartitions(ClusterConfig(), static_cast<int>(o.shards.size()));
}

uint64_t RandomIncarnation(Env* env) {
  std::random_device rd;
  return SplitMix64((uint64_t{rd()} << 32 ^ rd()) ^
                    static_cast<uint64_t>(absl::ToUnixNanos(env->Now())));
}

}  // namespace

PsClient::PsClient(Options options)
    : opt_(std::move(options)),
      router_(opt_.rows, DefaultPartitions(opt_), static_cast<int>(opt_.shards.size()),
              opt_.dense_size, opt_.table_splits, opt_.dynamic_row_dims),
      compact_(std::any_of(opt_.table_splits.begin(), opt_.table_splits.end(),
                           [this](const PartitionMap::TableSplit& t) {
                             return t.row_dim > 0 && t.row_dim < opt_.row_dim;
                           })),
      env_(opt_.env != nullptr ? opt_.env : Env::Default()),
      incarnation_(RandomIncarnation(env_)),
      pull_versions_(static_cast<int>(opt_.shards.size())),
      incarnations_(new std::atomic<uint64_t>[opt_.shards.size()]) {
  for (int s = 0; s < num_shards(); ++s) incarnations_[s] = 0;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(Options o) {
  RETURN_IF_ERROR(o.Validate());
  // The calls' completions run on gRPC's callback queue; it must outlive every channel whatever
  // thread releases the last one (common/rpc/callback_queue.h).
  HoldCallbackQueue();
  std::unique_ptr<PsClient> c(new PsClient(std::move(o)));
  const Options& opt = c->opt_;
  c->timer_ = std::make_unique<Timer>(c->env_);
  ShardConnections sc;
  sc.addresses = opt.shards;
  sc.security = opt.security;
  sc.policy.attempt_timeout = absl::Milliseconds(opt.rpc_deadline_ms);
  sc.policy.budget = c->CallBudget();
  sc.policy.max_attempts = opt.rpc_retries + 1;
  sc.policy.initial_backoff = absl::Milliseconds(opt.initial_backoff_ms);
  sc.policy.max_backoff = absl::Milliseconds(opt.max_backoff_ms);
  sc.policy.jitter = 0.5;  // backoffs in [50%, 100%], so that workers retrying together spread
  sc.timer = c->timer_.get();
  sc.env = c->env_;
  sc.seed = c->incarnation_;
  sc.row_dim = opt.row_dim;
  sc.router = &c->router_;
  sc.local_shard = opt.local_shard;
  sc.local = opt.local_server;
  // ASYNC only: BOUNDED / SYNC shards hold pulls and count pushes through their service.
  sc.direct = opt.consistency == ASYNC;
  ASSIGN_OR_RETURN(c->shards_, ConnectShards(sc));
  return c;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(
    Options o, std::vector<std::unique_ptr<ShardEndpoint>> shards) {
  RETURN_IF_ERROR(o.Validate());
  if (shards.size() != o.shards.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PsClient: ", shards.size(),
                                                   " endpoints for ", o.shards.size(), " shards"));
  }
  std::unique_ptr<PsClient> c(new PsClient(std::move(o)));
  c->timer_ = std::make_unique<Timer>(c->env_);
  c->shards_ = std::move(shards);
  return c;
}

PsClient::~PsClient() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    cv_.SignalAll();
  }
  for (auto& shard : shards_) shard->Shutdown();
  timer_->Stop();
  {
    absl::MutexLock lock(&mu_);
    while (ops_in_flight_ > 0) cv_.Wait(&mu_);
  }
  shards_.clear();
  timer_.reset();
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

template <typename Req, typename Resp, typename Call>
absl::Status PsClient::CallAllShards(const Req& request, std::vector<Resp>* responses,
                                     Call call) {
  const int S = num_shards();
  struct State : Parts {
    std::vector<Req> requests;
  };
  auto state = std::make_shared<State>();
  state->requests.assign(S, request);
  state->remaining = S;
  responses->assign(S, Resp());
  OpStarted();
  for (int s = 0; s < S; ++s) {
    call(s, &state->requests[s], &(*responses)[s], [state](absl::Status st) {
      absl::Status final;
      if (state->Done(std::move(st), &final)) state->future->Complete(final);
    });
  }
  const absl::Status status = state->future->Wait();
  OpFinished();
  return status;
}

void PsClient::Abort(absl::Status reason) {
  {
    absl::MutexLock lock(&mu_);
    if (!abort_.ok()) return;
    abort_ = reason;
  }
  for (auto& shard : shards_) shard->Abort(reason);
}

absl::Status PsClient::aborted() const {
  absl::MutexLock lock(&mu_);
  return abort_;
}

absl::Status PsClient::WaitForShards(absl::Duration timeout) {
  std::vector<InfoResponse> infos;
  InfoRequest request;
  request.set_worker_id(opt_.worker_id);
  RETURN_IF_ERROR(CallAllShards(request, &infos, [&](int s, const InfoRequest* req,
                                                     InfoResponse* resp, ShardDone done) {
    shards_[s]->Info(req, resp, /*wait_for_ready=*/true, timeout, std::move(done));
  }));
  for (int s = 0; s < num_shards(); ++s) {
    const InfoResponse& info = infos[s];
    RETURN_IF_ERROR(router_.CheckShard(s, opt_.shards[s], info, opt_.row_dim, opt_.worker_id));
    NoteIncarnation(s, info.incarnation());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ShardStats>> PsClient::GetStats() {
  std::vector<ShardStats> stats;
  RETURN_IF_ERROR(CallAllShards(StatsRequest(), &stats, [&](int s, const StatsRequest* req,
                                                            ShardStats* resp, ShardDone done) {
    shards_[s]->Stats(req, resp, CallBudget(), std::move(done));
  }));
  return stats;
}

void PsClient::NoteIncarnation(int shard, uint64_t incarnation) {
  if (incarnation == 0) return;  // not told (the in-process path)
  const uint64_t before = incarnations_[shard].exchange(incarnation);
  if (before != 0 && before != incarnation) {
    shard_restarts_.fetch_add(1);
    PSTRAIN_LOG(WARNING) << "shard " << shard << " (" << opt_.shards[shard]
                         << ") restarted: unless it restored a checkpoint, its rows and dense "
                            "slice are back at their initial values";
  }
}

std::vector<size_t> PsClient::RemoteFirst(const std::vector<int>& shards) const {
  std::vector<size_t> order;
  order.reserve(shards.size());
  for (size_t k = 0; k < shards.size(); ++k) {
    if (shards[k] != opt_.local_shard) order.push_back(k);
  }
  for (size_t k = 0; k < shards.size(); ++k) {
    if (shards[k] == opt_.local_shard) order.push_back(k);
  }
  return order;
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
  absl::Status grouped = router_.GroupByShard(ids, &order, &bounds);
  if (!grouped.ok()) return PsFuture::Completed(Annotate(grouped, "Pull"));
  auto op = std::make_shared<PullOp>();
  op->rows = rows;
  op->step = step;
  for (int s = 0; s < num_shards(); ++s) {
    const bool want_dense = dense != nullptr && router_.dense_size(s) > 0;
    // BOUNDED / SYNC: every training pull asks shard 0, whose answer carries the job state
    // (checkpoint rounds: PsJob::CheckpointRequested reads it instead of asking every step).
    const bool for_job = s == 0 && step > 0 && opt_.consistency != ASYNC;
    if (bounds[s] == bounds[s + 1] && !want_dense && !for_job) continue;
    op->shards.push_back(s);
    op->positions.emplace_back(order.begin() + bounds[s], order.begin() + bounds[s + 1]);
  }
  if (op->shards.empty()) return PsFuture::Completed(absl::OkStatus());
  op->parts.resize(op->shards.size());
  for (size_t k = 0; k < op->shards.size(); ++k) {
    const int s = op->shards[k];
    PullPart& part = op->parts[k];
    const std::vector<int32_t>& positions = op->positions[k];
    std::string* packed = part.request.mutable_ids();
    packed->resize(positions.size() * sizeof(int64_t));
    char* out = &(*packed)[0];
    for (size_t j = 0; j < positions.size(); ++j) {
      std::memcpy(out + j * sizeof(int64_t), &ids[positions[j]], sizeof(int64_t));
    }
    const bool want_dense = dense != nullptr && router_.dense_size(s) > 0;
    part.request.set_want_dense(want_dense);
    part.request.set_worker_id(opt_.worker_id);
    part.request.set_step(step);
    if (want_dense) part.dense_out = dense + router_.dense_begin(s);
  }
  op->remaining = static_cast<int>(op->parts.size());
  OpStarted();
  for (size_t k : RemoteFirst(op->shards)) {
    shards_[op->shards[k]]->Pull(&op->parts[k], [this, op, k](absl::Status st) {
      PullPartDone(op.get(), static_cast<int>(k), std::move(st));
    });
  }
  return op->future;
}

void PsClient::PullPartDone(PullOp* op, int k, absl::Status st) {
  PullPart& part = op->parts[k];
  const int s = op->shards[k];
  // Each row's width (its table's, compact widths), looked up once: the size check and the copy
  // both need it.
  std::vector<int> widths;
  if (st.ok()) {
    NoteIncarnation(s, part.incarnation);
    if (part.job != nullptr) NoteJobState(part.incarnation, *part.job);
    const std::vector<int32_t>& positions = op->positions[k];
    // Each row came at its table's width (compact widths): spread to the stride, zeros after.
    const char* ids = part.request.ids().data();
    widths.resize(positions.size());
    int64_t want = 0;
    for (size_t j = 0; j < positions.size(); ++j) {
      int64_t id;
      std::memcpy(&id, ids + j * sizeof(int64_t), sizeof(id));
      widths[j] = RowWidthOf(id);
      want += widths[j] * sizeof(float);
    }
    if (part.rows_bytes >= 0 && part.rows_bytes != want) {
      st = absl::InternalError(absl::StrCat(
          shards_[s]->name(), ": Pull answered ", part.rows_bytes, " row bytes for ",
          positions.size(), " rows, expected ", want, " (each row at its table's width)"));
    }
  }
  if (st.ok()) {
    const std::vector<int32_t>& positions = op->positions[k];
    const int dim = opt_.row_dim;
    const char* in = part.rows;
    for (size_t j = 0; j < positions.size(); ++j) {
      const int width = widths[j];
      float* out = op->rows + int64_t{positions[j]} * dim;
      std::memcpy(out, in, width * sizeof(float));
      std::fill(out + width, out + dim, 0.f);
      in += width * sizeof(float);
    }
    if (op->step > 0 && part.request.want_dense()) {
      pull_versions_.PulledDense(s, op->step, part.dense_version);
    }
    if (op->step > 0 && part.row_versions != nullptr) {
      pull_versions_.PulledRows(s, op->step, part.request.ids(), part.row_versions);
    }
    int64_t seen = op->staleness.load();
    while (part.staleness > seen && !op->staleness.compare_exchange_weak(seen, part.staleness)) {
    }
  }
  // Free the payloads early: the op lives until its last part is done.
  part = PullPart();
  absl::Status status;
  if (!op->Done(std::move(st), &status)) return;
  if (status.ok() && op->step > 0) {
    absl::MutexLock lock(&mu_);
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
  absl::Status grouped = router_.GroupByShard(ids, &order, &bounds);
  if (!grouped.ok()) return PsFuture::Completed(Annotate(grouped, "Push"));
  auto op = std::make_shared<PushOp>();
  const int dim = opt_.row_dim;
  std::vector<int> widths;  // a part's rows' widths, looked up once (sizing and packing need it)
  for (int s = 0; s < num_shards(); ++s) {
    const int64_t slice = dense_grad != nullptr ? router_.dense_size(s) : 0;
    const int64_t n = bounds[s + 1] - bounds[s];
    // BOUNDED / SYNC shards count every worker's every step: push to each, empty or not.
    if (n == 0 && slice == 0 && opt_.consistency == ASYNC) continue;
    op->shards.push_back(s);
  }
  if (op->shards.empty()) return PsFuture::Completed(absl::OkStatus());
  op->parts.resize(op->shards.size());
  for (size_t k = 0; k < op->shards.size(); ++k) {
    const int s = op->shards[k];
    const int64_t slice = dense_grad != nullptr ? router_.dense_size(s) : 0;
    const int64_t n = bounds[s + 1] - bounds[s];
    PushPart& part = op->parts[k];
    PushRequest& req = part.request;
    req.set_worker_id(opt_.worker_id);
    req.set_incarnation(incarnation_);
    req.set_step(step);
    std::string* packed_ids = req.mutable_ids();
    std::string* packed_grads = req.mutable_row_grads();
    packed_ids->resize(n * sizeof(int64_t));
    // Each row at its table's width (compact widths): its gradient's first floats only.
    widths.resize(n);
    int64_t floats = 0;
    for (int64_t j = 0; j < n; ++j) {
      widths[j] = RowWidthOf(ids[order[bounds[s] + j]]);
      floats += widths[j];
    }
    packed_grads->resize(floats * sizeof(float));
    char* id_out = &(*packed_ids)[0];
    char* grad_out = &(*packed_grads)[0];
    for (int64_t j = 0; j < n; ++j) {
      const int32_t pos = order[bounds[s] + j];
      const size_t row_bytes = widths[j] * sizeof(float);
      std::memcpy(id_out + j * sizeof(int64_t), &ids[pos], sizeof(int64_t));
      std::memcpy(grad_out, row_grads + int64_t{pos} * dim, row_bytes);
      grad_out += row_bytes;
    }
    const std::vector<uint32_t> versions = pull_versions_.RowsForPush(
        s, step, ids, absl::MakeConstSpan(order).subspan(bounds[s], n));
    if (!versions.empty()) PackArray(versions.data(), n, req.mutable_row_versions());
    if (slice > 0) {
      part.dense_grad = dense_grad + router_.dense_begin(s);
      part.dense_len = slice;
      if (const int64_t v = pull_versions_.DenseForPush(s, step); v >= 0) req.set_dense_version(v);
    }
  }
  op->remaining = static_cast<int>(op->parts.size());

  // One sequence per push, its tickets taken in sequence order on every shard it goes to (the
  // shards apply one client's pushes in order); sent outside the lock.
  std::vector<uint64_t> tickets(op->parts.size());
  {
    absl::MutexLock lock(&mu_);
    while (pushes_in_flight_ >= opt_.max_pushes_in_flight && !shutting_down_) cv_.Wait(&mu_);
    if (shutting_down_) {
      return PsFuture::Completed(absl::CancelledError("Push: the PS client is shutting down"));
    }
    ++pushes_in_flight_;
    ++ops_in_flight_;
    const uint64_t sequence = ++next_sequence_;
    for (size_t k = 0; k < op->parts.size(); ++k) {
      op->parts[k].request.set_sequence(sequence);
      tickets[k] = shards_[op->shards[k]]->ReservePush();
    }
  }
  // Remote parts are queued (copying the dense slice) and in-process ones applied here; either
  // way the caller's buffers are free once this returns.
  for (size_t k : RemoteFirst(op->shards)) {
    shards_[op->shards[k]]->Push(tickets[k], &op->parts[k], [this, op, k](absl::Status st) {
      PushPartDone(op.get(), static_cast<int>(k), std::move(st));
    });
  }
  return op->future;
}

void PsClient::PushPartDone(PushOp* op, int k, absl::Status st) {
  if (st.ok()) NoteIncarnation(op->shards[k], op->parts[k].incarnation);
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
  return CallAllShards(done, &responses, [&](int s, const PushRequest* req, PushResponse* resp,
                                             ShardDone done) {
    shards_[s]->PushOutOfOrder(req, resp, CallBudget(), std::move(done));
  });
}

void PsClient::NoteJobState(uint64_t incarnation, const JobState& job) {
  absl::MutexLock lock(&mu_);
  // Answers may complete out of order: keep the newest (versions grow within one incarnation of
  // shard 0; a restarted shard 0 starts over).
  if (incarnation != job_incarnation_ || job.version() > job_.version()) {
    job_incarnation_ = incarnation;
    job_ = job;
  }
}

JobState PsClient::job_state() const {
  absl::MutexLock lock(&mu_);
  return job_;
}

PsClient::Staleness PsClient::staleness() const {
  absl::MutexLock lock(&mu_);
  return staleness_;
}

PsClient::Traffic PsClient::traffic() const {
  Traffic t;
  for (const auto& shard : shards_) {
    const ShardTraffic s = shard->traffic();
    t.rpcs += s.rpcs;
    t.retries += s.retries;
    t.bytes_sent += s.bytes_sent;
    t.bytes_received += s.bytes_received;
  }
  return t;
}

}  // namespace pstrain
