// ShardServer's checkpoint half: the coordinator's rounds (shard 0) and every shard's copy,
// write and restore. The protocol is in docs/CHECKPOINT.md "PS mode".
#include <sys/stat.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/status.h"
#include "ps/server/shard_server.h"
#include "ps/store/store_blocks.h"

namespace pstrain {
namespace {

constexpr char kShardHeaderTag[] = "SHRD";
constexpr char kConsistencyTag[] = "CONS";

}  // namespace

std::string ShardServer::ShardFileName(int shard, int num_shards) {
  return pstrain::ShardFileName(shard, num_shards);
}

int64_t ShardServer::RequestCheckpoint(bool stop, int64_t target_step) {
  absl::MutexLock lock(&job_mu_);
  if (ckpt_round_ <= ckpt_released_) {  // no round open for arrivals: open the next one
    ++ckpt_round_;
    ckpt_arrivals_.clear();
    ckpt_stop_ = false;
    ckpt_target_ = target_step;
  }
  ckpt_stop_ = ckpt_stop_ || stop;
  return ckpt_round_;
}

absl::Status ShardServer::ArriveCheckpoint(int64_t round, int worker, std::string state) {
  absl::MutexLock lock(&job_mu_);
  if (round != ckpt_round_ || round <= ckpt_released_) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " arrived in checkpoint round ", round,
                     ", but the open round is ", ckpt_round_, " (released up to ",
                     ckpt_released_, ")"));
  }
  ckpt_arrivals_[worker] = std::move(state);
  return absl::OkStatus();
}

absl::Status ShardServer::CollectArrivals(int64_t round, int n, CoordinateResponse* out) const {
  absl::MutexLock lock(&job_mu_);
  if (round != ckpt_round_ || round <= ckpt_released_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint round ", round, " is not open (open: ", ckpt_round_, ", released up to ",
        ckpt_released_, ")"));
  }
  const auto done_it = reports_.find(TRAINING_DONE);
  for (int w = 0; w < n; ++w) {
    if (auto it = ckpt_arrivals_.find(w); it != ckpt_arrivals_.end()) {
      (*out->mutable_worker_states())[w] = it->second;
      continue;
    }
    // A worker that finished training takes part with its final state (its pushes are flushed).
    if (done_it != reports_.end()) {
      if (auto it = done_it->second.find(w);
          it != done_it->second.end() && !it->second.worker_state().empty()) {
        (*out->mutable_worker_states())[w] = it->second.worker_state();
        continue;
      }
    }
    out->add_missing(w);
  }
  return absl::OkStatus();
}

void ShardServer::Report(const ReportRequest& report) {
  absl::MutexLock lock(&job_mu_);
  reports_[report.phase()][report.worker_id()] = report;
}

std::vector<ReportRequest> ShardServer::Reports(JobPhase phase) const {
  absl::MutexLock lock(&job_mu_);
  std::vector<ReportRequest> out;
  if (auto it = reports_.find(phase); it != reports_.end()) {
    for (const auto& [w, r] : it->second) out.push_back(r);
  }
  return out;
}

void ShardServer::FinishJob() {
  absl::MutexLock lock(&job_mu_);
  job_finished_ = true;
}

absl::Status ShardServer::Coordinate(const CoordinateRequest& request,
                                     CoordinateResponse* response) {
  if (opt_.shard != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", opt_.shard, ": the job is coordinated by shard 0"));
  }
  switch (request.kind()) {
    case CoordinateRequest::REQUEST:
      response->set_round(RequestCheckpoint(request.stop(), request.target_step()));
      return absl::OkStatus();
    case CoordinateRequest::ARRIVE:
      return ArriveCheckpoint(request.round(), request.worker_id(), request.worker_state());
    case CoordinateRequest::COLLECT:
      return CollectArrivals(request.round(), request.num_workers(), response);
    case CoordinateRequest::RELEASE:
      ReleaseCheckpoint(request.round());
      return absl::OkStatus();
    case CoordinateRequest::COMPLETE:
      CompleteCheckpoint(request.round(), request.dir(), request.error());
      return absl::OkStatus();
    case CoordinateRequest::REPORTS:
      for (ReportRequest& r : Reports(request.phase())) *response->add_reports() = std::move(r);
      return absl::OkStatus();
    case CoordinateRequest::FINISH_JOB:
      FinishJob();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Coordinate: unknown kind ", static_cast<int>(request.kind())));
  }
}

void ShardServer::ReleaseCheckpoint(int64_t round) {
  absl::MutexLock lock(&job_mu_);
  ckpt_released_ = std::max(ckpt_released_, round);
}

void ShardServer::CompleteCheckpoint(int64_t round, const std::string& dir,
                                     const std::string& error) {
  absl::MutexLock lock(&job_mu_);
  ckpt_released_ = std::max(ckpt_released_, round);
  ckpt_done_ = std::max(ckpt_done_, round);
  ckpt_done_dir_ = error.empty() ? dir : "";
  ckpt_error_ = error;
}

absl::StatusOr<int64_t> ShardServer::CopyForCheckpoint(int64_t round) {
  std::lock_guard<std::mutex> lock(snap_mu_);
  snap_round_ = round;
  snap_header_ = Info().SerializeAsString();  // shard index, map and step of this instant
  snap_consistency_ = SaveConsistency().SerializeAsString();
  snap_stores_.clear();
  int64_t rows = 0;
  for (const auto& store : stores_) {
    snap_stores_.push_back(store->Snapshot());
    rows += snap_stores_.back().rows();
  }
  snap_dense_.reset(dense_ != nullptr ? new DenseSnapshot(dense_->Snapshot()) : nullptr);
  return rows;
}

absl::StatusOr<SaveShardResponse> ShardServer::WriteCheckpoint(int64_t round,
                                                               const std::string& dir) {
  std::lock_guard<std::mutex> lock(snap_mu_);
  if (snap_round_ != round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", opt_.shard, ": WRITE of checkpoint round ", round, " without its COPY (holding ",
        snap_round_ == 0 ? std::string("none") : absl::StrCat("round ", snap_round_), ")"));
  }
  // The copy is freed whatever happens: a failed round is not retried with it.
  struct Release {
    ShardServer* s;
    ~Release() {
      s->snap_round_ = 0;
      s->snap_stores_.clear();
      s->snap_dense_.reset();
    }
  } release{this};
  SaveShardResponse response;
  response.set_file(ShardFileName(opt_.shard, opt_.num_shards));
  const std::string path = dir + "/" + response.file();
  ASSIGN_OR_RETURN(auto w, BlockWriter::Create(path));
  RETURN_IF_ERROR(w->Add(kShardHeaderTag, snap_header_));
  RETURN_IF_ERROR(w->Add(kConsistencyTag, snap_consistency_));
  for (const EmbeddingSnapshot& s : snap_stores_) RETURN_IF_ERROR(SaveEmbeddingStore(s, w.get()));
  if (snap_dense_) RETURN_IF_ERROR(SaveDenseStore(*snap_dense_, w.get()));
  RETURN_IF_ERROR(w->Finish());
  response.set_bytes(w->bytes());
  return response;
}

absl::Status ShardServer::RestoreCheckpoint(const std::string& ckpt_dir,
                                            const CheckpointManifest& manifest) {
  if (manifest.table_rows() != opt_.rows || manifest.row_dim() != opt_.row_dim ||
      manifest.dense_size() != opt_.dense_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt_dir, " was written for another model: rows ", manifest.table_rows(), " x ",
        manifest.row_dim(), ", dense ", manifest.dense_size(), "; this shard has rows ", opt_.rows,
        " x ", opt_.row_dim, ", dense ", opt_.dense_size,
        ". Use a new --model_dir or the same config."));
  }
  std::vector<EmbeddingStore*> stores;
  for (const auto& s : stores_) stores.push_back(s.get());
  int64_t rows = 0, dense_floats = 0, step = 0;
  // This shard's own file of a checkpoint of the same layout also holds its BOUNDED / SYNC
  // bookkeeping (with SYNC, the kept pushes of a step only some workers had pushed).
  std::optional<ConsistencyState> own;
  for (const auto& f : manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    const std::string path = ckpt_dir + "/" + f.name();
    ASSIGN_OR_RETURN(auto reader, BlockReader::Open(path));
    Block b;
    ASSIGN_OR_RETURN(bool got, reader->Next(&b));
    InfoResponse header;
    if (!got || b.tag != kShardHeaderTag || !header.ParseFromString(b.payload)) {
      return absl::DataLossError(absl::StrCat(path, ": expected a '", kShardHeaderTag,
                                              "' block with the shard's map first"));
    }
    step = std::max(step, header.step());
    while (true) {
      ASSIGN_OR_RETURN(std::string tag, reader->PeekTag());
      if (tag.empty()) break;
      if (tag == kEmbeddingMetaTag) {
        RETURN_IF_ERROR(Annotate(LoadEmbeddingStores(reader.get(), stores, &rows), path));
      } else if (tag == kConsistencyTag) {
        RETURN_IF_ERROR(reader->Next(&b).status());
        if (header.shard() == opt_.shard && header.map().shards() == opt_.num_shards &&
            header.map().partitions() == opt_.partitions) {
          own.emplace();
          if (!own->ParseFromString(b.payload)) {
            return reader->Corrupt(b, "payload is not a valid ConsistencyState");
          }
        }
      } else if (tag == kDenseTag) {
        ASSIGN_OR_RETURN(DenseSnapshot d, LoadDenseSnapshot(reader.get()));
        if (dense_ != nullptr) {
          ASSIGN_OR_RETURN(int64_t n, dense_->RestoreOverlap(d));
          dense_floats += n;
        }
      } else {
        ASSIGN_OR_RETURN(bool more, reader->Next(&b));
        if (more) return reader->Corrupt(b, "unexpected block in a shard file");
      }
    }
  }
  if (dense_floats != dense_slice_size_) {
    return absl::DataLossError(absl::StrCat(ckpt_dir, ": the shard files hold ", dense_floats,
                                            " of shard ", opt_.shard, "'s ", dense_slice_size_,
                                            " dense floats"));
  }
  // With the same workers the exact bookkeeping comes back; otherwise (the workers restart their
  // data) every worker counts as having pushed the last step.
  if (!own || !RestoreConsistency(*own).ok()) ResumeSteps(step);
  absl::MutexLock lock(&job_mu_);
  restored_from_ = ckpt_dir;
  return absl::OkStatus();
}

}  // namespace pstrain
