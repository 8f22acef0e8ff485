// The trainer's human-facing output: a progress line rewritten in place on a TTY, plain log lines
// otherwise (CI logs, files), plus the machine-readable metrics.jsonl and TensorBoard events,
// flushed every `flush_seconds` (and at every evaluation), and the worker's Prometheus metrics
// (common/metrics/metrics.h, labelled worker="i"): examples, examples/s, loss, step, the step's
// phase times and the last evaluation.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/train/event_writer.h"

namespace pstrain {

// One dynamic table's counters (DynamicEmbeddingStore::Metrics, issue 28), for the metrics:
// cumulative since the job began (a resumed job's stores count on from the checkpoint).
struct DynamicTableMetrics {
  std::string table;
  int64_t rows_live = 0;
  int64_t admitted = 0;          // rows created
  int64_t rejected = 0;          // updates dropped: the id not admitted yet
  int64_t evicted_ttl = 0;
  int64_t evicted_capacity = 0;
  int64_t new_ids_last_step = 0;  // rows created by the last step's update
  int64_t bytes = 0;              // memory the table's store holds
};

// Not thread-safe: the trainer thread owns it.
class ProgressReporter {
 public:
  // Metrics go to <model_dir>/metrics.jsonl and TensorBoard events to <model_dir>/. `env`'s wall
  // clock stamps them and its monotonic clock times the flushes; it must outlive the reporter.
  static absl::StatusOr<std::unique_ptr<ProgressReporter>> Create(const std::string& model_dir,
                                                                  bool tty,
                                                                  double flush_seconds = 10,
                                                                  int worker = 0,
                                                                  Env* env = Env::Default());
  ~ProgressReporter();

  // A training progress point: prints (TTY: every call; otherwise the caller decides how often)
  // and records train/loss and train/examples_per_sec.
  void Train(int64_t step, int64_t epoch, double loss, double examples_per_sec,
             int64_t total_steps_estimate, double elapsed_seconds);
  // Examples trained since the last call (the examples counter of the metrics).
  void Examples(int64_t n);
  // The step's phase times accumulated so far (worker/train/train_step.h StepProfile), for the
  // metrics.
  void StepPhases(double dedup, double pull, double compute, double reduce, double push);
  // The dynamic tables' counters at `step`: one metrics.jsonl line per table ("dynamic_table":
  // its name, and every counter), TensorBoard scalars dynamic/<table>/<counter>, and Prometheus
  // gauges pstrain_worker_dynamic_<counter>{table, worker}.
  void DynamicTables(int64_t step, const std::vector<DynamicTableMetrics>& tables);
  // An evaluation result.
  void Eval(int64_t step, double auc, double logloss, int64_t examples, bool final_eval);
  // A plain message that must not be overwritten by the progress line.
  void Message(const std::string& text);
  void Flush();

 private:
  ProgressReporter() = default;
  void Line(const std::string& text, bool transient);
  // Warns once when writing events fails; training goes on.
  void Record(const absl::Status& s);

  struct Gauges;
  Env* env_ = nullptr;
  bool tty_ = false;
  double flush_seconds_ = 10;
  double last_flush_ = 0;
  std::unique_ptr<Gauges> gauges_;
  bool line_open_ = false;
  bool events_failed_ = false;
  double last_auc_ = -1;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<EventWriter> events_;
};

}  // namespace pstrain
