#include "worker/tools/datagen.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/metrics.h"

namespace pstrain {
namespace {

constexpr int kF = SyntheticData::kNumFields;
constexpr int kN = SyntheticData::kNumNumeric;

SyntheticData Make(const DatagenOptions& o) {
  auto d = SyntheticData::Create(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return std::move(d).value();
}

struct All {
  RawRows rows;
  std::vector<float> probs;
};

All GenerateAll(const SyntheticData& d, int64_t n, int threads) {
  All all;
  all.rows.Clear(kF);
  absl::Status s = d.Generate(n, threads, [&](const RawRows& r, absl::Span<const float> p) {
    all.rows.labels.insert(all.rows.labels.end(), r.labels.begin(), r.labels.end());
    all.rows.present.insert(all.rows.present.end(), r.present.begin(), r.present.end());
    all.rows.key.insert(all.rows.key.end(), r.key.begin(), r.key.end());
    all.rows.value.insert(all.rows.value.end(), r.value.begin(), r.value.end());
    all.probs.insert(all.probs.end(), p.begin(), p.end());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

// One shared large sample for the statistical tests.
const All& Sample() {
  static const All* all = [] {
    DatagenOptions o;
    o.seed = 11;
    return new All(GenerateAll(Make(o), 200000, 2));
  }();
  return *all;
}

TEST(DatagenTest, LayoutIsTheCriteoPreset) {
  auto spec = FeatureSpec::Create(FeatureConfig());
  ASSERT_TRUE(spec.ok());
  ASSERT_EQ(spec->num_fields(), kF);
  for (int f = 0; f < kF; ++f) {
    EXPECT_EQ(spec->field(f).name, SyntheticData::FieldName(f));
    EXPECT_EQ(spec->field(f).kind == NUMERIC, f < kN);
  }
  EXPECT_EQ(SyntheticData::CriteoCardinalities().size(), 26u);
  EXPECT_EQ(SyntheticData::CriteoCardinalities()[0], 1460u);
  EXPECT_EQ(SyntheticData::CriteoCardinalities()[25], 142572u);
}

TEST(DatagenTest, DeterministicAndIndependentOfThreads) {
  DatagenOptions o;
  o.seed = 5;
  o.chunk_rows = 1000;
  const SyntheticData d = Make(o);
  const All a = GenerateAll(d, 7500, 1), b = GenerateAll(d, 7500, 2), c = GenerateAll(d, 7500, 3);
  ASSERT_EQ(a.rows.size(), 7500);
  for (const All* x : {&b, &c}) {
    EXPECT_EQ(a.rows.labels, x->rows.labels);
    EXPECT_EQ(a.rows.present, x->rows.present);
    EXPECT_EQ(a.rows.key, x->rows.key);
    EXPECT_EQ(a.rows.value, x->rows.value);
    EXPECT_EQ(a.probs, x->probs);
  }
  // A fresh generator with the same options gives the same rows; fewer rows are a prefix.
  const All again = GenerateAll(Make(o), 2500, 2);
  EXPECT_TRUE(std::equal(again.rows.key.begin(), again.rows.key.end(), a.rows.key.begin()));
  EXPECT_TRUE(std::equal(again.probs.begin(), again.probs.end(), a.probs.begin()));
  // Another seed gives other rows.
  o.seed = 6;
  const All other = GenerateAll(Make(o), 7500, 1);
  EXPECT_NE(other.rows.key, a.rows.key);
}

TEST(DatagenTest, GenerateStopsAtTheFirstSinkError) {
  DatagenOptions o;
  o.chunk_rows = 100;
  const SyntheticData d = Make(o);
  for (int threads : {1, 2, 4}) {
    int calls = 0;
    const absl::Status s = d.Generate(5000, threads, [&](const RawRows&, absl::Span<const float>) {
      return ++calls == 3 ? absl::DataLossError("disk full") : absl::OkStatus();
    });
    EXPECT_EQ(s, absl::DataLossError("disk full"));
    EXPECT_EQ(calls, 3);
  }
  // More threads than chunks, and a partial last chunk.
  const All few = GenerateAll(d, 250, 8), one = GenerateAll(d, 250, 1);
  EXPECT_EQ(few.rows.key, one.rows.key);
  EXPECT_EQ(few.probs, one.probs);
}

TEST(DatagenTest, TeacherIsAFunctionOfTheVisibleRowAndTeacherSeed) {
  DatagenOptions o;
  o.seed = 1;
  const SyntheticData train = Make(o);
  o.seed = 2;
  const SyntheticData test = Make(o);
  EXPECT_EQ(train.bias(), test.bias());
  const All rows = GenerateAll(test, 3000, 1);
  for (int r = 0; r < rows.rows.size(); ++r) {
    const double p = 1 / (1 + std::exp(-train.TeacherLogit(rows.rows, r)));
    ASSERT_EQ(static_cast<float>(p), rows.probs[r]) << r;
  }
  o.teacher_seed = 9;
  const SyntheticData other_teacher = Make(o);
  EXPECT_NE(other_teacher.bias(), test.bias());
  EXPECT_NE(other_teacher.TeacherLogit(rows.rows, 0), test.TeacherLogit(rows.rows, 0));
}

// Drift: day 0 (or drift 0) is the plain teacher exactly; later days' teachers move away from it
// step by step (their logits on the same rows correlate less and less with day 0's), and each
// day's teacher is calibrated on its own.
TEST(DatagenTest, DriftMovesTheTeacherBySetAmountsPerDay) {
  DatagenOptions o;
  const SyntheticData plain = Make(o);
  const All rows = GenerateAll(plain, 3000, 1);
  auto logits = [&](double drift, int day) {
    DatagenOptions d = o;
    d.drift = drift;
    d.day = day;
    const SyntheticData t = Make(d);
    std::vector<double> out;
    for (int r = 0; r < rows.rows.size(); ++r) out.push_back(t.TeacherLogit(rows.rows, r));
    return out;
  };
  auto corr = [](const std::vector<double>& a, const std::vector<double>& b) {
    double ma = 0, mb = 0;
    for (size_t i = 0; i < a.size(); ++i) ma += a[i], mb += b[i];
    ma /= a.size();
    mb /= b.size();
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      sab += (a[i] - ma) * (b[i] - mb);
      saa += (a[i] - ma) * (a[i] - ma);
      sbb += (b[i] - mb) * (b[i] - mb);
    }
    return sab / std::sqrt(saa * sbb);
  };
  const std::vector<double> day0 = logits(0, 0);
  EXPECT_EQ(logits(0.3, 0), day0);
  EXPECT_EQ(logits(0, 4), day0);
  const double c1 = corr(day0, logits(0.1, 1)), c2 = corr(day0, logits(0.1, 2)),
               c5 = corr(day0, logits(0.1, 5));
  EXPECT_LT(c1, 0.99);  // it moved
  EXPECT_GT(c1, 0.8);   // by a tenth of the parameters' variance, not to another teacher
  EXPECT_LT(c2, c1);
  EXPECT_LT(c5, c2);
  // A whole quarter turn (drift 1, day 1) is the independent second teacher.
  EXPECT_LT(std::fabs(corr(day0, logits(1, 1))), 0.2);
  DatagenOptions bad = o;
  bad.drift = 1.5;
  EXPECT_EQ(SyntheticData::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.drift = 0.1;
  bad.day = -1;
  EXPECT_EQ(SyntheticData::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DatagenTest, PositiveRateIsCalibrated) {
  const All& s = Sample();
  double labels = 0, probs = 0;
  for (int r = 0; r < s.rows.size(); ++r) {
    labels += s.rows.labels[r];
    probs += s.probs[r];
  }
  EXPECT_NEAR(labels / s.rows.size(), 0.25, 0.01);
  EXPECT_NEAR(probs / s.rows.size(), 0.25, 0.01);
  // Another target.
  DatagenOptions o;
  o.positive_rate = 0.03;  // Criteo 1TB
  const All small = GenerateAll(Make(o), 50000, 2);
  double pos = 0;
  for (float l : small.rows.labels) pos += l;
  EXPECT_NEAR(pos / small.rows.size(), 0.03, 0.006);
}

TEST(DatagenTest, MissingRatesFollowCriteo) {
  const All& s = Sample();
  const int n = s.rows.size();
  std::vector<double> missing(kF, 0);
  for (int r = 0; r < n; ++r) {
    for (int f = 0; f < kF; ++f) missing[f] += s.rows.present[r * kF + f] == 0;
  }
  for (double& m : missing) m /= n;
  auto field = [](const char* name) {
    for (int f = 0; f < kF; ++f) {
      if (SyntheticData::FieldName(f) == name) return f;
    }
    return -1;
  };
  const std::map<std::string, double> expected = {
      {"I1", 0.454}, {"I2", 0},      {"I3", 0.215},  {"I4", 0.217},  {"I5", 0.026},  {"I6", 0.223},
      {"I7", 0.043}, {"I8", 0.0005}, {"I10", 0.454}, {"I12", 0.765}, {"I13", 0.217}, {"C1", 0},
      {"C3", 0.034}, {"C6", 0.121},  {"C19", 0.44},  {"C22", 0.763}, {"C26", 0.44}};
  for (const auto& [name, rate] : expected) {
    EXPECT_NEAR(missing[field(name.c_str())], rate, 0.006) << name;
  }
  // Fields of a group are missing together, in every row.
  for (int r = 0; r < n; ++r) {
    const uint8_t* p = &s.rows.present[r * kF];
    ASSERT_EQ(p[field("I1")], p[field("I10")]);
    ASSERT_EQ(p[field("C19")], p[field("C26")]);
    ASSERT_EQ(p[field("C3")], p[field("C24")]);
  }
  // I3 is missing independently of I4 (Criteo: 20% / 20% / 11% jointly).
  double both = 0;
  for (int r = 0; r < n; ++r) {
    both += !s.rows.present[r * kF + field("I3")] && !s.rows.present[r * kF + field("I4")];
  }
  EXPECT_NEAR(both / n, 0.215 * 0.217, 0.005);
}

TEST(DatagenTest, MissingFieldsAreZeroAndPresentOnesAreWellFormed) {
  const All& s = Sample();
  bool negative_i2 = false;
  for (int r = 0; r < 20000; ++r) {
    for (int f = 0; f < kF; ++f) {
      const size_t i = static_cast<size_t>(r) * kF + f;
      if (!s.rows.present[i]) {
        ASSERT_EQ(s.rows.key[i], 0u);
        ASSERT_EQ(s.rows.value[i], 0.0);
      } else if (f < kN) {
        ASSERT_EQ(s.rows.key[i], 0u);
        ASSERT_EQ(s.rows.value[i], std::nearbyint(s.rows.value[i]));  // integer counts
        if (f != 1) {
          ASSERT_GE(s.rows.value[i], 0) << SyntheticData::FieldName(f);
        }
        ASSERT_GE(s.rows.value[i], -3);
        negative_i2 |= f == 1 && s.rows.value[i] < 0;
      } else {
        ASSERT_LT(s.rows.key[i], uint64_t{1} << 32);
        ASSERT_EQ(s.rows.value[i], 1.0);
      }
    }
  }
  EXPECT_TRUE(negative_i2);
}

TEST(DatagenTest, NumericMediansAreCriteos) {
  // Medians of the present values in Kaggle's first 10k rows.
  const double kaggle_median[kN] = {1, 3, 7, 4, 2469, 40, 3, 7, 41, 0, 1, 0, 5};
  const All& s = Sample();
  for (int f = 0; f < kN; ++f) {
    std::vector<double> v;
    for (int r = 0; r < s.rows.size(); ++r) {
      if (s.rows.present[r * kF + f]) v.push_back(s.rows.value[r * kF + f]);
    }
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const double m = v[v.size() / 2];
    EXPECT_NEAR(m, kaggle_median[f], 0.15 * kaggle_median[f] + 1) << SyntheticData::FieldName(f);
  }
}

TEST(DatagenTest, CardinalityCapsHonouredAndKeysDistinctPerRank) {
  DatagenOptions o;
  o.max_cardinality = 50;
  const SyntheticData d = Make(o);
  const All a = GenerateAll(d, 30000, 2);
  for (int c = 0; c < SyntheticData::kNumCategorical; ++c) {
    const uint64_t cap = std::min<uint64_t>(50, SyntheticData::CriteoCardinalities()[c]);
    EXPECT_EQ(d.cardinalities()[c], cap);
    std::set<uint64_t> keys, all_keys;
    for (int r = 0; r < a.rows.size(); ++r) {
      const size_t i = static_cast<size_t>(r) * kF + kN + c;
      if (a.rows.present[i]) keys.insert(a.rows.key[i]);
    }
    for (uint64_t rank = 1; rank <= cap; ++rank) all_keys.insert(d.RankToKey(c, rank));
    EXPECT_EQ(all_keys.size(), cap) << "C" << c + 1;  // the rank -> key map is injective
    // Every key comes from a rank within the cap, and with 30k rows every rank is seen.
    EXPECT_EQ(keys, all_keys) << "C" << c + 1;
  }
}

TEST(DatagenTest, PopularityIsZipfLike) {
  const All& s = Sample();
  const SyntheticData d = Make(DatagenOptions());
  for (int c : {2, 9, 25}) {  // C3 (capped at 100000), C10 (93145), C26 (100000)
    std::map<uint64_t, int> count;
    int present = 0;
    for (int r = 0; r < s.rows.size(); ++r) {
      const size_t i = static_cast<size_t>(r) * kF + kN + c;
      if (s.rows.present[i]) {
        ++count[s.rows.key[i]];
        ++present;
      }
    }
    // Frequencies fall with rank like r^-1.1: rank 1 about 2^1.1 times rank 2, 10^1.1 rank 10.
    const double f1 = count[d.RankToKey(c, 1)], f2 = count[d.RankToKey(c, 2)],
                 f10 = count[d.RankToKey(c, 10)];
    EXPECT_NEAR(f1 / f2, std::pow(2, 1.1), 0.25) << c;
    EXPECT_NEAR(f1 / f10, std::pow(10, 1.1), 2.5) << c;
    // The top 1% of ids carry most of the mass, the bottom half very little.
    std::vector<int> freq;
    for (const auto& [k, v] : count) freq.push_back(v);
    std::sort(freq.rbegin(), freq.rend());
    const uint64_t n = d.cardinalities()[c];
    double head = 0;
    for (size_t i = 0; i < std::min<size_t>(freq.size(), n / 100); ++i) head += freq[i];
    EXPECT_GT(head / present, 0.5) << c;
    double tail = 0;
    for (uint64_t rank = n / 2; rank <= n; ++rank) {
      auto it = count.find(d.RankToKey(c, rank));
      if (it != count.end()) tail += it->second;
    }
    EXPECT_LT(tail / present, 0.05) << c;
  }
}

// Chi-square-like check of a sampler against the exact law, rank by rank (ranks > 40 pooled).
void CheckZipfLaw(uint64_t n, double s, ZipfSampler::Method method) {
  const ZipfSampler z(n, s, method);
  Rng rng(42);
  const int draws = 400000;
  const uint64_t shown = std::min<uint64_t>(n, 40);
  std::vector<double> count(shown + 1, 0);
  for (int i = 0; i < draws; ++i) {
    const uint64_t r = z.Sample(&rng);
    ASSERT_GE(r, 1u);
    ASSERT_LE(r, n);
    ++count[std::min(r, shown + 1) - 1];  // ranks past `shown` share the last slot
  }
  double total = 0;
  for (uint64_t k = 1; k <= n; ++k) total += std::pow(static_cast<double>(k), -s);
  double pooled = 1;
  for (uint64_t k = 1; k <= shown; ++k) {
    const double p = std::pow(static_cast<double>(k), -s) / total;
    pooled -= p;
    const double sd = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(count[k - 1], draws * p, 5 * sd + 1) << "rank " << k << " n=" << n << " s=" << s;
  }
  if (n > shown) {
    const double sd = std::sqrt(draws * pooled * (1 - pooled));
    EXPECT_NEAR(count[shown], draws * pooled, 5 * sd + 1) << "tail n=" << n;
  }
}

TEST(ZipfSamplerTest, BothMethodsFollowTheExactLaw) {
  for (auto m : {ZipfSampler::Method::kAlias, ZipfSampler::Method::kRejectionInversion}) {
    CheckZipfLaw(1, 1.1, m);
    CheckZipfLaw(3, 1.1, m);
    CheckZipfLaw(50, 1.1, m);
    CheckZipfLaw(100000, 1.1, m);
    CheckZipfLaw(1000, 0.7, m);
    CheckZipfLaw(1000, 1.0, m);
    CheckZipfLaw(200, 2.5, m);
    CheckZipfLaw(1000, 0.5, m);  // the high-cardinality fields' default exponent
  }
}

// Distinct present keys of categorical field c in rows.
std::set<uint64_t> DistinctKeys(const RawRows& rows, int c) {
  std::set<uint64_t> keys;
  for (int r = 0; r < rows.size(); ++r) {
    const size_t i = static_cast<size_t>(r) * kF + kN + c;
    if (rows.present[i]) keys.insert(rows.key[i]);
  }
  return keys;
}

DatagenOptions HighCardinality() {
  DatagenOptions o;
  o.seed = 3;
  o.chunk_rows = 1000;
  o.high_cardinality_fields = {8, 2};  // C9 (3 values in Criteo) and C3 (10,131,227)
  o.high_cardinality = 500000000;
  return o;
}

TEST(DatagenTest, HighCardinalityFieldsHaveMoreDistinctIdsThanAnyCap) {
  const SyntheticData d = Make(HighCardinality());
  EXPECT_EQ(d.cardinalities()[8], 500000000u);
  EXPECT_EQ(d.cardinalities()[2], 500000000u);
  EXPECT_EQ(d.cardinalities()[0], 1460u);  // the other fields keep their caps
  EXPECT_EQ(d.cardinalities()[3], 100000u);
  const int n = 20000;
  const All a = GenerateAll(d, n, 2);
  // C9 alone: never missing, so n draws; from 5e8 ids with exponent 0.5 nearly all are new
  // (the most popular id has probability ~2e-5): far beyond Criteo's 3 and the 100k cap.
  const std::set<uint64_t> c9 = DistinctKeys(a.rows, 8);
  EXPECT_GT(c9.size(), 0.97 * n);
  EXPECT_LE(c9.size(), static_cast<size_t>(n));
  // C3 is missing in ~3.4% of rows.
  EXPECT_GT(DistinctKeys(a.rows, 2).size(), 0.93 * n);
  // Keys stay 32-bit and the teacher takes them: finite probabilities, a realistic label rate.
  double prob_sum = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_LT(a.rows.key[static_cast<size_t>(r) * kF + kN + 8], uint64_t{1} << 32);
    ASSERT_TRUE(std::isfinite(a.probs[r])) << r;
    prob_sum += a.probs[r];
  }
  EXPECT_NEAR(prob_sum / n, 0.25, 0.03);
  // The ordinary fields are still Zipf(1.1) over their caps: C1's 1460 values nearly all seen.
  EXPECT_GT(DistinctKeys(a.rows, 0).size(), 1000u);
  EXPECT_LE(DistinctKeys(a.rows, 0).size(), 1460u);
}

TEST(DatagenTest, HighCardinalityDataAreDeterministicAndIndependentOfThreads) {
  const SyntheticData d = Make(HighCardinality()), again = Make(HighCardinality());
  const All a = GenerateAll(d, 5500, 1), b = GenerateAll(again, 5500, 3);
  EXPECT_EQ(a.rows.key, b.rows.key);
  EXPECT_EQ(a.rows.labels, b.rows.labels);
  EXPECT_EQ(a.probs, b.probs);
  // Another seed, the same teacher: other ids, the same calibrated bias.
  DatagenOptions o = HighCardinality();
  o.seed = 4;
  const SyntheticData other = Make(o);
  EXPECT_EQ(other.bias(), d.bias());
  const All c = GenerateAll(other, 5500, 1);
  EXPECT_NE(a.rows.key, c.rows.key);
}

// Without the option, the data are those of main before it existed: golden values of seed 1's
// first chunk (from main's `pstrain datagen --rows 4096` before this option), so recorded
// results made with the old flags stay reproducible.
TEST(DatagenTest, DefaultDataAreUnchangedByTheHighCardinalityOption) {
  const SyntheticData d = Make(DatagenOptions());
  RawRows rows;
  std::vector<float> probs;
  d.GenerateChunk(0, 4096, &rows, &probs);
  uint64_t key_sum = 0;
  double label_sum = 0;
  for (uint64_t k : rows.key) key_sum += k;
  for (float l : rows.labels) label_sum += l;
  EXPECT_EQ(key_sum, uint64_t{210903861072060});
  EXPECT_EQ(label_sum, 1034.0);
  EXPECT_EQ(rows.key[kN + 2], uint64_t{0x709768a4});  // row 0's C3
}

TEST(DatagenTest, ParsesCategoricalFieldNames) {
  auto fields = ParseCategoricalFields("C3,C26,C1");
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(*fields, (std::vector<int>{2, 25, 0}));
  EXPECT_TRUE(ParseCategoricalFields("")->empty());
  for (const char* bad : {"C0", "C27", "I3", "C3,x", "C03", "C3x", "3"}) {
    auto parsed = ParseCategoricalFields(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(std::string(ParseCategoricalFields("C3,C27").status().message()).find("'C27'"),
            std::string::npos);
}

TEST(DatagenTest, RejectsBadHighCardinalityOptions) {
  auto code = [](const DatagenOptions& o) { return SyntheticData::Create(o).status().code(); };
  DatagenOptions o = HighCardinality();
  EXPECT_EQ(code(o), absl::StatusCode::kOk);
  o.high_cardinality = (uint64_t{1} << 32) + 1;  // the 32-bit keys cannot hold it
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.high_cardinality = uint64_t{1} << 32;
  EXPECT_EQ(code(o), absl::StatusCode::kOk);
  o.high_cardinality = 0;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HighCardinality();
  o.high_cardinality_fields = {2, 2};
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.high_cardinality_fields = {26};
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.high_cardinality_fields = {-1};
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HighCardinality();
  o.high_cardinality_zipf_exponent = 0;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = DatagenOptions();
  o.high_cardinality = 1000;  // no fields to take it
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
}

TEST(DatagenTest, BayesAucIsRealisticAndBeatsWeakerPredictors) {
  const All& s = Sample();
  const SyntheticData d = Make(DatagenOptions());
  const double bayes = ComputeAuc(s.probs, s.rows.labels).value();
  const double logloss = ComputeLogLoss(s.probs, s.rows.labels).value();
  std::vector<float> first(s.rows.size()), first_fm(s.rows.size()), constant(s.rows.size(), 0.25f);
  for (int r = 0; r < s.rows.size(); ++r) {
    const TeacherTerms t = d.Terms(s.rows, r);
    first[r] = static_cast<float>(t.first_order);
    first_fm[r] = static_cast<float>(t.first_order + t.fm);
  }
  const double auc_first = ComputeAuc(first, s.rows.labels).value();
  const double auc_first_fm = ComputeAuc(first_fm, s.rows.labels).value();
  std::printf("bayes auc %.4f logloss %.4f | first-order auc %.4f | first+fm auc %.4f\n", bayes,
              logloss, auc_first, auc_first_fm);
  EXPECT_GT(bayes, 0.77);
  EXPECT_LT(bayes, 0.83);
  EXPECT_LT(logloss, ComputeLogLoss(constant, s.rows.labels).value() - 0.05);
  EXPECT_LT(auc_first, bayes - 0.02);
  EXPECT_LT(auc_first_fm, bayes - 0.005);
  EXPECT_GT(auc_first, 0.65);  // the weak predictor is still informative
}

TEST(DatagenTest, LogitStdControlsDifficulty) {
  DatagenOptions o;
  o.logit_std = 0.8;
  const All easy_less = GenerateAll(Make(o), 50000, 2);
  o.logit_std = 2.5;
  const All more = GenerateAll(Make(o), 50000, 2);
  EXPECT_LT(ComputeAuc(easy_less.probs, easy_less.rows.labels).value() + 0.05,
            ComputeAuc(more.probs, more.rows.labels).value());
}

TEST(DatagenTest, FillMissingKeepsEveryFieldPresent) {
  DatagenOptions o;
  o.fill_missing = true;
  const SyntheticData d = Make(o);
  const All a = GenerateAll(d, 20000, 2);
  int filled_c22 = 0, zero_i12 = 0;
  for (int r = 0; r < a.rows.size(); ++r) {
    for (int f = 0; f < kF; ++f) ASSERT_EQ(a.rows.present[r * kF + f], 1);
    filled_c22 += a.rows.key[r * kF + kN + 21] == SyntheticData::kMissingKey;
    zero_i12 += a.rows.value[r * kF + 11] == 0;
    ASSERT_EQ(static_cast<float>(1 / (1 + std::exp(-d.TeacherLogit(a.rows, r)))), a.probs[r]);
  }
  EXPECT_NEAR(filled_c22 / 20000.0, 0.763, 0.015);  // C22's missing rate
  EXPECT_GT(zero_i12 / 20000.0, 0.765);             // I12's missing rate plus its real zeros
  EXPECT_GT(ComputeAuc(a.probs, a.rows.labels).value(), 0.77);
}

TEST(DatagenTest, RejectsBadOptions) {
  DatagenOptions o;
  o.positive_rate = 1.5;
  EXPECT_EQ(SyntheticData::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = DatagenOptions();
  o.max_cardinality = 0;
  EXPECT_EQ(SyntheticData::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = DatagenOptions();
  o.zipf_exponent = -1;
  EXPECT_EQ(SyntheticData::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = DatagenOptions();
  o.chunk_rows = 0;
  EXPECT_EQ(SyntheticData::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// The cross and dot teachers (DatagenOptions::interaction): the same rows as the FM teacher, other
// labels; the interaction term has its calibrated share (40%) of the logit's variance; the
// teacher is still a function of the visible row; bad names are refused.
TEST(DatagenInteractionTest, CrossAndDotTeachersReplaceTheFmTerm) {
  DatagenOptions o;
  const SyntheticData fm = Make(o);
  RawRows fm_rows;
  std::vector<float> fm_probs;
  fm.GenerateChunk(0, 4096, &fm_rows, &fm_probs);
  for (TeacherInteraction t : {TeacherInteraction::kCross, TeacherInteraction::kDot,
                               TeacherInteraction::kCross3, TeacherInteraction::kCrossFull}) {
    SCOPED_TRACE(TeacherInteractionName(t));
    o.interaction = t;
    const SyntheticData d = Make(o);
    RawRows rows;
    std::vector<float> probs;
    d.GenerateChunk(0, 4096, &rows, &probs);
    EXPECT_EQ(rows.key, fm_rows.key);
    EXPECT_EQ(rows.value, fm_rows.value);
    EXPECT_NE(probs, fm_probs);
    double mean[3] = {0, 0, 0}, sq[3] = {0, 0, 0}, fm_cov = 0, fm_sq = 0;
    for (int r = 0; r < rows.size(); ++r) {
      ASSERT_EQ(static_cast<float>(1 / (1 + std::exp(-d.TeacherLogit(rows, r)))), probs[r]);
      const TeacherTerms terms = d.Terms(rows, r);
      const double v[3] = {terms.first_order, terms.fm, terms.mlp};
      for (int i = 0; i < 3; ++i) {
        mean[i] += v[i];
        sq[i] += v[i] * v[i];
      }
      const double f = fm.Terms(fm_rows, r).fm;
      fm_cov += f * terms.fm;
      fm_sq += f * f;
    }
    const int n = rows.size();
    double var[3];
    for (int i = 0; i < 3; ++i) var[i] = sq[i] / n - (mean[i] / n) * (mean[i] / n);
    // Calibrated on other rows: the shares are 40/40/20 up to sampling error.
    EXPECT_NEAR(var[1] / (var[0] + var[1] + var[2]), 0.4, 0.08);
    EXPECT_NEAR(var[0] / (var[0] + var[1] + var[2]), 0.4, 0.08);
    // Not the FM term under another name: little correlation with it.
    EXPECT_LT(std::fabs(fm_cov) / std::sqrt(fm_sq * sq[1]), 0.5);
    double positives = 0;
    for (float l : rows.labels) positives += l;
    EXPECT_NEAR(positives / n, 0.25, 0.03);
  }
  EXPECT_EQ(ParseTeacherInteraction("cross").value(), TeacherInteraction::kCross);
  EXPECT_EQ(ParseTeacherInteraction("dot").value(), TeacherInteraction::kDot);
  EXPECT_EQ(ParseTeacherInteraction("fm").value(), TeacherInteraction::kFm);
  EXPECT_EQ(ParseTeacherInteraction("cross3").value(), TeacherInteraction::kCross3);
  EXPECT_EQ(ParseTeacherInteraction("cross_full").value(), TeacherInteraction::kCrossFull);
  EXPECT_FALSE(ParseTeacherInteraction("din").ok());
}

// interaction_share gives the interaction term that share of the logit's variance and the
// first-order and MLP terms the rest in their default ratio (2:1); out of [0, 1) is refused
// naming the option. The full-rank cross term is not the low-rank one's.
TEST(DatagenInteractionTest, InteractionShareSetsTheTermsVariance) {
  DatagenOptions o;
  o.interaction = TeacherInteraction::kCrossFull;
  o.interaction_share = 0.7;
  const SyntheticData d = Make(o);
  RawRows rows;
  std::vector<float> probs;
  d.GenerateChunk(0, 4096, &rows, &probs);
  double mean[3] = {0, 0, 0}, sq[3] = {0, 0, 0};
  for (int r = 0; r < rows.size(); ++r) {
    const TeacherTerms terms = d.Terms(rows, r);
    const double v[3] = {terms.first_order, terms.fm, terms.mlp};
    for (int i = 0; i < 3; ++i) {
      mean[i] += v[i];
      sq[i] += v[i] * v[i];
    }
  }
  const int n = rows.size();
  double var[3];
  for (int i = 0; i < 3; ++i) var[i] = sq[i] / n - (mean[i] / n) * (mean[i] / n);
  const double total = var[0] + var[1] + var[2];
  EXPECT_NEAR(var[1] / total, 0.7, 0.08);
  EXPECT_NEAR(var[0] / total, 0.2, 0.06);
  EXPECT_NEAR(var[2] / total, 0.1, 0.04);
  // The low-rank cross teacher's term on the same rows: nearly uncorrelated.
  o.interaction = TeacherInteraction::kCross;
  const SyntheticData low = Make(o);
  double cov = 0, sa = 0, sb = 0;
  for (int r = 0; r < n; ++r) {
    const double a = d.Terms(rows, r).fm, b = low.Terms(rows, r).fm;
    cov += a * b;
    sa += a * a;
    sb += b * b;
  }
  EXPECT_LT(std::fabs(cov) / std::sqrt(sa * sb), 0.3);
  for (double bad : {-0.1, 1.0, std::nan("")}) {
    o.interaction_share = bad;
    const absl::StatusOr<SyntheticData> refused = SyntheticData::Create(o);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("interaction_share"), std::string::npos);
  }
}

// Adding the cross3 teacher left the cross and dot teachers' labels as they were (goldens from
// before it existed), and cross3's interaction term is not the cross teacher's (the third-order
// term of two cross layers is nearly uncorrelated with the one layer's second-order term).
TEST(DatagenInteractionTest, CrossThreeIsANewTermAndLeavesTheOthersUnchanged) {
  DatagenOptions o;
  RawRows rows;
  std::vector<float> probs;
  double sums[3] = {0, 0, 0};
  std::vector<double> terms[2];
  int i = 0;
  for (TeacherInteraction t : {TeacherInteraction::kCross, TeacherInteraction::kDot,
                               TeacherInteraction::kCross3}) {
    o.interaction = t;
    const SyntheticData d = Make(o);
    d.GenerateChunk(0, 4096, &rows, &probs);
    for (float l : rows.labels) sums[i] += l;
    if (t != TeacherInteraction::kDot) {
      for (int r = 0; r < rows.size(); ++r) terms[i / 2].push_back(d.Terms(rows, r).fm);
    }
    ++i;
  }
  // Goldens of the cross and dot teachers from before kCross3 existed.
  EXPECT_EQ(sums[0], 976.0);
  EXPECT_EQ(sums[1], 1011.0);
  EXPECT_GT(sums[2], 0);
  double cov = 0, sa = 0, sb = 0;
  for (size_t r = 0; r < terms[0].size(); ++r) {
    cov += terms[0][r] * terms[1][r];
    sa += terms[0][r] * terms[0][r];
    sb += terms[1][r] * terms[1][r];
  }
  EXPECT_LT(std::fabs(cov) / std::sqrt(sa * sb), 0.3);
}

// An explicit kFm is the default teacher, bit for bit (the golden of
// DefaultDataAreUnchangedByTheHighCardinalityOption, and every probability).
TEST(DatagenInteractionTest, TheFmTeacherIsUnchanged) {
  DatagenOptions o;
  o.interaction = TeacherInteraction::kFm;
  RawRows rows;
  std::vector<float> probs, default_probs;
  Make(o).GenerateChunk(0, 4096, &rows, &probs);
  double label_sum = 0;
  for (float l : rows.labels) label_sum += l;
  EXPECT_EQ(label_sum, 1034.0);
  Make(DatagenOptions()).GenerateChunk(0, 4096, &rows, &default_probs);
  EXPECT_EQ(probs, default_probs);
}

}  // namespace
}  // namespace pstrain
