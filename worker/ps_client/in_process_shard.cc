// InProcessShard: ASYNC's direct path to the shard this process serves
// (worker/ps_client/shard_endpoint.h).
#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/wire.h"
#include "common/status.h"
#include "worker/ps_client/shard_endpoint.h"

namespace pstrain {
namespace {

class InProcessShard final : public ShardEndpoint {
 public:
  InProcessShard(int shard, LocalShard* local, int row_dim, std::unique_ptr<ShardEndpoint> channel)
      : local_(local),
        row_dim_(row_dim),
        channel_(std::move(channel)),
        where_(absl::StrCat("shard ", shard, " (in this process)")) {}

  const std::string& name() const override { return channel_->name(); }

  // On the caller's thread: the rows through the part's scratch buffer, the dense slice in place.
  void Pull(PullPart* part, ShardDone done) override {
    if (absl::Status aborted = Aborted("Pull"); !aborted.ok()) return done(aborted);
    const PullRequest& req = part->request;
    std::vector<int64_t> unaligned;
    absl::Span<const int64_t> ids;
    absl::Status st = UnpackArray(req.ids(), "PullRequest.ids", &unaligned, &ids);
    if (st.ok()) {
      part->scratch_rows.resize(ids.size() * row_dim_);
      part->scratch_versions.resize(req.step() > 0 && local_->row_versions() ? ids.size() : 0);
      st = local_->PullDirect(
          ids, req.step(), part->scratch_rows.data(), req.want_dense() ? part->dense_out : nullptr,
          &part->staleness, &part->dense_version,
          part->scratch_versions.empty() ? nullptr : part->scratch_versions.data());
    }
    if (st.ok()) {
      part->rows = reinterpret_cast<const char*>(part->scratch_rows.data());
      part->row_versions = part->scratch_versions.empty()
                               ? nullptr
                               : reinterpret_cast<const char*>(part->scratch_versions.data());
    }
    done(Annotate(st, where_));
  }

  uint64_t ReservePush() override { return 0; }  // applied at once, in call order

  // On the caller's thread, on the request's bytes in place.
  void Push(uint64_t /*ticket*/, PushPart* part, ShardDone done) override {
    if (absl::Status aborted = Aborted("Push"); !aborted.ok()) return done(aborted);
    const PushRequest& req = part->request;
    std::vector<int64_t> ids_scratch;
    std::vector<float> grads_scratch;
    std::vector<uint32_t> versions_scratch;
    absl::Span<const int64_t> ids;
    absl::Span<const float> grads;
    absl::Span<const uint32_t> versions;
    absl::Status st = UnpackArray(req.ids(), "PushRequest.ids", &ids_scratch, &ids);
    if (st.ok()) st = UnpackArray(req.row_grads(), "PushRequest.row_grads", &grads_scratch, &grads);
    if (st.ok()) {
      st = UnpackArray(req.row_versions(), "PushRequest.row_versions", &versions_scratch,
                       &versions);
    }
    if (st.ok()) {
      st = local_->PushDirect(req.worker_id(), req.step(), ids, grads.data(),
                              part->dense_len > 0 ? part->dense_grad : nullptr,
                              part->dense_len > 0 && req.has_dense_version()
                                  ? req.dense_version()
                                  : -1,
                              versions.empty() ? nullptr : versions.data());
    }
    part->dense_grad = nullptr;
    done(Annotate(st, where_));
  }

  void Info(const InfoRequest* request, InfoResponse* response, bool wait_for_ready,
            absl::Duration budget, ShardDone done) override {
    channel_->Info(request, response, wait_for_ready, budget, std::move(done));
  }
  void Stats(const StatsRequest* request, ShardStats* response, absl::Duration budget,
             ShardDone done) override {
    channel_->Stats(request, response, budget, std::move(done));
  }
  void PushOutOfOrder(const PushRequest* request, PushResponse* response, absl::Duration budget,
                      ShardDone done) override {
    channel_->PushOutOfOrder(request, response, budget, std::move(done));
  }

  void Abort(absl::Status reason) override {
    {
      absl::MutexLock lock(&mu_);
      if (abort_.ok()) abort_ = reason;
    }
    aborting_ = true;
    channel_->Abort(std::move(reason));
  }
  void Shutdown() override { channel_->Shutdown(); }
  ShardTraffic traffic() const override { return channel_->traffic(); }

 private:
  absl::Status Aborted(const char* method) const {
    if (!aborting_.load()) return absl::OkStatus();  // the hot path takes no lock
    absl::MutexLock lock(&mu_);
    if (abort_.ok()) return abort_;
    return absl::Status(abort_.code(), absl::StrCat(name(), ": ", method, ": ", abort_.message()));
  }

  LocalShard* const local_;
  const int row_dim_;
  const std::unique_ptr<ShardEndpoint> channel_;
  const std::string where_;  // "shard 1 (in this process)"
  std::atomic<bool> aborting_{false};  // abort_ is set
  mutable absl::Mutex mu_;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ShardEndpoint> MakeInProcessShard(int shard, LocalShard* local, int row_dim,
                                                  std::unique_ptr<ShardEndpoint> channel) {
  return std::make_unique<InProcessShard>(shard, local, row_dim, std::move(channel));
}

}  // namespace pstrain
