#include "serving/server/predict_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/rpc/callback_queue.h"
#include "common/rpc/grpc_status.h"
#include "common/status.h"
#include "pstrain/serving.grpc.pb.h"
#include "serving/export.h"
#include "serving/request_rows.h"

namespace pstrain {
namespace {

constexpr char kServiceName[] = "pstrain.Predictor";

// Compares without an early exit, so that the time taken says nothing about the token.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

// Every method is registered raw (its request and response as bytes): a request that does not
// parse gets the server's own INVALID_ARGUMENT naming the message it expected (ParseRequest), not
// gRPC's bare UNIMPLEMENTED.
using PredictorBase = Predictor::WithRawCallbackMethod_Predict<
    Predictor::WithRawCallbackMethod_GetModelInfo<Predictor::WithRawCallbackMethod_Reload<
        Predictor::Service>>>;

// One Predict call's messages, alive until its answer is serialized (the scoring threads write
// the probabilities into `response`).
struct PredictCall {
  PredictRequest request;
  PredictResponse response;
};

class PredictorService final : public PredictorBase {
 public:
  explicit PredictorService(PredictServer* server) : server_(server) {}

  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    auto call = std::make_shared<PredictCall>();
    absl::Status s = ParseRequest(*request, &call->request);
    if (s.ok()) s = Accept(call, response, reactor);
    if (!s.ok()) {
      {
        absl::MutexLock l(&server_->mu_);
        ++server_->stats_.rejected;
      }
      reactor->Finish(ToGrpcStatus(s));
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    ModelInfoRequest parsed;
    if (absl::Status s = ParseRequest(*request, &parsed); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
    ModelInfo answer;
    ModelInfo* info = &answer;
    const std::shared_ptr<const ServingModel> model = server_->model();
    info->set_version(model->origin().version);
    info->set_step(model->origin().step);
    info->set_path(model->origin().path);
    for (const auto& f : model->spec().fields()) info->add_field(f.name);
    info->set_model_type(ModelType_Name(model->description().model().type()));
    info->set_stored_rows(model->stored_rows());
    info->set_max_request_rows(server_->opt_.max_request_rows);
    info->set_reloads(server_->stats().reloads);
    reactor->Finish(Serialize(answer, response));
    return reactor;
  }

  grpc::ServerUnaryReactor* Reload(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (server_->opt_.admin_token.empty()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                   "Reload is off: start the server with --admin_token_file (it "
                                   "also reloads by itself when a newer version appears)"));
      return reactor;
    }
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string want = "Bearer " + server_->opt_.admin_token;
    if (it == md.end() ||
        !ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), want)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                   "Reload needs the admin token (metadata 'authorization: "
                                   "Bearer <token>')"));
      return reactor;
    }
    // The request is parsed only for a caller with the token (it has no fields yet).
    ReloadRequest parsed;
    if (absl::Status s = ParseRequest(*request, &parsed); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
    // The load runs on the loader thread; the call finishes when it is done.
    PredictServer* server = server_;
    server_->RequestLoad([reactor, response, server](absl::StatusOr<bool> changed) {
      if (!changed.ok()) {
        reactor->Finish(ToGrpcStatus(changed.status()));
        return;
      }
      ReloadResponse answer;
      answer.set_changed(*changed);
      answer.set_version(server->model()->origin().version);
      reactor->Finish(Serialize(answer, response));
    });
    return reactor;
  }

 private:
  // A raw request as message M; INVALID_ARGUMENT naming M when its bytes do not parse.
  template <typename M>
  static absl::Status ParseRequest(const grpc::ByteBuffer& bytes, M* out) {
    grpc::ByteBuffer copy(bytes);  // shares the slices; Deserialize consumes its argument
    const grpc::Status s = grpc::SerializationTraits<M>::Deserialize(&copy, out);
    if (s.ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the request (", bytes.Length(), " bytes) is not a ", M::descriptor()->full_name(),
        " (proto/pstrain/serving.proto): its bytes do not parse as that message",
        s.error_message().empty() ? "" : absl::StrCat(" (", s.error_message(), ")")));
  }
  // A raw answer: `message`'s bytes into `out`; the status to finish the call with.
  template <typename M>
  static grpc::Status Serialize(const M& message, grpc::ByteBuffer* out) {
    bool own = false;
    return grpc::SerializationTraits<M>::Serialize(message, out, &own);
  }

  // Serializes the answer into the call's raw response and finishes the call.
  static void Answer(const PredictCall& call, grpc::ByteBuffer* out,
                     grpc::ServerUnaryReactor* reactor) {
    reactor->Finish(Serialize(call.response, out));
  }

  absl::Status Accept(const std::shared_ptr<PredictCall>& call, grpc::ByteBuffer* out,
                      grpc::ServerUnaryReactor* reactor) {
    const PredictRequest& request = call->request;
    PredictResponse* response = &call->response;
    const int64_t n = static_cast<int64_t>(request.rows_size()) + request.examples_size();
    if (n > server_->opt_.max_request_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request of ", n, " rows: at most ", server_->opt_.max_request_rows,
          " a request (the server's --max_request_rows); split it"));
    }
    std::shared_ptr<const ServingModel> model;
    {
      absl::MutexLock l(&server_->mu_);
      if (server_->stopping_) return absl::UnavailableError("the server is stopping");
      model = server_->model_;
    }
    response->set_model_version(model->origin().version);
    RETURN_IF_ERROR(CheckRequestFields(request));
    if (n == 0) {
      Answer(*call, out, reactor);
      return absl::OkStatus();
    }
    RawRows raw;
    raw.Clear(model->spec().num_fields());
    RETURN_IF_ERROR(ParseRequestRows(request, model->spec(), &raw));
    auto job = std::make_shared<ScoreJob>();
    job->model = model;
    model->spec().Encode(raw, &job->rows);
    response->mutable_probabilities()->Resize(static_cast<int>(n), 0.f);
    job->probs = response->mutable_probabilities()->mutable_data();
    if (request.want_logits()) {
      response->mutable_logits()->Resize(static_cast<int>(n), 0.f);
      job->logits = response->mutable_logits()->mutable_data();
    }
    PredictServer* server = server_;
    Env* env = server->opt_.batching.env;
    job->done = [reactor, server, env, call, out, start = env->MonotonicNow()](absl::Status s) {
      if (s.ok()) {
        server->metrics_->ObservePredict(absl::ToDoubleSeconds(env->MonotonicNow() - start));
        Answer(*call, out, reactor);
      } else {
        reactor->Finish(ToGrpcStatus(s));
      }
      absl::MutexLock l(&server->mu_);
      --server->in_flight_;
    };
    {
      absl::MutexLock l(&server_->mu_);
      ++server_->in_flight_;
    }
    absl::Status queued = server_->batcher_->Enqueue(std::move(job));
    absl::MutexLock l(&server_->mu_);
    if (!queued.ok()) {
      --server_->in_flight_;
      return queued;
    }
    ++server_->stats_.requests;
    return absl::OkStatus();
  }

  PredictServer* const server_;
};

PredictServer::PredictServer(Options options) : opt_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<PredictServer>> PredictServer::Start(Options options) {
  if (options.max_request_rows < 1) {
    return absl::InvalidArgumentError("max_request_rows must be >= 1");
  }
  std::unique_ptr<PredictServer> s(new PredictServer(std::move(options)));
  const std::string& path = s->opt_.model_path;
  ReadExportOptions ro;
  ro.cancel = s->opt_.stop;
  // One version directory, or the newest version of a base directory that reads.
  s->versioned_ = !PathExists(path + "/" + kExportFileName);
  absl::StatusOr<std::unique_ptr<ServingModel>> model =
      !s->versioned_ ? (s->opt_.read_export ? s->opt_.read_export(path, ro) : ReadExport(path, ro))
                     : ReadNewestExport(path, -1, ro, s->opt_.read_export);
  if (!model.ok()) return Annotate(model.status(), "loading " + path);
  if (*model == nullptr) {
    RETURN_IF_ERROR(ResolveExportDir(path, s->opt_.batching.env).status());
    return absl::NotFoundError(absl::StrCat(path, ": its versions changed while read; try again"));
  }
  s->model_ = std::shared_ptr<const ServingModel>(*std::move(model));
  ASSIGN_OR_RETURN(s->batcher_, Batcher::Create(s->opt_.batching));
  s->metrics_ = std::make_unique<ServeMetrics>([p = s.get()] {
    const Stats st = p->stats();
    ServeCounters c;
    c.requests = st.requests;
    c.rejected = st.rejected;
    c.rows = st.batcher.rows;
    c.padded_rows = st.batcher.padded_rows;
    c.batches = st.batcher.batches;
    c.reloads = st.reloads;
    c.version = p->model()->origin().version;
    return c;
  });
  s->loader_ = std::thread([p = s.get()] { p->LoaderLoop(); });
  if (s->versioned_ && s->opt_.watch) {
    s->watch_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    s->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->watch_fd_ < 0 || s->wake_fd_ < 0 ||
        inotify_add_watch(s->watch_fd_, s->opt_.model_path.c_str(),
                          IN_MOVED_TO | IN_CREATE | IN_CLOSE_WRITE) < 0) {
      PSTRAIN_LOG(WARNING) << "cannot watch " << s->opt_.model_path << " (" << std::strerror(errno)
                           << "): newer versions load only on Reload";
    } else {
      s->watcher_ = std::thread([p = s.get()] { p->WatchLoop(); });
    }
  }
  RETURN_IF_ERROR(s->Listen());
  return s;
}

absl::Status PredictServer::Listen() {
  // A callback service: gRPC's process-wide callback queue must outlive every release of a
  // channel or server, whatever thread it happens on (common/rpc/callback_queue.h).
  HoldCallbackQueue();
  grpc::EnableDefaultHealthCheckService(true);
  service_ = std::make_unique<PredictorService>(this);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(opt_.address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", opt_.address, " (address in use, or not an address of this host)"));
  }
  port_ = port;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(kServiceName, true);
    health->SetServingStatus(true);
  }
  return absl::OkStatus();
}

PredictServer::~PredictServer() { Shutdown(absl::ZeroDuration()); }

std::shared_ptr<const ServingModel> PredictServer::model() const {
  absl::MutexLock l(&mu_);
  return model_;
}

PredictServer::Stats PredictServer::stats() const {
  Stats s;
  {
    absl::MutexLock l(&mu_);
    s = stats_;
  }
  if (batcher_ != nullptr) s.batcher = batcher_->stats();
  return s;
}

absl::StatusOr<bool> PredictServer::LoadNewest() {
  absl::MutexLock load(&load_mu_);
  if (!versioned_) return false;
  const int64_t current = model()->origin().version;
  ReadExportOptions ro;
  ro.cancel = &cancel_loads_;
  // Newest first; a version that does not read is skipped (and logged, naming it).
  absl::StatusOr<std::unique_ptr<ServingModel>> loaded =
      ReadNewestExport(opt_.model_path, current, ro, opt_.read_export);
  if (!loaded.ok()) {
    if (!absl::IsCancelled(loaded.status())) {
      PSTRAIN_LOG(ERROR) << "still serving version " << current << ": "
                         << loaded.status().message();
    }
    return Annotate(loaded.status(), absl::StrCat("still serving version ", current));
  }
  if (*loaded == nullptr) return false;
  std::shared_ptr<const ServingModel> next(*std::move(loaded));
  const std::string dir = next->origin().path;
  {
    absl::MutexLock l(&mu_);
    model_ = std::move(next);
    ++stats_.reloads;
  }
  PSTRAIN_LOG(INFO) << "serving " << dir << " (was version " << current << ")";
  return true;
}

void PredictServer::RequestLoad(std::function<void(absl::StatusOr<bool>)> done) {
  {
    absl::MutexLock l(&mu_);
    if (!stopping_) {
      if (done) load_requests_.push_back(std::move(done));
      load_wanted_ = true;
      load_cv_.Signal();
      return;
    }
  }
  if (done) done(absl::UnavailableError("the server is stopping"));
}

void PredictServer::LoaderLoop() {
  while (true) {
    std::vector<std::function<void(absl::StatusOr<bool>)>> waiting;
    bool stop;
    {
      absl::MutexLock l(&mu_);
      while (!load_wanted_ && !stopping_) load_cv_.Wait(&mu_);
      stop = stopping_;
      load_wanted_ = false;
      waiting.swap(load_requests_);
    }
    if (stop) {
      for (auto& w : waiting) w(absl::UnavailableError("the server is stopping"));
      return;
    }
    // Requests that arrive while this load runs ask for another one (load_wanted_).
    const absl::StatusOr<bool> result = LoadNewest();
    for (auto& w : waiting) w(result);
  }
}

void PredictServer::WatchLoop() {
  alignas(inotify_event) char buf[4096];
  while (true) {
    pollfd fds[2] = {{watch_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      PSTRAIN_LOG(ERROR) << "watching " << opt_.model_path << ": poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    bool relevant = false;
    while (true) {
      const ssize_t len = read(watch_fd_, buf, sizeof(buf));
      if (len <= 0) break;
      for (char* p = buf; p < buf + len;) {
        const auto* e = reinterpret_cast<const inotify_event*>(p);
        // A version appears by a rename of its staging directory (hidden names are staging).
        if (e->len > 0 && e->name[0] != '.') relevant = true;
        p += sizeof(inotify_event) + e->len;
      }
    }
    if (relevant) RequestLoad(nullptr);
  }
}

void PredictServer::Shutdown(absl::Duration grace) {
  if (shut_down_.exchange(true)) return;
  cancel_loads_.Notify();  // a reload in progress gives up: it must not hold the stop up
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    load_cv_.Signal();
  }
  Env* env = opt_.batching.env;
  const absl::Time deadline = env->Now() + grace;  // wall: gRPC deadlines are
  if (server_ != nullptr) {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(kServiceName, false);
      health->SetServingStatus(false);
    }
    // Drain: the accepted requests are answered while gRPC still runs (the batcher keeps
    // scoring); new ones are answered UNAVAILABLE by the handler.
    {
      absl::MutexLock l(&mu_);
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
      mu_.AwaitWithTimeout(absl::Condition(&drained), deadline - env->Now());
    }
    // What is left are calls that arrive now (our handler answers them at once) and idle client
    // connections, which gRPC would otherwise wait for until the deadline: a short last wait.
    server_->Shutdown(absl::ToChronoTime(
        std::min(deadline, env->Now() + absl::Milliseconds(200))));
  }
  if (batcher_ != nullptr) batcher_->Stop();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (watcher_.joinable()) watcher_.join();
  if (loader_.joinable()) loader_.join();
  if (server_ != nullptr) server_->Wait();
  if (watch_fd_ >= 0) close(watch_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

}  // namespace pstrain
