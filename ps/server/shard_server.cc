#include "ps/server/shard_server.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/wire.h"
#include "common/status.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

// A training pull in BOUNDED / SYNC mode: held in ShardServer::held_ until it may be answered.
// Exactly one of the push that releases it, its cancellation, its expiry and Shutdown takes it
// off the list (under sync_mu_) and finishes it; gRPC deletes it in OnDone, which comes after
// Finish and after OnCancel has returned.
class ShardServer::DeferredPull final : public grpc::ServerUnaryReactor {
 public:
  DeferredPull(ShardServer* shard, const PullRequest* request, PullResponse* response)
      : shard_(shard), request_(request), response_(response), since_(absl::Now()) {}

  void OnCancel() override {
    uint64_t id;
    {
      absl::MutexLock lock(&shard_->sync_mu_);
      id = id_;
    }
    if (id != 0) {
      shard_->DropHeld(id, grpc::Status(grpc::StatusCode::CANCELLED, "pull cancelled"), false);
    }
  }
  void OnDone() override { delete this; }

  ShardServer* const shard_;
  const PullRequest* const request_;
  PullResponse* const response_;
  const absl::Time since_;
  uint64_t id_ = 0;  // guarded by shard_->sync_mu_; 0 = not held
};

// Each handler but a held pull's finishes its reactor before returning: the work is CPU-bound
// and short.
class ShardServer::Service final : public ParameterServer::CallbackService {
 public:
  explicit Service(ShardServer* shard) : shard_(shard) {}

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest* request,
                                 PullResponse* response) override {
    if (shard_->opt_.consistency == ASYNC || request->step() <= 0) {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(shard_->Pull(*request, response)));
      return reactor;
    }
    auto* pull = new DeferredPull(shard_, request, response);
    shard_->HoldOrAnswer(pull, absl::FromChrono(ctx->deadline()));
    return pull;
  }
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const PushRequest* request,
                                 PushResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(shard_->Push(*request, response)));
    return reactor;
  }
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const InfoRequest*,
                                 InfoResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    *response = shard_->Info();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest*,
                                  ShardStats* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    *response = shard_->Stats();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx, const ReportRequest* request,
                                   ReportResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    shard_->Report(*request);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Coordinate(grpc::CallbackServerContext* ctx,
                                       const CoordinateRequest* request,
                                       CoordinateResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(shard_->Coordinate(*request, response)));
    return reactor;
  }
  // COPY is a memory copy and runs on the gRPC thread; WRITE does file I/O for seconds, so it
  // runs on its own thread and finishes the reactor from there.
  grpc::ServerUnaryReactor* SaveShard(grpc::CallbackServerContext* ctx,
                                      const SaveShardRequest* request,
                                      SaveShardResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (request->phase() == SaveShardRequest::COPY) {
      auto rows = shard_->CopyForCheckpoint(request->round());
      if (rows.ok()) response->set_rows(*rows);
      reactor->Finish(ToGrpcStatus(rows.status()));
    } else if (request->phase() == SaveShardRequest::WRITE) {
      std::thread([shard = shard_, request, response, reactor] {
        auto r = shard->WriteCheckpoint(request->round(), request->dir());
        if (r.ok()) *response = *r;
        reactor->Finish(ToGrpcStatus(r.status()));
      }).detach();
    } else {
      reactor->Finish(ToGrpcStatus(
          absl::InvalidArgumentError("SaveShard: phase must be COPY or WRITE")));
    }
    return reactor;
  }

 private:
  ShardServer* const shard_;
};

namespace {

uint64_t RandomIncarnation() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 ^ rd()) ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

}  // namespace

ShardServer::ShardServer(Options options)
    : opt_(std::move(options)),
      map_(opt_.rows, opt_.partitions, opt_.num_shards),
      incarnation_(RandomIncarnation()),
      start_time_(absl::Now()) {}

ShardServer::Options ShardServer::OptionsFromConfig(const Config& config, int shard, int num_shards,
                                                    int64_t rows, int row_dim, int64_t dense_size) {
  Options o;
  o.shard = shard;
  o.num_shards = num_shards;
  o.rows = rows;
  o.partitions = NumPartitions(config.cluster(), num_shards);
  o.row_dim = row_dim;
  o.dense_size = dense_size;
  o.sparse_optimizer = config.sparse_optimizer();
  o.dense_optimizer = config.dense_optimizer();
  o.consistency = config.cluster().consistency();
  o.num_workers = num_shards;
  o.staleness = config.cluster().staleness();
  return o;
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Create(Options options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " of ",
                                                   options.num_shards,
                                                   ": need 0 <= shard < "
                                                   "num_shards"));
  }
  if (options.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rows must be > 0, got ", options.rows));
  }
  if (options.partitions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("partitions must be > 0, got ", options.partitions));
  }
  if (options.row_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("row_dim must be > 0, got ", options.row_dim));
  }
  if (options.dense_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_size must be >= 0, got ", options.dense_size));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be > 0, got ", options.num_workers));
  }
  if (options.consistency == BOUNDED && options.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BOUNDED consistency needs staleness >= 0, got ", options.staleness));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> sparse_opt,
                   Optimizer::Create(options.sparse_optimizer));
  ASSIGN_OR_RETURN(std::shared_ptr<const Optimizer> dense_opt,
                   Optimizer::Create(options.dense_optimizer));

  std::unique_ptr<ShardServer> s(new ShardServer(std::move(options)));
  const Options& o = s->opt_;
  for (int p : s->map_.PartitionsOfShard(o.shard)) {
    if (s->map_.PartitionSize(p) == 0) break;  // V < P: the trailing partitions are empty
    EmbeddingStore::Options eo;
    eo.begin = s->map_.PartitionBegin(p);
    eo.end = s->map_.PartitionBegin(p + 1);
    eo.dim = o.row_dim;
    eo.optimizer = sparse_opt;
    eo.row_init = o.row_init;
    eo.threads = o.threads;
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> store, EmbeddingStore::Create(std::move(eo)));
    s->stores_.push_back(std::move(store));
  }
  const PartitionMap dense_map(o.dense_size, o.num_shards, o.num_shards);
  s->dense_begin_ = dense_map.PartitionBegin(o.shard);
  s->dense_slice_size_ = dense_map.PartitionSize(o.shard);
  if (s->dense_slice_size_ > 0) {
    DenseStore::Options d;
    d.begin = s->dense_begin_;
    d.size = s->dense_slice_size_;
    d.optimizer = dense_opt;
    d.threads = o.threads;
    ASSIGN_OR_RETURN(s->dense_, DenseStore::Create(std::move(d)));
    if (o.dense_init) {
      std::vector<float> full(o.dense_size);
      o.dense_init(full.data());
      s->dense_->Set(full.data() + s->dense_begin_);
    }
  }
  {
    absl::MutexLock lock(&s->sync_mu_);
    s->pushed_.assign(o.num_workers, 0);
    s->done_.assign(o.num_workers, false);
  }
  if (o.consistency != ASYNC) s->timer_ = std::make_unique<Timer>();
  s->service_ = std::make_unique<Service>(s.get());
  return s;
}

ShardServer::~ShardServer() {
  Shutdown(absl::ZeroDuration());
  timer_.reset();  // runs the pending expiries now; they find nothing held
  absl::MutexLock lock(&server_mu_);
  server_.reset();  // before service_, which it references
}

absl::Status ShardServer::Start(const std::string& address) {
  absl::MutexLock lock(&server_mu_);
  if (server_ != nullptr || shut_down_) {
    return absl::FailedPreconditionError("ShardServer::Start called twice");
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(-1);  // a pull of 100k rows is several MB
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("shard ", opt_.shard, ": cannot listen on ", address,
                     " (address in use, or not an address of this host)"));
  }
  port_ = port;
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr) return nullptr;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return server_->InProcessChannel(args);
}

void ShardServer::Shutdown(absl::Duration grace) {
  std::vector<DeferredPull*> held;
  {
    absl::MutexLock lock(&sync_mu_);
    holding_stopped_ = true;
    for (auto& [id, pull] : held_) held.push_back(pull);
    held_.clear();
  }
  for (DeferredPull* pull : held) {
    pull->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("shard ", opt_.shard, " is shutting down")));
  }
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

absl::Status ShardServer::Route(absl::Span<const int64_t> ids, std::vector<Run>* runs) const {
  runs->clear();
  const int S = opt_.num_shards;
  for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) {
    const int64_t id = ids[i];
    // Ids usually come grouped by partition (PsClient sorts them so): extend the current run
    // without a division when the id is in the same store.
    if (!runs->empty() && stores_[runs->back().store]->Owns(id)) {
      runs->back().end = i + 1;
      continue;
    }
    if (id < 0 || id >= map_.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": row ", id, " is outside the table [0, ", map_.rows(), ")"));
    }
    const int p = map_.PartitionOf(id);
    if (map_.ShardOfPartition(p) != opt_.shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", opt_.shard, ": row ", id, " is owned by shard ", map_.ShardOfPartition(p),
          " (partition ", p, " of ", map_.partitions(), "), not by this shard"));
    }
    runs->push_back(Run{p / S, i, i + 1});
  }
  return absl::OkStatus();
}

absl::Status ShardServer::Pull(const PullRequest& request, PullResponse* response) {
  if (request.step() > 0) {
    absl::MutexLock lock(&sync_mu_);
    response->set_staleness(StalenessLocked(request.step()));
  }
  return Gather(request, response);
}

absl::Status ShardServer::GatherInto(absl::Span<const int64_t> ids, float* rows, float* dense) {
  pull_requests_.fetch_add(1, std::memory_order_relaxed);
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));
  const int dim = opt_.row_dim;
  for (const Run& r : runs) {
    RETURN_IF_ERROR(
        stores_[r.store]->Gather(ids.subspan(r.begin, r.end - r.begin), rows + r.begin * dim));
  }
  if (dense != nullptr && dense_ != nullptr) dense_->Get(dense);
  pull_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ShardServer::Gather(const PullRequest& request, PullResponse* response) {
  bytes_in_.fetch_add(request.ByteSizeLong(), std::memory_order_relaxed);
  std::vector<int64_t> id_scratch;
  absl::Span<const int64_t> ids;
  RETURN_IF_ERROR(UnpackArray(request.ids(), "PullRequest.ids", &id_scratch, &ids));
  // Gather straight into the response bytes when they are float-aligned (heap storage is): the
  // dense slice is megabytes, copied on every pull.
  auto view = [](std::string* bytes, size_t floats, std::vector<float>* scratch) {
    bytes->resize(floats * sizeof(float));
    if (reinterpret_cast<uintptr_t>(bytes->data()) % alignof(float) == 0) {
      return reinterpret_cast<float*>(&(*bytes)[0]);
    }
    scratch->resize(floats);
    return scratch->data();
  };
  std::vector<float> row_scratch, dense_scratch;
  std::string* rows = response->mutable_rows();
  float* rows_out = view(rows, ids.size() * opt_.row_dim, &row_scratch);
  const bool want_dense = request.want_dense() && dense_ != nullptr;
  float* dense_out =
      want_dense ? view(response->mutable_dense(), dense_slice_size_, &dense_scratch) : nullptr;
  RETURN_IF_ERROR(GatherInto(ids, rows_out, dense_out));
  if (!row_scratch.empty()) PackArray(row_scratch.data(), row_scratch.size(), rows);
  if (!dense_scratch.empty()) {
    PackArray(dense_scratch.data(), dense_scratch.size(), response->mutable_dense());
  }
  response->set_dense_begin(dense_begin_);
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  bytes_out_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ShardServer::PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows,
                                     float* dense, int64_t* staleness) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PullDirect: only for ASYNC shards");
  }
  {
    absl::MutexLock lock(&sync_mu_);
    *staleness = step > 0 ? StalenessLocked(step) : 0;
  }
  return GatherInto(ids, rows, dense);
}

absl::Status ShardServer::PushDirect(int32_t worker_id, int64_t step,
                                     absl::Span<const int64_t> ids, const float* row_grads,
                                     const float* dense_grad) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PushDirect: only for ASYNC shards");
  }
  push_requests_.fetch_add(1, std::memory_order_relaxed);
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));
  return ApplyUpdate(ids, runs, row_grads, dense_grad, worker_id, step);
}

absl::Status ShardServer::ApplyUpdate(absl::Span<const int64_t> ids, const std::vector<Run>& runs,
                                      const float* grads, const float* dense_grad,
                                      int32_t worker_id, int64_t step) {
  const int dim = opt_.row_dim;
  for (const Run& r : runs) {
    RETURN_IF_ERROR(stores_[r.store]->Apply(ids.subspan(r.begin, r.end - r.begin),
                                            grads + r.begin * dim, step));
  }
  if (dense_grad != nullptr && dense_ != nullptr) dense_->Apply(dense_grad, step);
  push_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  if (Tracked(worker_id)) {
    absl::MutexLock sync_lock(&sync_mu_);
    int64_t& pushed = pushed_[worker_id];
    pushed = std::max(pushed, step);
  }
  if (opt_.consistency == BOUNDED) ReleaseReady();
  return absl::OkStatus();
}

ShardServer::PushState* ShardServer::PushStateOf(int32_t worker_id, uint64_t incarnation) {
  absl::MutexLock lock(&push_mu_);
  std::unique_ptr<PushState>& s = push_states_[{worker_id, incarnation}];
  if (s == nullptr) s = std::make_unique<PushState>();
  return s.get();
}

absl::Status ShardServer::Push(const PushRequest& request, PushResponse* response) {
  push_requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(request.ByteSizeLong(), std::memory_order_relaxed);
  if (opt_.consistency != ASYNC && !Tracked(request.worker_id())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.shard, ": push from worker ", request.worker_id(), ", but this ",
        Consistency_Name(opt_.consistency), " job has workers [0, ", opt_.num_workers, ")"));
  }
  if (request.worker_done()) return MarkDone(request, response);
  std::vector<int64_t> id_scratch;
  std::vector<float> grad_scratch, dense_scratch;
  absl::Span<const int64_t> ids;
  absl::Span<const float> grads, dense_grad;
  RETURN_IF_ERROR(UnpackArray(request.ids(), "PushRequest.ids", &id_scratch, &ids));
  RETURN_IF_ERROR(UnpackArray(request.row_grads(), "PushRequest.row_grads", &grad_scratch, &grads));
  RETURN_IF_ERROR(
      UnpackArray(request.dense_grad(), "PushRequest.dense_grad", &dense_scratch, &dense_grad));
  const int dim = opt_.row_dim;
  if (grads.size() != ids.size() * dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": push of ", ids.size(), " rows carries ", grads.size(),
                     " gradient floats, expected ", ids.size() * dim, " (row_dim ", dim, ")"));
  }
  if (!dense_grad.empty() && static_cast<int64_t>(dense_grad.size()) != dense_slice_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": dense gradient of ", dense_grad.size(),
                     " floats, but this shard's dense slice has ", dense_slice_size_));
  }
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));

  PushState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  if (request.sequence() != 0) {
    state = PushStateOf(request.worker_id(), request.incarnation());
    lock = std::unique_lock<std::mutex>(state->mu);
    if (request.sequence() <= state->last_sequence) {
      duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
      response->set_duplicate(true);
      response->set_last_step(LastStep());
      response->set_incarnation(incarnation_);
      return absl::OkStatus();
    }
  }
  if (opt_.consistency == SYNC) {
    bool duplicate = false;
    RETURN_IF_ERROR(KeepSyncPush(request, ids, grads, dense_grad, &duplicate));
    if (state != nullptr) state->last_sequence = request.sequence();
    if (lock.owns_lock()) lock.unlock();
    if (duplicate) {
      duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
      response->set_duplicate(true);
    } else {
      AdvanceSync();
    }
  } else {
    RETURN_IF_ERROR(ApplyUpdate(ids, runs, grads.data(),
                                dense_grad.empty() ? nullptr : dense_grad.data(),
                                request.worker_id(), request.step()));
    if (state != nullptr) state->last_sequence = request.sequence();
  }
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  bytes_out_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ShardServer::MarkDone(const PushRequest& request, PushResponse* response) {
  if (!request.ids().empty() || !request.row_grads().empty() || !request.dense_grad().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", opt_.shard, ": worker ",
                                                   request.worker_id(),
                                                   "'s worker_done push carries gradients"));
  }
  if (Tracked(request.worker_id())) {
    absl::MutexLock lock(&sync_mu_);
    done_[request.worker_id()] = true;
  }
  // Steps and pulls that waited for this worker may go on without it.
  if (opt_.consistency == SYNC) {
    AdvanceSync();
  } else if (opt_.consistency == BOUNDED) {
    ReleaseReady();
  }
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  return absl::OkStatus();
}

absl::Status ShardServer::KeepSyncPush(const PushRequest& request, absl::Span<const int64_t> ids,
                                       absl::Span<const float> grads,
                                       absl::Span<const float> dense_grad, bool* duplicate) {
  const int w = request.worker_id();
  const int64_t t = request.step();
  absl::MutexLock lock(&sync_mu_);
  if (done_[w]) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", opt_.shard, ": worker ", w,
                                                      " pushed step ", t, " after it finished"));
  }
  if (t <= pushed_[w]) {  // a repeat (sequence 0 opts out of the sequence check)
    *duplicate = true;
    return absl::OkStatus();
  }
  if (t <= applied_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", opt_.shard, ": worker ", w, " pushed step ", t, ", but SYNC step ", applied_,
        " is already applied (a restarted worker cannot rejoin a SYNC job)"));
  }
  SyncPush& p = sync_steps_[t][w];
  p.ids.assign(ids.begin(), ids.end());
  p.row_grads.assign(grads.begin(), grads.end());
  p.dense_grad.assign(dense_grad.begin(), dense_grad.end());
  pushed_[w] = t;
  return absl::OkStatus();
}

void ShardServer::AdvanceSync() {
  while (true) {
    std::map<int, SyncPush> pushes;
    int64_t t;
    {
      absl::MutexLock lock(&sync_mu_);
      // One thread applies at a time, in step order; it loops and sees the others' pushes.
      if (applying_) return;
      t = applied_ + 1;
      if (sync_steps_.empty() || MinActivePushedLocked() < t) break;
      auto it = sync_steps_.find(t);
      if (it != sync_steps_.end()) {
        pushes = std::move(it->second);
        sync_steps_.erase(it);
      }
      applying_ = true;
    }
    if (!pushes.empty()) ApplyMean(t, pushes);
    absl::MutexLock lock(&sync_mu_);
    applied_ = t;
    applying_ = false;
  }
  ReleaseReady();
}

void ShardServer::ApplyMean(int64_t step, const std::map<int, SyncPush>& pushes) {
  // Sum in worker order (deterministic whatever the arrival order), then scale once.
  const int dim = opt_.row_dim;
  absl::flat_hash_map<int64_t, int64_t> slot;
  std::vector<int64_t> ids;
  std::vector<float> sum, dense;
  for (const auto& [w, p] : pushes) {
    for (size_t i = 0; i < p.ids.size(); ++i) {
      auto [it, fresh] = slot.emplace(p.ids[i], static_cast<int64_t>(ids.size()));
      if (fresh) {
        ids.push_back(p.ids[i]);
        sum.resize(sum.size() + dim, 0.f);
      }
      float* out = sum.data() + it->second * dim;
      const float* in = p.row_grads.data() + i * dim;
      for (int d = 0; d < dim; ++d) out[d] += in[d];
    }
    if (!p.dense_grad.empty()) {
      if (dense.empty()) dense.assign(p.dense_grad.size(), 0.f);
      for (size_t i = 0; i < dense.size(); ++i) dense[i] += p.dense_grad[i];
    }
  }
  const float scale = 1.0f / static_cast<float>(pushes.size());
  // Ascending ids: each partition's rows form one run.
  std::vector<int64_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> sorted(ids.size());
  std::vector<float> grads(sum.size());
  for (size_t j = 0; j < order.size(); ++j) {
    sorted[j] = ids[order[j]];
    for (int d = 0; d < dim; ++d) grads[j * dim + d] = sum[order[j] * dim + d] * scale;
  }
  for (float& g : dense) g *= scale;
  std::vector<Run> runs;
  absl::Status status = Route(sorted, &runs);  // every id was routed when its push came
  for (const Run& r : runs) {
    if (!status.ok()) break;
    status = stores_[r.store]->Apply(absl::MakeConstSpan(sorted).subspan(r.begin, r.end - r.begin),
                                     grads.data() + r.begin * dim, step);
  }
  PSTRAIN_CHECK(status.ok()) << "shard " << opt_.shard << ": SYNC step " << step << ": " << status;
  if (!dense.empty()) dense_->Apply(dense.data(), step);
  push_rows_.fetch_add(sorted.size(), std::memory_order_relaxed);
}

int64_t ShardServer::applied_step() const {
  absl::MutexLock lock(&sync_mu_);
  return applied_;
}

int64_t ShardServer::consistency_step() const {
  absl::MutexLock lock(&sync_mu_);
  if (opt_.consistency == SYNC) return applied_;
  int64_t step = 0;
  for (int64_t p : pushed_) step = std::max(step, p);
  return step;
}

ConsistencyState ShardServer::SaveConsistency() const {
  absl::MutexLock lock(&sync_mu_);
  ConsistencyState c;
  c.set_applied(applied_);
  for (int64_t p : pushed_) c.add_pushed(p);
  for (bool d : done_) c.add_done(d);
  for (const auto& [step, pushes] : sync_steps_) {
    for (const auto& [w, p] : pushes) {
      ConsistencyState::Pending* out = c.add_pending();
      out->set_step(step);
      out->set_worker(w);
      PackArray(p.ids.data(), p.ids.size(), out->mutable_ids());
      PackArray(p.row_grads.data(), p.row_grads.size(), out->mutable_row_grads());
      PackArray(p.dense_grad.data(), p.dense_grad.size(), out->mutable_dense_grad());
    }
  }
  return c;
}

absl::Status ShardServer::RestoreConsistency(const ConsistencyState& c) {
  if (c.pushed_size() != opt_.num_workers || c.done_size() != opt_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.shard, ": consistency state of ", c.pushed_size(),
                     " workers, this job has ", opt_.num_workers));
  }
  std::map<int64_t, std::map<int, SyncPush>> steps;
  for (const ConsistencyState::Pending& p : c.pending()) {
    SyncPush& out = steps[p.step()][p.worker()];
    absl::Span<const int64_t> ids;
    absl::Span<const float> grads, dense;
    std::vector<int64_t> id_scratch;
    std::vector<float> grad_scratch, dense_scratch;
    RETURN_IF_ERROR(UnpackArray(p.ids(), "ConsistencyState.ids", &id_scratch, &ids));
    RETURN_IF_ERROR(UnpackArray(p.row_grads(), "ConsistencyState.row_grads", &grad_scratch, &grads));
    RETURN_IF_ERROR(
        UnpackArray(p.dense_grad(), "ConsistencyState.dense_grad", &dense_scratch, &dense));
    out.ids.assign(ids.begin(), ids.end());
    out.row_grads.assign(grads.begin(), grads.end());
    out.dense_grad.assign(dense.begin(), dense.end());
  }
  absl::MutexLock lock(&sync_mu_);
  applied_ = c.applied();
  pushed_.assign(c.pushed().begin(), c.pushed().end());
  done_.assign(c.done().begin(), c.done().end());
  sync_steps_ = std::move(steps);
  return absl::OkStatus();
}

void ShardServer::ResumeSteps(int64_t step) {
  absl::MutexLock lock(&sync_mu_);
  applied_ = step;
  for (int64_t& p : pushed_) p = step;
}

int64_t ShardServer::MinActivePushedLocked() const {
  int64_t m = INT64_MAX;
  for (int w = 0; w < opt_.num_workers; ++w) {
    if (!done_[w]) m = std::min(m, pushed_[w]);
  }
  return m;
}

bool ShardServer::PullReadyLocked(int64_t step) const {
  if (step <= 0 || opt_.consistency == ASYNC) return true;
  const int64_t slowest = MinActivePushedLocked();
  if (opt_.consistency == BOUNDED) return slowest >= step - 1 - opt_.staleness;
  // SYNC; once every worker has finished no step will be applied any more.
  return applied_ >= step - 1 || slowest == INT64_MAX;
}

int64_t ShardServer::StalenessLocked(int64_t step) const {
  const int64_t slowest = MinActivePushedLocked();
  if (step <= 0 || slowest == INT64_MAX) return 0;
  return std::max<int64_t>(0, step - 1 - slowest);
}

std::string ShardServer::WaitingForLocked(int64_t step) const {
  // The active workers that have not pushed step `need` yet, with the step each is at.
  auto behind = [&](int64_t need) {
    std::string out;
    for (int w = 0; w < opt_.num_workers; ++w) {
      if (done_[w] || pushed_[w] >= need) continue;
      absl::StrAppend(&out, out.empty() ? "" : ", ", w, " (at step ", pushed_[w], ")");
    }
    return out;
  };
  if (opt_.consistency == BOUNDED) {
    const int64_t need = step - 1 - opt_.staleness;
    return absl::StrCat("BOUNDED (staleness ", opt_.staleness, "): waits for every worker to push ",
                        "step ", need, "; workers not there yet: ", behind(need));
  }
  return absl::StrCat("SYNC: waits for step ", step - 1, " to be applied (applied: ", applied_,
                      "); workers that have not pushed step ", applied_ + 1, ": ",
                      behind(applied_ + 1));
}

void ShardServer::HoldOrAnswer(DeferredPull* pull, absl::Time deadline) {
  const int64_t step = pull->request_->step();
  int64_t staleness = 0;
  uint64_t id = 0;
  bool refuse = false;
  {
    absl::MutexLock lock(&sync_mu_);
    if (PullReadyLocked(step)) {
      staleness = StalenessLocked(step);
    } else if (holding_stopped_) {
      refuse = true;
    } else {
      id = pull->id_ = ++next_hold_id_;
      held_[id] = pull;
    }
  }
  // Reactors are finished outside sync_mu_: OnCancel takes it.
  if (refuse) {
    return pull->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     absl::StrCat("shard ", opt_.shard, " is shutting down")));
  }
  if (id == 0) return Answer(pull, staleness);
  // Answer a little before the client's deadline, so that its error says what was missing.
  const absl::Duration left = deadline - absl::Now();
  if (left < absl::Hours(24)) {
    timer_->At(deadline - std::min(left / 10, absl::Milliseconds(500)), [this, id] {
      DropHeld(id, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""), true);
    });
  }
}

void ShardServer::ReleaseReady() {
  std::vector<std::pair<DeferredPull*, int64_t>> ready;
  {
    absl::MutexLock lock(&sync_mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      const int64_t step = it->second->request_->step();
      if (PullReadyLocked(step)) {
        ready.emplace_back(it->second, StalenessLocked(step));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [pull, staleness] : ready) Answer(pull, staleness);
}

void ShardServer::DropHeld(uint64_t id, grpc::Status status, bool expired) {
  DeferredPull* pull = nullptr;
  {
    absl::MutexLock lock(&sync_mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;  // answered, cancelled or expired already
    pull = it->second;
    held_.erase(it);
    if (expired) {
      status = grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrFormat("shard %d: worker %d's pull of step %d waited %.1f s: %s", opt_.shard,
                          pull->request_->worker_id(), pull->request_->step(),
                          absl::ToDoubleSeconds(absl::Now() - pull->since_),
                          WaitingForLocked(pull->request_->step())));
    }
  }
  pull->Finish(status);
}

void ShardServer::Answer(DeferredPull* pull, int64_t staleness) {
  pull->response_->set_staleness(staleness);
  pull->Finish(ToGrpcStatus(Gather(*pull->request_, pull->response_)));
}

int64_t ShardServer::LastStep() const {
  int64_t step = dense_ != nullptr ? dense_->last_step() : 0;
  for (const auto& s : stores_) step = std::max(step, s->last_step());
  return step;
}

InfoResponse ShardServer::Info() const {
  InfoResponse info;
  info.set_shard(opt_.shard);
  ShardMap* m = info.mutable_map();
  m->set_rows(opt_.rows);
  m->set_partitions(opt_.partitions);
  m->set_shards(opt_.num_shards);
  m->set_row_dim(opt_.row_dim);
  m->set_dense_size(opt_.dense_size);
  m->set_version(0);
  info.set_ready(true);
  info.set_last_step(LastStep());
  info.set_dense_begin(dense_begin_);
  info.set_dense_slice_size(dense_slice_size_);
  info.set_incarnation(incarnation_);
  info.set_sparse_optimizer(opt_.sparse_optimizer.type());
  info.set_dense_optimizer(opt_.dense_optimizer.type());
  absl::MutexLock lock(&job_mu_);
  info.set_job_finished(job_finished_);
  info.set_checkpoint_round(ckpt_round_);
  info.set_checkpoint_stop(ckpt_stop_);
  info.set_checkpoint_target_step(ckpt_target_);
  info.set_checkpoint_released_round(ckpt_released_);
  info.set_checkpoint_done_round(ckpt_done_);
  info.set_checkpoint_done_dir(ckpt_done_dir_);
  info.set_checkpoint_error(ckpt_error_);
  info.set_restored_from(restored_from_);
  info.set_step(consistency_step());
  return info;
}

ShardStats ShardServer::Stats() const {
  ShardStats s;
  s.set_shard(opt_.shard);
  s.set_rows_owned(map_.RowsOfShard(opt_.shard));
  int64_t rows = 0, bytes = 0;
  for (const auto& store : stores_) {
    const EmbeddingStore::Stats st = store->stats();
    rows += st.rows_initialized;
    bytes += st.bytes;
  }
  if (dense_ != nullptr) {
    bytes += (dense_slice_size_ + dense_->optimizer().StateFloats(dense_slice_size_)) *
             static_cast<int64_t>(sizeof(float));
  }
  s.set_rows_initialized(rows);
  s.set_bytes(bytes);
  s.set_dense_floats(dense_slice_size_);
  s.set_pull_requests(pull_requests_.load(std::memory_order_relaxed));
  s.set_push_requests(push_requests_.load(std::memory_order_relaxed));
  s.set_duplicate_pushes(duplicate_pushes_.load(std::memory_order_relaxed));
  s.set_pull_rows(pull_rows_.load(std::memory_order_relaxed));
  s.set_push_rows(push_rows_.load(std::memory_order_relaxed));
  s.set_bytes_in(bytes_in_.load(std::memory_order_relaxed));
  s.set_bytes_out(bytes_out_.load(std::memory_order_relaxed));
  const double uptime = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start_time_));
  s.set_uptime_seconds(uptime);
  s.set_pull_qps(s.pull_requests() / uptime);
  s.set_push_qps(s.push_requests() / uptime);
  s.set_last_step(LastStep());
  return s;
}


}  // namespace pstrain
