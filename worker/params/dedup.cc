#include "worker/params/dedup.h"

namespace pstrain {

void Deduper::Run(absl::Span<const int64_t> ids, std::vector<int64_t>* unique,
                  std::vector<int32_t>* slots) {
  index_.clear();  // keeps the capacity, so steady-state steps do not rehash
  index_.reserve(ids.size());
  unique->clear();
  slots->resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, inserted] = index_.try_emplace(ids[i], static_cast<int32_t>(unique->size()));
    if (inserted) unique->push_back(ids[i]);
    (*slots)[i] = it->second;
  }
}

}  // namespace pstrain
