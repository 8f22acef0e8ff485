#include "serving/server/batcher.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "serving/scorer.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(Options options) {
  if (options.threads < 1 || options.intra_op_threads < 1 || options.max_batch < 1 ||
      options.max_queue_rows < 1 || options.max_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batcher: threads ", options.threads, ", intra_op_threads ", options.intra_op_threads,
        ", max_batch ", options.max_batch, ", max_queue_rows ", options.max_queue_rows,
        " must be >= 1 and max_delay >= 0"));
  }
  std::unique_ptr<Batcher> b(new Batcher(options));
  for (int t = 0; t < options.threads; ++t) b->threads_.emplace_back([p = b.get()] { p->Loop(); });
  return b;
}

Batcher::Batcher(Options options) : opt_(options) {
  sizes_.push_back(1);
  for (int s = 8; s < opt_.max_batch; s *= 2) sizes_.push_back(s);
  if (opt_.max_batch > 1) sizes_.push_back(opt_.max_batch);
}

Batcher::~Batcher() { Stop(); }

int Batcher::PaddedSize(int n) const {
  for (int s : sizes_) {
    if (s >= n) return s;
  }
  return n;
}

absl::Status Batcher::Enqueue(std::shared_ptr<ScoreJob> job) {
  const int n = job->rows.size;
  if (n < 1) return absl::InvalidArgumentError("batcher: a job without rows");
  job->arrival = opt_.env->MonotonicNow();
  job->taken = 0;
  job->remaining.store(n);
  absl::MutexLock l(&mu_);
  if (stop_) return absl::UnavailableError("the server is stopping");
  if (queued_rows_ + n > opt_.max_queue_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server's queue is full (", queued_rows_, " rows waiting, at most ",
        opt_.max_queue_rows, "): retry later"));
  }
  queued_rows_ += n;
  queue_.push_back(std::move(job));
  cv_.SignalAll();
  return absl::OkStatus();
}

void Batcher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (joined_.exchange(true)) return;
  for (std::thread& t : threads_) t.join();
}

Batcher::Stats Batcher::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void Batcher::Take(std::vector<Piece>* pieces) {
  const ServingModel* model = queue_.front()->model.get();
  int room = opt_.max_batch;
  while (room > 0 && !queue_.empty() && queue_.front()->model.get() == model) {
    std::shared_ptr<ScoreJob>& job = queue_.front();
    const int count = std::min(room, job->rows.size - job->taken);
    pieces->push_back(Piece{job, job->taken, count});
    job->taken += count;
    queued_rows_ -= count;
    room -= count;
    if (job->taken == job->rows.size) queue_.pop_front();
  }
}

// The pieces' n encoded rows, then copies of the last row up to `padded`, as one batch. A model
// with list fields carries Batch::offsets: each piece's entries are the span its rows' offsets
// name, and the merged offsets are rebased to start at 0.
void Batcher::Gather(const std::vector<Piece>& pieces, int n, int padded, int F, Batch* out) {
  out->Clear(F);
  out->size = padded;
  const bool jagged = !pieces.front().job->rows.offsets.empty();
  if (jagged) out->offsets.push_back(0);
  auto append = [&](const Batch& rows, int begin, int count) {
    const size_t first = static_cast<size_t>(begin) * F;
    const size_t cells = static_cast<size_t>(count) * F;
    size_t from = first, to = first + cells;  // entries
    if (jagged) {
      from = rows.offsets[first];
      to = rows.offsets[first + cells];
      const int32_t shift = static_cast<int32_t>(out->ids.size()) - rows.offsets[first];
      for (size_t c = 1; c <= cells; ++c) out->offsets.push_back(rows.offsets[first + c] + shift);
    }
    out->ids.insert(out->ids.end(), rows.ids.begin() + from, rows.ids.begin() + to);
    out->values.insert(out->values.end(), rows.values.begin() + from, rows.values.begin() + to);
  };
  for (const Piece& p : pieces) append(p.job->rows, p.begin, p.count);
  if (padded == n) return;
  // Padding: copies of the last row (taken from its job: out may reallocate while appended to).
  const Piece& last = pieces.back();
  for (int r = n; r < padded; ++r) append(last.job->rows, last.begin + last.count - 1, 1);
}

void Batcher::Loop() {
  std::shared_ptr<const ServingModel> model;
  std::unique_ptr<Scorer> scorer;
  std::vector<Piece> pieces;
  Batch batch;
  std::vector<float> probs, logits;
  while (true) {
    pieces.clear();
    {
      absl::MutexLock l(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopped, and everything queued was taken
      // The batching window: wait for a full batch while the oldest request is young.
      const absl::Duration deadline = queue_.front()->arrival + opt_.max_delay;
      absl::Duration left;
      while (!stop_ && !queue_.empty() && queued_rows_ < opt_.max_batch &&
             (left = deadline - opt_.env->MonotonicNow()) > absl::ZeroDuration()) {
        cv_.WaitWithTimeout(&mu_, left);
      }
      if (queue_.empty()) continue;  // another thread took them
      Take(&pieces);
    }
    int n = 0;
    for (const Piece& p : pieces) n += p.count;
    const std::shared_ptr<const ServingModel>& job_model = pieces.front().job->model;
    absl::Status status;
    if (model != job_model) {
      // The first batch of a (reloaded) model on this thread: a scorer for it.
      scorer.reset();
      model = job_model;
      absl::StatusOr<std::unique_ptr<Scorer>> s =
          Scorer::Create(model, opt_.max_batch, opt_.intra_op_threads);
      if (s.ok()) {
        scorer = *std::move(s);
      } else {
        status = s.status();
        model.reset();
      }
    }
    const int padded = PaddedSize(n);
    if (status.ok()) {
      Gather(pieces, n, padded, job_model->spec().num_fields(), &batch);
      probs.resize(padded);
      logits.resize(padded);
      status = scorer->Score(padded, batch.ids.data(), batch.values.data(), logits.data(),
                             probs.data(), batch.offsets.empty() ? nullptr : batch.offsets.data());
    }
    {
      absl::MutexLock l(&mu_);
      ++stats_.batches;
      stats_.rows += n;
      stats_.padded_rows += padded;
    }
    int at = 0;
    for (const Piece& p : pieces) {
      ScoreJob& job = *p.job;
      if (status.ok()) {
        std::copy(probs.begin() + at, probs.begin() + at + p.count, job.probs + p.begin);
        if (job.logits != nullptr) {
          std::copy(logits.begin() + at, logits.begin() + at + p.count, job.logits + p.begin);
        }
      } else if (!job.failed.exchange(true)) {
        job.done(status);
      }
      at += p.count;
      // The last piece of a job completes it (after a failure, without calling done again).
      if (job.remaining.fetch_sub(p.count) == p.count && !job.failed.load()) job.done({});
    }
  }
}

}  // namespace pstrain
