// Helpers shared by the formats in worker/data/formats/: number parsing and printing for the text
// formats, error messages, and the writer plumbing (buffering, row validation).
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {

// ---- Parsing text values. Each takes the whole token [p, end) and rejects anything else. ----

namespace internal {
extern const std::array<int8_t, 256> kHexDigit;
}  // namespace internal
// Value of a hex digit (either case), or -1.
inline int HexDigit(char c) { return internal::kHexDigit[static_cast<unsigned char>(c)]; }

// A decimal integer (optional '-') or a floating-point number ("260.0", "1e-3"). Rejects empty
// text, '+', surrounding spaces, and non-finite values (nan, inf).
bool ParseNumber(const char* p, const char* end, double* v);
// 1..16 hex digits, either case; the key is their value.
bool ParseHexKey(const char* p, const char* end, uint64_t* key);
// A decimal unsigned 64-bit integer.
bool ParseUint64(const char* p, const char* end, uint64_t* v);
// "0", "1", or a number in [0, 1] (a soft label), parsed as float.
bool ParseLabel(const char* p, const char* end, float* label);

// ---- Printing values so that the parsers above read back the same bits. ----
//
// The writers' hot path: each Write* prints at p, which must have room for the matching kMax*
// bound, and returns the end of what it wrote. Nothing allocates.

constexpr size_t kMaxNumberChars = 32;  // WriteNumber: at most 24 ("-2.2250738585072014e-308")
constexpr size_t kMaxLabelChars = 24;   // WriteLabel: at most 15 ("-1.17549435e-38")
constexpr size_t kMaxHexKeyChars = 16;
constexpr size_t kMaxUint64Chars = 20;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the kernels below build text and wire-format bytes in little-endian words");

namespace internal {
// SIMD-within-a-register kernels of the Write* functions, on one uint64_t or lane-wise on a GCC
// vector of them (DelimitedTextWriter formats 8 fields at once). In place, as vectors passed by
// value would change the ABI with the ISA.

// A 32-bit value per lane -> its 8 lowercase hex digits, most significant first, as the bytes of
// a little-endian word.
template <class T>
inline void Hex8InPlace(T& v) {
  // Spread the nibbles so that byte i holds nibble 7 - i, then turn each into its ASCII digit.
  v = (v >> 16) | (v & 0xFFFFull) << 32;
  v = ((v >> 8) & 0x000000FF000000FFull) | (v & 0x000000FF000000FFull) << 16;
  v = ((v >> 4) & 0x000F000F000F000Full) | (v & 0x000F000F000F000Full) << 8;
  const T letters = ((v + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;  // digit >= 10
  v += 0x3030303030303030ull + (letters << 5) + (letters << 3) - letters;  // 'a' - '0' - 10 = 39
}

// A value < 10^8 per lane -> its 8 decimal digits (zero-padded), most significant first, as the
// bytes 0..9 of a little-endian word. Divisions are multiplications by reciprocals, exact in
// these ranges: v / 10^4 = (v * 109951163) >> 40, x / 100 = (x * 10486) >> 20 for x < 10^4,
// x / 10 = (x * 103) >> 10 for x < 100.
template <class T>
inline void Decimal8InPlace(T& v) {
  const T high = (v * 109951163ull) >> 40;
  const T x = high | (v - high * 10000ull) << 32;  // 4-digit halves in 32-bit lanes
  const T hundreds = ((x * 10486ull) >> 20) & 0x0000007F0000007Full;
  const T y = hundreds | (x - hundreds * 100ull) << 16;  // 2-digit quarters in 16-bit lanes
  const T tens = ((y * 103ull) >> 10) & 0x000F000F000F000Full;
  v = tens | (y - tens * 10ull) << 8;
}
constexpr uint64_t kAsciiZeros = 0x3030303030303030ull;
}  // namespace internal

// Decimal digits of v < 10^8. Always stores 8 bytes at p (kMaxUint64Chars of room suffice).
inline char* WriteSmallUint(uint32_t v, char* p) {
  uint64_t d = v;
  internal::Decimal8InPlace(d);
  // Leading zero digits are the low zero bytes; the last digit always stays.
  const int zeros = __builtin_ctzll(d | uint64_t{1} << 63) >> 3;
  const uint64_t ascii = (d + internal::kAsciiZeros) >> (8 * zeros);
  std::memcpy(p, &ascii, 8);
  return p + 8 - zeros;
}

// Decimal digits of v.
inline char* WriteUint64(uint64_t v, char* p) {
  constexpr uint64_t k1e8 = 100000000;
  if (v < k1e8) return WriteSmallUint(static_cast<uint32_t>(v), p);
  if (v < k1e8 * k1e8) {
    p = WriteSmallUint(static_cast<uint32_t>(v / k1e8), p);
    uint64_t low = v % k1e8;
    internal::Decimal8InPlace(low);
    low += internal::kAsciiZeros;
    std::memcpy(p, &low, 8);
    return p + 8;
  }
  return std::to_chars(p, p + kMaxUint64Chars, v).ptr;
}

// Integer text when v is integral and fits int64, else the shortest round-trip text.
inline char* WriteNumber(double v, char* p) {
  // |v| < 9.2e18 makes the cast defined; it round-trips exactly when v is integral.
  if (std::fabs(v) < 9.2e18 && static_cast<double>(static_cast<int64_t>(v)) == v) {
    const int64_t i = static_cast<int64_t>(v);
    *p = '-';
    p += i < 0;
    return WriteUint64(i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i), p);
  }
  return std::to_chars(p, p + kMaxNumberChars, v).ptr;
}

// Shortest float text that reads back as the same float ("0", "1", "0.25", "-0").
inline char* WriteLabel(float v, char* p) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (bits == 0 || bits == 0x3f800000u) {  // +0.0f, 1.0f (not -0.0f, which prints "-0")
    *p = bits == 0 ? '0' : '1';
    return p + 1;
  }
  return std::to_chars(p, p + kMaxLabelChars, v).ptr;
}

// Lowercase hex, zero-padded to at least 8 digits, as Criteo's hashed categories.
inline char* WriteHexKey(uint64_t key, char* p) {
  uint64_t lo = key & 0xFFFFFFFFu;
  internal::Hex8InPlace(lo);
  if (key >> 32 == 0) {
    std::memcpy(p, &lo, 8);
    return p + 8;
  }
  char digits[16];
  uint64_t hi = key >> 32;
  internal::Hex8InPlace(hi);
  std::memcpy(digits, &hi, 8);
  std::memcpy(digits + 8, &lo, 8);
  const int n = (64 - __builtin_clzll(key) + 3) / 4;  // 9..16
  std::memcpy(p, digits + 16 - n, n);
  return p + n;
}

// ---- Errors. ----

// A value quoted for an error message: at most 40 bytes, C-escaped.
std::string Quote(absl::string_view s);
// INVALID_ARGUMENT "<file>:line 12: <what>" (or ": record 12" for binary formats).
absl::Status BadRecord(const RecordRef& rec, DataFormat format, absl::string_view what);

// How many of a list's `length` ids a reader keeps for list field `field`: all of them, or the
// first max_length under TRUNCATE (counting the list in rows->truncated_lists); under REFUSE an
// over-long list is a BadRecord naming the field.
absl::StatusOr<size_t> ListLengthToKeep(const RecordRef& rec, DataFormat format,
                                        const FeatureSpec::Field& field, size_t length,
                                        RawRows* rows);
// The same without a record: under REFUSE, INVALID_ARGUMENT "list field 'hist' has 12 ids, more
// than its list.max_length 10 (list.overflow: REFUSE)", for the caller to prefix with the place.
absl::StatusOr<size_t> ListLengthToKeep(const FeatureSpec::Field& field, size_t length,
                                        RawRows* rows);

// A list as text, as a CSV list column and a serve request's text row write it (docs/FORMATS.md
// "Lists"): items joined by the field's separator ("a|b:0.5|c"; empty text: an empty list), each
// an id as in a categorical column (1..16 hex digits, else hashed), optionally ":weight" (else 1).
// Starts list (row, f) of *rows and appends the ids ListLengthToKeep keeps. An empty item
// ("a||b"), a bad weight or an over-long list under REFUSE is INVALID_ARGUMENT saying what is
// wrong with the text, for the caller to prefix with where it is. `pieces` is scratch.
absl::Status ParseListText(absl::string_view text, const FeatureSpec& spec, int f, int row,
                           RawRows* rows, std::vector<absl::string_view>* pieces);

// ---- Protobuf payloads (TFRecord, RecordIO). ----

// The writers encode the wire format by hand (no message objects); these are its pieces.
inline uint8_t* WriteVarint(uint64_t v, uint8_t* p) {
  return google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, p);
}
inline size_t VarintSize(uint64_t v) {
  return google::protobuf::io::CodedOutputStream::VarintSize64(v);
}
// The one-byte tag (field number < 16, wire type 2) and the length of a length-delimited field.
inline uint8_t* WriteFieldHead(uint8_t tag, size_t length, uint8_t* p) {
  *p++ = tag;
  return WriteVarint(length, p);
}
// The size of such a field holding `length` bytes.
inline size_t FieldSize(size_t length) { return 1 + VarintSize(length) + length; }
constexpr size_t kMaxVarintBytes = 10;

// A protobuf arena whose first block survives Reset(), so parsing one small message per record
// allocates nothing once warm. Not thread-safe.
class ScratchArena {
 public:
  ScratchArena();
  // Frees every message made on the arena.
  void Reset() { arena_.Reset(); }
  // A new empty T on the arena, valid until Reset.
  template <class T>
  T* Create() {
    return google::protobuf::Arena::CreateMessage<T>(&arena_);
  }
  // Reset() then Create<T>().
  template <class T>
  T* Fresh() {
    Reset();
    return Create<T>();
  }

 private:
  static constexpr size_t kBlockBytes = size_t{64} << 10;
  std::unique_ptr<char[]> block_;
  google::protobuf::Arena arena_;
};

// ---- Parsers. ----

// RecordParser plumbing: checks the RawRows shape and parses records one at a time. ParseOne
// adds exactly one row, or returns the record's error having added none.
class RowParser : public RecordParser {
 public:
  void Parse(absl::Span<const RecordRef> records, RawRows* rows,
             std::vector<absl::Status>* errors) final;

 protected:
  explicit RowParser(const FeatureSpec& spec) : spec_(spec) {}
  virtual absl::Status ParseOne(const RecordRef& rec, RawRows* rows) = 0;

  const FeatureSpec spec_;
};

// ---- Writers. ----

// What a written row must satisfy so that reading it back gives the identical RawRows row.
struct WritableRows {
  bool missing_ok = true;            // false for LibSVM (one pair per field)
  bool categorical_scale_ok = false; // true when the format stores a categorical value (LibSVM)
};

// RecordWriter plumbing: buffered output, row validation (labels in [0, 1] and finite numeric
// values always; missing fields and categorical scales as the format allows), and an error that
// names the row. Subclasses only serialize one row. Not thread-safe.
class BufferedRecordWriter : public RecordWriter {
 public:
  absl::Status Write(const RawRows& rows, int begin, int end) final;
  absl::Status Close() final;
  uint64_t bytes_written() const final { return out_->bytes_written(); }

 protected:
  BufferedRecordWriter(DataFormat format, const FeatureSpec& spec,
                       std::unique_ptr<BufferedWriter> out, WritableRows rules);
  // Appends row r (already validated, unless check_before_append_ is false) to *out. On error
  // the writer drops what was appended.
  virtual absl::Status AppendRow(const RawRows& rows, int r, std::string* out) = 0;
  // INVALID_ARGUMENT naming the output file, the row index in the RawRows and the record number
  // in the output.
  absl::Status RowError(int r, absl::string_view what) const;
  // Row r's RowError if it breaks the rules, else OK.
  absl::Status CheckRow(const RawRows& rows, int r) const;

  const DataFormat format_;
  const FeatureSpec spec_;
  const std::vector<uint8_t> categorical_;  // per field: 1 if CATEGORICAL
  std::unique_ptr<BufferedWriter> out_;
  // Write calls CheckRow before AppendRow. A subclass whose AppendRow validates rows as it goes
  // (and returns CheckRow's error when its own test fails) clears this.
  bool check_before_append_ = true;

 private:
  const WritableRows rules_;
  uint64_t records_written_ = 0;
};

// The Criteo TSV and CSV writers: one line per row, the label then every field in spec order,
// separated by `sep`. A field's text is empty when it is missing, WriteHexKey for a categorical
// field and WriteNumber for a numeric one. `header` (if not empty) is written first, as a line.
class DelimitedTextWriter : public BufferedRecordWriter {
 public:
  DelimitedTextWriter(DataFormat format, const FeatureSpec& spec,
                      std::unique_ptr<BufferedWriter> out, char sep, absl::string_view header);

 private:
  absl::Status AppendRow(const RawRows& rows, int r, std::string* out) override;

  static constexpr uint8_t kSlowText = 0xff;
  struct Group {  // fields [begin, begin + 8)
    int begin;
    bool numeric;  // holds a numeric field
  };
  const char sep_;
  std::vector<Group> groups_;  // covering every field (none if there are fewer than 8)
  // Per field of the row being written: its text as one 8-byte word and the text's length (0
  // if missing), or kSlowText if the text does not fit the word.
  std::vector<uint64_t> text_;
  std::vector<uint8_t> length_;
  std::unique_ptr<char[]> line_;  // one formatted row
};

}  // namespace pstrain
