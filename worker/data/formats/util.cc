#include "worker/data/formats/util.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace internal {

namespace {
constexpr std::array<int8_t, 256> MakeHexDigits() {
  std::array<int8_t, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = -1;
  for (int i = 0; i < 10; ++i) t['0' + i] = static_cast<int8_t>(i);
  for (int i = 0; i < 6; ++i) t['a' + i] = t['A' + i] = static_cast<int8_t>(10 + i);
  return t;
}
}  // namespace

const std::array<int8_t, 256> kHexDigit = MakeHexDigits();

}  // namespace internal

namespace {

// 8 fields at a time, with GCC vector extensions: one AVX-512 register per vector, or split by
// the compiler for narrower ISAs.
typedef uint64_t U64x8 __attribute__((vector_size(64)));
typedef int64_t I64x8 __attribute__((vector_size(64)));
typedef double F64x8 __attribute__((vector_size(64)));
typedef uint8_t U8x8 __attribute__((vector_size(8)));

// Calls fn(g) with the starts of 8-field groups covering fields [0, n), n >= 8: 0, 8, 16, ...,
// and n - 8 for the last one, which may overlap the one before (the callers' results per field
// do not depend on the group).
template <class Fn>
inline void ForEachGroup(int n, Fn&& fn) {
  for (int f = 0; f < n; f += 8) fn(std::min(f, n - 8));
}

template <class V, class T>
inline void Load(V* v, const T* p) {
  static_assert(sizeof(V) == 8 * sizeof(T), "8 lanes");
  std::memcpy(v, p, sizeof(V));
}

// -1 in the lanes whose byte is not 0. (A shift per lane: GCC 12 turns a conversion from a
// vector of 8 bytes into lane-by-lane inserts.)
inline void ByteMask(I64x8* mask, const uint8_t* bytes) {
  uint64_t word;
  std::memcpy(&word, bytes, 8);
  U64x8 lanes = {};
  lanes += word;
  *mask = ((lanes >> U64x8{0, 8, 16, 24, 32, 40, 48, 56}) & 0xFF) != 0;
}

}  // namespace

bool ParseNumber(const char* p, const char* end, double* v) {
  // Criteo's counts are short integers: a plain digit loop avoids from_chars<double>'s cost.
  const char* q = p;
  const bool neg = q < end && *q == '-';
  q += neg;
  if (q == end) return false;
  if (end - q <= 18) {
    uint64_t acc = 0;
    const char* s = q;
    while (s < end && static_cast<unsigned>(*s - '0') < 10) acc = acc * 10 + (*s++ - '0');
    if (s == end) {
      *v = neg ? -static_cast<double>(acc) : static_cast<double>(acc);
      return true;
    }
  }
  double d;
  const auto r = std::from_chars(p, end, d);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(d)) return false;
  *v = d;
  return true;
}

bool ParseHexKey(const char* p, const char* end, uint64_t* key) {
  const ptrdiff_t n = end - p;
  if (n < 1 || n > 16) return false;
  uint64_t k = 0;
  for (; p < end; ++p) {
    const int d = HexDigit(*p);
    if (d < 0) return false;
    k = (k << 4) | static_cast<uint64_t>(d);
  }
  *key = k;
  return true;
}

bool ParseUint64(const char* p, const char* end, uint64_t* v) {
  const auto r = std::from_chars(p, end, *v);
  return p < end && r.ec == std::errc() && r.ptr == end;
}

bool ParseLabel(const char* p, const char* end, float* label) {
  if (end - p == 1 && (*p == '0' || *p == '1')) {
    *label = static_cast<float>(*p - '0');
    return true;
  }
  float f;
  const auto r = std::from_chars(p, end, f);
  if (p == end || r.ec != std::errc() || r.ptr != end || !(f >= 0.0f && f <= 1.0f)) return false;
  *label = f;
  return true;
}

std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 40;
  if (s.size() <= kMax) return absl::StrCat("'", absl::CHexEscape(s), "'");
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, kMax)), "'... (", s.size(), " bytes)");
}

absl::Status BadRecord(const RecordRef& rec, DataFormat format, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(DescribeRecord(rec, format), ": ", what));
}

absl::StatusOr<size_t> ListLengthToKeep(const FeatureSpec::Field& field, size_t length,
                                        RawRows* rows) {
  const size_t max = static_cast<size_t>(field.max_length);
  if (length <= max) return length;
  if (field.overflow == REFUSE) {
    return absl::InvalidArgumentError(absl::StrCat("list field '", field.name, "' has ", length,
                                                   " ids, more than its list.max_length ", max,
                                                   " (list.overflow: REFUSE)"));
  }
  ++rows->truncated_lists;
  return max;
}

absl::StatusOr<size_t> ListLengthToKeep(const RecordRef& rec, DataFormat format,
                                        const FeatureSpec::Field& field, size_t length,
                                        RawRows* rows) {
  absl::StatusOr<size_t> keep = ListLengthToKeep(field, length, rows);
  if (!keep.ok()) return BadRecord(rec, format, keep.status().message());
  return keep;
}

absl::Status ParseListText(absl::string_view text, const FeatureSpec& spec, int f, int row,
                           RawRows* rows, std::vector<absl::string_view>* pieces) {
  const FeatureSpec::Field& field = spec.field(f);
  rows->StartList(row, f);
  if (text.empty()) return absl::OkStatus();
  *pieces = absl::StrSplit(text, field.separator);
  ASSIGN_OR_RETURN(const size_t keep, ListLengthToKeep(field, pieces->size(), rows));
  for (size_t j = 0; j < keep; ++j) {
    const absl::string_view id = (*pieces)[j];
    if (id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("empty id ", j + 1, " in list ", Quote(text),
                                                     ": expected ids separated by '",
                                                     field.separator, "'"));
    }
    // "id:weight": the text after the last ':' is the weight.
    absl::string_view key_text = id;
    double weight = 1.0;
    if (const size_t colon = id.rfind(':'); colon != absl::string_view::npos) {
      key_text = id.substr(0, colon);
      const absl::string_view w = id.substr(colon + 1);
      if (key_text.empty() || !ParseNumber(w.data(), w.data() + w.size(), &weight)) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad list item ", Quote(id),
                         ": expected id or id:weight with a numeric weight"));
      }
    }
    uint64_t key;
    if (!ParseHexKey(key_text.data(), key_text.data() + key_text.size(), &key)) {
      key = HashBytes(key_text);
    }
    rows->AddToList(row, f, key, weight);
  }
  return absl::OkStatus();
}

namespace {
google::protobuf::ArenaOptions ArenaWithBlock(char* block, size_t size) {
  google::protobuf::ArenaOptions o;
  o.initial_block = block;
  o.initial_block_size = size;
  return o;
}
}  // namespace

ScratchArena::ScratchArena()
    : block_(new char[kBlockBytes]), arena_(ArenaWithBlock(block_.get(), kBlockBytes)) {}

void RowParser::Parse(absl::Span<const RecordRef> records, RawRows* rows,
                      std::vector<absl::Status>* errors) {
  PSTRAIN_CHECK(rows->num_fields == spec_.num_fields())
      << "RawRows has " << rows->num_fields << " fields, the feature spec has "
      << spec_.num_fields();
  for (const RecordRef& rec : records) {
    absl::Status s = ParseOne(rec, rows);
    if (!s.ok()) errors->push_back(std::move(s));
  }
}

namespace {
std::vector<uint8_t> CategoricalMask(const FeatureSpec& spec) {
  std::vector<uint8_t> m;
  for (const auto& f : spec.fields()) m.push_back(f.kind == CATEGORICAL);
  return m;
}
}  // namespace

BufferedRecordWriter::BufferedRecordWriter(DataFormat format, const FeatureSpec& spec,
                                           std::unique_ptr<BufferedWriter> out, WritableRows rules)
    : format_(format),
      spec_(spec),
      categorical_(CategoricalMask(spec)),
      out_(std::move(out)),
      rules_(rules) {}

absl::Status BufferedRecordWriter::RowError(int r, absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(out_->path(), ": row ", r, " (record ",
                                                 records_written_ + 1, " of the output): ", what));
}

absl::Status BufferedRecordWriter::CheckRow(const RawRows& rows, int r) const {
  const float label = rows.labels[r];
  const int nf = spec_.num_fields();
  // One branch-free pass for the common case, 8 fields at a time; the loop below only names
  // the problem.
  if (nf >= 8) {
    constexpr double kMax = std::numeric_limits<double>::max();
    const size_t base = static_cast<size_t>(r) * nf;
    const int64_t missing_bad = rules_.missing_ok ? 0 : -1;
    const int64_t scale_bad = rules_.categorical_scale_ok ? 0 : -1;
    I64x8 bad = {};
    ForEachGroup(nf, [&](int g) {
      I64x8 present, categorical;
      F64x8 v;
      ByteMask(&present, rows.present.data() + base + g);
      ByteMask(&categorical, categorical_.data() + g);
      Load(&v, rows.value.data() + base + g);
      const I64x8 finite = (v <= kMax) & (v >= -kMax);  // false for NaN
      const I64x8 wrong = ~finite | (categorical & scale_bad & (v != 1.0));
      bad |= (present & wrong) | (~present & missing_bad);
    });
    int64_t any = !(label >= 0.0f && label <= 1.0f);
    for (int j = 0; j < 8; ++j) any |= bad[j];
    if (!any) return absl::OkStatus();
  }
  if (!(label >= 0.0f && label <= 1.0f)) {
    return RowError(r, absl::StrCat("label ", label, " is not in [0, 1]"));
  }
  for (int f = 0; f < nf; ++f) {
    const size_t i = static_cast<size_t>(r) * nf + f;
    const FeatureSpec::Field& field = spec_.field(f);
    if (field.list) {  // key / value unused; an absent list is written as an empty one
      for (uint32_t j = 0; j < rows.ListSize(i); ++j) {
        const double w = rows.list_weight[rows.list_begin[i] + j];
        if (!std::isfinite(w)) {
          return RowError(r, absl::StrCat("list field '", field.name, "' has non-finite weight ",
                                          w, " (id ", j + 1, ")"));
        }
      }
      continue;
    }
    if (!rows.present[i]) {
      if (!rules_.missing_ok) {
        return RowError(r, absl::StrCat("field '", field.name, "' is missing; ",
                                        DataFormatName(format_),
                                        " cannot represent a missing field"));
      }
      continue;
    }
    const double v = rows.value[i];
    if (!std::isfinite(v)) {
      return RowError(r, absl::StrCat("field '", field.name, "' has non-finite value ", v));
    }
    if (categorical_[f] && !rules_.categorical_scale_ok && v != 1.0) {
      return RowError(r, absl::StrCat("categorical field '", field.name, "' has value ", v, "; ",
                                      DataFormatName(format_),
                                      " stores no categorical value (it reads back as 1)"));
    }
  }
  return absl::OkStatus();
}

absl::Status BufferedRecordWriter::Write(const RawRows& rows, int begin, int end) {
  if (out_->closed()) {
    return absl::FailedPreconditionError(absl::StrCat(out_->path(), ": Write after Close"));
  }
  if (rows.num_fields != spec_.num_fields()) {
    return absl::InvalidArgumentError(absl::StrCat(out_->path(), ": rows have ", rows.num_fields,
                                                   " fields, the feature spec has ",
                                                   spec_.num_fields()));
  }
  if (begin < 0 || end > rows.size() || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat(out_->path(), ": bad row range [", begin, ", ",
                                                   end, ") of ", rows.size(), " rows"));
  }
  std::string* buf = out_->buffer();
  for (int r = begin; r < end; ++r) {
    if (check_before_append_) RETURN_IF_ERROR(CheckRow(rows, r));
    const size_t mark = buf->size();
    absl::Status s = AppendRow(rows, r, buf);
    if (!s.ok()) {
      buf->resize(mark);
      return s;
    }
    ++records_written_;
    RETURN_IF_ERROR(out_->MaybeFlush());
  }
  return absl::OkStatus();
}

absl::Status BufferedRecordWriter::Close() { return out_->Close(); }

DelimitedTextWriter::DelimitedTextWriter(DataFormat format, const FeatureSpec& spec,
                                         std::unique_ptr<BufferedWriter> out, char sep,
                                         absl::string_view header)
    : BufferedRecordWriter(format, spec, std::move(out), WritableRows{}),
      sep_(sep),
      text_(spec.num_fields()),
      length_(spec.num_fields()),
      line_(new char[kMaxLabelChars + spec.num_fields() * (1 + kMaxNumberChars) + 1]) {
  static_assert(kMaxHexKeyChars <= kMaxNumberChars, "a field's text fits kMaxNumberChars");
  check_before_append_ = false;  // AppendRow checks each row in its first pass
  const int nf = spec.num_fields();
  if (nf >= 8) {
    ForEachGroup(nf, [&](int g) {
      bool numeric = false;
      for (int f = g; f < g + 8; ++f) numeric |= !categorical_[f];
      groups_.push_back(Group{g, numeric});
    });
  }
  if (!header.empty()) absl::StrAppend(out_->buffer(), header, "\n");
}

absl::Status DelimitedTextWriter::AppendRow(const RawRows& rows, int r, std::string* out) {
  const int nf = rows.num_fields;
  const size_t base = static_cast<size_t>(r) * nf;
  const uint8_t* present = rows.present.data() + base;
  const uint64_t* key = rows.key.data() + base;
  const double* value = rows.value.data() + base;
  uint64_t* text = text_.data();
  uint8_t* length = length_.data();
  // Pass 1, 8 fields at a time and without branches (whether a field is missing is a coin flip
  // that a branch would mispredict): the text of each field whose text fits one word (32-bit
  // keys; integral numbers in (-10^7, 10^8)) and its length, and the row checks (finite numbers,
  // categorical values of 1), which touch the same data.
  int64_t bad = !(rows.labels[r] >= 0.0f && rows.labels[r] <= 1.0f);
  if (nf >= 8) {
    constexpr double kMax = std::numeric_limits<double>::max();
    I64x8 wrong = {};
    for (const Group& group : groups_) {
      const int g = group.begin;
      U64x8 k, t;
      F64x8 v;
      I64x8 is_present, categorical, n;
      Load(&k, key + g);
      Load(&v, value + g);
      ByteMask(&is_present, present + g);
      ByteMask(&categorical, categorical_.data() + g);
      const I64x8 finite = (v <= kMax) & (v >= -kMax);  // false for NaN
      wrong |= is_present & ((categorical & (v != 1.0)) | (~categorical & ~finite));
      t = k & 0xFFFFFFFFull;
      internal::Hex8InPlace(t);
      const I64x8 hex_fits = (k >> 32) == 0;
      n = (hex_fits & 8) | (~hex_fits & kSlowText);
      if (group.numeric) {
        const I64x8 in_range = (v > -1e7) & (v < 1e8);
        v = reinterpret_cast<F64x8>(reinterpret_cast<I64x8>(v) & in_range);  // else 0
        const I64x8 i = __builtin_convertvector(v, I64x8);
        const I64x8 dec_fits = in_range & (__builtin_convertvector(i, F64x8) == v);
        const I64x8 neg = i < 0;
        U64x8 dec = reinterpret_cast<U64x8>((i ^ neg) - neg);  // |i|
        I64x8 digits = 1 - (dec >= 10) - (dec >= 100) - (dec >= 1000) - (dec >= 10000) -
                       (dec >= 100000) - (dec >= 1000000) - (dec >= 10000000);
        internal::Decimal8InPlace(dec);
        dec = (dec + internal::kAsciiZeros) >> reinterpret_cast<U64x8>(64 - 8 * digits);
        const U64x8 minus = reinterpret_cast<U64x8>(neg);
        dec = ((dec << 8 | '-') & minus) | (dec & ~minus);
        digits -= neg;
        const U64x8 cat = reinterpret_cast<U64x8>(categorical);
        t = (t & cat) | (dec & ~cat);
        n = (n & categorical) | (~categorical & ((dec_fits & digits) | (~dec_fits & kSlowText)));
      }
      n &= is_present;
      std::memcpy(text + g, &t, 64);
      const U8x8 n8 = __builtin_convertvector(n, U8x8);
      std::memcpy(length + g, &n8, 8);
    }
    for (int j = 0; j < 8; ++j) bad |= wrong[j];
  } else {
    bad = 1;  // CheckRow decides
    for (int f = 0; f < nf; ++f) length[f] = present[f] ? kSlowText : 0;
  }
  if (bad) RETURN_IF_ERROR(CheckRow(rows, r));
  // Pass 2: the line.
  const char sep = sep_;
  char* p = WriteLabel(rows.labels[r], line_.get());
  for (int f = 0; f < nf; ++f) {
    *p++ = sep;
    const unsigned n = length[f];
    if (n != kSlowText) {
      std::memcpy(p, &text[f], 8);
      p += n;
    } else {
      p = categorical_[f] ? WriteHexKey(key[f], p) : WriteNumber(value[f], p);
    }
  }
  *p++ = '\n';
  out->append(line_.get(), p - line_.get());
  return absl::OkStatus();
}

}  // namespace pstrain
