#include "worker/data/validation_split.h"

#include <cstdint>

#include "common/hash.h"

namespace pstrain {

bool InValidationSplit(absl::string_view record, double fraction) {
  if (fraction <= 0) return false;
  while (!record.empty() && (record.back() == '\n' || record.back() == '\r')) {
    record.remove_suffix(1);
  }
  // FNV-1a alone mixes its last bytes weakly into the high bits; the finalizer spreads them.
  const uint64_t h = Fmix64(HashBytes(record));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

}  // namespace pstrain
