// Server-side batching of `pstrain serve` (TensorFlow Serving's BasicBatchScheduler, in
// small): requests that arrive together are scored as one batch. Each request is a ScoreJob of n
// encoded rows (with Batch::offsets for a model with list fields); `threads` scoring threads each
// take up to max_batch rows from the front of a bounded queue, waiting for more only while the
// oldest queued request is younger than max_delay, then score them with a Scorer of their own. A
// request larger than max_batch is scored in pieces, by one or several threads; a batch never
// mixes rows of two models (a request is scored entirely by the model it was parsed for, also
// across a reload).
//
// Batch sizes are padded up to a few fixed sizes (1, 8, 16, 32, ..., max_batch: at most 8), so
// that each scorer keeps one oneDNN plan per size instead of creating one for every size that
// arrives (TF Serving's allowed_batch_sizes); the padding repeats the last row and is discarded.
//
// Memory: the queue holds at most max_queue_rows rows (Enqueue refuses more: RESOURCE_EXHAUSTED,
// the client retries later); each thread holds one batch of scratch.
//
// Thread-safety: Enqueue and Stop may be called from any thread; a job's `done` runs on a scoring
// thread (or on the thread calling Stop), exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "serving/serving_model.h"
#include "worker/data/batch.h"

namespace pstrain {

// One request's rows and where their scores go.
struct ScoreJob {
  std::shared_ptr<const ServingModel> model;  // the model the rows were encoded for
  Batch rows;                                 // n encoded rows (ids, values); labels unused
  float* probs = nullptr;                     // n outputs, written by the scoring threads
  float* logits = nullptr;                    // n outputs, or null
  // Called once when every row is scored (OK) or the first piece failed; from a scoring thread.
  std::function<void(absl::Status)> done;

  // The batcher's bookkeeping.
  absl::Duration arrival;  // on the batcher's env->MonotonicNow()
  int taken = 0;                  // rows handed to batches (under the batcher's lock)
  std::atomic<int> remaining{0};  // rows not yet scored
  std::atomic<bool> failed{false};
};

class Batcher {
 public:
  struct Options {
    int threads = 1;            // scoring threads
    int intra_op_threads = 1;   // OpenMP threads of each scoring thread's forward pass
    int max_batch = 512;        // rows per batch
    absl::Duration max_delay = absl::Microseconds(500);  // batching window of the oldest request
    int max_queue_rows = 65536; // rows queued and not yet taken
    Env* env = Env::Default();  // the clock of the batching window; must outlive the batcher
  };
  struct Stats {
    int64_t batches = 0;
    int64_t rows = 0;         // scored rows (without padding)
    int64_t padded_rows = 0;  // rows computed, padding included
  };

  // Starts the threads. INVALID_ARGUMENT for a value < 1 (max_delay may be 0).
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(Options options);
  ~Batcher();  // Stop()
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues job (job->rows.size rows, at least 1). RESOURCE_EXHAUSTED when the queue would hold
  // more than max_queue_rows; UNAVAILABLE after Stop. job->done is not called on an error.
  absl::Status Enqueue(std::shared_ptr<ScoreJob> job);
  // Stops taking jobs, scores every job already queued, and joins the threads. Idempotent.
  void Stop();
  Stats stats() const;

  // The batch size a batch of n rows is padded to (exposed for tests).
  int PaddedSize(int n) const;

 private:
  struct Piece {
    std::shared_ptr<ScoreJob> job;
    int begin = 0;
    int count = 0;
  };
  explicit Batcher(Options options);
  void Loop();
  // The pieces' n rows and padded - n copies of the last one, as one batch (offsets rebased when
  // the rows carry lists).
  static void Gather(const std::vector<Piece>& pieces, int n, int padded, int F, Batch* out);
  // Up to max_batch rows of the front job's model, from the front of the queue.
  void Take(std::vector<Piece>* pieces) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options opt_;
  std::vector<int> sizes_;  // the padded sizes, ascending
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::shared_ptr<ScoreJob>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_rows_ ABSL_GUARDED_BY(mu_) = 0;  // rows in the queue not yet taken
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
  std::atomic<bool> joined_{false};
};

}  // namespace pstrain
