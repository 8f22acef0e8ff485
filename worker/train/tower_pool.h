// T tower threads, each owning one Tower (and so its own OpenMP team of intra_op_threads), as in
// TF's tower method. The trainer hands every tower a slice of the batch per step.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/model.h"

namespace pstrain {

// Thread-safe for one caller at a time: RunAll must not be called concurrently.
class TowerPool {
 public:
  // Starts `towers` threads; each sets its OpenMP thread count to intra_op_threads and creates
  // its Tower on itself, so the tower's OpenMP team belongs to that thread.
  static absl::StatusOr<std::unique_ptr<TowerPool>> Create(const Model& model, int towers,
                                                           int max_batch_per_tower,
                                                           int intra_op_threads);
  ~TowerPool();
  TowerPool(const TowerPool&) = delete;
  TowerPool& operator=(const TowerPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs fn(t, tower_t) on every tower's thread and waits for all of them. Returns the first
  // error any tower returned.
  absl::Status RunAll(const std::function<absl::Status(int, Tower*)>& fn);

  // RunAll in two halves, so that the caller can work while the towers run: Start returns at
  // once; Wait waits for every tower and returns the first error. `fn` must stay valid until
  // Wait returns, and every Start must be followed by one Wait before the next Start / RunAll.
  void Start(const std::function<absl::Status(int, Tower*)>& fn);
  absl::Status Wait();

 private:
  TowerPool() = default;
  void Loop(int t, const Model* model, int max_batch, int intra);

  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  int created_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  const std::function<absl::Status(int, Tower*)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace pstrain
