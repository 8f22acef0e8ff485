#include "ps/server/shard_server.h"

#include <grpcpp/health_check_service_interface.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/status.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

// A training pull in BOUNDED / SYNC mode: held by the ConsistencyTracker until it may be answered.
// Exactly one of the push that releases it, its cancellation, its expiry and Shutdown takes it
// off the tracker's list and finishes it; gRPC deletes it in OnDone, which comes after Finish and
// after OnCancel has returned.
class ShardServer::PullReactor final : public grpc::ServerUnaryReactor,
                                       public ConsistencyTracker::HeldPull {
 public:
  PullReactor(ShardServer* server, const PullRequest* request, PullResponse* response)
      : server_(server), request_(request), response_(response) {}

  int64_t step() const override { return request_->step(); }
  int32_t worker_id() const override { return request_->worker_id(); }
  void Answer(int64_t staleness) override {
    response_->set_staleness(staleness);
    Finish(ToGrpcStatus(server_->Gather(*request_, response_)));
  }
  void Fail(absl::Status status) override { Finish(ToGrpcStatus(status)); }
  void OnCancel() override { server_->tracker_->Cancel(this); }
  void OnDone() override { delete this; }

 private:
  ShardServer* const server_;
  const PullRequest* const request_;
  PullResponse* const response_;
};

// A watched Info or Coordinate call (a long-poll): held by the JobCoordinator until the job state
// changes or its hold expires, then answered by `answer` with the state as it is then. The same
// lifetime rules as PullReactor's.
class ShardServer::WatchReactor final : public grpc::ServerUnaryReactor,
                                        public JobCoordinator::Watch {
 public:
  WatchReactor(ShardServer* server, std::function<absl::Status()> answer)
      : server_(server), answer_(std::move(answer)) {}

  void Wake(absl::Status status) override {
    if (status.ok()) status = answer_();
    Finish(ToGrpcStatus(status));
  }
  void OnCancel() override { server_->coordinator_->Cancel(this); }
  void OnDone() override { delete this; }

 private:
  ShardServer* const server_;
  const std::function<absl::Status()> answer_;
};

// Each handler but a held call's finishes its reactor before returning: the work is CPU-bound
// and short.
class ShardServer::Service final : public ParameterServer::CallbackService {
 public:
  explicit Service(ShardServer* server) : server_(server) {}

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest* request,
                                 PullResponse* response) override {
    if (server_->opt_.consistency == ASYNC || request->step() <= 0) {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      const absl::Time start = absl::Now();
      reactor->Finish(ToGrpcStatus(server_->Pull(*request, response)));
      server_->metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start));
      return reactor;
    }
    auto* pull = new PullReactor(server_, request, response);
    server_->tracker_->HoldOrAnswer(pull, absl::FromChrono(ctx->deadline()));
    return pull;
  }
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const PushRequest* request,
                                 PushResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const absl::Time start = absl::Now();
    reactor->Finish(ToGrpcStatus(server_->Push(*request, response)));
    server_->metrics_->ObservePush(absl::ToDoubleSeconds(absl::Now() - start));
    return reactor;
  }
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const InfoRequest* request,
                                 InfoResponse* response) override {
    if (request->watch_timeout_ms() <= 0) {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      *response = server_->Info();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    ShardServer* server = server_;
    auto* watch = new WatchReactor(server, [server, response] {
      *response = server->Info();
      return absl::OkStatus();
    });
    server->coordinator_->Hold(watch, request->watch_version(),
                               WatchUntil(absl::FromChrono(ctx->deadline()),
                                          request->watch_timeout_ms()));
    return watch;
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest*,
                                  ShardStats* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    *response = server_->Stats();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx, const ReportRequest* request,
                                   ReportResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    server_->Report(*request);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Coordinate(grpc::CallbackServerContext* ctx,
                                       const CoordinateRequest* request,
                                       CoordinateResponse* response) override {
    const bool watch = request->watch_timeout_ms() > 0 && server_->opt_.shard == 0 &&
                       (request->kind() == CoordinateRequest::COLLECT ||
                        request->kind() == CoordinateRequest::REPORTS);
    if (!watch) {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(server_->Coordinate(*request, response)));
      return reactor;
    }
    ShardServer* server = server_;
    auto* held = new WatchReactor(server, [server, request, response] {
      response->Clear();
      return server->Coordinate(*request, response);
    });
    server->coordinator_->Hold(held, request->watch_version(),
                               WatchUntil(absl::FromChrono(ctx->deadline()),
                                          request->watch_timeout_ms()));
    return held;
  }
  // COPY is a memory copy and runs on the gRPC thread; WRITE does file I/O for seconds, so it
  // runs on its own thread and finishes the reactor from there.
  grpc::ServerUnaryReactor* SaveShard(grpc::CallbackServerContext* ctx,
                                      const SaveShardRequest* request,
                                      SaveShardResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (request->phase() == SaveShardRequest::COPY) {
      auto rows = server_->CopyForCheckpoint(request->round());
      if (rows.ok()) response->set_rows(*rows);
      reactor->Finish(ToGrpcStatus(rows.status()));
    } else if (request->phase() == SaveShardRequest::WRITE) {
      std::thread([server = server_, request, response, reactor] {
        auto r = server->WriteCheckpoint(request->round(), request->dir());
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
  ShardServer* const server_;
};

ShardServer::ShardServer(Options options) : opt_(std::move(options)) {}

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
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be > 0, got ", options.num_workers));
  }
  if (options.consistency == BOUNDED && options.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BOUNDED consistency needs staleness >= 0, got ", options.staleness));
  }
  Shard::Options so;
  so.shard = options.shard;
  so.num_shards = options.num_shards;
  so.rows = options.rows;
  so.partitions = options.partitions;
  so.row_dim = options.row_dim;
  so.dense_size = options.dense_size;
  so.sparse_optimizer = options.sparse_optimizer;
  so.dense_optimizer = options.dense_optimizer;
  so.row_init = options.row_init;
  so.dense_init = options.dense_init;
  so.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<Shard> data, Shard::Create(std::move(so)));

  std::unique_ptr<ShardServer> s(new ShardServer(std::move(options)));
  const Options& o = s->opt_;
  s->data_ = std::move(data);
  s->timer_ = std::make_unique<Timer>();
  ConsistencyTracker::Options co;
  co.shard = o.shard;
  co.consistency = o.consistency;
  co.num_workers = o.num_workers;
  co.staleness = o.staleness;
  s->tracker_ = std::make_unique<ConsistencyTracker>(co, s->data_.get(), s->timer_.get());
  s->coordinator_ = std::make_unique<JobCoordinator>(o.shard, s->timer_.get());
  s->service_ = std::make_unique<Service>(s.get());
  s->metrics_ = std::make_unique<ShardMetrics>(s->opt_.shard, [p = s.get()] { return p->Stats(); });
  return s;
}

ShardServer::~ShardServer() {
  metrics_.reset();  // no scrape reads Stats() from here on
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
  // The standard gRPC health service (grpc.health.v1.Health): SERVING while the shard serves,
  // for Kubernetes' gRPC probes and load balancers.
  grpc::EnableDefaultHealthCheckService(true);
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
  tracker_->StopHolding();
  coordinator_->StopHolding();
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

absl::Time ShardServer::WatchUntil(absl::Time deadline, int64_t watch_ms) {
  const absl::Time now = absl::Now();
  absl::Time until = now + std::min(absl::Milliseconds(watch_ms), kMaxWatch);
  // Answer a little before the client's deadline (as a held pull does), never after it.
  const absl::Duration left = deadline - now;
  if (left < absl::Hours(24)) {
    until = std::min(until, deadline - std::min(left / 10, absl::Milliseconds(500)));
  }
  return until;
}

absl::Status ShardServer::Gather(const PullRequest& request, PullResponse* response) {
  // The job state as of this answer: it comes after the pushes the pull waited for, so after any
  // checkpoint request made before them (docs/CHECKPOINT.md "PS mode").
  if (opt_.shard == 0 && opt_.consistency != ASYNC && request.step() > 0) {
    *response->mutable_job() = coordinator_->State();
  }
  return data_->Gather(request, response);
}

absl::Status ShardServer::Pull(const PullRequest& request, PullResponse* response) {
  if (request.step() > 0) response->set_staleness(tracker_->Staleness(request.step()));
  return Gather(request, response);
}

absl::Status ShardServer::PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows,
                                     float* dense, int64_t* staleness) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PullDirect: only for ASYNC shards");
  }
  *staleness = step > 0 ? tracker_->Staleness(step) : 0;
  return data_->GatherInto(ids, rows, dense);
}

absl::Status ShardServer::PushDirect(int32_t worker_id, int64_t step,
                                     absl::Span<const int64_t> ids, const float* row_grads,
                                     const float* dense_grad) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PushDirect: only for ASYNC shards");
  }
  data_->CountPushRequest(0);
  RETURN_IF_ERROR(data_->Apply(ids, row_grads, dense_grad, step));
  tracker_->NoteApplied(worker_id, step);
  return absl::OkStatus();
}

absl::Status ShardServer::Push(const PushRequest& request, PushResponse* response) {
  data_->CountPushRequest(request.ByteSizeLong());
  RETURN_IF_ERROR(tracker_->CheckWorker(request.worker_id()));
  auto answer = [&] {
    response->set_last_step(data_->LastStep());
    response->set_incarnation(data_->incarnation());
  };
  if (request.worker_done()) {
    if (!request.ids().empty() || !request.row_grads().empty() || !request.dense_grad().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", opt_.shard, ": worker ",
                                                     request.worker_id(),
                                                     "'s worker_done push carries gradients"));
    }
    tracker_->MarkDone(request.worker_id());
    answer();
    return absl::OkStatus();
  }
  Shard::Update update;
  RETURN_IF_ERROR(data_->Unpack(request, &update));
  Shard::PushGuard guard =
      data_->BeginPush(request.worker_id(), request.incarnation(), request.sequence());
  if (guard.duplicate()) {
    data_->CountDuplicatePush();
    response->set_duplicate(true);
    answer();
    return absl::OkStatus();
  }
  if (opt_.consistency == SYNC) {
    bool duplicate = false;
    RETURN_IF_ERROR(tracker_->KeepSyncPush(request.worker_id(), request.step(), update.ids,
                                           update.grads, update.dense_grad, &duplicate));
    guard.Commit();
    guard.Release();  // applying the step's mean may take a while: not under the worker's lock
    if (duplicate) {
      data_->CountDuplicatePush();
      response->set_duplicate(true);
    } else {
      tracker_->AdvanceSync();
    }
  } else {
    RETURN_IF_ERROR(data_->Apply(update, request.step()));
    tracker_->NoteApplied(request.worker_id(), request.step());
    guard.Commit();
  }
  answer();
  data_->CountBytesOut(response->ByteSizeLong());
  return absl::OkStatus();
}

InfoResponse ShardServer::Info() const {
  InfoResponse info;
  data_->FillInfo(&info);
  coordinator_->FillInfo(&info);
  info.set_step(tracker_->step());
  return info;
}

ShardStats ShardServer::Stats() const { return data_->Stats(); }

absl::Status ShardServer::Coordinate(const CoordinateRequest& request,
                                     CoordinateResponse* response) {
  if (opt_.shard != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", opt_.shard, ": the job is coordinated by shard 0"));
  }
  return coordinator_->Coordinate(request, response);
}

void ShardServer::Report(const ReportRequest& report) { coordinator_->Report(report); }

absl::StatusOr<int64_t> ShardServer::CopyForCheckpoint(int64_t round) {
  // The shard file's SHRD header: this shard's Info at the copy, without the coordinator's
  // job_version (a counter of this process's long-polls, meaningless after a restore; leaving it
  // out keeps the header's bytes those of format version 1, tests/checkpoint/fixtures_test.cc).
  InfoResponse header = Info();
  header.clear_job_version();
  return data_->CopyForCheckpoint(round, header.SerializeAsString(),
                                  tracker_->Save().SerializeAsString());
}

absl::StatusOr<SaveShardResponse> ShardServer::WriteCheckpoint(int64_t round,
                                                               const std::string& dir) {
  return data_->WriteCheckpoint(round, dir);
}

absl::Status ShardServer::RestoreCheckpoint(const std::string& ckpt_dir,
                                            const CheckpointManifest& manifest) {
  ASSIGN_OR_RETURN(Shard::Restored restored, data_->RestoreCheckpoint(ckpt_dir, manifest));
  // With the same workers the exact bookkeeping comes back; otherwise (the workers restart their
  // data) every worker counts as having pushed the last step.
  if (!restored.consistency || !tracker_->Restore(*restored.consistency).ok()) {
    tracker_->ResumeSteps(restored.step);
  }
  coordinator_->SetRestoredFrom(ckpt_dir);
  return absl::OkStatus();
}

}  // namespace pstrain
