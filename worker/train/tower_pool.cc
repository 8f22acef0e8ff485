#include "worker/train/tower_pool.h"

#include <omp.h>

#include "common/logging.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<TowerPool>> TowerPool::Create(const Model& model, int towers,
                                                             int max_batch_per_tower,
                                                             int intra_op_threads) {
  if (towers < 1 || intra_op_threads < 1 || max_batch_per_tower < 1) {
    return absl::InvalidArgumentError("towers, intra_op_threads and the batch size must be >= 1");
  }
  std::unique_ptr<TowerPool> pool(new TowerPool());
  {
    absl::MutexLock l(&pool->mu_);
    pool->results_.assign(towers, absl::OkStatus());
  }
  for (int t = 0; t < towers; ++t) {
    pool->threads_.emplace_back(&TowerPool::Loop, pool.get(), t, &model, max_batch_per_tower,
                                intra_op_threads);
  }
  // Wait until every thread has created its tower, and surface creation errors.
  absl::MutexLock l(&pool->mu_);
  while (pool->created_ < towers) pool->done_cv_.Wait(&pool->mu_);
  for (const auto& s : pool->results_) {
    if (!s.ok()) return s;  // the destructor joins the threads
  }
  return pool;
}

TowerPool::~TowerPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (auto& th : threads_) th.join();
}

void TowerPool::Loop(int t, const Model* model, int max_batch, int intra) {
  omp_set_num_threads(intra);
  absl::StatusOr<std::unique_ptr<Tower>> tower = model->CreateTower(max_batch, intra);
  int64_t seen = 0;
  {
    absl::MutexLock l(&mu_);
    if (!tower.ok()) {
      results_[t] = tower.status();
      stop_ = true;
    }
    ++created_;
    done_cv_.SignalAll();
  }
  if (!tower.ok()) return;
  while (true) {
    const std::function<absl::Status(int, Tower*)>* fn;
    {
      absl::MutexLock l(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      fn = fn_;
    }
    absl::Status s = (*fn)(t, tower->get());
    absl::MutexLock l(&mu_);
    results_[t] = std::move(s);
    if (--pending_ == 0) done_cv_.SignalAll();
  }
}

absl::Status TowerPool::RunAll(const std::function<absl::Status(int, Tower*)>& fn) {
  Start(fn);
  return Wait();
}

void TowerPool::Start(const std::function<absl::Status(int, Tower*)>& fn) {
  absl::MutexLock l(&mu_);
  PSTRAIN_CHECK(fn_ == nullptr) << "TowerPool::Start while towers are running";
  fn_ = &fn;
  pending_ = size();
  ++generation_;
  work_cv_.SignalAll();
}

absl::Status TowerPool::Wait() {
  absl::MutexLock l(&mu_);
  while (pending_ > 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
  for (const auto& s : results_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pstrain
