#include "worker/train/trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/cpu.h"
#include "common/file.h"
#include "common/json_writer.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/evaluator.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/isa.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data_pass.h"
#include "worker/train/progress.h"
#include "worker/train/train_loop.h"

namespace pstrain {
namespace {

// {"per": "shard", "parameter_bytes": [..], "optimizer_bytes": [..], "total_bytes": [..]}, one
// array element per part.
std::string MemoryJson(const std::string& per, const std::vector<StoreMemory>& parts) {
  std::string params, optimizer, total;
  for (const StoreMemory& m : parts) {
    const char* sep = params.empty() ? "" : ", ";
    absl::StrAppend(&params, sep, m.parameter_bytes);
    absl::StrAppend(&optimizer, sep, m.optimizer_bytes);
    absl::StrAppend(&total, sep, m.total_bytes);
  }
  JsonObject j;
  j.Add("per", per)
      .AddRaw("parameter_bytes", "[" + params + "]")
      .AddRaw("optimizer_bytes", "[" + optimizer + "]")
      .AddRaw("total_bytes", "[" + total + "]");
  return j.str();
}

// The counters of `params`' dynamic tables (ProgressReporter's metrics, summary.json).
std::vector<DynamicTableMetrics> DynamicMetricsOf(LocalParams& params) {
  std::vector<DynamicTableMetrics> out;
  for (int d = 0; d < params.num_dynamic(); ++d) {
    const DynamicEmbeddingStore::Metrics m = params.dynamic_store(d)->metrics();
    DynamicTableMetrics t;
    t.table = params.dynamic_name(d);
    t.rows_live = m.rows_live;
    t.admitted = m.admitted;
    t.rejected = m.rejected;
    t.evicted_ttl = m.evicted_ttl;
    t.evicted_capacity = m.evicted_capacity;
    t.new_ids_last_step = m.new_keys_last_step;
    t.bytes = m.bytes;
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status WriteSummary(const std::string& path, const TrainSummary& s, const Config& config,
                          const TrainerOptions& opts) {
  const ThreadConfig& t = config.threads();
  JsonObject j;
  j.Add("test_auc", s.test_auc)
      .Add("test_logloss", s.test_logloss)
      .Add("eval_examples", s.eval_examples)
      .Add("examples_per_sec", s.examples_per_sec)
      .Add("examples", s.examples)
      .Add("examples_this_run", s.examples_this_run)
      .Add("steps", s.steps)
      .Add("wall_seconds", s.wall_seconds)
      .Add("mode", opts.mode)
      .Add("model", ModelType_Name(config.model().type()))
      .Add("precision", Precision_Name(config.model().precision()))
      .Add("isa", IsaName(KernelIsa()))
      .Add("onednn_isa", OneDnnIsaName())
      .Add("towers", t.towers())
      .Add("intra_op_threads", t.intra_op_threads())
      .Add("inter_op_threads", t.inter_op_threads())
      .Add("batch_size_per_tower", config.train().batch_size())
      .Add("global_batch_size", config.train().global_batch_size())
      .Add("step_batch", StepBatch(config.train(), t, opts.worker_index, opts.num_workers))
      .Add("hosts", opts.hosts)
      .Add("bad_records", s.bad_records)
      .Add("unique_rows_per_step", s.unique_rows_per_step)
      .Add("row_dim", s.row_dim)
      .Add("dense_params", s.dense_params)
      .Add("preempted", s.preempted)
      .Add("checkpoint", s.checkpoint);
  if (s.staleness_pulls > 0) {
    j.Add("staleness_max", s.staleness_max).Add("staleness_mean", s.staleness_mean);
  }
  if (s.sparse_lr_factor != 1) j.Add("sparse_lr_factor", s.sparse_lr_factor);
  if (s.wire_bytes >= 0) j.Add("wire_bytes", s.wire_bytes);
  if (!s.memory.empty()) j.AddRaw("memory", MemoryJson(s.memory_per, s.memory));
  if (!s.dynamic_tables.empty()) {
    JsonObject tables;
    for (const DynamicTableMetrics& t : s.dynamic_tables) {
      tables.AddRaw(t.table, JsonObject()
                                 .Add("rows_live", t.rows_live)
                                 .Add("admitted", t.admitted)
                                 .Add("rejected", t.rejected)
                                 .Add("evicted_ttl", t.evicted_ttl)
                                 .Add("evicted_capacity", t.evicted_capacity)
                                 .Add("new_ids_last_step", t.new_ids_last_step)
                                 .Add("bytes", t.bytes)
                                 .str());
    }
    j.AddRaw("dynamic_tables", tables.str());
  }
  if (!s.restart_log.empty()) {
    std::string list = "[";
    for (const std::string& line : s.restart_log) {
      if (list.size() > 1) list += ", ";
      JsonObject::Quote(line, &list);
    }
    j.Add("restarts", static_cast<int64_t>(s.restart_log.size())).AddRaw("restart_log", list + "]");
  }
  if (config.train().has_early_stopping() || config.checkpoint().keep_best()) {
    j.Add("stopped_early", s.stopped_early);
    if (!s.early_stopping_metric.empty()) {
      j.Add("best_metric", s.early_stopping_metric)
          .Add("best_value", s.best_value)
          .Add("best_step", s.best_step);
    }
    if (!s.best_checkpoint.empty()) j.Add("best_checkpoint", s.best_checkpoint);
  }
  return WriteFileAtomic(path, j.str() + "\n");
}

}  // namespace

absl::StatusOr<TrainSummary> RunTraining(const Config& config_in, const TrainerOptions& opts) {
  Config config = config_in;
  if (opts.cores > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--cores ", opts.cores, ": expected at most ",
                                                   kMaxThreads));
  }
  const int cores = opts.cores > 0 ? opts.cores : DetectCpuBudget().cpus;
  const std::string thread_note = ResolveThreadDefaults(cores, &config, opts.omp_num_threads,
                                                        opts.worker_index, opts.num_workers);
  const int T = config.threads().towers();
  const int I = config.threads().intra_op_threads();
  const int J = config.threads().inter_op_threads();
  const int B = config.train().batch_size();
  const std::string model_dir = config.train().model_dir();
  const std::string ckpt_dir = JobCheckpointDir(config);
  RETURN_IF_ERROR(MakeDirs(model_dir));

  if (opts.chief) {
    // The config this job runs with (thread settings resolved), for `--config` to reproduce it.
    // A per-tower batch_size derived from global_batch_size is left out: the global batch is
    // the setting, and the two together are refused.
    Config effective = config;
    if (effective.train().global_batch_size() > 0) effective.mutable_train()->clear_batch_size();
    RETURN_IF_ERROR(WriteFileAtomic(
        model_dir + "/config.textproto",
        absl::StrCat("# The effective config of this run (", opts.mode, ", ", cores,
                     " cores; threads resolved). Reproduce: pstrain train --config <this file>\n",
                     ConfigToText(effective))));
  }
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  // Dynamic tables live in LocalParams (below, or allreduce's replica: opts.replica) or on the
  // PS shards (opts.params, a PsClient: ps/server/shard.h).
  ASSIGN_OR_RETURN(auto model, Model::Create(config.model(), ModelInputsOf(spec)));
  // Local parameters (with checkpoints) unless the caller brings its own.
  const bool async_local = opts.params == nullptr && config.train().async_local_updates();
  const bool prefetch_pulls = opts.prefetch_pulls || async_local;
  std::unique_ptr<LocalParams> local;
  std::unique_ptr<LocalCheckpointer> local_checkpointer;
  ParameterAccess* params = opts.params;
  Checkpointer* checkpointer = opts.checkpointer;
  if (params == nullptr) {
    // Asynchronous updates keep the optimizer and the gather off the towers' cores' OpenMP
    // teams: one thread each, overlapping the towers.
    ASSIGN_OR_RETURN(StoreTables tables, StoreTablesOf(spec, *model, config.sparse_optimizer(),
                                                      config.train().seed()));
    // A store needs one row at least: a config whose every table is dynamic has none fixed.
    ASSIGN_OR_RETURN(local, LocalParams::Create(*model,
                                                std::max<int64_t>(1, spec.total_rows()), config,
                                                async_local ? 1 : T * I, std::move(tables)));
    RETURN_IF_ERROR(AddDynamicTablesOf(spec, config, async_local ? 1 : T * I, local.get()));
    if (async_local) local->EnableBackgroundPush();
    params = local.get();
    ASSIGN_OR_RETURN(ModelDescription description, DescribeModel(config));
    local_checkpointer = std::make_unique<LocalCheckpointer>(
        ckpt_dir, local.get(), config.checkpoint().keep(), std::move(description),
        config.train().has_warm_start() ? std::optional<WarmStart>(config.train().warm_start())
                                        : std::nullopt,
        config.checkpoint().incremental_every());
    local_checkpointer->set_evict_every_steps(config.checkpoint().every_steps());
    checkpointer = local_checkpointer.get();
  }
  ASSIGN_OR_RETURN(auto progress,
                   ProgressReporter::Create(model_dir, opts.tty,
                                            config.train().metrics_flush_seconds(),
                                            opts.worker_index));
  progress->Message(absl::StrFormat(
      "pstrain %s: %s %s k=%d, %d fields (%d rows), towers=%d intra_op=%d inter_op=%d, batch %d x "
      "%d%s; isa %s (oneDNN %s), %d cores",
      opts.mode, ModelType_Name(config.model().type()), Precision_Name(config.model().precision()),
      config.model().embedding_dim(), spec.num_fields(), spec.total_rows(), T, I, J, T, B,
      opts.num_workers == 1 ? ""
                            : absl::StrFormat(", worker %d of %d", opts.worker_index,
                                              opts.num_workers),
      IsaName(KernelIsa()), OneDnnIsaName(), cores));
  if (!thread_note.empty()) progress->Message(thread_note);

  // Resume, train, save (worker/train/train_loop.h).
  TrainLoop::Parts parts;
  parts.config = &config;
  parts.options = &opts;
  parts.spec = &spec;
  parts.model = model.get();
  parts.params = params;
  parts.checkpointer = checkpointer;
  LocalJob local_job(opts.stop);
  parts.job = opts.job != nullptr ? opts.job : &local_job;
  parts.progress = progress.get();
  parts.prefetch_pulls = prefetch_pulls;
  // The in-process stores whose dynamic tables this trainer handles: its own or allreduce's
  // replica (identical on every rank, so every rank does the same); a PS chief's come from the
  // shards (opts.dynamic_metrics).
  LocalParams* const dynamic = local != nullptr ? local.get() : opts.replica;
  if (dynamic != nullptr && dynamic->num_dynamic() > 0) {
    parts.dynamic_metrics = [dynamic] { return DynamicMetricsOf(*dynamic); };
  } else if (opts.dynamic_metrics) {
    parts.dynamic_metrics = opts.dynamic_metrics;
  }
  TrainLoop loop(parts);
  RETURN_IF_ERROR(loop.Resume());
  if (dynamic != nullptr && dynamic->num_dynamic() > 0) {
    // The pass ("day") the dynamic tables record in their rows, for the TTL in passes: the
    // restored one (Restore sets it), one more when this run begins a new pass.
    int32_t pass = dynamic->dynamic_store(0)->pass();
    if (loop.pass_action() == PassAction::kNewPass) ++pass;
    dynamic->SetPass(pass);
  }
  RETURN_IF_ERROR(loop.Run());
  ASSIGN_OR_RETURN(TrainSummary summary, loop.Finish());
  const int64_t step = loop.step();

  if (local != nullptr) {
    summary.memory_per = "process";
    summary.memory = {local->memory()};
  }
  if (dynamic != nullptr && dynamic->num_dynamic() > 0) {
    // After the final checkpoint's eviction.
    summary.dynamic_tables = DynamicMetricsOf(*dynamic);
    progress->DynamicTables(step, summary.dynamic_tables);
  }
  if (opts.after_training && !summary.preempted) {
    RETURN_IF_ERROR(opts.after_training(&summary));
    if (dynamic == nullptr && opts.dynamic_metrics && !summary.dynamic_tables.empty()) {
      // The shards' tables after the final checkpoint (its evictions at a pass's end), as
      // summary.json has them.
      progress->DynamicTables(step, summary.dynamic_tables);
    }
  }

  summary.test_auc = std::nan("");
  summary.test_logloss = std::nan("");
  if (summary.nothing_to_do) {
    // The message saying why was logged by the loop; summary.json stays the finished pass's.
    progress->Flush();
    return summary;
  }
  // A pass that ended without one example (summary.examples: the whole job's, after
  // after_training) is an error: nothing may be skipped silently.
  if (opts.chief && !summary.preempted && summary.examples == 0) {
    return NoExamplesError(loop.pass_spec());
  }
  if (opts.chief && HasPeriodicEvalData(config.data()) && !summary.preempted) {
    ASSIGN_OR_RETURN(EvalResult e, Evaluate(config, spec, *model, params, step, T * I));
    summary.test_auc = e.auc;
    summary.test_logloss = e.logloss;
    summary.eval_examples = e.examples;
    progress->Eval(step, e.auc, e.logloss, e.examples, true);
  }
  progress->Flush();
  if (!opts.chief) return summary;
  RETURN_IF_ERROR(WriteSummary(model_dir + "/summary.json", summary, config, opts));
  progress->Message(absl::StrFormat(
      "done: %d steps, %d examples in %.1f s (%.0f ex/s), test auc %.5f logloss %.5f -> %s",
      summary.steps, summary.examples, summary.wall_seconds, summary.examples_per_sec,
      summary.test_auc, summary.test_logloss, model_dir + "/summary.json"));
  return summary;
}

}  // namespace pstrain
