// A shard's checkpoint file: every shard's copy, write and restore (Shard). The rounds that decide
// when they happen are shard 0's (ps/server/job_coordinator.cc); the protocol is in
// docs/CHECKPOINT.md "PS mode".

#include <algorithm>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/logging.h"
#include "checkpoint/layout.h"
#include "common/dynamic_rows.h"
#include "common/status.h"
#include "ps/server/shard.h"
#include "ps/store/dynamic_checkpoint.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/dynamic_routing.h"
#include "ps/store/parameter_files.h"
#include "ps/store/store_blocks.h"

namespace pstrain {
namespace {

constexpr char kShardHeaderTag[] = "SHRD";
constexpr char kConsistencyTag[] = "CONS";

}  // namespace

absl::Status Shard::CopyForCheckpoint(int64_t round, std::string header, std::string consistency,
                                      std::optional<int64_t> delta_parent, bool end_pass,
                                      int64_t step) {
  absl::MutexLock lock(&snap_mu_);
  snap_round_ = round;
  snap_header_ = std::move(header);  // shard index, map and step of this instant
  snap_consistency_ = std::move(consistency);
  snap_images_.clear();  // an earlier round's instant, never written: its copy-on-write ends
  snap_dynamic_.clear();
  uint32_t changed_since = 0;  // every row
  if (delta_parent) {
    const auto parent = delta_parents_.find(*delta_parent);
    if (parent != delta_parents_.end()) {
      changed_since = parent->second;
    } else {
      PSTRAIN_LOG(WARNING) << "shard " << opt_.shard << ": no record of "
                           << CheckpointName(*delta_parent)
                           << " (the parent of the incremental checkpoint of round " << round
                           << "): its delta holds every row";
    }
  }
  // Updates after this copy are stamped with a new generation: the next delta's rows. The chief
  // names as a delta's parent its last committed checkpoint, so no later copy asks for rows
  // changed before this one's parent (or, for a full copy, before this copy): older change logs
  // are dropped.
  snap_generation_ = ++generation_;
  snap_changed_since_ = changed_since;
  const uint32_t keep_from = changed_since > 0 ? changed_since : snap_generation_;
  for (const auto& store : stores_) {
    snap_images_.push_back(store->Freeze(snap_generation_, keep_from));
  }
  // Dynamic tables: without a step schedule (dynamic_evict_every_steps), evict first
  // (docs/CHECKPOINT.md "Dynamic tables in PS mode"; each eviction is a tombstone of the
  // generation this copy ends, so this checkpoint's delta carries it), then copy the rows (full,
  // or changed since the parent), then start the copy's generation as the fixed stores just did.
  // The pass's end happens once per checkpoint step: the same step again is a redo of the round
  // that ended it (its COPY retried, or the round redone after a restore from the checkpoint that
  // holds this pass end), whose stores already count the next pass and whose sketch is already
  // aged. A new pass always ends at a later step: it trained at least one step.
  if (end_pass && step > 0 && step == pass_end_step_) {
    PSTRAIN_LOG(INFO) << "shard " << opt_.shard << ": the pass's end at step " << step
                      << " (checkpoint round " << round
                      << ") already happened: a redone round, not ended again";
  } else if (end_pass) {
    EvictDynamic(absl::StrCat("at the pass's end (checkpoint round ", round,
                              step > 0 ? absl::StrCat(", step ", step) : "", ")"),
                 /*pass_end=*/true);
    if (step > 0) pass_end_step_ = step;
  } else if (opt_.dynamic_evict_every_steps <= 0) {
    EvictDynamic(absl::StrCat("before the checkpoint of round ", round));
  }
  if (pass_end_step_ > 0) {
    // Saved with the stores' pass, so that a restored shard knows which pass end it holds.
    InfoResponse h;
    if (h.ParseFromString(snap_header_)) {
      h.set_pass_end_step(pass_end_step_);
      snap_header_ = h.SerializeAsString();
    }
  }
  for (size_t d = 0; d < dynamic_stores_.size(); ++d) {
    DynamicEmbeddingStore& store = *dynamic_stores_[d];
    absl::StatusOr<DynamicSnapshot> snap = store.Snapshot(changed_since);
    if (!snap.ok()) {
      // A delta whose change logs are gone (cannot happen while the chief names its last
      // committed checkpoint): the round fails rather than lose the tombstones.
      snap_round_ = 0;
      snap_images_.clear();
      snap_dynamic_.clear();
      return Annotate(snap.status(), absl::StrCat("shard ", opt_.shard, ": ", DynamicName(d)));
    }
    snap_dynamic_.push_back(*std::move(snap));
    store.BeginGeneration(snap_generation_, keep_from);
  }
  // The dense slice is small (the MLP's share): copied.
  snap_dense_.reset(dense_ != nullptr ? new DenseSnapshot(dense_->Snapshot()) : nullptr);
  return absl::OkStatus();
}

void Shard::RecordDeltaParent(int64_t step, uint32_t generation) {
  delta_parents_[step] = generation;
  while (delta_parents_.size() > kDeltaParents) delta_parents_.erase(delta_parents_.begin());
}

namespace {

// The directory a WRITE of `name` may write into: <checkpoint_dir>/<name>, where name is a
// checkpoint name (no '/', no '..', not absolute), the directory exists (the chief made it), is a
// directory and no symbolic link, and is not committed (no MANIFEST in it, LATEST does not name
// it): a committed checkpoint is never rewritten.
absl::StatusOr<std::string> CheckpointWriteDir(int shard, const std::string& checkpoint_dir,
                                               const std::string& name, Env* env) {
  if (checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, " has no checkpoint directory (start it with the job's --model_dir or "
        "checkpoint.dir): it writes no checkpoint"));
  }
  const std::optional<int64_t> step = ParseCheckpointName(name);
  if (!step) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, ": SaveShard WRITE of '", absl::CEscape(name.substr(0, 200)),
                     "': expected a checkpoint name ckpt-<step> under the shard's own checkpoint "
                     "directory"));
  }
  const std::string dir = checkpoint_dir + "/" + name;
  if (!env->IsRealDirectory(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard, ": ", dir, " is not a directory (the chief creates it)"));
  }
  if (PathExists(dir + "/" + kManifestFileName)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, ": ", dir, " is a complete checkpoint; it is never rewritten"));
  }
  if (absl::StatusOr<int64_t> latest = ReadLatest(checkpoint_dir); latest.ok() && *latest == *step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, ": ", dir, " is the committed checkpoint; it is never rewritten"));
  }
  return dir;
}

}  // namespace

bool Shard::HoldsCopy(int64_t round) {
  absl::MutexLock lock(&snap_mu_);
  return round > 0 && snap_round_ == round;
}

absl::StatusOr<SaveShardResponse> Shard::WriteCheckpoint(int64_t round, const std::string& name) {
  absl::MutexLock lock(&snap_mu_);
  if (snap_round_ != round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", opt_.shard, ": WRITE of checkpoint round ", round, " without its COPY (holding ",
        snap_round_ == 0 ? std::string("none") : absl::StrCat("round ", snap_round_), ")"));
  }
  // The copy is freed whatever happens: a failed round is not retried with it.
  struct Release {
    Shard* s;
    ~Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      s->snap_round_ = 0;
      s->snap_images_.clear();
      s->snap_dynamic_.clear();
      s->snap_dense_.reset();
    }
  } release{this};
  ASSIGN_OR_RETURN(const std::string dir,
                   CheckpointWriteDir(opt_.shard, opt_.checkpoint_dir, name, opt_.env));
  SaveShardResponse response;
  response.set_file(pstrain::ShardFileName(opt_.shard, opt_.num_shards));
  const std::string path = dir + "/" + response.file();
  ASSIGN_OR_RETURN(auto w, BlockWriter::Create(path));
  RETURN_IF_ERROR(w->Add(kShardHeaderTag, snap_header_));
  RETURN_IF_ERROR(w->Add(kConsistencyTag, snap_consistency_));
  int64_t rows = 0;
  for (const auto& image : snap_images_) {
    RETURN_IF_ERROR(SaveEmbeddingStore(*image, w.get(), snap_changed_since_, &rows));
  }
  for (size_t d = 0; d < snap_dynamic_.size(); ++d) {
    RETURN_IF_ERROR(WriteDynamicSnapshot(DynamicName(d), snap_dynamic_[d], w.get()));
    rows += snap_dynamic_[d].rows();
  }
  if (snap_dense_) RETURN_IF_ERROR(SaveDenseStore(*snap_dense_, w.get()));
  RETURN_IF_ERROR(w->Finish());
  response.set_bytes(w->bytes());
  response.set_rows(rows);
  RecordDeltaParent(*ParseCheckpointName(name), snap_generation_);
  return response;
}

absl::StatusOr<Shard::Restored> Shard::RestoreCheckpoint(absl::Span<const CheckpointLink> chain,
                                                         ParameterLoadMode mode) {
  if (chain.empty()) return absl::InvalidArgumentError("shard restore: no checkpoint given");
  const std::string& ckpt_dir = chain.back().dir;
  const CheckpointManifest& manifest = chain.back().manifest;
  // A warm start across changed tables (mode.moves) maps rows by table and may leave the dense
  // vector out: the shapes then differ by design.
  const bool same_rows = !mode.moves.empty() || (manifest.table_rows() == opt_.rows &&
                                                  manifest.row_dim() == opt_.row_dim);
  if (!same_rows || (mode.dense && manifest.dense_size() != opt_.dense_size)) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt_dir, " was written for another model: rows ", manifest.table_rows(), " x ",
        manifest.row_dim(), ", dense ", manifest.dense_size(), "; this shard has rows ", opt_.rows,
        " x ", opt_.row_dim, ", dense ", opt_.dense_size,
        ". Use a new --model_dir or the same config."));
  }
  std::vector<EmbeddingStore*> stores;
  for (const auto& s : stores_) stores.push_back(s.get());
  // A PS shard file starts with its SHRD header; this shard's own file of a checkpoint of the
  // same layout also holds its BOUNDED / SYNC bookkeeping (CONS: with SYNC, the kept pushes of a
  // step only some workers had pushed). The file of an in-process replica (`pstrain train`,
  // allreduce) has neither: its step is the MANIFEST's.
  Restored restored;
  std::string header_of;  // the file whose SHRD header `header` is
  InfoResponse header;
  auto other = [&](const std::string& path, BlockReader* reader) -> absl::Status {
    Block b;
    RETURN_IF_ERROR(reader->Next(&b).status());
    if (b.tag == kShardHeaderTag) {
      if (!header.ParseFromString(b.payload)) {
        return reader->Corrupt(b, "payload is not a valid InfoResponse");
      }
      header_of = path;
      restored.step = std::max(restored.step, header.step());
      restored.pass_end_step = std::max(restored.pass_end_step, header.pass_end_step());
      return absl::OkStatus();
    }
    if (b.tag == kConsistencyTag) {
      if (header_of != path) return reader->Corrupt(b, "a 'CONS' block before the 'SHRD' header");
      if (header.shard() == opt_.shard && header.map().shards() == opt_.num_shards &&
          header.map().partitions() == opt_.partitions) {
        restored.consistency.emplace();
        if (!restored.consistency->ParseFromString(b.payload)) {
          return reader->Corrupt(b, "payload is not a valid ConsistencyState");
        }
      }
      return absl::OkStatus();
    }
    if (b.tag == kDynamicMetaTag || b.tag == kDynamicRowsTag || b.tag == kDynamicDeletedTag ||
        b.tag == kDynamicSketchTag) {
      return absl::OkStatus();  // the dynamic tables': RestoreDynamic reads them
    }
    return reader->Corrupt(b, "unexpected block in a shard file");
  };
  ASSIGN_OR_RETURN(ParameterLoadCounts counts,
                   LoadParameterFiles(chain, stores, dense_.get(), mode, other));
  if (header_of.empty()) restored.step = manifest.step();
  RETURN_IF_ERROR(RestoreDynamic(chain, mode));
  if (mode.dense && counts.dense_floats != dense_slice_size_) {
    return absl::DataLossError(absl::StrCat(ckpt_dir, ": the shard files hold ",
                                            counts.dense_floats, " of shard ", opt_.shard, "'s ",
                                            dense_slice_size_, " dense floats"));
  }
  absl::MutexLock lock(&snap_mu_);
  // A resume knows the pass end its checkpoint holds (none in an older checkpoint, or in a
  // `pstrain train` one: 0); a warm start's job counts its own steps, so none of its pass ends.
  pass_end_step_ = mode.keep_step ? restored.pass_end_step : 0;
  if (mode.keep_step) {
    // A resume: the restored rows are stamped 0, so the rows updated from now on (stamped with
    // the live generation) are what a delta after this checkpoint holds.
    RecordDeltaParent(manifest.step(), generation_);
  }
  return restored;
}

void Shard::EvictDynamic(const std::string& why, bool pass_end) {
  for (size_t d = 0; d < dynamic_stores_.size(); ++d) {
    DynamicEmbeddingStore& store = *dynamic_stores_[d];
    const int32_t pass = store.pass();
    const DynamicEmbeddingStore::EvictionResult evicted = store.Evict(pass_end ? pass : pass - 1);
    if (pass_end) {
      store.AgeAdmissionCounts();
      store.SetPass(pass + 1);
    }
    if (evicted.ttl + evicted.capacity > 0) {
      PSTRAIN_LOG(INFO) << "shard " << opt_.shard << ": " << DynamicName(static_cast<int>(d))
                        << ": evicted " << evicted.ttl << " rows by TTL and " << evicted.capacity
                        << " by capacity " << why << "; "
                        << dynamic_stores_[d]->metrics().rows_live << " live";
    }
  }
}

std::string Shard::DynamicName(int d) const {
  return d < static_cast<int>(opt_.dynamic_names.size()) ? opt_.dynamic_names[d]
                                                         : absl::StrCat("dynamic-", d);
}

absl::Status Shard::RestoreDynamic(absl::Span<const CheckpointLink> chain,
                                   ParameterLoadMode mode) {
  if (dynamic_stores_.empty()) return absl::OkStatus();
  std::vector<DynamicEmbeddingStore*> stores;
  std::vector<std::string> names;
  for (int d = 0; d < static_cast<int>(dynamic_stores_.size()); ++d) {
    stores.push_back(dynamic_stores_[d].get());
    names.push_back(DynamicName(d));
  }
  const int shard = opt_.shard, shards = opt_.num_shards;
  return LoadDynamicTables(
      chain, stores, names,
      [shard, shards](int table, uint64_t key) {
        return DynamicShardOf(DynamicRow(table, key), shards) == shard;
      },
      ShardFileName(shard, shards), mode,
      // Re-sharded: shard 0 carries the old shards' counters summed (admitted, rejected,
      // evicted), so that the job's sums go on; the others restart at 0.
      /*carry_counters=*/shard == 0);
}

}  // namespace pstrain
