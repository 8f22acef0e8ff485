// PullVersions: which versions of a shard's parameters a worker's gradients were computed from,
// so that its pushes can name them (the staleness of a push: ps/store/dense_store.h,
// ps/store/embedding_store.h). A training pull of step t records what each shard answered:
//   - the dense slice's version. The dense push of step s was computed from the latest training
//     pull of a step <= s: with cluster.dense_sync_steps k the dense is pulled at t and its mean
//     gradient pushed at t + k - 1, and pulls of later steps (prefetched) may have been answered
//     meanwhile.
//   - the rows' versions (shards with per-row staleness), in the order of the shard's ids. The
//     row push of step s was computed from the rows pulled at step s; it takes them only if its
//     ids are the pulled ones in the same order (same Fingerprint), else it names none.
//
// Memory: at most kKept pulls per shard (older ones are forgotten, as are those a push passed).
// Thread-safety: every method may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace pstrain {

class PullVersions {
 public:
  static constexpr size_t kKept = 64;

  explicit PullVersions(int shards) : dense_(shards), rows_(shards) {}

  // An order-dependent hash of ids, fed one id at a time from 0.
  static uint64_t Fingerprint(uint64_t h, int64_t id) {
    h ^= static_cast<uint64_t>(id) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ull;
  }

  // A training pull of `step` (> 0) got version `version` of shard `shard`'s dense slice.
  void PulledDense(int shard, int64_t step, int64_t version) {
    absl::MutexLock lock(&mu_);
    Keep(&dense_[shard], step, version);
  }
  // ... and `versions` of the rows whose ids have `fingerprint`.
  void PulledRows(int shard, int64_t step, uint64_t fingerprint, std::vector<uint32_t> versions) {
    rows_seen_.store(true, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    Keep(&rows_[shard], step, Rows{fingerprint, std::move(versions)});
  }

  // The version the dense gradient pushed at `step` to `shard` was computed from; -1 if no
  // training pull of a step <= `step` is known.
  int64_t DenseForPush(int shard, int64_t step) {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, int64_t>& m = dense_[shard];
    auto it = m.upper_bound(step);
    if (it == m.begin()) return -1;
    --it;
    const int64_t version = it->second;
    m.erase(m.begin(), it);  // pushes come in step order: older pulls are not needed again
    return version;
  }

  // PulledRows for the ids packed in `packed_ids` (int64 each, as in PullRequest.ids) and their
  // versions packed in `versions` (uint32 each, as many).
  void PulledRows(int shard, int64_t step, const std::string& packed_ids, const char* versions) {
    const size_t n = packed_ids.size() / sizeof(int64_t);
    uint64_t fingerprint = 0;
    for (size_t j = 0; j < n; ++j) {
      int64_t id;
      std::memcpy(&id, packed_ids.data() + j * sizeof(int64_t), sizeof(id));
      fingerprint = Fingerprint(fingerprint, id);
    }
    std::vector<uint32_t> copy(n);
    if (n > 0) std::memcpy(copy.data(), versions, n * sizeof(uint32_t));
    PulledRows(shard, step, fingerprint, std::move(copy));
  }

  // Whether any shard answered row versions (per-row staleness is on): until then a push need
  // not fingerprint its ids (the default, no compensation, costs the hot path nothing).
  bool rows_seen() const { return rows_seen_.load(std::memory_order_relaxed); }

  // The versions of the rows pulled at `step` from `shard`, if the push's ids have the pulled
  // ids' fingerprint; else empty. Forgets that pull and older ones.
  // RowsForPush for the ids ids[positions[j]] (none when no shard answered row versions).
  std::vector<uint32_t> RowsForPush(int shard, int64_t step, absl::Span<const int64_t> ids,
                                    absl::Span<const int32_t> positions) {
    if (!rows_seen() || positions.empty()) return {};
    uint64_t fingerprint = 0;
    for (int32_t pos : positions) fingerprint = Fingerprint(fingerprint, ids[pos]);
    return RowsForPush(shard, step, fingerprint);
  }
  std::vector<uint32_t> RowsForPush(int shard, int64_t step, uint64_t fingerprint) {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, Rows>& m = rows_[shard];
    auto it = m.find(step);
    std::vector<uint32_t> versions;
    if (it != m.end() && it->second.fingerprint == fingerprint) {
      versions = std::move(it->second.versions);
    }
    m.erase(m.begin(), m.upper_bound(step));
    return versions;
  }

 private:
  struct Rows {
    uint64_t fingerprint = 0;
    std::vector<uint32_t> versions;
  };
  template <typename V>
  static void Keep(std::map<int64_t, V>* m, int64_t step, V value) {
    (*m)[step] = std::move(value);
    while (m->size() > kKept) m->erase(m->begin());
  }

  std::atomic<bool> rows_seen_{false};
  absl::Mutex mu_;
  std::vector<std::map<int64_t, int64_t>> dense_ ABSL_GUARDED_BY(mu_);
  std::vector<std::map<int64_t, Rows>> rows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain
