#include "ps/shard_server.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "ps/grpc_status.h"
#include "ps/wire.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

// Each handler finishes its reactor before returning: the work is CPU-bound and short.
class ShardServer::Service final : public ParameterServer::CallbackService {
 public:
  explicit Service(ShardServer* shard) : shard_(shard) {}

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest* request,
                                 PullResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(shard_->Pull(*request, response)));
    return reactor;
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

int NumPartitions(const ClusterConfig& cluster, int shards) {
  return cluster.num_partitions() > 0 ? cluster.num_partitions() : 4 * shards;
}

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
  s->service_ = std::make_unique<Service>(s.get());
  return s;
}

ShardServer::~ShardServer() {
  Shutdown(absl::ZeroDuration());
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

void ShardServer::Shutdown(absl::Duration grace) {
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
  pull_requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_in_.fetch_add(request.ByteSizeLong(), std::memory_order_relaxed);
  std::vector<int64_t> id_scratch;
  absl::Span<const int64_t> ids;
  RETURN_IF_ERROR(UnpackArray(request.ids(), "PullRequest.ids", &id_scratch, &ids));
  std::vector<Run> runs;
  RETURN_IF_ERROR(Route(ids, &runs));

  const int dim = opt_.row_dim;
  std::string* rows = response->mutable_rows();
  rows->resize(ids.size() * dim * sizeof(float));
  // Gather straight into the response bytes when they are float-aligned (heap storage is).
  std::vector<float> row_scratch;
  float* out = reinterpret_cast<float*>(&(*rows)[0]);
  const bool aligned = reinterpret_cast<uintptr_t>(out) % alignof(float) == 0;
  if (!aligned) row_scratch.resize(ids.size() * dim), out = row_scratch.data();
  for (const Run& r : runs) {
    RETURN_IF_ERROR(
        stores_[r.store]->Gather(ids.subspan(r.begin, r.end - r.begin), out + r.begin * dim));
  }
  if (!aligned) PackArray(row_scratch.data(), row_scratch.size(), rows);

  if (request.want_dense() && dense_ != nullptr) {
    std::vector<float> slice(dense_slice_size_);
    dense_->Get(slice.data());
    PackArray(slice.data(), dense_slice_size_, response->mutable_dense());
  }
  response->set_dense_begin(dense_begin_);
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  pull_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  bytes_out_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
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
  for (const Run& r : runs) {
    RETURN_IF_ERROR(stores_[r.store]->Apply(ids.subspan(r.begin, r.end - r.begin),
                                            grads.data() + r.begin * dim, request.step()));
  }
  if (!dense_grad.empty()) dense_->Apply(dense_grad.data(), request.step());
  if (state != nullptr) state->last_sequence = request.sequence();

  push_rows_.fetch_add(ids.size(), std::memory_order_relaxed);
  response->set_last_step(LastStep());
  response->set_incarnation(incarnation_);
  bytes_out_.fetch_add(response->ByteSizeLong(), std::memory_order_relaxed);
  return absl::OkStatus();
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
  info.set_checkpoint_released_round(ckpt_released_);
  info.set_checkpoint_done_round(ckpt_done_);
  info.set_checkpoint_done_dir(ckpt_done_dir_);
  info.set_checkpoint_error(ckpt_error_);
  info.set_restored_from(restored_from_);
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

std::string FormatShardBalance(const std::vector<ShardStats>& stats) {
  std::string out =
      absl::StrFormat("%-6s %12s %12s %10s %10s %10s %10s %10s", "shard", "rows_owned",
                      "rows_trained", "memory_MB", "pull_qps", "push_qps", "in_MB", "out_MB");
  for (const ShardStats& s : stats) {
    absl::StrAppend(
        &out, absl::StrFormat("\n%-6d %12d %12d %10.1f %10.1f %10.1f %10.1f %10.1f", s.shard(),
                              s.rows_owned(), s.rows_initialized(), s.bytes() / 1e6, s.pull_qps(),
                              s.push_qps(), s.bytes_in() / 1e6, s.bytes_out() / 1e6));
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
