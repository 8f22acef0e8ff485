// How a worker reaches the parameters: in-process stores (single-process `train`), PS shards over
// gRPC (`host`/`worker`), or a replicated copy (allreduce). The trainer's step is written against
// this interface only.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pstrain {

// Completion of an asynchronous ParameterAccess call (StartPull / StartPush). Not thread-safe:
// one thread waits on it. A default-constructed op is complete and OK.
class ParamsOp {
 public:
  ParamsOp() = default;
  // An op that already finished with `status`.
  explicit ParamsOp(absl::Status status) : status_(std::move(status)) {}
  // An op in flight: `wait` blocks until it finished and returns its status; it runs once.
  explicit ParamsOp(std::function<absl::Status()> wait) : wait_(std::move(wait)) {}

  // Blocks until the call finished; returns its status (the same status on later calls).
  absl::Status Wait() {
    if (wait_) {
      status_ = wait_();
      wait_ = nullptr;
    }
    return status_;
  }

 private:
  std::function<absl::Status()> wait_;
  absl::Status status_;
};

// In-process parameters that a training step reads and updates on its own threads, range by
// range, instead of through Pull and Push (LocalParams; TrainStep's in-process step). One thread
// brackets a step with BeginStep and EndStep; between them, any threads call the rest on
// disjoint ranges, each call running on the calling thread. Pull, Push and the stores'
// snapshots from other threads wait for EndStep where they read the dense vector, and see rows
// one by one as always.
class InProcessParams {
 public:
  virtual ~InProcessParams() = default;
  // Holds the dense vector for the step whose update is `step` (1-based global step).
  virtual void BeginStep(int64_t step) = 0;
  // rows[i * row_dim, ...) = the weights of ids[i] (ids unique).
  virtual absl::Status GatherRows(absl::Span<const int64_t> ids, float* rows) = 0;
  // out[begin, end) = dense weights [begin, end) (out: the whole vector's buffer).
  virtual void CopyDense(int64_t begin, int64_t end, float* out) = 0;
  // One update of the rows `ids` (unique) with grads (ids.size() x row_dim), of step `step`.
  virtual absl::Status ApplyRows(absl::Span<const int64_t> ids, const float* grads,
                                 int64_t step) = 0;
  // The update of dense elements [begin, end) with grad[begin, end) (grad: the whole vector's
  // gradient). Ranges that start at multiples of dense_chunk() update exactly as one Push would.
  virtual void ApplyDense(int64_t begin, int64_t end, const float* grad) = 0;
  virtual int64_t dense_chunk() const = 0;
  // Ends the step; `applied`: ApplyDense covered the whole vector (else nothing was applied).
  virtual void EndStep(bool applied) = 0;
};

// Implementations are thread-safe: the evaluator pulls while the trainer pushes.
class ParameterAccess {
 public:
  virtual ~ParameterAccess() = default;
  virtual int row_dim() const = 0;
  virtual int64_t dense_size() const = 0;

  // Copies rows `ids` (unique) into rows[n x row_dim]; if dense is not null, the dense vector
  // into dense[dense_size].
  virtual absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) = 0;

  // Applies gradients, already averaged over the global batch: row_grads[n x row_dim] for the
  // unique `ids`, dense_grad[dense_size]. `step` is the 1-based global step.
  virtual absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads,
                            const float* dense_grad, int64_t step) = 0;

  // Asynchronous Pull, for pipelining: `ids` are read before return; rows and dense must stay
  // valid until the op's Wait returned. The default runs Pull before returning, so an
  // implementation with only synchronous calls keeps read-after-write order.
  virtual ParamsOp StartPull(absl::Span<const int64_t> ids, float* rows, float* dense) {
    return ParamsOp(Pull(ids, rows, dense));
  }

  // Asynchronous Push: ids and gradients are copied or applied before return (the caller may
  // reuse its buffers at once). A pull started after the op's Wait returned sees the update; a
  // pull started while it is in flight may or may not. The default runs Push before returning.
  virtual ParamsOp StartPush(absl::Span<const int64_t> ids, const float* row_grads,
                             const float* dense_grad, int64_t step) {
    return ParamsOp(Push(ids, row_grads, dense_grad, step));
  }

  // The same parameters for an in-process step (above), or null: remote parameters (PS shards,
  // allreduce replicas) and pushes on a background thread go through Pull and Push.
  virtual InProcessParams* in_process() { return nullptr; }
};

// Another ParameterAccess through Pull and Push only: in_process() stays null, so a TrainStep
// takes the path of remote parameters over it (for benchmarks and tests that compare the two,
// or observe the calls by overriding Pull / Push and calling these).
class ForwardingParams : public ParameterAccess {
 public:
  explicit ForwardingParams(ParameterAccess* inner) : inner_(inner) {}
  int row_dim() const override { return inner_->row_dim(); }
  int64_t dense_size() const override { return inner_->dense_size(); }
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    return inner_->Pull(ids, rows, dense);
  }
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads, const float* dense_grad,
                    int64_t step) override {
    return inner_->Push(ids, row_grads, dense_grad, step);
  }

 private:
  ParameterAccess* inner_;
};

}  // namespace pstrain
