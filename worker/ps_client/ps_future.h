// PsFuture: the completion of one asynchronous PsClient operation (a pull or a push).
#pragma once

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

// Thread-safe.
class PsFuture {
 public:
  // A future already completed with `status`.
  static std::shared_ptr<PsFuture> Completed(absl::Status status) {
    auto f = std::make_shared<PsFuture>();
    f->Complete(std::move(status));
    return f;
  }

  // Blocks until the operation has finished (bounded by the client's call budget) and returns
  // its status. May be called any number of times, from any thread.
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  // Completes the future once (later calls are ignored).
  void Complete(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain
