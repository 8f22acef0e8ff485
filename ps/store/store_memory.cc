#include "ps/store/store_memory.h"

#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"

namespace pstrain {

StoreMemory MemoryOf(const EmbeddingStore& store) {
  const EmbeddingStore::Stats st = store.stats();
  StoreMemory m;
  m.parameter_bytes = st.rows_initialized * store.dim() * static_cast<int64_t>(sizeof(float));
  m.optimizer_bytes =
      st.rows_initialized * store.state_floats() * static_cast<int64_t>(sizeof(float));
  m.total_bytes = st.bytes;
  return m;
}

StoreMemory MemoryOf(const DenseStore& store) {
  StoreMemory m;
  m.parameter_bytes = store.size() * static_cast<int64_t>(sizeof(float));
  m.optimizer_bytes =
      store.optimizer().StateFloats(store.size()) * static_cast<int64_t>(sizeof(float));
  m.total_bytes = m.parameter_bytes + m.optimizer_bytes;
  return m;
}

}  // namespace pstrain
