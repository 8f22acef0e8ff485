// Row ids of dynamic tables (issue 28; docs/ARCHITECTURE.md "Dynamic tables").
//
// Every layer between the reader and the stores carries a row as an int64 id: the batch, the
// dedup, Pull / Push, the PS wire and the shards. A fixed table's rows are the non-negative ids
// [0, FeatureSpec::total_rows()). A dynamic table's row is keyed by the 64-bit hash of the raw id
// instead, and travels as a NEGATIVE id that carries the table and the key:
//
//   id = INT64_MIN | (table << kDynamicKeyBits) | (key & kDynamicKeyMask)
//
// so that the existing paths carry it unchanged, and a store, a router or a checkpoint tells the
// two apart by the sign alone. `table` is the dynamic table's index among the dynamic tables in
// config order (0 .. kMaxDynamicTables - 1); `key` keeps the hash's low 55 bits (two distinct
// ids of one table collide with probability 2^-55: 10^9 live ids give ~1.4% odds of one
// collision in the whole table, against a fixed table's certain collisions).
//
// The key 0 is reserved for "missing" (an absent or empty value, FeatureSpec's row 0 of a fixed
// table): a hash that lands on 0 is mapped to 1.
#pragma once

#include <cstdint>

namespace pstrain {

inline constexpr int kDynamicKeyBits = 55;
inline constexpr int kMaxDynamicTables = 256;  // 8 bits between the sign and the key
inline constexpr uint64_t kDynamicKeyMask = (uint64_t{1} << kDynamicKeyBits) - 1;

inline constexpr bool IsDynamicRow(int64_t id) { return id < 0; }

// The id of `key` (any 64-bit hash) in dynamic table `table` (0 <= table < kMaxDynamicTables).
inline constexpr int64_t DynamicRow(int table, uint64_t key) {
  uint64_t k = key & kDynamicKeyMask;
  if (k == 0) k = 1;
  return static_cast<int64_t>((uint64_t{1} << 63) |
                              (static_cast<uint64_t>(table) << kDynamicKeyBits) | k);
}

// The row of dynamic table `table` that stands for a missing value.
inline constexpr int64_t DynamicMissingRow(int table) {
  return static_cast<int64_t>((uint64_t{1} << 63) |
                              (static_cast<uint64_t>(table) << kDynamicKeyBits));
}

inline constexpr int DynamicTableOf(int64_t id) {
  return static_cast<int>((static_cast<uint64_t>(id) >> kDynamicKeyBits) &
                          (kMaxDynamicTables - 1));
}

inline constexpr uint64_t DynamicKeyOf(int64_t id) {
  return static_cast<uint64_t>(id) & kDynamicKeyMask;
}

static_assert(IsDynamicRow(DynamicRow(0, 0)));
static_assert(DynamicTableOf(DynamicRow(255, ~uint64_t{0})) == 255);
static_assert(DynamicKeyOf(DynamicRow(3, 12345)) == 12345);
static_assert(DynamicKeyOf(DynamicRow(3, uint64_t{1} << kDynamicKeyBits)) == 1);  // 0 -> 1
static_assert(IsDynamicRow(DynamicMissingRow(0)) && DynamicKeyOf(DynamicMissingRow(7)) == 0);

}  // namespace pstrain
