// The change logs both row stores keep per lock stripe (EmbeddingStore's rows, the dynamic
// store's keys), one entry per generation, oldest first: what BeginGeneration drops once no
// delta needs them.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace pstrain {

// Drops each stripe's logs of generations below `keep_from`, under the stripe's lock. `Stripe`
// has `mu` (a std::mutex) and `logs` (a vector of entries with `generation`, oldest first).
template <typename Stripe>
void DropLogsBefore(Stripe* stripes, int num_stripes, uint32_t keep_from) {
  for (int s = 0; s < num_stripes; ++s) {
    std::lock_guard<std::mutex> lock(stripes[s].mu);
    auto& logs = stripes[s].logs;
    size_t old = 0;
    while (old < logs.size() && logs[old].generation < keep_from) ++old;
    logs.erase(logs.begin(), logs.begin() + old);
  }
}

}  // namespace pstrain
