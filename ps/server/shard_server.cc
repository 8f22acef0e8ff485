#include "ps/server/shard_server.h"

#include <grpcpp/health_check_service_interface.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc/callback_queue.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/security.h"
#include "common/status.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

// A pull's request and answer, made by gRPC through PullAllocator for every Pull call. Release
// (after the reactor's OnDone, once gRPC is done with both messages) frees them and then gives
// the answer's bytes back to the budget: giving them back in OnDone would admit the next pull
// while this answer still lives (three answers of memory where the budget allows two copies of
// one: the answer and its serialized form).
class ShardServer::PullMessages final
    : public grpc::MessageHolder<PullRequest, PullResponse> {
 public:
  explicit PullMessages(AnswerBudget* budget) : budget_(budget) {
    set_request(&request_);
    set_response(&response_);
  }
  // The answer took `bytes` of the budget (once admitted).
  void Took(int64_t bytes) { taken_ = bytes; }
  void Release() override {
    AnswerBudget* budget = budget_;
    const int64_t taken = taken_;
    delete this;  // the messages first
    if (taken > 0) budget->Release(taken);
  }

 private:
  AnswerBudget* const budget_;
  int64_t taken_ = 0;  // written before Finish, read after OnDone
  PullRequest request_;
  PullResponse response_;
};

class ShardServer::PullAllocator final
    : public grpc::MessageAllocator<PullRequest, PullResponse> {
 public:
  explicit PullAllocator(AnswerBudget* budget) : budget_(budget) {}
  grpc::MessageHolder<PullRequest, PullResponse>* AllocateMessages() override {
    return new PullMessages(budget_);
  }

 private:
  AnswerBudget* const budget_;
};

// Every pull over gRPC. Its answer's bytes come from the shard's AnswerBudget before it is
// gathered and go back once gRPC has sent it and freed it (PullMessages::Release). An ASYNC pull, or one of step <= 0, asks
// for them at once (Start); a BOUNDED / SYNC training pull is first held by the
// ConsistencyTracker until its step may be answered (Answer), then asks. Exactly one of these
// finishes it: the budget's Admit (gather, answer), a refusal of the budget's (its expiry, the
// call's cancellation, Shutdown), or a failure of the tracker's (the same, and a lost worker).
// gRPC deletes it in OnDone, which comes after Finish and after OnCancel has returned.
class ShardServer::PullReactor final : public grpc::ServerUnaryReactor,
                                       public ConsistencyTracker::HeldPull {
 public:
  PullReactor(ShardServer* server, PullMessages* messages, int64_t answer_bytes,
              absl::Time until)
      : server_(server),
        messages_(messages),
        request_(messages->request()),
        response_(messages->response()),
        answer_bytes_(answer_bytes),
        until_(until) {
    ticket_.pull = this;
  }

  // Not held by the tracker: answered (Pull, with its staleness) once the bytes are free.
  void Start() { server_->budget_->Acquire(&ticket_, answer_bytes_, until_); }

  int64_t step() const override { return request_->step(); }
  int32_t worker_id() const override { return request_->worker_id(); }
  void Answer(int64_t staleness) override {
    response_->set_staleness(staleness);
    held_ = true;
    server_->budget_->Acquire(&ticket_, answer_bytes_, until_);
  }
  void Fail(absl::Status status) override { Finish(ToGrpcStatus(status)); }
  void OnCancel() override {
    server_->tracker_->Cancel(this);
    server_->budget_->Cancel(&ticket_);
  }
  void OnDone() override { delete this; }  // then gRPC releases the messages, and the bytes

 private:
  // The pull's place in the budget's list (apart from its place in the tracker's: a call is in
  // at most one of them at a time, and each has its own hold id).
  struct Ticket final : AnswerBudget::Waiter {
    void Admit() override {
      pull->messages_->Took(pull->answer_bytes_);
      pull->Gather();
    }
    void Refuse(absl::Status status) override { pull->Finish(ToGrpcStatus(status)); }
    PullReactor* pull = nullptr;
  };

  void Gather() {
    if (held_) {
      Finish(ToGrpcStatus(server_->Gather(*request_, response_)));
      return;
    }
    Env* env = server_->opt_.data.env;
    const absl::Duration start = env->MonotonicNow();
    const absl::Status s = server_->Pull(*request_, response_);
    server_->metrics_->ObservePull(absl::ToDoubleSeconds(env->MonotonicNow() - start));
    Finish(ToGrpcStatus(s));
  }

  ShardServer* const server_;
  PullMessages* const messages_;  // gRPC's, alive until after OnDone
  const PullRequest* const request_;
  PullResponse* const response_;
  const int64_t answer_bytes_;
  const absl::Time until_;
  bool held_ = false;  // answered by the tracker (Gather) rather than at once (Pull)
  Ticket ticket_;
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

// Each handler but a held call's (and a pull's that waits for the answer budget) finishes its
// reactor before returning: the work is CPU-bound and short. Every handler first checks the
// cluster secret (Refused): a call without it is answered UNAUTHENTICATED before anything reads
// or changes the shard's state (the server's credentials refused it earlier still, on its
// headers, unless it came through the in-process channel).
class ShardServer::Service final : public ParameterServer::CallbackService {
 public:
  explicit Service(ShardServer* server)
      : server_(server), pull_allocator_(server->budget_.get()) {
    SetMessageAllocatorFor_Pull(&pull_allocator_);
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const PullRequest* request,
                                 PullResponse* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    server_->Heard(request->worker_id());
    if (absl::Status s = server_->CheckPull(*request); !s.ok()) return Done(ctx, s);
    const absl::Time deadline = absl::FromChrono(ctx->deadline());
    // The messages are PullAllocator's (the constructor sets it for this method).
    auto* messages = static_cast<PullMessages*>(ctx->GetRpcAllocatorState());
    PSTRAIN_CHECK(messages != nullptr && messages->request() == request &&
                  messages->response() == response)
        << "Pull's messages are not PullAllocator's";
    auto* pull = new PullReactor(server_, messages, server_->AnswerBytes(*request),
                                 server_->BudgetWaitUntil(deadline));
    if (server_->opt_.consistency == ASYNC || request->step() <= 0) {
      pull->Start();
    } else {
      server_->tracker_->HoldOrAnswer(pull, deadline);
    }
    return pull;
  }
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const PushRequest* request,
                                 PushResponse* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    server_->Heard(request->worker_id());
    Env* env = server_->opt_.data.env;
    const absl::Duration start = env->MonotonicNow();
    const absl::Status s = server_->Push(*request, response);
    server_->metrics_->ObservePush(absl::ToDoubleSeconds(env->MonotonicNow() - start));
    return Done(ctx, s);
  }
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const InfoRequest* request,
                                 InfoResponse* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    if (request->has_worker_id()) server_->Heard(request->worker_id());
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
                               server->WatchUntil(absl::FromChrono(ctx->deadline()),
                                                  request->watch_timeout_ms()));
    return watch;
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest*,
                                  ShardStats* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    *response = server_->Stats();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx, const ReportRequest* request,
                                   ReportResponse*) override {
    if (auto* refused = Refused(ctx)) return refused;
    server_->Heard(request->worker_id());
    return Done(ctx, server_->Report(*request));
  }
  grpc::ServerUnaryReactor* Coordinate(grpc::CallbackServerContext* ctx,
                                       const CoordinateRequest* request,
                                       CoordinateResponse* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    if (request->kind() == CoordinateRequest::REQUEST ||
        request->kind() == CoordinateRequest::ARRIVE) {
      server_->Heard(request->worker_id());
    }
    const bool watch = request->watch_timeout_ms() > 0 && server_->opt_.data.shard == 0 &&
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
                               server->WatchUntil(absl::FromChrono(ctx->deadline()),
                                                  request->watch_timeout_ms()));
    return held;
  }
  // COPY freezes an instant (copy-on-write, no row is copied) and runs on the gRPC thread; WRITE
  // does file I/O for seconds, so it runs on its own thread and finishes the reactor from there.
  grpc::ServerUnaryReactor* SaveShard(grpc::CallbackServerContext* ctx,
                                      const SaveShardRequest* request,
                                      SaveShardResponse* response) override {
    if (auto* refused = Refused(ctx)) return refused;
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (request->phase() == SaveShardRequest::COPY) {
      reactor->Finish(ToGrpcStatus(server_->CopyForCheckpoint(
          request->round(),
          request->delta() ? std::optional<int64_t>(request->delta_parent_step()) : std::nullopt,
          request->end_pass(), request->step())));
    } else if (request->phase() == SaveShardRequest::WRITE) {
      // One WRITE thread at a time, and only for the round whose copy is held.
      if (!server_->data_->HoldsCopy(request->round())) {
        reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
            "shard ", server_->opt_.data.shard, ": WRITE of checkpoint round ", request->round(),
            " without its COPY"))));
      } else if (server_->writing_.exchange(true)) {
        reactor->Finish(ToGrpcStatus(absl::AbortedError(
            absl::StrCat("shard ", server_->opt_.data.shard, ": a WRITE is in progress"))));
      } else {
        std::thread([server = server_, request, response, reactor] {
          auto r = server->WriteCheckpoint(request->round(), request->name());
          if (r.ok()) *response = *r;
          server->writing_ = false;
          reactor->Finish(ToGrpcStatus(r.status()));
        }).detach();
      }
    } else {
      reactor->Finish(ToGrpcStatus(
          absl::InvalidArgumentError("SaveShard: phase must be COPY or WRITE")));
    }
    return reactor;
  }

 private:
  // A finished reactor answering `status`.
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                                        const absl::Status& status) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  // A finished UNAUTHENTICATED reactor when the call lacks the cluster secret, else null.
  grpc::ServerUnaryReactor* Refused(grpc::CallbackServerContext* ctx) {
    absl::Status s = server_->secret_.Check(*ctx);
    if (s.ok()) return nullptr;
    server_->data_->CountUnauthenticated();
    return Done(ctx, s);
  }

  ShardServer* const server_;
  PullAllocator pull_allocator_;
};

ShardServer::ShardServer(Options options)
    : opt_(std::move(options)), secret_(opt_.security.secret) {}

ShardServer::Options ShardServer::OptionsFromConfig(const Config& config, int shard, int num_shards,
                                                    int64_t rows, int row_dim, int64_t dense_size) {
  Options o;
  o.data.shard = shard;
  o.data.num_shards = num_shards;
  o.data.rows = rows;
  o.data.partitions = NumPartitions(config.cluster(), num_shards);
  o.data.row_dim = row_dim;
  o.data.dense_size = dense_size;
  o.data.sparse_optimizer = config.sparse_optimizer();
  o.data.dense_optimizer = config.dense_optimizer();
  o.consistency = config.cluster().consistency();
  o.num_workers = num_shards;
  o.staleness = config.cluster().staleness();
  o.lease = absl::Milliseconds(config.cluster().lease_ms());
  const StalenessCompensation comp = config.cluster().consistency() == ASYNC
                                         ? config.cluster().staleness_compensation()
                                         : NO_COMPENSATION;
  o.data.scale_dense_lr_by_staleness = comp == SCALE_DENSE_LR || comp == SCALE_LR;
  o.data.scale_row_lr_by_staleness = comp == SCALE_ROW_LR || comp == SCALE_LR;
  o.data.max_gradient_abs = config.cluster().max_gradient_abs();
  o.answer_budget_bytes = int64_t{config.cluster().answer_budget_mb()} << 20;
  return o;
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Create(Options options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be > 0, got ", options.num_workers));
  }
  if (absl::Status s = ValidateRpcSecurity(options.security); !s.ok()) return s;
  if (options.lease < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the lease must be >= 1 s, got ", absl::FormatDuration(options.lease)));
  }
  if (options.answer_budget_bytes < 0 ||
      (options.answer_budget_bytes > 0 &&
       options.answer_budget_bytes < options.security.max_message_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the answer budget (cluster.answer_budget_mb) must be 0 (twice the largest message) or at "
        "least the largest message, ", options.security.max_message_bytes, " bytes, so that the "
        "largest legal pull fits; got ", options.answer_budget_bytes, " bytes"));
  }
  if (options.consistency == BOUNDED && options.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BOUNDED consistency needs staleness >= 0, got ", options.staleness));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Shard> data, Shard::Create(options.data));

  std::unique_ptr<ShardServer> s(new ShardServer(std::move(options)));
  const Options& o = s->opt_;
  s->data_ = std::move(data);
  s->timer_ = std::make_unique<Timer>(o.data.env);
  ConsistencyTracker::Options co;
  co.shard = o.data.shard;
  co.consistency = o.consistency;
  co.num_workers = o.num_workers;
  co.staleness = o.staleness;
  co.env = o.data.env;
  s->tracker_ = std::make_unique<ConsistencyTracker>(co, s->data_.get(), s->timer_.get());
  s->coordinator_ =
      std::make_unique<JobCoordinator>(o.data.shard, o.num_workers, o.lease, s->timer_.get(),
                                       o.data.env);
  s->budget_ = std::make_unique<AnswerBudget>(
      o.answer_budget_bytes > 0 ? o.answer_budget_bytes : 2 * o.security.max_message_bytes,
      absl::StrCat("shard ", o.data.shard), s->timer_.get(), o.data.env);
  // A lost worker in BOUNDED / SYNC: the pulls that wait for it fail at once, naming it, instead
  // of at their deadline (shard 0 only: it keeps the leases).
  ConsistencyTracker* tracker = s->tracker_.get();
  s->coordinator_->SetLostCallback([tracker](const std::string& detail) {
    tracker->SetLost(detail);
  });
  s->service_ = std::make_unique<Service>(s.get());
  s->metrics_ = std::make_unique<ShardMetrics>(s->opt_.data.shard, [p = s.get()] { return p->Stats(); });
  return s;
}

ShardServer::~ShardServer() {
  metrics_.reset();  // no scrape reads Stats() from here on
  Shutdown(absl::ZeroDuration());
  timer_.reset();  // runs the pending expiries now; they find nothing held
  absl::MutexLock lock(&server_mu_);
  server_.reset();  // before service_, which it references
}

std::string ShardServer::ListenAddress(const std::string& bind, int port) {
  const bool bare_v6 = bind.find(':') != std::string::npos && !absl::StartsWith(bind, "[");
  return bare_v6 ? absl::StrCat("[", bind, "]:", port) : absl::StrCat(bind, ":", port);
}

absl::Status ShardServer::Start(const std::string& address) {
  // More than one ':' outside brackets is an IPv6 address without them, which gRPC cannot split
  // from the port (it then failed as if the port were taken).
  if (!absl::StartsWith(address, "[") &&
      std::count(address.begin(), address.end(), ':') > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", opt_.data.shard, ": cannot listen on ", address,
        ": an IPv6 address needs brackets around it, e.g. [::1]:5000"));
  }
  absl::MutexLock lock(&server_mu_);
  if (server_ != nullptr || shut_down_) {
    return absl::FailedPreconditionError("ShardServer::Start called twice");
  }
  // The standard gRPC health service (grpc.health.v1.Health): SERVING while the shard serves,
  // for Kubernetes' gRPC probes and load balancers.
  grpc::EnableDefaultHealthCheckService(true);
  // The callback service's reactors run on gRPC's callback queue, which this server's shutdown
  // must never tear down from one of its threads (common/rpc/callback_queue.h).
  HoldCallbackQueue();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, MakeServerCredentials(opt_.security, refused_before_message_),
                           &port);
  builder.RegisterService(service_.get());
  // Every message is capped: a peer cannot make this shard allocate more than that per call
  // (CheckPull caps the answers the same way).
  builder.SetMaxReceiveMessageSize(static_cast<int>(opt_.security.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(opt_.security.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("shard ", opt_.data.shard, ": cannot listen on ", address,
                     " (address in use, or not an address of this host)"));
  }
  port_ = port;
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr) return nullptr;
  return server_->experimental().InProcessChannelWithInterceptors(
      MakeChannelArguments(opt_.security), SecretInterceptors(opt_.security.secret));
}

void ShardServer::Shutdown(absl::Duration grace) {
  tracker_->StopHolding();
  coordinator_->StopHolding();
  budget_->Stop();
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(opt_.data.env->Now() + grace));
  server_->Wait();
}

absl::Time ShardServer::BudgetWaitUntil(absl::Time deadline) const {
  // As a held pull's expiry: a little before the client's deadline, so that its error says what
  // it waited for; kMaxHold at most.
  const absl::Time now = opt_.data.env->Now();
  const absl::Duration left = std::min(deadline - now, ConsistencyTracker::kMaxHold);
  return now + left - std::min(left / 10, absl::Milliseconds(500));
}

absl::Time ShardServer::WatchUntil(absl::Time deadline, int64_t watch_ms) const {
  const absl::Time now = opt_.data.env->Now();  // wall: gRPC deadlines are
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
  if (opt_.data.shard == 0 && opt_.consistency != ASYNC && request.step() > 0) {
    *response->mutable_job() = coordinator_->State();
  }
  return data_->Gather(request, response);
}

absl::Status ShardServer::Pull(const PullRequest& request, PullResponse* response) {
  if (request.step() > 0) response->set_staleness(tracker_->Staleness(request.step()));
  return Gather(request, response);
}

absl::Status ShardServer::PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows,
                                     float* dense, int64_t* staleness,
                                     int64_t* dense_version, uint32_t* row_versions) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PullDirect: only for ASYNC shards");
  }
  *staleness = step > 0 ? tracker_->Staleness(step) : 0;
  return data_->GatherInto(ids, rows, dense, dense_version, step > 0 ? row_versions : nullptr);
}

absl::Status ShardServer::PushDirect(int32_t worker_id, int64_t step,
                                     absl::Span<const int64_t> ids, const float* row_grads,
                                     const float* dense_grad, int64_t dense_version,
                                     const uint32_t* row_versions) {
  if (opt_.consistency != ASYNC) {
    return absl::FailedPreconditionError("PushDirect: only for ASYNC shards");
  }
  data_->CountPushRequest(0);
  RETURN_IF_ERROR(tracker_->CheckWorker(worker_id));
  RETURN_IF_ERROR(tracker_->CheckPushStep(worker_id, step));
  std::vector<Shard::Run> runs;
  RETURN_IF_ERROR(data_->Route(ids, &runs));
  RETURN_IF_ERROR(data_->CheckFinite(data_->RowFloats(runs), row_grads, dense_grad));
  RETURN_IF_ERROR(data_->Apply(ids, row_grads, dense_grad, step, dense_version, row_versions));
  tracker_->NoteApplied(worker_id, step);
  return absl::OkStatus();
}

void ShardServer::Heard(int32_t worker_id) {
  if (opt_.data.shard == 0) coordinator_->Heard(worker_id);
}

int64_t ShardServer::AnswerBytes(const PullRequest& request) const {
  const int64_t n = static_cast<int64_t>(request.ids().size() / sizeof(int64_t));
  return n * opt_.data.row_dim * static_cast<int64_t>(sizeof(float)) +
         (request.want_dense() ? data_->dense_slice_size() * 4 : 0) + 1024;
}

absl::Status ShardServer::CheckPull(const PullRequest& request) const {
  // The answer's size is chosen by the caller (ids may repeat): refuse one above the message cap
  // before gathering anything.
  const int64_t n = static_cast<int64_t>(request.ids().size() / sizeof(int64_t));
  const int64_t answer = AnswerBytes(request);
  if (answer > opt_.security.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard ", opt_.data.shard, ": a pull of ", n, " rows",
        request.want_dense() ? " and the dense slice" : "", " would answer ", answer,
        " bytes, above the largest message (", opt_.security.max_message_bytes,
        " bytes, cluster.max_message_mb)"));
  }
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", opt_.data.shard, ": pull of step ", request.step(), " < 0"));
  }
  return tracker_->CheckPullStep(request.worker_id(), request.step());
}

absl::Status ShardServer::Push(const PushRequest& request, PushResponse* response) {
  data_->CountPushRequest(request.ByteSizeLong());
  RETURN_IF_ERROR(tracker_->CheckWorker(request.worker_id()));
  if (!request.worker_done()) {
    RETURN_IF_ERROR(tracker_->CheckPushStep(request.worker_id(), request.step()));
  }
  auto answer = [&] {
    response->set_last_step(data_->LastStep());
    response->set_incarnation(data_->incarnation());
  };
  if (request.worker_done()) {
    if (!request.ids().empty() || !request.row_grads().empty() || !request.dense_grad().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", opt_.data.shard, ": worker ",
                                                     request.worker_id(),
                                                     "'s worker_done push carries gradients"));
    }
    tracker_->MarkDone(request.worker_id());
    answer();
    return absl::OkStatus();
  }
  Shard::Update update;
  RETURN_IF_ERROR(data_->Unpack(request, &update));
  ASSIGN_OR_RETURN(Shard::PushGuard guard, data_->BeginPush(request.worker_id(),
                                                           request.incarnation(),
                                                           request.sequence()));
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
  info.set_num_workers(opt_.num_workers);
  return info;
}

ShardStats ShardServer::Stats() const {
  ShardStats stats = data_->Stats();
  stats.set_unauthenticated_calls(stats.unauthenticated_calls() +
                                  refused_before_message_->load(std::memory_order_relaxed));
  return stats;
}

absl::Status ShardServer::Coordinate(const CoordinateRequest& request,
                                     CoordinateResponse* response) {
  if (opt_.data.shard != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", opt_.data.shard, ": the job is coordinated by shard 0"));
  }
  // A round's target must be reachable: at most kMaxStepsAhead past the steps this shard saw.
  if (request.kind() == CoordinateRequest::REQUEST &&
      request.target_step() > tracker_->step() + kMaxStepsAhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard 0: a checkpoint round at step ", request.target_step(), ", but the job is at step ",
        tracker_->step(), " (at most ", kMaxStepsAhead, " steps ahead)"));
  }
  return coordinator_->Coordinate(request, response);
}

absl::Status ShardServer::Report(const ReportRequest& report) {
  return coordinator_->Report(report);
}

absl::Status ShardServer::CopyForCheckpoint(int64_t round, std::optional<int64_t> delta_parent,
                                            bool end_pass, int64_t step) {
  // The shard file's SHRD header: this shard's Info at the copy, without the coordinator's
  // job_version (a counter of this process's long-polls, meaningless after a restore; leaving it
  // out keeps the header's bytes those of format version 1, tests/checkpoint/fixtures_test.cc).
  InfoResponse header = Info();
  header.clear_job_version();
  header.clear_num_workers();  // as job_version: not part of the format's header
  return data_->CopyForCheckpoint(round, header.SerializeAsString(),
                                  tracker_->Save().SerializeAsString(), delta_parent, end_pass,
                                  step);
}

absl::StatusOr<SaveShardResponse> ShardServer::WriteCheckpoint(int64_t round,
                                                               const std::string& name) {
  return data_->WriteCheckpoint(round, name);
}

absl::Status ShardServer::RestoreCheckpoint(absl::Span<const CheckpointLink> chain) {
  ASSIGN_OR_RETURN(Shard::Restored restored, data_->RestoreCheckpoint(chain));
  const std::string& ckpt_dir = chain.back().dir;
  // With the same workers the exact bookkeeping comes back; otherwise (the workers restart their
  // data) every worker counts as having pushed the last step.
  if (!restored.consistency || !tracker_->Restore(*restored.consistency).ok()) {
    tracker_->ResumeSteps(restored.step);
  }
  coordinator_->SetRestoredFrom(ckpt_dir);
  return absl::OkStatus();
}

absl::Status ShardServer::WarmStart(absl::Span<const CheckpointLink> chain,
                                    bool reset_optimizer,
                                    const std::optional<TableWarmStart>& tables) {
  return data_->RestoreCheckpoint(chain, WarmStartLoadMode(reset_optimizer, tables)).status();
}

}  // namespace pstrain
