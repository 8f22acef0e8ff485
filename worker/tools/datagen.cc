#include "worker/tools/datagen.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include <immintrin.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/json_writer.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/record_io.h"
#include "worker/eval/metrics.h"

namespace pstrain {
namespace {

constexpr int kNumeric = SyntheticData::kNumNumeric;
constexpr int kFields = SyntheticData::kNumFields;

// ---- Numeric fields: quantiles of the first 10,000 rows of Kaggle train.txt ---------------------

// Quantiles are taken at probabilities kQuantileCells[i] / 1024, so that each of 1024 equal cells
// of [0, 1) lies inside one segment between two quantiles and a draw needs no search.
constexpr int kQuantiles = 40;
constexpr int kCells = 1024;
constexpr int kQuantileCells[kQuantiles] = {0,   1,   10,  32,  64,   96,   128,  160,  192,  224,
                                            256, 288, 320, 352, 384,  416,  448,  480,  512,  544,
                                            576, 608, 640, 672, 704,  736,  768,  800,  832,  864,
                                            896, 928, 960, 992, 1004, 1014, 1019, 1022, 1023, 1024};
// Order statistic round(p * (n - 1)) of each field's present values, p = kQuantileCells / 1024.
constexpr double kNumericQuantiles[kNumeric][kQuantiles] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  0,  0,  1,   1,
     1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6, 9, 13, 23, 29, 44, 62, 82, 103, 214},
    {-2, -1, -1,  -1,  -1,  -1,  0,    0,    0,    0,    0,    1,    1,  1,
     1,  1,  2,   2,   3,   4,   6,    9,    12,   17,   22,   29,   38, 51,
     66, 94, 137, 220, 392, 937, 1471, 2224, 2868, 3401, 3582, 18522},
    {0, 0,  1,  1,  1,  1,  1,  1,  2,  2,  2,  3,  3,  4,   4,   5,   5,   6,    7,    8,
     9, 10, 11, 13, 15, 18, 21, 24, 29, 35, 44, 55, 80, 131, 187, 306, 526, 1372, 2807, 65535},
    {0, 0, 0, 0, 0, 1, 1,  1,  1,  1,  2,  2,  2,  2,  3,  3,  4,  4,  4,  5,
     5, 6, 7, 7, 8, 9, 10, 12, 13, 15, 18, 21, 25, 34, 38, 45, 52, 66, 79, 280},
    {0,     0,     0,     1,      4,      11,     23,     44,     84,     156,
     272,   432,   624,   914,    1427,   1536,   1712,   1959,   2469,   3003,
     3497,  4386,  5028,  6168,   7390,   8900,   10493,  13042,  16493,  20446,
     27613, 33732, 41941, 110954, 177320, 318489, 488211, 625626, 775584, 1618112},
    {0,   0,   0,   0,   0,   1,   3,    4,    6,    7,    9,    12,   14,  18,
     21,  25,  30,  35,  40,  48,  54,   63,   72,   82,   94,   110,  129, 155,
     187, 227, 280, 358, 506, 802, 1077, 1740, 2197, 3168, 3960, 12167},
    {0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  0,  1,  1,  1,  1,   2,   2,   2,   3,   3,
     4, 4, 5, 6, 7, 9, 10, 13, 15, 19, 25, 32, 48, 80, 121, 194, 330, 547, 711, 1658},
    {0,  0,  0,  0,  0,  0,  1,  1,  1,  2,  2,  3,  3,  4,  4,  5,  6,  7,  7,  9,
     10, 11, 13, 14, 16, 18, 20, 22, 25, 28, 32, 36, 40, 45, 47, 48, 49, 49, 70, 682},
    {0,   0,   0,   0,   1,   2,   3,   4,    6,    8,    10,   13,  16,  19,
     23,  27,  31,  36,  41,  48,  54,  61,   70,   81,   93,   106, 123, 145,
     174, 209, 256, 329, 437, 677, 888, 1244, 1640, 2574, 3189, 7335},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 6},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1,  1,  1,  1,  1,  1,  1,
     1, 1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 6, 7, 12, 16, 23, 32, 45, 52, 79},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  0,
     0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 3, 7, 9, 14, 21, 34, 39, 98},
    {0, 0, 0, 0, 1,  1,  1,  1,  1,  2,  2,  2,  2,  3,  3,  4,  4,   4,   5,   6,
     6, 7, 8, 9, 10, 12, 13, 15, 17, 20, 23, 28, 34, 46, 54, 76, 100, 157, 223, 770},
};

inline double SignedLog(double x) { return x < 0 ? -std::log1p(-x) : std::log1p(x); }

// e^t for 0 <= t < 700 with relative error below 3e-10: enough for values that are rounded to
// integers below 2^21, several times faster than libm, branch-free, and the same bits on every
// platform.
inline double FastExp(double t) {
  const double k = std::floor(t * 1.4426950408889634 + 0.5);
  const double r = t - k * 0.6931471805599453;  // |r| <= ln(2) / 2
  constexpr double kTaylor[] = {1 / 40320., 1 / 5040., 1 / 720., 1 / 120., 1 / 24.,
                                1 / 6.,     1 / 2.,    1,        1};
  double p = kTaylor[0];
  for (int i = 1; i < 9; ++i) p = p * r + kTaylor[i];
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Inverse-CDF sampling of the quantile table, interpolating in sign(x) ln(1 + |x|) space and
// rounding: t = intercept + slope * u on u's segment, x = round(sign(t) (e^|t| - 1)).
struct NumericTables {
  uint8_t segment[kCells];  // segment of each cell
  double intercept[kNumeric][kQuantiles - 1], slope[kNumeric][kQuantiles - 1];
  NumericTables() {
    for (int i = 0; i + 1 < kQuantiles; ++i) {
      for (int c = kQuantileCells[i]; c < kQuantileCells[i + 1]; ++c) {
        segment[c] = static_cast<uint8_t>(i);
      }
    }
    for (int f = 0; f < kNumeric; ++f) {
      for (int i = 0; i + 1 < kQuantiles; ++i) {
        const double p0 = kQuantileCells[i] / double{kCells},
                     p1 = kQuantileCells[i + 1] / double{kCells};
        const double t0 = SignedLog(kNumericQuantiles[f][i]),
                     t1 = SignedLog(kNumericQuantiles[f][i + 1]);
        slope[f][i] = (t1 - t0) / (p1 - p0);
        intercept[f][i] = t0 - slope[f][i] * p0;
      }
    }
  }
  // u: a uniform 64-bit word (its top 10 bits pick the cell).
  double Sample(int f, uint64_t u) const {
    const int seg = segment[u >> 54];
    const double t = intercept[f][seg] + slope[f][seg] * ((u >> 11) * 0x1.0p-53);
    return std::nearbyint(std::copysign(FastExp(std::abs(t)) - 1, t));
  }
};
const NumericTables& Numeric() {
  static const NumericTables* tables = new NumericTables();
  return *tables;
}

// ---- Missing values -----------------------------------------------------------------------------

// A source of missingness: with probability `rate`, every listed field is missing in the row.
// Fields are numbered as in the CRITEO preset: I_j is j - 1, C_j is 12 + j.
struct MissingSource {
  double rate;
  int fields[6];
  int num_fields;
};
constexpr MissingSource kMissing[] = {
    {0.454, {0, 9}, 2},                    // I1, I10
    {0.217, {3, 12}, 2},                   // I4, I13
    {0.043, {6, 8, 10}, 3},                // I7, I9, I11
    {0.034, {15, 16, 24, 28, 33, 36}, 6},  // C3, C4, C12, C16, C21, C24
    {0.440, {31, 32, 37, 38}, 4},          // C19, C20, C25, C26
    {0.215, {2}, 1},                       // I3
    {0.026, {4}, 1},                       // I5
    {0.223, {5}, 1},                       // I6
    {0.0005, {7}, 1},                      // I8
    {0.765, {11}, 1},                      // I12
    {0.121, {18}, 1},                      // C6
    {0.763, {34}, 1},                      // C22
};
constexpr int kNumMissing = sizeof(kMissing) / sizeof(kMissing[0]);

// Per source: the 32-bit threshold of a uniform draw and the bit mask of its fields.
struct MissingTables {
  uint32_t threshold[kNumMissing];
  uint64_t mask[kNumMissing];
  MissingTables() {
    for (int i = 0; i < kNumMissing; ++i) {
      threshold[i] = static_cast<uint32_t>(std::min(kMissing[i].rate * 4294967296.0, 4294967295.0));
      mask[i] = 0;
      for (int j = 0; j < kMissing[i].num_fields; ++j) {
        mask[i] |= uint64_t{1} << kMissing[i].fields[j];
      }
    }
  }
};
const MissingTables& Missing() {
  static const MissingTables* tables = new MissingTables();
  return *tables;
}

// ---- Teacher helpers ----------------------------------------------------------------------------

// The teacher's input id of a missing field: no key (32-bit) or bucket (a small integer) is this.
constexpr uint64_t kMissingId = uint64_t{1} << 62;

// Buckets of integral values in [-3, 2^16) come from a table (one log saved per numeric field);
// anything else (e.g. float32 values read back from TFRecord, I5's largest counts) is computed.
struct BucketTable {
  static constexpr int kMin = -3, kEnd = 1 << 16;
  uint8_t bucket[kEnd - kMin];
  BucketTable() {
    for (int x = kMin; x < kEnd; ++x) {
      bucket[x - kMin] = static_cast<uint8_t>(FeatureSpec::LogSquaredBucket(x));
    }
  }
};
inline int64_t Bucket(const BucketTable& table, double x) {
  if (x >= BucketTable::kMin && x < BucketTable::kEnd && x == std::trunc(x)) {
    return static_cast<int8_t>(table.bucket[static_cast<int>(x) - BucketTable::kMin]);
  }
  return FeatureSpec::LogSquaredBucket(x);
}
const BucketTable& Buckets() {
  static const BucketTable* table = new BucketTable();
  return *table;
}

// 16 signed bytes to 16 floats. GCC scalarizes __builtin_convertvector from int8 inside the
// loop below, hence the intrinsics (vpmovsxbd + vcvtdq2ps, twice). AVX2 is the build's baseline,
// and datagen has this one path on every CPU, so a seed gives the same data everywhere.
// (Written through a pointer: a 64-byte vector returned by value has another ABI with AVX-512.)
inline void BytesToFloats(const int8_t* p, SyntheticData::V16* out) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(bytes, bytes)));
  std::memcpy(out, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(lo), &hi, sizeof(hi));
}

inline double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Wellons' lowbias32: a bijection of 32-bit words with good avalanche.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

constexpr int kCriteoCardinalities[SyntheticData::kNumCategorical] = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

// The high-cardinality options (DatagenOptions): fields in range and distinct, a cardinality the
// 32-bit keys can hold, an exponent the sampler takes.
absl::Status CheckHighCardinality(const DatagenOptions& o) {
  const auto& fields = o.high_cardinality_fields;
  if (fields.empty()) {
    if (o.high_cardinality != 0) {
      return absl::InvalidArgumentError(
          "datagen: high_cardinality is set but no high_cardinality_fields name the fields "
          "that take it (e.g. C3,C12)");
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i] < 0 || fields[i] >= SyntheticData::kNumCategorical) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datagen: high_cardinality_fields: categorical field index ", fields[i],
          " is outside 0..", SyntheticData::kNumCategorical - 1, " (C1..C26)"));
    }
    if (std::count(fields.begin(), fields.begin() + i, fields[i]) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datagen: high_cardinality_fields: C", fields[i] + 1, " is listed twice"));
    }
  }
  if (o.high_cardinality < 1 || o.high_cardinality > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datagen: high_cardinality must be in [1, 2^32 = 4294967296] (keys are 32-bit) when "
        "high_cardinality_fields are given, got ",
        o.high_cardinality));
  }
  if (!(o.high_cardinality_zipf_exponent > 0) || o.high_cardinality_zipf_exponent > 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: high_cardinality_zipf_exponent must be in (0, 10], got ",
                     o.high_cardinality_zipf_exponent));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TeacherInteraction> ParseTeacherInteraction(const std::string& name) {
  for (TeacherInteraction t :
       {TeacherInteraction::kFm, TeacherInteraction::kCross, TeacherInteraction::kDot,
        TeacherInteraction::kCross3, TeacherInteraction::kCrossFull}) {
    if (name == TeacherInteractionName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("teacher interaction '", name,
                   "', expected fm, cross, dot, cross3 or cross_full"));
}

const char* TeacherInteractionName(TeacherInteraction interaction) {
  switch (interaction) {
    case TeacherInteraction::kCross:
      return "cross";
    case TeacherInteraction::kDot:
      return "dot";
    case TeacherInteraction::kCross3:
      return "cross3";
    case TeacherInteraction::kCrossFull:
      return "cross_full";
    default:
      return "fm";
  }
}

absl::StatusOr<std::vector<int>> ParseCategoricalFields(const std::string& names) {
  std::vector<int> fields;
  for (absl::string_view entry : absl::StrSplit(names, ',', absl::SkipEmpty())) {
    absl::string_view number = entry;
    int j = 0;
    if (!absl::ConsumePrefix(&number, "C") || !absl::SimpleAtoi(number, &j) || j < 1 ||
        j > SyntheticData::kNumCategorical || absl::StrCat(j) != number) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected categorical field names C1..C26 separated by commas, got '", entry, "'"));
    }
    fields.push_back(j - 1);
  }
  return fields;  // repeats are refused by SyntheticData::Create
}

std::vector<Batch> DatagenBatches(const SyntheticData& data, const FeatureSpec& spec, int count,
                                  int rows) {
  std::vector<Batch> batches(count);
  RawRows raw;
  std::vector<float> probs;
  int64_t chunk = 0;
  for (auto& b : batches) {
    b.Clear(spec.num_fields());
    while (b.size < rows) {
      data.GenerateChunk(chunk++, std::min(4096, rows - b.size), &raw, &probs);
      spec.Encode(raw, &b);
    }
  }
  return batches;
}

// ---- ZipfSampler --------------------------------------------------------------------------------

ZipfSampler::ZipfSampler(uint64_t n, double exponent, Method method)
    : n_(std::max<uint64_t>(n, 1)), s_(exponent) {
  if (method == Method::kRejectionInversion || (method == Method::kAuto && n_ > kMaxAliasRanks)) {
    h_x1_ = H(1.5) - 1.0;
    h_n_ = H(static_cast<double>(n_) + 0.5);
    accept_ = 2.0 - HInverse(H(2.5) - std::exp(-s_ * std::log(2.0)));
    return;
  }
  constexpr uint64_t kHead = 256;
  head_ = std::min(n_, kHead);
  std::vector<long double> mass;
  long double total = 0;
  for (uint64_t lo = 1; lo <= n_;) {
    const uint64_t size = std::min(lo <= kHead ? 1 : lo / 8, n_ - lo + 1);
    long double m = 0;
    for (uint64_t k = lo + size; k-- > lo;) m += std::pow(static_cast<double>(k), -s_);
    const double top = static_cast<double>(lo + size - 1) / static_cast<double>(lo);
    alias_.push_back({0, 0, static_cast<uint32_t>(size)});
    ranges_.push_back({lo, std::pow(top, -s_)});
    mass.push_back(m);
    total += m;
    lo += size;
  }
  // Vose's alias construction on probabilities scaled by the bucket count.
  const size_t b = alias_.size();
  std::vector<long double> scaled(b);
  std::vector<uint32_t> small, large;
  for (size_t i = 0; i < b; ++i) {
    scaled[i] = mass[i] / total * b;
    (scaled[i] < 1 ? small : large).push_back(static_cast<uint32_t>(i));
  }
  const long double two64 = 18446744073709551616.0L;
  auto set = [&](uint32_t i, long double p, uint32_t alias) {
    const long double t = std::floor(p * two64);
    alias_[i].threshold = t >= two64 ? ~uint64_t{0} : static_cast<uint64_t>(t);
    alias_[i].alias = alias;
  };
  while (!small.empty() && !large.empty()) {
    const uint32_t s = small.back(), l = large.back();
    small.pop_back();
    set(s, scaled[s], l);
    scaled[l] -= 1 - scaled[s];
    if (scaled[l] < 1) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // Leftovers are 1 up to rounding.
  for (uint32_t i : small) set(i, 1, i);
  for (uint32_t i : large) set(i, 1, i);
}

double ZipfSampler::AcceptProbability(uint64_t k, uint64_t lo) const {
  return std::pow(static_cast<double>(k) / static_cast<double>(lo), -s_);
}

// H(x) = integral of x^-s = (x^(1-s) - 1) / (1 - s), written to stay accurate near s = 1 (as in
// Apache Commons' RejectionInversionZipfSampler).
double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  const double t = (1.0 - s_) * log_x;
  const double expm1_t_over_t =
      std::abs(t) > 1e-8 ? std::expm1(t) / t : 1.0 + t * 0.5 * (1.0 + t / 3.0 * (1.0 + 0.25 * t));
  return expm1_t_over_t * log_x;
}

double ZipfSampler::HInverse(double x) const {
  double t = x * (1.0 - s_);
  if (t < -1.0) t = -1.0;
  const double log1p_t_over_t =
      std::abs(t) > 1e-8 ? std::log1p(t) / t : 1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t));
  return std::exp(log1p_t_over_t * x);
}

bool ZipfSampler::RejectionInversionStep(double uniform, uint64_t* rank) const {
  const double u = h_n_ + uniform * (h_x1_ - h_n_);
  const double x = HInverse(u);
  double k = std::floor(x + 0.5);
  if (k < 1) k = 1;
  if (k > static_cast<double>(n_)) k = static_cast<double>(n_);
  *rank = static_cast<uint64_t>(k);
  return k - x <= accept_ || u >= H(k + 0.5) - std::exp(-s_ * std::log(k));
}

// ---- SyntheticData ------------------------------------------------------------------------------

const std::vector<uint64_t>& SyntheticData::CriteoCardinalities() {
  static const std::vector<uint64_t>* v =
      new std::vector<uint64_t>(std::begin(kCriteoCardinalities), std::end(kCriteoCardinalities));
  return *v;
}

std::string SyntheticData::FieldName(int f) {
  return f < kNumNumeric ? absl::StrCat("I", f + 1) : absl::StrCat("C", f - kNumNumeric + 1);
}

uint32_t SyntheticData::RankToKey(int c, uint64_t rank) const {
  return Mix32(static_cast<uint32_t>(rank - 1) ^ key_salt_[c][0]) ^ key_salt_[c][1];
}

uint64_t SyntheticData::IdGeneration(int c, uint64_t rank, int day) const {
  if (!(options_.id_churn > 0) || day <= 0) return 0;
  // The rank's retirement days are a Bernoulli process of rate id_churn, walked by geometric
  // gaps from a hash of (teacher's key salts, field, rank): teacher_seed only, so that a day's
  // train and test sets share their ids.
  uint64_t h = HashKey(rank, (uint64_t{key_salt_[c][0]} << 32 | key_salt_[c][1]) ^
                                 (0xc4a2e00000000000ull + static_cast<uint64_t>(c)));
  const double log_keep = std::log1p(-options_.id_churn);
  uint64_t generation = 0;
  int64_t t = 0;
  for (;;) {
    h = Fmix64(h + 0x9e3779b97f4a7c15ull);
    const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
    t += 1 + static_cast<int64_t>(std::floor(std::log(u) / log_keep));
    if (t > day) return generation;
    ++generation;
  }
}

uint32_t SyntheticData::KeyOnDay(int c, uint64_t rank, int day) const {
  // Generation g of rank r is the rank r + g x cardinality: distinct keys for every (r, g).
  return RankToKey(c, rank + IdGeneration(c, rank, day) * cardinalities_[c]);
}

absl::StatusOr<SyntheticData> SyntheticData::Create(const DatagenOptions& o) {
  if (o.max_cardinality < 1) {
    return absl::InvalidArgumentError("datagen: max_cardinality must be >= 1");
  }
  if (!(o.zipf_exponent > 0) || o.zipf_exponent > 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: zipf_exponent must be in (0, 10], got ", o.zipf_exponent));
  }
  if (!(o.positive_rate > 0 && o.positive_rate < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: positive_rate must be in (0, 1), got ", o.positive_rate));
  }
  if (!(o.logit_std > 0) || o.logit_std > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: logit_std must be in (0, 20], got ", o.logit_std));
  }
  if (!(o.drift >= 0 && o.drift <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: drift must be in [0, 1], got ", o.drift));
  }
  if (o.day < 0) {
    return absl::InvalidArgumentError(absl::StrCat("datagen: day must be >= 0, got ", o.day));
  }
  if (!(o.interaction_share >= 0 && o.interaction_share < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datagen: interaction_share must be in [0, 1) (0: the default shares), got ",
        o.interaction_share));
  }
  if (o.chunk_rows < 1) return absl::InvalidArgumentError("datagen: chunk_rows must be >= 1");
  if (o.calibration_rows < 100) {
    return absl::InvalidArgumentError("datagen: calibration_rows must be >= 100");
  }
  RETURN_IF_ERROR(CheckHighCardinality(o));
  if (!(o.id_churn >= 0 && o.id_churn < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagen: id_churn must be in [0, 1), got ", o.id_churn));
  }
  if (!(o.history_mean_length >= 0 && o.history_mean_length <= 1000)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datagen: history_mean_length must be in [0, 1000] (0: no history field), got ",
        o.history_mean_length));
  }
  if (o.history_attention && !(o.history_mean_length > 0)) {
    return absl::InvalidArgumentError(
        "datagen: history_pooling attention needs a history field (history_mean_length > 0)");
  }
  if (o.history_mean_length > 0) {
    if (o.history_max_length < 1 || o.history_max_length > kMaxListLength) {
      return absl::InvalidArgumentError(absl::StrCat("datagen: history_max_length must be in [1, ",
                                                     kMaxListLength, "], got ",
                                                     o.history_max_length));
    }
    if (o.history_item_field < 0 || o.history_item_field >= kNumCategorical) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datagen: history_item_field must be a categorical field index in [0, ",
          kNumCategorical, ") (0 is C1), got ", o.history_item_field));
    }
    if (!(o.history_importance > 0 && o.history_importance <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datagen: history_importance must be in (0, 100], got ", o.history_importance));
    }
  }

  SyntheticData d;
  d.options_ = o;
  d.stride_ = kFields + (o.history_mean_length > 0 ? 1 : 0);
  for (int c = 0; c < kNumCategorical; ++c) {
    const bool high = std::count(o.high_cardinality_fields.begin(),
                                 o.high_cardinality_fields.end(), c) > 0;
    d.cardinalities_.push_back(
        high ? o.high_cardinality
             : std::min<uint64_t>(kCriteoCardinalities[c], o.max_cardinality));
    d.zipf_.emplace_back(d.cardinalities_.back(),
                         high ? o.high_cardinality_zipf_exponent : o.zipf_exponent);
    if (o.id_churn > 0 &&
        static_cast<unsigned __int128>(o.day + 1) * d.cardinalities_.back() > (uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datagen: id_churn: C", c + 1, " has ", d.cardinalities_.back(), " ids, and day ", o.day,
          " needs (day + 1) x ids <= 2^32 distinct 32-bit keys; lower --day or the cardinality"));
    }
  }
  d.churn_ = o.id_churn > 0 && o.day > 0;

  // Everything below depends on teacher_seed only (plus the feature distribution), so that two
  // runs with different data seeds share the teacher.
  Rng rng(SplitMix64(o.teacher_seed ^ 0x7eac4e7000000000ull));
  for (int f = 0; f < kFields; ++f) {
    d.salt_[f][0] = rng.Next();
    d.salt_[f][1] = rng.Next();
    // Per-field importance, log-normal: a few fields matter much more than others, as in Criteo.
    // The 1/128 turns the int8 hash bytes into [-1, 1).
    const float first = static_cast<float>(std::exp(0.6 * rng.Normal()) / 128);
    const float fm = static_cast<float>(std::exp(0.6 * rng.Normal()) / 128);
    const float emb = static_cast<float>(std::exp(0.6 * rng.Normal()) / 128);
    V16& scale = d.param_scale_[f];
    scale[0] = first;
    for (int j = 1; j <= kEmbDim; ++j) scale[j] = emb;
    for (int j = 8; j < 16; ++j) scale[j] = fm;
  }
  for (int c = 0; c < kNumCategorical; ++c) {
    d.key_salt_[c][0] = static_cast<uint32_t>(rng.Next());
    d.key_salt_[c][1] = static_cast<uint32_t>(rng.Next());
  }
  const int inputs = kFields * kEmbDim;
  d.w1_.resize(inputs);
  const double w1_scale = std::sqrt(6.0 / inputs);  // He-uniform for the ReLU layer
  for (V16& row : d.w1_) {
    for (int j = 0; j < kHidden; ++j) {
      row[j] = static_cast<float>(w1_scale * (2 * rng.UniformDouble() - 1));
    }
  }
  for (int j = 0; j < kHidden; ++j) {
    d.b1_[j] = static_cast<float>(0.1 * (2 * rng.UniformDouble() - 1));
    d.w2_[j] = static_cast<float>(std::sqrt(3.0 / kHidden) * (2 * rng.UniformDouble() - 1));
  }
  if (o.drift > 0 && o.day > 0) {
    // The day's teacher: a rotation from T0 (above) towards T1 (drawn here) by day x a.
    const double angle = o.day * std::acos(1 - o.drift);
    const double c = std::cos(angle), s = std::sin(angle);
    d.rotate_ = true;
    d.rot_cos_ = static_cast<float>(c);
    d.rot_sin_ = static_cast<float>(s);
    Rng other(SplitMix64(o.teacher_seed ^ 0xd21f7000000000ull));
    for (int f = 0; f < kFields; ++f) {
      d.drift_salt_[f][0] = other.Next();
      d.drift_salt_[f][1] = other.Next();
    }
    for (V16& row : d.w1_) {
      for (int j = 0; j < kHidden; ++j) {
        row[j] = static_cast<float>(c * row[j] + s * w1_scale * (2 * other.UniformDouble() - 1));
      }
    }
    for (int j = 0; j < kHidden; ++j) {
      d.b1_[j] = static_cast<float>(c * d.b1_[j] + s * 0.1 * (2 * other.UniformDouble() - 1));
      d.w2_[j] = static_cast<float>(
          c * d.w2_[j] + s * std::sqrt(3.0 / kHidden) * (2 * other.UniformDouble() - 1));
    }
  }

  if (o.interaction != TeacherInteraction::kFm) {
    // From a stream of its own, so that the FM teacher's draws above are untouched.
    Rng second(SplitMix64(o.teacher_seed ^ 0x5ec0dd0000000000ull));
    const int D = kFields * kFmDim;
    if (o.interaction == TeacherInteraction::kCross) {
      d.cross_v_.resize(kCrossRank * D);
      d.cross_u_.resize(kCrossRank * D);
      const double sd = 1.0 / std::sqrt(D);
      for (float& v : d.cross_v_) v = static_cast<float>(sd * second.Normal());
      for (float& u : d.cross_u_) u = static_cast<float>(sd * second.Normal());
    } else if (o.interaction == TeacherInteraction::kCross3) {
      const double sd = 1.0 / std::sqrt(D);
      for (std::vector<float>* m : {&d.cross_v_, &d.cross_u_, &d.cross2_v_, &d.cross2_u_}) {
        m->resize(kCrossRank * D);
        for (float& w : *m) w = static_cast<float>(sd * second.Normal());
      }
    } else if (o.interaction == TeacherInteraction::kCrossFull) {
      const double sd = 1.0 / std::sqrt(D);
      d.cross_v_.resize(static_cast<size_t>(D) * D);
      for (float& w : d.cross_v_) w = static_cast<float>(sd * second.Normal());
    } else {
      d.pair_weight_.assign(kFields * kFields, 0.f);
      for (int f = 0; f < kFields; ++f) {
        for (int g = f + 1; g < kFields; ++g) {
          d.pair_weight_[f * kFields + g] = static_cast<float>(second.Normal());
        }
      }
    }
  }

  // Calibration on rows from a teacher-derived seed: give the terms their share of the logit
  // variance (60/20/20; 40/40/20 with a cross, dot or cross3 interaction), then bisect the bias
  // to the target mean probability.
  RawRows rows;
  rows.Clear(d.stride_);
  const int n = o.calibration_rows;
  rows.labels.assign(n, 0.f);
  rows.present.assign(static_cast<size_t>(n) * d.stride_, 0);
  rows.key.assign(static_cast<size_t>(n) * d.stride_, 0);
  rows.value.assign(static_cast<size_t>(n) * d.stride_, 0.0);
  Rng calib(SplitMix64(o.teacher_seed ^ 0xca11b4a7e0000000ull));
  std::vector<TeacherTerms> raw(n);
  d.FillRows(&calib, &rows, 0, n);
  d.RawTerms(rows, 0, n, raw.data());
  double mean[3] = {0, 0, 0}, sq[3] = {0, 0, 0};
  for (int r = 0; r < n; ++r) {
    const double t[3] = {raw[r].first_order, raw[r].fm, raw[r].mlp};
    for (int i = 0; i < 3; ++i) {
      mean[i] += t[i];
      sq[i] += t[i] * t[i];
    }
  }
  const bool fm_teacher = o.interaction == TeacherInteraction::kFm;
  double share[3] = {fm_teacher ? 0.6 : 0.4, fm_teacher ? 0.2 : 0.4, 0.2};
  if (o.interaction_share > 0) {
    // The rest in the default ratio of the first-order and MLP terms.
    const double rest = (1 - o.interaction_share) / (share[0] + share[2]);
    share[0] *= rest;
    share[2] *= rest;
    share[1] = o.interaction_share;
  }
  double* scale[3] = {&d.scale_first_, &d.scale_fm_, &d.scale_mlp_};
  for (int i = 0; i < 3; ++i) {
    mean[i] /= n;
    const double var = sq[i] / n - mean[i] * mean[i];
    *scale[i] = var > 1e-30 ? o.logit_std * std::sqrt(share[i] / var) : 0.0;
  }
  std::vector<double> z(n);
  for (int r = 0; r < n; ++r) {
    z[r] =
        d.scale_first_ * raw[r].first_order + d.scale_fm_ * raw[r].fm + d.scale_mlp_ * raw[r].mlp;
  }
  double lo = -60, hi = 60;
  for (int iter = 0; iter < 80 && hi - lo > 1e-12; ++iter) {
    const double mid = 0.5 * (lo + hi);
    double mean_p = 0;
    for (double zr : z) mean_p += Sigmoid(mid + zr);
    (mean_p / n > o.positive_rate ? hi : lo) = mid;
  }
  d.bias_ = 0.5 * (lo + hi);
  return d;
}

void SyntheticData::FillRows(Rng* stream, RawRows* rows, int begin, int end) const {
  // Branch-free where the outcome is a coin flip (missingness, presence): every row draws every
  // field's value, missing or not, so mispredictions do not dominate the cost.
  Rng rng = *stream;  // a local copy whose state can live in registers
  const MissingTables& missing = Missing();
  const NumericTables& numeric = Numeric();
  const bool fill = options_.fill_missing;
  // The history's geometric length: floor(ln(u) / ln(m / (1 + m))) for u in (0, 1] has mean m.
  const double m = options_.history_mean_length;
  const double log_q = has_history() ? std::log(m / (1 + m)) : 0.0;
  const int item = options_.history_item_field;
  for (int r = begin; r < end; ++r) {
    const size_t base = static_cast<size_t>(r) * stride_;
    uint8_t* present = rows->present.data() + base;
    uint64_t* key = rows->key.data() + base;
    double* value = rows->value.data() + base;
    // Two 32-bit uniforms per draw decide the missing sources.
    uint64_t missing_fields = 0, bits = 0;
    for (int i = 0; i < kNumMissing; ++i) {
      if (i % 2 == 0) bits = rng.Next();
      const uint32_t u = static_cast<uint32_t>(i % 2 == 0 ? bits : bits >> 32);
      missing_fields |= missing.mask[i] & -static_cast<uint64_t>(u < missing.threshold[i]);
    }
    for (int f = 0; f < kNumNumeric; ++f) {
      const bool is_present = ((missing_fields >> f) & 1) == 0;
      const double x = numeric.Sample(f, rng.Next());
      present[f] = is_present || fill;
      key[f] = 0;
      value[f] = is_present ? x : 0.0;
    }
    for (int f = kNumNumeric; f < kFields; ++f) {
      const bool is_present = ((missing_fields >> f) & 1) == 0;
      const uint64_t k = DrawnKey(f - kNumNumeric, zipf_[f - kNumNumeric].Sample(&rng));
      present[f] = is_present || fill;
      key[f] = is_present ? k : fill ? kMissingKey : 0;
      value[f] = is_present || fill ? 1.0 : 0.0;
    }
    if (has_history()) {
      const double len = std::floor(std::log(1.0 - rng.UniformDouble()) / log_q);
      const int n = static_cast<int>(std::min(len, static_cast<double>(options_.history_max_length)));
      rows->StartList(r, kFields);
      for (int i = 0; i < n; ++i) {
        rows->AddToList(r, kFields, DrawnKey(item, zipf_[item].Sample(&rng)));
      }
    }
  }
  *stream = rng;
}

void SyntheticData::RawTerms(const RawRows& rows, int begin, int end, TeacherTerms* out) const {
  // Blocks of rows go through flat passes (ids, hashes, bytes -> floats, MLP) with the block's
  // scratch in L1/L2. GCC's auto-vectorizer makes a poor job of the 16-wide per-field and
  // per-input steps, so they are written with vector extensions (two AVX2 registers each).
  constexpr int kBlock = 32;
  alignas(64) uint64_t hashes[kBlock * kFields * 2];
  alignas(64) uint64_t drift_hashes[kBlock * kFields * 2];  // rotate_ only
  const BucketTable& buckets = Buckets();
  for (int b0 = begin; b0 < end; b0 += kBlock) {
    const int n = std::min(kBlock, end - b0);
    for (int r = 0; r < n; ++r) {
      const size_t base = static_cast<size_t>(b0 + r) * stride_;
      for (int f = 0; f < kFields; ++f) {
        // Branch-free on presence (a coin flip for many fields).
        const uint64_t id = f < kNumNumeric
                                ? static_cast<uint64_t>(Bucket(buckets, rows.value[base + f]))
                                : rows.key[base + f];
        const uint64_t keep = -static_cast<uint64_t>(rows.present[base + f] != 0);
        const uint64_t input = (id & keep) | (kMissingId & ~keep);
        hashes[(r * kFields + f) * 2] = input ^ salt_[f][0];
        hashes[(r * kFields + f) * 2 + 1] = input ^ salt_[f][1];
        drift_hashes[(r * kFields + f) * 2] = input ^ drift_salt_[f][0];
        drift_hashes[(r * kFields + f) * 2 + 1] = input ^ drift_salt_[f][1];
      }
    }
    for (int i = 0; i < n * kFields * 2; ++i) hashes[i] = Fmix64(hashes[i]);
    if (rotate_) {
      for (int i = 0; i < n * kFields * 2; ++i) drift_hashes[i] = Fmix64(drift_hashes[i]);
    }
    const int8_t* bytes = reinterpret_cast<const int8_t*>(hashes);
    const int8_t* drift_bytes = reinterpret_cast<const int8_t*>(drift_hashes);
    for (int r = 0; r < n; ++r) {
      V16 sum = {}, sum_sq = {};
      V16 params[kFields];
      for (int f = 0; f < kFields; ++f) {
        V16 p;
        BytesToFloats(&bytes[(r * kFields + f) * 16], &p);
        if (rotate_) {
          V16 q;
          BytesToFloats(&drift_bytes[(r * kFields + f) * 16], &q);
          p = p * rot_cos_ + q * rot_sin_;
        }
        p *= param_scale_[f];
        params[f] = p;
        sum += p;
        sum_sq += p * p;
      }
      if (has_history()) {  // the pooled history joins the first-order and FM sums
        V16 h;
        HistoryParams(rows, b0 + r, params[kNumeric + options_.history_item_field], &h);
        sum += h;
        sum_sq += h * h;
      }
      out[b0 - begin + r].first_order = sum[0];
      if (options_.interaction == TeacherInteraction::kFm) {
        float fm = 0;
        for (int d = 8; d < 16; ++d) fm += sum[d] * sum[d] - sum_sq[d];
        out[b0 - begin + r].fm = 0.5 * fm;
      } else {
        out[b0 - begin + r].fm = SecondOrder(params);
      }
      // The MLP's input is bytes 1..4 of every field; four accumulators hide the FMA latency.
      V16 h[kEmbDim] = {b1_};
      for (int f = 0; f < kFields; ++f) {
        for (int k = 0; k < kEmbDim; ++k) h[k] += params[f][1 + k] * w1_[f * kEmbDim + k];
      }
      const V16 hidden = (h[0] + h[1]) + (h[2] + h[3]);  // kEmbDim == 4
      float mlp = 0;
      for (int j = 0; j < kHidden; ++j) mlp += std::max(hidden[j], 0.f) * w2_[j];
      out[b0 - begin + r].mlp = mlp;
    }
  }
}

void SyntheticData::HistoryParams(const RawRows& rows, int r, const V16& candidate,
                                  V16* out) const {
  // The item field's parameters of each id (as RawTerms computes them), averaged.
  const int f = kNumeric + options_.history_item_field;
  const size_t cell = static_cast<size_t>(r) * stride_ + kFields;
  const uint32_t n = rows.ListSize(cell);
  V16 sum = {};
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t id = rows.list_key[rows.list_begin[cell] + i];
    uint64_t h[2] = {Fmix64(id ^ salt_[f][0]), Fmix64(id ^ salt_[f][1])};
    V16 p;
    BytesToFloats(reinterpret_cast<const int8_t*>(h), &p);
    if (rotate_) {
      uint64_t d[2] = {Fmix64(id ^ drift_salt_[f][0]), Fmix64(id ^ drift_salt_[f][1])};
      V16 q;
      BytesToFloats(reinterpret_cast<const int8_t*>(d), &q);
      p = p * rot_cos_ + q * rot_sin_;
    }
    if (options_.history_attention) {
      // w = 2 max(0, cos) over the FM dims 8..15 (the scale of p_c cancels).
      float dot = 0, pp = 0, cc = 0;
      for (int d = 8; d < 16; ++d) {
        dot += p[d] * candidate[d];
        pp += p[d] * p[d];
        cc += candidate[d] * candidate[d];
      }
      const float denom = std::sqrt(pp * cc);
      p *= denom > 0 ? 2.f * std::max(dot, 0.f) / denom : 0.f;
    }
    sum += p;
  }
  *out = n == 0 ? sum
                : sum * param_scale_[f] * static_cast<float>(options_.history_importance / n);
}

double SyntheticData::SecondOrder(const V16* params) const {
  // x = concat_f p_f, p_f = bytes 8..15 of field f's parameters.
  constexpr int D = kFields * kFmDim;
  float x[D];
  for (int f = 0; f < kFields; ++f) {
    for (int j = 0; j < kFmDim; ++j) x[f * kFmDim + j] = params[f][8 + j];
  }
  double term = 0;
  if (options_.interaction == TeacherInteraction::kCross) {
    for (int q = 0; q < kCrossRank; ++q) {
      const float* v = cross_v_.data() + q * D;
      const float* u = cross_u_.data() + q * D;
      float xv = 0, xu = 0;
      for (int i = 0; i < D; ++i) {
        xv += x[i] * v[i];
        xu += x[i] * u[i];
      }
      term += double{xv} * xu;
    }
  } else if (options_.interaction == TeacherInteraction::kCrossFull) {
    // x^T W x: y = x W row by row (vectorizes over j), then x . y.
    float y[D] = {};
    for (int i = 0; i < D; ++i) {
      const float* w = cross_v_.data() + static_cast<size_t>(i) * D;
      const float xi = x[i];
      for (int j = 0; j < D; ++j) y[j] += xi * w[j];
    }
    for (int j = 0; j < D; ++j) term += double{x[j]} * y[j];
  } else if (options_.interaction == TeacherInteraction::kCross3) {
    // z = x * (x V U); term = x . (z V2 U2) = sum_q (z . V2_q)(x . U2_q).
    float z[D] = {};
    for (int q = 0; q < kCrossRank; ++q) {
      const float* v = cross_v_.data() + q * D;
      const float* u = cross_u_.data() + q * D;
      float xv = 0;
      for (int i = 0; i < D; ++i) xv += x[i] * v[i];
      for (int i = 0; i < D; ++i) z[i] += xv * u[i];
    }
    for (int i = 0; i < D; ++i) z[i] *= x[i];
    for (int q = 0; q < kCrossRank; ++q) {
      const float* v = cross2_v_.data() + q * D;
      const float* u = cross2_u_.data() + q * D;
      float zv = 0, xu = 0;
      for (int i = 0; i < D; ++i) {
        zv += z[i] * v[i];
        xu += x[i] * u[i];
      }
      term += double{zv} * xu;
    }
  } else {
    for (int f = 0; f < kFields; ++f) {
      for (int g = f + 1; g < kFields; ++g) {
        float dot = 0;
        for (int j = 0; j < kFmDim; ++j) dot += x[f * kFmDim + j] * x[g * kFmDim + j];
        term += double{pair_weight_[f * kFields + g]} * dot;
      }
    }
  }
  return term;
}

TeacherTerms SyntheticData::Terms(const RawRows& rows, int r) const {
  TeacherTerms t;
  RawTerms(rows, r, r + 1, &t);
  return {scale_first_ * t.first_order, scale_fm_ * t.fm, scale_mlp_ * t.mlp};
}

double SyntheticData::Logit(const TeacherTerms& raw) const {
  return bias_ + scale_first_ * raw.first_order + scale_fm_ * raw.fm + scale_mlp_ * raw.mlp;
}

double SyntheticData::TeacherLogit(const RawRows& rows, int r) const {
  TeacherTerms t;
  RawTerms(rows, r, r + 1, &t);
  return Logit(t);
}

void SyntheticData::GenerateChunk(int64_t chunk, int num_rows, RawRows* rows,
                                  std::vector<float>* probs) const {
  PSTRAIN_CHECK(num_rows >= 0 && num_rows <= options_.chunk_rows) << num_rows;
  rows->Clear(stride_);
  rows->labels.resize(num_rows);
  rows->present.resize(static_cast<size_t>(num_rows) * stride_);
  rows->key.resize(static_cast<size_t>(num_rows) * stride_);
  rows->value.resize(static_cast<size_t>(num_rows) * stride_);
  probs->resize(num_rows);
  // The chunk's stream: every row's features, then every row's label.
  Rng rng(SplitMix64(SplitMix64(options_.seed) + static_cast<uint64_t>(chunk)));
  FillRows(&rng, rows, 0, num_rows);
  std::vector<TeacherTerms> raw(num_rows);
  RawTerms(*rows, 0, num_rows, raw.data());
  for (int r = 0; r < num_rows; ++r) {
    const double p = Sigmoid(Logit(raw[r]));
    (*probs)[r] = static_cast<float>(p);
    rows->labels[r] = rng.UniformDouble() < p ? 1.f : 0.f;
  }
}

absl::Status SyntheticData::Generate(int64_t num_rows, int threads, const Sink& sink) const {
  const int64_t chunk_rows = options_.chunk_rows;
  const int64_t chunks = (num_rows + chunk_rows - 1) / chunk_rows;
  auto rows_of = [&](int64_t c) {
    return static_cast<int>(std::min(chunk_rows, num_rows - c * chunk_rows));
  };
  if (threads <= 1 || chunks <= 1) {
    RawRows rows;
    std::vector<float> probs;
    for (int64_t c = 0; c < chunks; ++c) {
      GenerateChunk(c, rows_of(c), &rows, &probs);
      RETURN_IF_ERROR(sink(rows, probs));
    }
    return absl::OkStatus();
  }
  // A pipeline: worker w generates chunks w, w + threads, ... into a ring of 2 * threads slots
  // while this thread hands finished chunks to the sink in order, so writing overlaps generation.
  const int num_slots = 2 * threads;
  struct Slot {
    RawRows rows;
    std::vector<float> probs;
  };
  std::vector<Slot> slots(num_slots);
  // std::mutex rather than absl::Mutex: Debian's abseil is not built for ThreadSanitizer, which
  // then misreads absl::Condition and flags races that are not there.
  std::mutex mu;
  std::condition_variable changed;
  // Guarded by mu: the chunk in each slot (-1: none yet), the chunks handed to the sink, stop.
  std::vector<int64_t> ready(num_slots, -1);
  int64_t consumed = 0;
  bool stop = false;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (int64_t c = w; c < chunks; c += threads) {
        {
          // Slot c % num_slots is free once chunk c - num_slots went to the sink.
          std::unique_lock<std::mutex> lock(mu);
          changed.wait(lock, [&] { return stop || consumed > c - num_slots; });
          if (stop) return;
        }
        Slot& slot = slots[c % num_slots];
        GenerateChunk(c, rows_of(c), &slot.rows, &slot.probs);
        std::lock_guard<std::mutex> lock(mu);
        ready[c % num_slots] = c;
        changed.notify_all();
      }
    });
  }
  absl::Status status;
  for (int64_t c = 0; c < chunks && status.ok(); ++c) {
    {
      std::unique_lock<std::mutex> lock(mu);
      changed.wait(lock, [&] { return ready[c % num_slots] == c; });
    }
    const Slot& slot = slots[c % num_slots];
    status = sink(slot.rows, slot.probs);
    std::lock_guard<std::mutex> lock(mu);
    consumed = c + 1;
    if (!status.ok()) stop = true;
    changed.notify_all();
  }
  for (std::thread& t : workers) t.join();
  return status;
}

absl::StatusOr<DatagenResult> WriteSyntheticData(const SyntheticData& data,
                                                 const DatagenOutput& out) {
  if (out.rows < 0) return absl::InvalidArgumentError("datagen: rows must be >= 0");
  if (out.files < 1) return absl::InvalidArgumentError("datagen: files must be >= 1");
  if (out.dir.empty()) {
    return absl::InvalidArgumentError("datagen: an output directory is required");
  }
  if (out.format == LIBSVM && !data.options().fill_missing) {
    return absl::InvalidArgumentError(
        "datagen: libsvm cannot express a missing value: generate with fill_missing "
        "(pstrain datagen --format libsvm sets it)");
  }
  ASSIGN_OR_RETURN(const FeatureSpec spec, FeatureSpec::Create(data.Features()));
  RETURN_IF_ERROR(MakeDirs(out.dir));
  DatagenResult result;
  for (int i = 0; i < out.files; ++i) {
    result.files.push_back(
        absl::StrFormat("%s/part-%05d%s", out.dir, i, DataFormatExtension(out.format)));
  }
  AucAccumulator bayes;
  bayes.Reserve(static_cast<size_t>(out.rows));
  double prob_sum = 0;
  std::unique_ptr<RecordWriter> writer;
  int file = -1;
  int64_t file_end = 0, row = 0;  // global index of the next row and of the current file's end
  auto next_file = [&]() -> absl::Status {
    if (writer != nullptr) {
      RETURN_IF_ERROR(writer->Close());
      result.bytes += writer->bytes_written();
    }
    ++file;
    int64_t begin;
    Balance211(out.rows, out.files, file, &begin, &file_end);
    ASSIGN_OR_RETURN(writer, CreateRecordWriter(out.format, spec, result.files[file]));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(next_file());
  RETURN_IF_ERROR(
      data.Generate(out.rows, out.threads, [&](const RawRows& rows, absl::Span<const float> probs) {
        bayes.Add(probs, rows.labels);
        for (float p : probs) prob_sum += p;
        for (int begin = 0; begin < rows.size();) {
          while (row == file_end) RETURN_IF_ERROR(next_file());
          const int end = static_cast<int>(std::min<int64_t>(rows.size(), begin + file_end - row));
          RETURN_IF_ERROR(writer->Write(rows, begin, end));
          row += end - begin;
          begin = end;
        }
        return absl::OkStatus();
      }));
  // Files past the last row (more files than rows) are still written, empty.
  while (file + 1 < out.files) RETURN_IF_ERROR(next_file());
  RETURN_IF_ERROR(writer->Close());
  result.bytes += writer->bytes_written();
  ASSIGN_OR_RETURN(result.bayes_auc, bayes.Auc());
  ASSIGN_OR_RETURN(result.bayes_logloss, bayes.LogLoss());
  result.positive_rate = bayes.PositiveRate();
  result.mean_probability = out.rows > 0 ? prob_sum / out.rows : std::nan("");
  RETURN_IF_ERROR(
      WriteFileAtomic(out.dir + "/teacher.json", TeacherJson(data, out, result) + "\n"));
  return result;
}

FeatureConfig SyntheticData::Features() const {
  FeatureConfig c;  // the CRITEO preset
  if (has_history()) {
    FieldSpec* h = c.add_field();
    h->set_name(kHistoryName);
    h->set_share_rows_with(FieldName(kNumeric + options_.history_item_field));
    h->mutable_list()->set_combiner(MEAN);
    h->mutable_list()->set_max_length(options_.history_max_length);
  }
  return c;
}

std::string TeacherJson(const SyntheticData& data, const DatagenOutput& out,
                        const DatagenResult& result) {
  const DatagenOptions& o = data.options();
  std::string cards = "{";
  for (int c = 0; c < SyntheticData::kNumCategorical; ++c) {
    absl::StrAppend(&cards, c ? "," : "", "\"C", c + 1, "\":", data.cardinalities()[c]);
  }
  cards += "}";
  std::string files = "[";
  for (size_t i = 0; i < result.files.size(); ++i) {
    const size_t slash = result.files[i].rfind('/');
    absl::StrAppend(&files, i ? "," : "");
    JsonObject::Quote(result.files[i].substr(slash + 1), &files);
  }
  files += "]";
  JsonObject json;
  json.Add("generator", "pstrain datagen v1")
      .Add("rows", out.rows)
      .Add("format", DataFormatName(out.format))
      .AddRaw("files", files)
      .Add("seed", o.seed)
      .Add("teacher_seed", o.teacher_seed)
      .Add("drift", o.drift)
      .Add("day", o.day)
      .Add("bayes_auc", result.bayes_auc)
      .Add("bayes_logloss", result.bayes_logloss)
      .Add("positive_rate", result.positive_rate)
      .Add("mean_probability", result.mean_probability)
      .Add("target_positive_rate", o.positive_rate)
      .Add("logit_std", o.logit_std)
      .Add("zipf_exponent", o.zipf_exponent)
      .Add("max_cardinality", o.max_cardinality)
      .Add("chunk_rows", o.chunk_rows)
      .Add("calibration_rows", o.calibration_rows)
      .Add("fill_missing", o.fill_missing)
      .Add("bias", data.bias())
      .AddRaw("cardinalities", cards);
  // Only when used, so that teacher.json stays byte for byte what it was without it.
  if (o.id_churn > 0) json.Add("id_churn", o.id_churn);
  // Only when used, so that teacher.json stays byte for byte what it was without it.
  if (o.interaction != TeacherInteraction::kFm) {
    json.Add("interaction", TeacherInteractionName(o.interaction));
  }
  if (o.interaction_share > 0) json.Add("interaction_share", o.interaction_share);
  // Only when used, so that teacher.json stays byte for byte what it was without them.
  if (!o.high_cardinality_fields.empty()) {
    std::string fields = "[";
    for (size_t i = 0; i < o.high_cardinality_fields.size(); ++i) {
      absl::StrAppend(&fields, i ? "," : "", "\"C", o.high_cardinality_fields[i] + 1, "\"");
    }
    fields += "]";
    json.AddRaw("high_cardinality_fields", fields)
        .Add("high_cardinality", o.high_cardinality)
        .Add("high_cardinality_zipf_exponent", o.high_cardinality_zipf_exponent);
  }
  if (data.has_history()) {
    json.Add("history_mean_length", o.history_mean_length)
        .Add("history_max_length", o.history_max_length)
        .Add("history_item_field", SyntheticData::FieldName(kNumeric + o.history_item_field))
        .Add("history_importance", o.history_importance);
    if (o.history_attention) json.Add("history_pooling", "attention");
  }
  return json.str();
}

}  // namespace pstrain
