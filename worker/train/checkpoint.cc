#include "worker/train/checkpoint.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "checkpoint/warm_start.h"
#include "common/logging.h"
#include "ps/store/dynamic_checkpoint.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/parameter_files.h"
#include "ps/store/store_blocks.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {

bool EvictDynamicTables(const WorkerState& state, int64_t every_steps, LocalParams* params) {
  const bool pass_end = state.finished() && !state.max_steps_reached();
  const bool scheduled = every_steps > 0 && state.step() % every_steps == 0;
  if (params->num_dynamic() == 0 || !(pass_end || scheduled)) return false;
  for (int d = 0; d < params->num_dynamic(); ++d) {
    DynamicEmbeddingStore* s = params->dynamic_store(d);
    // The TTL in passes counts finished passes: before the pass's end its clock is the last
    // finished pass, so that a row of the previous pass not yet seen again in this one stays
    // (with the current pass, ttl_passes 1 would evict, at the pass's first checkpoint, every
    // row this pass had not reached yet). The trainer is between steps: nothing reads the pass.
    const int32_t pass = s->pass();
    if (!pass_end) s->SetPass(pass - 1);
    const DynamicEmbeddingStore::EvictionResult e = s->Evict();
    s->SetPass(pass);
    if (pass_end) s->AgeAdmissionCounts();
    PSTRAIN_LOG(INFO) << "dynamic table '" << params->dynamic_name(d) << "' at step "
                      << state.step() << ": evicted " << e.ttl << " row(s) by TTL and "
                      << e.capacity << " by capacity; " << s->metrics().rows_live << " live";
  }
  return true;
}

std::string DynamicTableFileName(const std::string& table) {
  return absl::StrCat("dynamic-", table);
}

namespace {

// Each dynamic table's file of a checkpoint: the rows changed since the delta's parent (and the
// tombstones of the rows evicted since), or every row. The stores' generations move in lockstep
// with the fixed store's (both start at 1 and only checkpoints raise them).
absl::Status SaveDynamicTables(const std::string& ckpt, uint32_t generation,
                               uint32_t changed_since, LocalParams& params,
                               CheckpointManifest* manifest) {
  for (int d = 0; d < params.num_dynamic(); ++d) {
    DynamicEmbeddingStore& store = *params.dynamic_store(d);
    if (store.generation() >= generation) {
      return absl::InternalError(absl::StrCat(
          "dynamic table '", params.dynamic_name(d), "' is at generation ", store.generation(),
          ", the checkpoint's is ", generation));
    }
    store.BeginGeneration(generation, changed_since > 0 ? changed_since : generation);
    ASSIGN_OR_RETURN(const DynamicSnapshot snapshot, store.Snapshot(changed_since));
    const std::string file = DynamicTableFileName(params.dynamic_name(d));
    ASSIGN_OR_RETURN(auto w, BlockWriter::Create(ckpt + "/" + file));
    RETURN_IF_ERROR(WriteDynamicSnapshot(params.dynamic_name(d), snapshot, w.get()));
    RETURN_IF_ERROR(w->Finish());
    auto* f = manifest->add_file();
    f->set_name(file);
    f->set_bytes(w->bytes());
  }
  return absl::OkStatus();
}

// The dynamic tables' files of every link of the chain: the base's full snapshot, then each
// delta's rows and tombstones.
absl::Status RestoreDynamicTables(absl::Span<const CheckpointLink> chain, LocalParams* params) {
  for (int d = 0; d < params->num_dynamic(); ++d) {
    const std::string& name = params->dynamic_name(d);
    const std::string file = DynamicTableFileName(name);
    for (size_t i = 0; i < chain.size(); ++i) {
      const CheckpointLink& link = chain[i];
      bool listed = false;
      for (const auto& f : link.manifest.file()) listed = listed || f.name() == file;
      if (!listed) {
        return absl::FailedPreconditionError(absl::StrCat(
            link.dir, " has no file ", file, " for dynamic table '", name,
            "': it was written by a job without that table; use a new --model_dir"));
      }
      const std::string path = link.dir + "/" + file;
      ASSIGN_OR_RETURN(NamedDynamicSnapshot s, ReadDynamicFile(path));
      if (s.name != name) {
        return absl::DataLossError(
            absl::StrCat(path, ": holds table '", s.name, "', expected '", name, "'"));
      }
      if ((i == 0) != (s.snapshot.changed_since == 0)) {
        return absl::DataLossError(absl::StrCat(
            path, ": a ", s.snapshot.changed_since == 0 ? "full snapshot" : "delta",
            " where the chain needs a ", i == 0 ? "full snapshot (its base)" : "delta"));
      }
      RETURN_IF_ERROR(Annotate(params->dynamic_store(d)->Restore(s.snapshot), path));
    }
  }
  return absl::OkStatus();
}

// The fixed rows a checkpoint of `params` holds: the stores' rows, or 0 for a config whose every
// table is dynamic. There LocalParams holds one placeholder row (a store needs a row: trainer.cc)
// that no id reaches, so it is neither saved nor counted: the checkpoint is a PS job's of the
// same config (table_rows 0, no fixed row group; cmd/ps_setup.cc) and serving's
// (ServingModel::table_rows 0): PS shards restore it, and each mode warm-starts from the
// other's. Only a 1-row store beside dynamic tables can be the placeholder; the model
// description says whether it is.
int64_t CheckpointRows(const LocalParams& params, const ModelDescription& model) {
  if (params.total_rows() != 1 || params.num_dynamic() == 0) return params.total_rows();
  absl::StatusOr<FeatureSpec> spec = FeatureSpec::Create(model.features(), model.model());
  return spec.ok() && spec->total_rows() == 0 ? 0 : params.total_rows();
}

}  // namespace

absl::StatusOr<ModelDescription> DescribeModel(const Config& config) {
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  ModelDescription d;
  *d.mutable_features() = spec.Resolved();
  *d.mutable_model() = ResolveModelConfig(config.model());
  d.set_init_seed(config.train().seed());
  d.set_init_rule(1);
  *d.mutable_sparse_optimizer() = config.sparse_optimizer();
  *d.mutable_dense_optimizer() = config.dense_optimizer();
  return d;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const WorkerState& state,
                                           LocalParams& params, int keep,
                                           const ModelDescription& model, ReplicaDeltas* deltas) {
  return SaveCheckpoint(dir, state.step(), {{0, state}}, params, keep, "pstrain train", model,
                        deltas);
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int64_t step,
                                           const std::map<int, WorkerState>& workers,
                                           LocalParams& params, int keep,
                                           absl::string_view created_by,
                                           const ModelDescription& model, ReplicaDeltas* deltas) {
  if (IsCommittedCheckpoint(dir, step)) {
    RETURN_IF_ERROR(MarkPassEnd(dir, step, workers));
    return CheckpointPath(dir, step);
  }
  ASSIGN_OR_RETURN(const std::string ckpt, PrepareCheckpointDir(dir, step));
  CheckpointManifest manifest;
  const std::optional<CheckpointDelta> delta =
      deltas != nullptr ? deltas->chain.Next() : std::nullopt;
  if (delta) *manifest.mutable_delta() = *delta;
  // Updates after this copy are stamped with a new generation: the next delta's rows.
  // A delta keeps the change logs since its parent: if its write fails, the next checkpoint is
  // again a delta from that parent. A full checkpoint drops every older log. With named tables,
  // one store per table at its width, one embedding group each (every store's generation moves
  // together: they start at 1 and are raised here only).
  const int64_t table_rows = CheckpointRows(params, model);
  const uint32_t generation = params.embeddings().front()->generation() + 1;
  for (EmbeddingStore* store : params.embeddings()) {
    store->BeginGeneration(generation, delta ? deltas->changed_since : generation);
  }
  {
    const std::string file = ShardFileName(0, 1);
    ASSIGN_OR_RETURN(auto w, BlockWriter::Create(ckpt + "/" + file));
    for (const EmbeddingStore* store : params.embeddings()) {
      if (table_rows == 0) break;  // the placeholder row of a config whose every table is dynamic
      RETURN_IF_ERROR(SaveEmbeddingStore(*store, w.get(), delta ? deltas->changed_since : 0));
    }
    RETURN_IF_ERROR(SaveDenseStore(params.dense()->Snapshot(), w.get()));
    RETURN_IF_ERROR(w->Finish());
    auto* f = manifest.add_file();
    f->set_name(file);
    f->set_bytes(w->bytes());
  }
  RETURN_IF_ERROR(SaveDynamicTables(ckpt, generation, delta ? deltas->changed_since : 0, params,
                                    &manifest));
  manifest.set_step(step);
  manifest.set_num_shards(1);
  manifest.set_table_rows(table_rows);
  manifest.set_partitions(1);
  manifest.set_row_dim(params.row_dim());
  manifest.set_dense_size(params.dense_size());
  manifest.set_created_by(std::string(created_by));
  *manifest.mutable_model() = model;
  ASSIGN_OR_RETURN(std::string committed, CommitCheckpoint(dir, manifest, workers, keep));
  if (deltas != nullptr) {
    deltas->chain.Committed(manifest);
    deltas->changed_since = generation;
  }
  RETURN_IF_ERROR(MarkPassEnd(dir, step, workers));
  return committed;
}

absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(
    const std::string& dir, LocalParams* params, WorkerState* state, const ModelDescription& model,
    ReplicaDeltas* deltas) {
  return RestoreLatestCheckpoint(dir, params, state, 0, 1, model, deltas);
}

absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(
    const std::string& dir, LocalParams* params, WorkerState* state, int worker, int num_workers,
    const ModelDescription& model, ReplicaDeltas* deltas) {
  ASSIGN_OR_RETURN(std::optional<CheckpointChoice> choice, ChooseCheckpoint(dir));
  if (!choice) return std::optional<std::string>();
  const std::string& ckpt = choice->dir;
  const CheckpointManifest& manifest = choice->manifest;
  // The description first: it names the field that differs, where the shapes below would only
  // say that they differ (and a hash seed changes no shape at all).
  RETURN_IF_ERROR(CheckCheckpointModel(ckpt, manifest, model));
  const int64_t table_rows = CheckpointRows(*params, model);
  if (manifest.row_dim() != params->row_dim() || manifest.dense_size() != params->dense_size() ||
      manifest.table_rows() != table_rows) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " was written for another model: rows ", manifest.table_rows(), " x ",
        manifest.row_dim(), ", dense ", manifest.dense_size(), "; this config has rows ",
        table_rows, " x ", params->row_dim(), ", dense ", params->dense_size(),
        ". Use a new --model_dir or the same config."));
  }
  if (manifest.num_shards() != 1 || manifest.num_workers() != num_workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " was written by a job of ", manifest.num_shards(), " PS shards and ",
        manifest.num_workers(), " workers (", manifest.created_by(), "); this job resumes only "
        "checkpoints of one in-process replica and ", num_workers, " worker(s): use the same "
        "command and number of ranks, or a new --model_dir"));
  }
  RETURN_IF_ERROR(ReadWorkerState(ckpt, worker, state));
  const std::vector<EmbeddingStore*>& stores = params->embeddings();
  ASSIGN_OR_RETURN(ParameterLoadCounts counts,
                   LoadParameterFiles(choice->chain, stores, params->dense(), ParameterLoadMode()));
  if (counts.dense_floats != params->dense_size()) {
    return absl::DataLossError(absl::StrCat(ckpt, ": its shard files hold ", counts.dense_floats,
                                            " of the ", params->dense_size(), " dense floats"));
  }
  RETURN_IF_ERROR(RestoreDynamicTables(choice->chain, params));
  if (choice->chain.size() > 1) {
    PSTRAIN_LOG(INFO) << "restored " << ckpt << " with its chain: the full "
                      << choice->chain.front().dir << " and " << choice->chain.size() - 1
                      << " delta(s)";
  }
  if (deltas != nullptr) {
    deltas->chain.Committed(manifest);
    // Restored rows are stamped 0; every update from now on is stamped with the live generation.
    deltas->changed_since = params->embeddings().front()->generation();
  }
  return std::optional<std::string>(ckpt);
}

absl::StatusOr<std::string> WarmStartParams(const WarmStart& warm_start,
                                            const ModelDescription& model, LocalParams* params) {
  std::optional<TableWarmStart> tables;
  ASSIGN_OR_RETURN(const CheckpointChoice source,
                   ChooseWarmStartCheckpoint(warm_start, model, Env::Default(), &tables));
  const CheckpointManifest& m = source.manifest;
  const ParameterLoadMode mode = WarmStartLoadMode(warm_start.reset_optimizer(), tables);
  // Across changed tables the row space and the stride differ by design (rows move by table).
  const int64_t table_rows = CheckpointRows(*params, model);
  if ((!tables && (m.row_dim() != params->row_dim() || m.table_rows() != table_rows)) ||
      (mode.dense && m.dense_size() != params->dense_size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "warm start from ", source.dir, ": written for another model: rows ", m.table_rows(),
        " x ", m.row_dim(), ", dense ", m.dense_size(), "; this config has rows ", table_rows,
        " x ", params->row_dim(), ", dense ", params->dense_size()));
  }
  const std::vector<EmbeddingStore*>& stores = params->embeddings();
  ASSIGN_OR_RETURN(ParameterLoadCounts counts,
                   LoadParameterFiles(source.chain, stores, params->dense(), mode));
  if (mode.dense && counts.dense_floats != params->dense_size()) {
    return absl::DataLossError(absl::StrCat("warm start from ", source.dir, ": the shard files hold ",
                                            counts.dense_floats, " of the ",
                                            params->dense_size(), " dense floats"));
  }
  // The dynamic tables' live rows, by table name (the plan refused a kind or dim change); a
  // table the source lacks starts empty, one the config dropped is skipped.
  std::vector<DynamicEmbeddingStore*> dynamic_stores;
  std::vector<std::string> dynamic_names;
  for (int d = 0; d < params->num_dynamic(); ++d) {
    dynamic_stores.push_back(params->dynamic_store(d));
    dynamic_names.push_back(params->dynamic_name(d));
  }
  RETURN_IF_ERROR(Annotate(LoadDynamicTables(source.chain, dynamic_stores, dynamic_names,
                                             nullptr, "", mode),
                           absl::StrCat("warm start from ", source.dir)));
  int64_t dynamic_rows = 0;
  for (DynamicEmbeddingStore* s : dynamic_stores) dynamic_rows += s->metrics().rows_live;
  PSTRAIN_LOG(INFO) << "warm start from " << source.dir << " (" << m.num_shards()
                    << " shard(s)): " << counts.rows << " embedding rows, " << dynamic_rows
                    << " dynamic rows and the dense vector"
                    << (warm_start.reset_optimizer() ? ", optimizer slots reset"
                                                     : " with their optimizer slots")
                    << (tables ? "; " + tables->Summary() : std::string());
  return source.dir;
}

absl::StatusOr<std::optional<std::string>> RestoreOrWarmStart(
    std::optional<std::string> restored, const std::optional<WarmStart>& warm_start,
    const std::function<absl::StatusOr<std::string>()>& warm_start_params) {
  if (!warm_start) return restored;
  if (restored) {
    PSTRAIN_LOG(INFO) << "resuming " << *restored << "; --warm_start_from "
                      << warm_start->from() << " is ignored (it only starts a fresh model dir)";
    return restored;
  }
  RETURN_IF_ERROR(warm_start_params().status());
  return restored;
}

}  // namespace pstrain
