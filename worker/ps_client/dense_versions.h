// DenseVersions: which version of each shard's dense slice a worker's dense gradients were
// computed from (the staleness of a push: ps/store/dense_store.h). A training pull of step t
// records the version each shard answered with; the dense push of step s was computed from the
// latest training pull of a step <= s. With cluster.dense_sync_steps k the dense is pulled at t
// and its mean gradient pushed at t + k - 1; pulls of later steps (prefetched) may have been
// answered meanwhile and are not taken.
//
// Memory: at most kKept pulls per shard (older ones are forgotten, as are those a push passed).
// Thread-safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pstrain {

class DenseVersions {
 public:
  static constexpr size_t kKept = 64;

  explicit DenseVersions(int shards) : pulled_(shards) {}

  // A training pull of `step` (> 0) got version `version` of shard `shard`'s dense slice.
  void Pulled(int shard, int64_t step, int64_t version) {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, int64_t>& m = pulled_[shard];
    m[step] = version;
    while (m.size() > kKept) m.erase(m.begin());
  }

  // The version the dense gradient pushed at `step` to `shard` was computed from; -1 if no
  // training pull of a step <= `step` is known.
  int64_t ForPush(int shard, int64_t step) {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, int64_t>& m = pulled_[shard];
    auto it = m.upper_bound(step);
    if (it == m.begin()) return -1;
    --it;
    const int64_t version = it->second;
    m.erase(m.begin(), it);  // pushes come in step order: older pulls are not needed again
    return version;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::map<int64_t, int64_t>> pulled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain
