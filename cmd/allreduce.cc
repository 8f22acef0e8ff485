// `pstrain allreduce`: synchronous MPI data parallelism (worker/allreduce/allreduce_params.h), the baseline
// the PS mode is compared with. The only command that initializes MPI.
#include <fcntl.h>
#include <mpi.h>
#include <semaphore.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/stop_signal.h"
#include "common/config.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/memory.h"
#include "common/status.h"
#include "worker/allreduce/allreduce_params.h"
#include "worker/allreduce/replica_memory.h"
#include "worker/data/feature_spec.h"
#include "worker/data/file_list.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/model.h"
#include "worker/train/trainer.h"

namespace pstrain {
namespace {

// Posted by a stop signal (StopSignals::on_stop) and by the end of training.
sem_t g_wake;
std::atomic<bool> g_training_done{false};
// The terminal's stderr: rank r > 0 sends its own stderr (progress) to <model_dir>/rank-<r>/
// output.log, but its errors go here too.
int g_console = STDERR_FILENO;

// An error line on stderr and, when stderr is a rank's log, on the terminal too.
void Report(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  if (g_console != STDERR_FILENO) dprintf(g_console, "%s\n", line.c_str());
}

// After a stop signal, the ranks agree to stop at the next step and write a checkpoint. When a
// rank has died, mpirun signals the survivors, which may then be stuck in a collective that
// OpenMPI never fails (it has no fault tolerance); mpirun kills them after
// odls_base_sigkill_timeout. If that is raised for large checkpoints, this watchdog still bounds
// the wait: a rank not done `timeout` seconds after the signal says why and exits.
void StopWatchdog(int rank, int size, double timeout) {
  sem_wait(&g_wake);
  if (g_training_done) return;
  timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += static_cast<time_t>(timeout);
  while (sem_timedwait(&g_wake, &deadline) != 0) {
    if (errno == EINTR) continue;  // another signal: not the end of training
    Report(absl::StrFormat(
        "pstrain allreduce: rank %d of %d: stopped by a signal, but the ranks did not reach the "
        "checkpoint within %.0f s (--stop_timeout): another rank has probably died or hangs (see "
        "mpirun's message); exiting without a checkpoint",
        rank, size, timeout));
    _exit(1);
  }
}

// The share of a rank's memory budget its replica may take; the rest is for the step's buffers,
// the data pipeline and MPI.
constexpr double kReplicaShare = 0.9;

// Refuses (when `refuse`) a replica that will not fit this rank's memory
// (worker/allreduce/replica_memory.h); returns the bytes the replica may grow to (-1: no limit
// known), which each step then checks.
absl::StatusOr<int64_t> CheckReplicaFits(const Config& config, const FeatureSpec& spec,
                                         const Model& model, int rank, int size, bool refuse) {
  const MemoryBudget budget = DetectMemoryBudget();
  if (budget.bytes < 0) return int64_t{-1};
  // The data's distinct values, when datagen's teacher.json is beside the first channel's files
  // (none for pipe mode; a path that does not expand is the pipeline's error to report).
  std::vector<std::string> paths(config.data().train(0).path().begin(),
                                 config.data().train(0).path().end());
  std::optional<DataCardinality> data;
  if (absl::StatusOr<std::vector<std::string>> files = ExpandPath(paths);
      !paths.empty() && files.ok()) {
    ASSIGN_OR_RETURN(data, ReadDataCardinality(*files));
  }
  ASSIGN_OR_RETURN(ReplicaEstimate e, EstimateReplica(config, spec, model.row_dim(),
                                                      model.dense_size(), data));
  const int64_t usable = static_cast<int64_t>(budget.bytes * kReplicaShare);
  if (rank == 0) {
    std::fprintf(stderr,
                 "pstrain allreduce: each rank's replica: about %.0f MB expected (%s); this rank "
                 "may take %.0f MB (%.0f%% of %s)\n",
                 e.bytes / 1048576.0, e.basis.c_str(), usable / 1048576.0, kReplicaShare * 100,
                 budget.source.c_str());
  }
  if (refuse && e.bytes > usable) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the model does not fit: each of the %d ranks holds a full replica of every trained row "
        "and its optimizer slots, about %.0f MB (%s), but this rank may take only %.0f MB "
        "(%.0f%% of %s). Use the parameter server (`pstrain host`, docs/PS.md), which splits the "
        "tables over the shards; or give each rank more memory, or smaller tables "
        "(features.categorical_vocab_size); --nomemory_check starts anyway (each step still "
        "stops the job before the replica passes the limit)",
        size, e.bytes / 1048576.0, e.basis, usable / 1048576.0, kReplicaShare * 100,
        budget.source));
  }
  return usable;
}

absl::Status Train(Config config, int rank, int size, int local_ranks, bool memory_check,
                   std::atomic<bool>* local_stop) {
  const int cores = std::max(1, Launch().cpus.cpus / local_ranks);
  const std::string thread_note =
      ResolveThreadDefaults(cores, &config, Launch().omp_num_threads, rank, size);
  if (!thread_note.empty() && rank == 0) std::fprintf(stderr, "pstrain allreduce: %s\n", thread_note.c_str());
  const int threads = config.threads().towers() * config.threads().intra_op_threads();
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  ASSIGN_OR_RETURN(auto model, Model::Create(config.model(), ModelInputsOf(spec)));
  AllreduceOptions ao;
  ASSIGN_OR_RETURN(ao.replica_budget_bytes,
                   CheckReplicaFits(config, spec, *model, rank, size, memory_check));
  ASSIGN_OR_RETURN(StoreTables tables, StoreTablesOf(spec, *model, config.sparse_optimizer(),
                                                    config.train().seed()));
  // A store needs one row at least: a config whose every table is dynamic has none fixed.
  ASSIGN_OR_RETURN(auto replica,
                   LocalParams::Create(*model, std::max<int64_t>(1, spec.total_rows()), config,
                                       threads, std::move(tables)));
  // Dynamic tables: a store each in every replica, created alike (same options, same seeds);
  // AllreduceParams keeps their admissions and evictions identical (docs/ALLREDUCE.md).
  RETURN_IF_ERROR(AddDynamicTablesOf(spec, config, threads, replica.get()));

  ao.sparse_as_dense = config.allreduce().sparse_as_dense();
  ao.max_dense_table_bytes = int64_t{config.allreduce().max_dense_table_mb()} << 20;
  ao.checkpoint_dir = JobCheckpointDir(config);
  ao.keep = config.checkpoint().keep();
  ao.incremental_every = config.checkpoint().incremental_every();
  ao.checkpoint_every_steps = config.checkpoint().every_steps();
  ao.checkpoint_every_seconds = config.checkpoint().every_seconds();
  ao.local_stop = local_stop;
  ASSIGN_OR_RETURN(ao.model, DescribeModel(config));
  if (config.train().has_warm_start()) ao.warm_start = config.train().warm_start();
  ASSIGN_OR_RETURN(auto params, AllreduceParams::Create(std::move(replica), std::move(ao)));
  AllreduceCheckpointer checkpointer(params.get());
  AllreduceJob job(params.get());
  // The checkpoint schedule is agreed by the ranks inside AllreduceParams, not by the trainer's
  // chief-only schedule.
  config.mutable_checkpoint()->set_every_steps(0);
  config.mutable_checkpoint()->set_every_seconds(0);
  // Rank 0 logs to the model dir; the others to <model_dir>/rank-<r>/ (metrics, events).
  if (rank != 0) {
    config.mutable_train()->set_model_dir(
        absl::StrCat(config.train().model_dir(), "/rank-", rank));
  }

  TrainerOptions opts;
  opts.cores = cores;
  opts.tty = rank == 0 && isatty(STDERR_FILENO);
  opts.stop = params->agreed_stop();
  opts.params = params.get();
  opts.replica = params->replica();
  opts.checkpointer = &checkpointer;
  opts.job = &job;
  opts.worker_index = rank;
  opts.num_workers = size;
  opts.chief = rank == 0;
  opts.mode = "allreduce";
  opts.hosts = size;
  opts.after_training = [&](TrainSummary* s) { return params->Finish(s); };
  return RunTraining(config, opts).status();
}

// The process's MPI world: this rank, the ranks, and the ranks on this machine.
struct MpiWorld {
  int provided = 0;  // the thread support MPI gave
  int rank = 0, size = 1, local_ranks = 1;
};

absl::StatusOr<MpiWorld> InitMpi() {
  MpiWorld w;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &w.provided) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Init_thread failed");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &w.local_ranks);
  MPI_Comm_free(&local);
  return w;
}

// Rank r > 0: one progress line per step on the terminal (rank 0's), the others' in their log
// files: stderr goes to <model_dir>/rank-<r>/output.log, and g_console keeps the terminal.
absl::Status RedirectRankStderr(const Config& config, int rank) {
  const std::string dir = absl::StrCat(config.train().model_dir(), "/rank-", rank);
  RETURN_IF_ERROR(MakeDirs(dir));
  const std::string log = dir + "/output.log";
  // Not a planted FIFO or symlink (common/file.h OpenForAppend).
  ASSIGN_OR_RETURN(const int fd, OpenForAppend(log));
  std::fflush(stderr);
  g_console = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
  return absl::OkStatus();
}

// Fewer files than ranks: record sharding (every rank decides alike from the same files).
absl::Status ShardTheData(Config* config, const MpiWorld& w) {
  if (w.provided < MPI_THREAD_FUNNELED) {
    return absl::FailedPreconditionError("MPI does not provide MPI_THREAD_FUNNELED");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> notes, ShardByRecordWhenTooFewFiles(config, w.size));
  if (w.rank == 0) {
    for (const std::string& n : notes) std::fprintf(stderr, "pstrain allreduce: %s\n", n.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunAllreduce(int argc, char** argv) {
  FlagSet flags(
      "allreduce",
      "Synchronous data-parallel training over MPI, the baseline for the PS mode: run it as\n"
      "  mpirun -np N pstrain allreduce --config FILE [flags]\n"
      "Every rank holds a full replica, trains its shard of the data and applies the same\n"
      "averaged update (dense gradient by MPI_Allreduce, sparse rows by allgather; see\n"
      "docs/ALLREDUCE.md). Without mpirun it runs as one rank. Rank 0 evaluates and writes\n"
      "<model_dir>/summary.json and the checkpoints; rank r > 0 logs to <model_dir>/rank-<r>/\n"
      "(output.log; its errors also reach the terminal).\n"
      "SIGTERM (to every rank) writes a checkpoint and exits 0; the next run with the same\n"
      "--model_dir and N resumes exactly.");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  double stop_timeout = 120;
  flags.Double("stop_timeout", &stop_timeout,
               "after SIGTERM, seconds to reach and write the checkpoint before this rank gives up "
               "(a collective that never completes because another rank died)");
  bool memory_check = true;
  flags.Bool("memory_check", &memory_check,
             "refuse to start when the replica (estimated from the config and the data's "
             "distinct ids) will not fit this rank's memory (the cgroup limit, RLIMIT_AS or "
             "MemAvailable); without it, the job starts and stops cleanly at the first step that "
             "could pass the limit");
  Config config;
  if (auto code = ParseTrainingCommand("allreduce", argc, argv, &flags, tf, &config)) return *code;
  if (config.data().train_size() == 0) {
    return CommandError("allreduce", "no training data: pass --train PATH or set data.train", 2);
  }
  absl::StatusOr<MpiWorld> w = InitMpi();
  if (!w.ok()) return CommandError("allreduce", w.status().message(), 1);
  // The first line of a job: scripts/emulate_hosts.sh takes a log still empty long after the
  // launch for a launch that hung before MPI_Init returned.
  if (w->rank == 0) std::fprintf(stderr, "pstrain allreduce: %d ranks up\n", w->size);
  absl::Status s = w->rank != 0 ? RedirectRankStderr(config, w->rank) : absl::OkStatus();
  sem_init(&g_wake, 0, 0);
  std::thread watchdog(StopWatchdog, w->rank, w->size, stop_timeout);
  // The first stop signal: the ranks agree to stop and checkpoint (and the watchdog bounds it);
  // a second one (the user insists) ends the process without the checkpoint.
  StopSignals& signals = InstallStopSignals();
  signals.on_stop = [](int) { sem_post(&g_wake); };
  signals.served = true;
  if (s.ok()) s = ShardTheData(&config, *w);
  if (s.ok()) s = Train(std::move(config), w->rank, w->size, w->local_ranks, memory_check,
                        &signals.stop);
  g_training_done = true;
  sem_post(&g_wake);
  watchdog.join();
  if (!s.ok()) {
    Report(absl::StrCat("pstrain allreduce: rank ", w->rank, " of ", w->size, ": ", s.ToString()));
    // The other ranks may be waiting in a collective for this one: end the whole job.
    if (w->size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 1;
  }
  MPI_Finalize();
  return 0;
}

}  // namespace pstrain
