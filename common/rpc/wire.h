// Packed payloads of the PS wire protocol (proto/pstrain/ps_service.proto): arrays of int64 ids
// and float32 values carried in `bytes` fields, little-endian (the host order on every platform
// pstrain builds for; checked at compile time).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the PS wire format is little-endian");

namespace pstrain {

// Overwrites `bytes` with the raw bytes of values[n].
template <typename T>
void PackArray(const T* values, int64_t n, std::string* bytes) {
  static_assert(std::is_trivially_copyable<T>::value, "");
  bytes->resize(static_cast<size_t>(n) * sizeof(T));
  if (n > 0) std::memcpy(&(*bytes)[0], values, bytes->size());
}

// A view of `bytes` as an array of T. Views the bytes in place when they are suitably aligned
// (std::string storage from the heap always is), else copies them into *scratch. `what` names the
// field in the INVALID_ARGUMENT returned when the size is not a multiple of sizeof(T).
template <typename T>
absl::Status UnpackArray(const std::string& bytes, absl::string_view what, std::vector<T>* scratch,
                         absl::Span<const T>* out) {
  static_assert(std::is_trivially_copyable<T>::value, "");
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes.size(), " bytes is not a whole number of ", sizeof(T), "-byte values"));
  }
  const size_t n = bytes.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    *out = absl::MakeConstSpan(reinterpret_cast<const T*>(bytes.data()), n);
  } else {
    scratch->resize(n);
    if (n > 0) std::memcpy(scratch->data(), bytes.data(), bytes.size());
    *out = absl::MakeConstSpan(*scratch);
  }
  return absl::OkStatus();
}

}  // namespace pstrain
