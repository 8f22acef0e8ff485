// The trainer's human-facing output: a progress line rewritten in place on a TTY, plain log lines
// otherwise (CI logs, files), plus the machine-readable metrics.jsonl and TensorBoard events.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "worker/train/event_writer.h"

namespace pstrain {

// Not thread-safe: the trainer thread owns it.
class ProgressReporter {
 public:
  // Metrics go to <model_dir>/metrics.jsonl and TensorBoard events to <model_dir>/.
  static absl::StatusOr<std::unique_ptr<ProgressReporter>> Create(const std::string& model_dir,
                                                                  bool tty);
  ~ProgressReporter();

  // A training progress point: prints (TTY: every call; otherwise the caller decides how often)
  // and records train/loss and train/examples_per_sec.
  void Train(int64_t step, int64_t epoch, double loss, double examples_per_sec,
             int64_t total_steps_estimate, double elapsed_seconds);
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

  bool tty_ = false;
  bool line_open_ = false;
  bool events_failed_ = false;
  double last_auc_ = -1;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<EventWriter> events_;
};

}  // namespace pstrain
