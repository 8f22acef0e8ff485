// StoreMemory: the memory that parameter stores hold, split into the weights, their optimizer
// slots and everything else (an EmbeddingStore's row index pages, its arena's untouched rows and
// its locks). summary.json reports it per process, per PS shard or per allreduce rank
// (docs/PERFORMANCE.md "Memory per host").
#pragma once

#include <cstdint>

namespace pstrain {

class DenseStore;
class EmbeddingStore;

struct StoreMemory {
  int64_t parameter_bytes = 0;  // weights: stored rows x dim, plus dense floats, x 4 bytes
  int64_t optimizer_bytes = 0;  // their optimizer state (slots and per-vector extras), x 4 bytes
  int64_t total_bytes = 0;      // all memory held: >= parameter_bytes + optimizer_bytes

  StoreMemory& operator+=(const StoreMemory& o) {
    parameter_bytes += o.parameter_bytes;
    optimizer_bytes += o.optimizer_bytes;
    total_bytes += o.total_bytes;
    return *this;
  }
};

// What `store` holds now. Thread-safe (reads the stores' counters).
StoreMemory MemoryOf(const EmbeddingStore& store);
StoreMemory MemoryOf(const DenseStore& store);

}  // namespace pstrain
