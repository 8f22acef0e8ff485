// Deduplication of a batch's embedding row ids: the worker pulls and pushes each unique row once
// per step, and the towers index rows through slots.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace pstrain {

// Reusable across steps (keeps its hash table's capacity). Not thread-safe.
class Deduper {
 public:
  // unique: the distinct ids of `ids` in first-occurrence order.
  // slots[i]: index into unique of ids[i] (so unique[slots[i]] == ids[i]).
  void Run(absl::Span<const int64_t> ids, std::vector<int64_t>* unique,
           std::vector<int32_t>* slots);

 private:
  absl::flat_hash_map<int64_t, int32_t> index_;
};

}  // namespace pstrain
