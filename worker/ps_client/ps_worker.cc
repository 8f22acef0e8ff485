#include "worker/ps_client/ps_worker.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "common/config.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/model.h"
#include "worker/ps_client/ps_job.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/ps_client/shard_rpc.h"

namespace pstrain {

absl::StatusOr<TrainSummary> RunPsWorker(Config config, const PsWorkerOptions& o) {
  const int me = o.index;
  const int N = o.num_workers;
  const bool chief = me == 0;
  const std::string ckpt_dir = JobCheckpointDir(config);

  // The table's shape, as the shards have it (ShardOptionsForJob does the same).
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  ASSIGN_OR_RETURN(auto model, Model::Create(config.model(), ModelInputsOf(spec)));
  const int64_t rows = spec.total_rows();
  const int row_dim = model->row_dim();
  const int64_t dense_size = model->dense_size();

  ClusterConfig* cc = config.mutable_cluster();
  cc->clear_ps();
  for (const std::string& h : o.shards) cc->add_ps(h);
  cc->set_index(me);
  if (!chief) {
    config.mutable_train()->set_model_dir(
        absl::StrCat(config.train().model_dir(), "/", o.log_dir_prefix, "-", me));
  }
  RpcSecurity security = o.security;
  if (security.max_message_bytes <= 0) {
    security.max_message_bytes = MaxMessageBytes(config, spec.num_fields(), row_dim, dense_size);
  }
  PsClient::Options client_options = PsClient::OptionsFromConfig(*cc, rows, row_dim, dense_size);
  // The tables' own partitions (TableSplitsOf), as ShardOptionsForJob gives the shards.
  client_options.table_splits = TableSplitsOf(spec, *cc, cc->ps_size());
  if (!client_options.table_splits.empty()) {
    client_options.partitions =
        PartitionMap(client_options.table_splits, cc->ps_size()).partitions();
  }
  // The dynamic tables' rows go to the shards by key hash; each shard must hold them all.
  for (int d = 0; d < spec.num_dynamic_tables(); ++d) {
    client_options.dynamic_row_dims.push_back(1 + spec.dynamic_table(d).dim);
  }
  client_options.local_shard = o.local_shard;
  client_options.local_server = o.local_server;
  client_options.security = security;
  ASSIGN_OR_RETURN(auto client, PsClient::Create(std::move(client_options)));
  RETURN_IF_ERROR(Annotate(client->WaitForShards(o.connect_timeout), "waiting for the shards"));
  std::printf("pstrain %s: %s %d/%d ready, training\n", o.log_dir_prefix.c_str(),
              o.log_dir_prefix.c_str(), me, N);
  std::fflush(stdout);
  // The chief commits the job's checkpoints: what an interrupted write left goes first.
  if (chief) RemoveIncompleteCheckpoints(ckpt_dir);

  PsJob::Options co;
  co.dir = ckpt_dir;
  co.worker = me;
  co.num_workers = N;
  co.keep = config.checkpoint().keep();
  co.incremental_every = config.checkpoint().incremental_every();
  co.shards = o.shards;
  co.client = client.get();
  co.stop = o.stop;
  co.timeout = o.barrier_timeout;
  co.consistency = config.cluster().consistency();
  co.staleness = config.cluster().staleness();
  co.restored = o.restored;
  ASSIGN_OR_RETURN(co.model, DescribeModel(config));
  co.security = security;
  co.lease = absl::Milliseconds(cc->lease_ms());
  co.first_contact = o.connect_timeout;
  co.on_failure = o.on_failure;
  co.worker_hosts = o.worker_hosts;
  PsJob job(std::move(co));
  Env* const env = Env::Default();
  const absl::Duration t_start = env->MonotonicNow();

  TrainerOptions opts;
  opts.tty = chief && isatty(STDERR_FILENO);
  opts.cores = o.cores;
  opts.omp_num_threads = o.omp_num_threads;
  opts.stop = o.stop;
  opts.params = client.get();
  // Pulls of the next batch while this one computes: ASYNC only (BOUNDED / SYNC hold pulls).
  opts.prefetch_pulls =
      config.cluster().consistency() == ASYNC && config.cluster().prefetch_pulls();
  // ASYNC only, as prefetch_pulls: BOUNDED / SYNC shards count one push per worker and step.
  opts.dense_sync_steps = cc->consistency() == ASYNC ? cc->dense_sync_steps() : 1;
  if (chief && cc->dense_sync_steps() > 1 && cc->consistency() != ASYNC) {
    PSTRAIN_LOG(INFO) << "cluster.dense_sync_steps " << cc->dense_sync_steps()
                      << " applies to ASYNC only: " << Consistency_Name(cc->consistency())
                      << " pulls and pushes the dense vector every step";
  }
  opts.checkpointer = job.checkpointer();
  opts.job = &job;
  opts.worker_index = me;
  opts.num_workers = N;
  opts.chief = chief;
  opts.mode = absl::AsciiStrToLower(absl::StrCat("ps-", Consistency_Name(cc->consistency())));
  opts.hosts = static_cast<int>(o.shards.size());
  if (chief && spec.num_dynamic_tables() > 0) {
    // The chief's metrics carry the shards' dynamic tables summed, under `pstrain train`'s names
    // (dynamic/<table>/rows_live, ...): one Stats call to every shard per logged step. A failed
    // call skips that point (training goes on; said once).
    opts.dynamic_metrics = [c = client.get(), warned = false]() mutable {
      absl::StatusOr<std::vector<ShardStats>> stats = c->GetStats();
      if (stats.ok()) return SumDynamicTables(*stats);
      if (!warned) {
        PSTRAIN_LOG(WARNING) << "shard stats for the dynamic tables' metrics (points skipped "
                                "while the shards do not answer): "
                             << stats.status();
        warned = true;
      }
      return std::vector<DynamicTableMetrics>();
    };
  }
  opts.after_training = [&](TrainSummary* summary) -> absl::Status {
    if (o.training != nullptr) *o.training = false;
    // Flushes, then tells the shards that this worker pushes no more (BOUNDED / SYNC stop
    // waiting for it).
    RETURN_IF_ERROR(Annotate(client->FinishTraining(), "finishing training on the shards"));
    const PsClient::Staleness st = client->staleness();
    PSTRAIN_LOG(INFO) << "worker " << me << ": " << Consistency_Name(cc->consistency())
                      << " staleness over " << st.pulls << " training pulls: max " << st.max
                      << ", mean " << absl::StrFormat("%.3f", st.mean());
    RETURN_IF_ERROR(job.ReportTrainingDone(*summary, st, o.restart_log));
    if (!chief) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<ReportRequest> all, job.WaitForTrainingDone());
    summary->examples = 0;
    summary->examples_this_run = 0;
    summary->steps = 0;
    double staleness_sum = 0;
    for (const ReportRequest& r : all) {
      summary->examples += r.examples();
      summary->examples_this_run += r.examples_this_run();
      summary->steps += r.steps();
      summary->staleness_pulls += r.training_pulls();
      summary->staleness_max = std::max(summary->staleness_max, r.staleness_max());
      staleness_sum += r.staleness_sum();
      summary->restart_log.insert(summary->restart_log.end(), r.restart_log().begin(),
                                  r.restart_log().end());
    }
    summary->staleness_mean = staleness_sum / std::max<int64_t>(1, summary->staleness_pulls);
    summary->sparse_lr_factor = SparseLrShareFactor(config, N);
    summary->wall_seconds = absl::ToDoubleSeconds(env->MonotonicNow() - t_start);
    summary->examples_per_sec =
        summary->examples_this_run / std::max(1e-9, summary->wall_seconds);
    // Parameter traffic of the training, every shard's request and response payloads (before
    // the final evaluation's pulls).
    if (auto stats = client->GetStats(); stats.ok()) {
      summary->wire_bytes = 0;
      summary->memory_per = "shard";
      for (const ShardStats& st : *stats) {
        summary->wire_bytes += st.bytes_in() + st.bytes_out();
        summary->memory.push_back({st.parameter_bytes(), st.optimizer_bytes(), st.bytes()});
      }
    }
    auto final_ckpt = job.SaveFinal();
    RETURN_IF_ERROR(Annotate(final_ckpt.status(), "the job's final checkpoint"));
    summary->checkpoint = *final_ckpt;
    // The shards' dynamic tables summed, after the final checkpoint's evictions (a pass's end):
    // summary.json's dynamic_tables as `train` writes it.
    if (auto stats = client->GetStats(); stats.ok()) {
      summary->dynamic_tables = SumDynamicTables(*stats);
    } else {
      PSTRAIN_LOG(WARNING) << "shard stats for the dynamic tables: " << stats.status();
    }
    PSTRAIN_LOG(INFO) << "chief: final checkpoint " << summary->checkpoint;
    return absl::OkStatus();
  };
  if (o.training != nullptr) *o.training = true;
  absl::StatusOr<TrainSummary> summary = RunTraining(config, opts);
  if (o.training != nullptr) *o.training = false;
  // The other workers learn at once that the job failed (their long-polls answer), instead of
  // waiting for shard 0's calls to time out. Best effort: shard 0 may be what failed.
  if (!summary.ok() && chief) job.FailJob(summary.status());
  if (!summary.ok() || !chief) return summary;
  if (!summary->preempted) {
    if (auto stats = client->GetStats(); stats.ok()) {
      std::fprintf(stderr, "PS shard balance:\n%s\n", FormatShardBalance(*stats).c_str());
    } else {
      PSTRAIN_LOG(WARNING) << "shard stats: " << stats.status();
    }
  }
  RETURN_IF_ERROR(job.FinishJob());
  return summary;
}

}  // namespace pstrain
