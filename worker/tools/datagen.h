// Criteo-shaped synthetic data whose labels come from a planted teacher model, so that a
// trainer's AUC can be compared with the best achievable (Bayes-optimal) AUC.
//
// Rows have the layout of FeatureSpec's CRITEO preset: field 0..12 are the numeric fields I1..I13,
// fields 13..38 the categorical fields C1..C26 (RawRows, worker/data/batch.h).
//
// Features (all fields independent of each other, except for missingness):
//   - Categorical field C_j has min(criteo_cardinality_j, max_cardinality) ids. The id's rank r
//     (1 = most popular) is drawn from a Zipf law, P(r) ~ r^-zipf_exponent, by an exact sampler
//     (ZipfSampler below). The rank becomes a 32-bit key through a per-field bijection, so keys
//     look like Criteo's 8-hex-digit values and distinct ranks never collide.
//   - High-cardinality fields (DatagenOptions::high_cardinality_fields) instead take
//     `high_cardinality` ids each (up to 2^32, beyond any Criteo field) with their own, flatter
//     Zipf exponent, so that most draws are ids never seen before: a model whose touched rows
//     grow with the data (the "model larger than one host" runs, docs/DATAGEN.md).
//   - Numeric fields follow the empirical distribution of the first 10,000 rows of Kaggle's
//     train.txt: 40 quantiles per field, interpolated in sign(x)·ln(1 + |x|) space and rounded to
//     integers (I2 takes -1 and, rarely, -2).
//   - Values go missing at Criteo's per-field rates, and fields that are missing together in
//     Criteo are missing together here: {I1, I10} 45.4%, {I4, I13} 21.7%, {I7, I9, I11} 4.3%,
//     {C3, C4, C12, C16, C21, C24} 3.4%, {C19, C20, C25, C26} 44%; alone: I3 21.5%, I5 2.6%,
//     I6 22.3%, I8 0.05%, I12 76.5%, C6 12.1%, C22 76.3%; every other field is always present.
//
// Teacher (a DeepFM-like model over exactly what a trainee sees):
//   input of field f:  the categorical key, or FeatureSpec::LogSquaredBucket(x) of a numeric value,
//                      or a per-field "missing" id.
//   logit = bias + a1 · sum_f w(f, id_f)                                     (first order)
//                + a2 · 1/2 sum_d [(sum_f v_d(f, id_f))^2 - sum_f v_d(f, id_f)^2]  (FM, k = 8)
//                + a3 · MLP(concat_f e(f, id_f))             (4 dims a field, 156-16-1, ReLU)
//   label ~ Bernoulli(sigmoid(logit)).
// DatagenOptions::interaction replaces the FM term by another second-order interaction of the
// same per-field 8-dim vectors p_f (x = concat_f p_f, 312 dims), so that DCN-v2 and DLRM are
// measured where they should win (docs/DATAGEN.md "Teachers"):
//   kCross: a low-rank DCN-v2 cross layer, sum_j x_j (x V U)_j = sum_{q<16} (x . V_q)(x . U_q),
//           V, U with N(0, 1/312) entries: products across embedding dimensions and fields;
//   kDot:   DLRM's dot interaction with a linear top layer, sum_{f<g} c_fg <p_f, p_g>, c_fg
//           ~ N(0, 1): each pair of fields has its own weight and sign (FM's are all 1);
//   kCross3: the third-order term of two stacked low-rank cross layers, sum_j x_j (z V2 U2)_j with
//           z = x * (x V U) (elementwise), V, U, V2, U2 of rank 16 ~ N(0, 1/312): products of three
//           embedding entries, which no second-order term (FM, one cross layer, dots) expresses
//           and a cross network of two or more layers does.
//   kCrossFull: one full-rank cross layer, sum_j x_j (x W)_j = x^T W x, W [312, 312] ~ N(0, 1/312):
//           every pair of fields (f, g) has its own random, indefinite 8 x 8 bilinear form W_fg,
//           which neither FM's one shared inner product nor DLRM's weighted dots of per-field
//           vectors express, and DCN-v2's full-rank cross layer does exactly.
// Those teachers give the terms the variance shares 40/40/20 (first order, interaction, MLP);
// DatagenOptions::interaction_share changes the interaction's.
// kFm (the default) is the teacher above, bit for bit.
// w, v and e of (field, id) are not stored: they are bytes of a hash of (teacher_seed, field, id)
// times a per-field importance. The MLP's dense weights are drawn once from teacher_seed. So the
// teacher's memory does not depend on the cardinalities: any id of any field has its parameters
// in O(1) memory, also at billions of ids.
// Calibration (at Create, on rows drawn from a seed derived from teacher_seed only): a1, a2, a3
// give the three terms standard deviations in the ratio 2:1:1 (variance 60/20/20%) with a total
// logit spread of `logit_std`, and the bias is bisected so that the mean teacher probability is
// `positive_rate`. With the defaults the Bayes AUC is about 0.80 and the Bayes logloss about 0.44
// (real Criteo DeepFM: 0.80-0.81 and 0.44-0.45).
//
// Determinism: rows come in chunks of `chunk_rows`; chunk c's RNG is seeded from (seed, c) only.
// So a (seed, teacher_seed, options) triple gives the same rows, labels and probabilities whatever
// the thread count, and N rows are always a prefix of N' > N rows. Train and test sets are two
// runs with different `seed` and the same `teacher_seed` (and the same other options).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/random.h"
#include "pstrain/config.pb.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"

namespace pstrain {

// Exact sampler of the Zipf law on ranks 1..n: P(r) = r^-s / sum_{i<=n} i^-s. Immutable after
// construction; Sample is const and thread-safe (the caller owns the Rng).
//   kAlias: ranks 1..256 are buckets of their own, larger ranks are grouped into buckets
//           [lo, ~1.125 lo). A bucket is drawn by Walker's alias method (one table look-up), a rank
//           inside it uniformly and accepted with probability (r / lo)^-s (a precomputed lower
//           bound accepts ~90% without a pow). About 10 KB per field, so the tables stay in L1/L2.
//           Building it sums all n terms: the default up to 2^20 ranks.
//   kRejectionInversion: Hörmann & Derflinger (1996), O(1) memory and set-up, a few
//           transcendentals per draw; the default above 2^20 ranks.
class ZipfSampler {
 public:
  enum class Method { kAuto, kAlias, kRejectionInversion };
  static constexpr uint64_t kMaxAliasRanks = uint64_t{1} << 20;

  ZipfSampler(uint64_t n, double exponent, Method method = Method::kAuto);
  uint64_t n() const { return n_; }
  // Inline: this is the generator's hottest call (26 per row).
  uint64_t Sample(Rng* rng) const {
    // Everything that touches the Rng is inline, so that a caller's Rng can stay in registers.
    uint64_t k;
    if (alias_.empty()) {
      while (!RejectionInversionStep(rng->UniformDouble(), &k)) {
      }
      return k;
    }
    // The high word of u * B picks a bucket uniformly, the low word is a uniform fraction
    // (branch-free: the outcome is a coin flip).
    const unsigned __int128 x = static_cast<unsigned __int128>(rng->Next()) * alias_.size();
    const size_t j = static_cast<size_t>(x >> 64);
    const uint64_t keep = -static_cast<uint64_t>(static_cast<uint64_t>(x) < alias_[j].threshold);
    const size_t i = (j & keep) | (alias_[j].alias & ~keep);
    if (i < head_) return i + 1;
    // A rank of bucket i, uniformly, accepted with probability (k / lo)^-s = P(k) / P(lo).
    const Range& range = ranges_[i];
    for (;;) {
      k = range.lo + rng->Uniform(alias_[i].size);
      const double v = rng->UniformDouble();
      if (v < range.squeeze || v < AcceptProbability(k, range.lo)) return k;
    }
  }

 private:
  // Bucket i holds ranks lo .. lo + size - 1.
  struct Alias {
    uint64_t threshold;  // keep bucket i if the draw's fraction is below this, else take `alias`
    uint32_t alias;
    uint32_t size;
  };
  struct Range {
    uint64_t lo;
    double squeeze;  // ((lo + size - 1) / lo)^-s: accept below this without computing pow
  };
  double AcceptProbability(uint64_t k, uint64_t lo) const;
  // One rejection-inversion trial from a uniform in [0, 1): true and *rank if accepted.
  bool RejectionInversionStep(double uniform, uint64_t* rank) const;
  double H(double x) const;
  double HInverse(double x) const;

  uint64_t n_ = 1;
  double s_ = 1;
  size_t head_ = 0;  // buckets [0, head_) are the single ranks 1..head_
  std::vector<Alias> alias_;
  std::vector<Range> ranges_;
  double h_x1_ = 0, h_n_ = 0, accept_ = 0;  // rejection-inversion constants
};

// The teacher's second-order term (see the teacher above).
enum class TeacherInteraction { kFm, kCross, kDot, kCross3, kCrossFull };
// "fm", "cross", "dot", "cross3", "cross_full".
absl::StatusOr<TeacherInteraction> ParseTeacherInteraction(const std::string& name);
const char* TeacherInteractionName(TeacherInteraction interaction);

struct DatagenOptions {
  uint64_t seed = 1;                  // which rows
  uint64_t teacher_seed = 1;          // which teacher (share it between train and test)
  uint64_t max_cardinality = 100000;  // cap on each categorical field's id count (>= 1)
  double zipf_exponent = 1.1;         // popularity skew of categorical ids (> 0)
  double positive_rate = 0.25;        // mean teacher probability the bias is calibrated to (0, 1)
  double logit_std = 1.4;             // spread of the teacher's logit: sets the Bayes AUC (> 0)
  int chunk_rows = 4096;              // rows per deterministic chunk (part of the seed contract)
  int calibration_rows = 65536;       // rows the teacher is calibrated on
  // Every field present: a value that would be missing becomes 0 (numeric) or the key
  // kMissingKey (categorical), the usual Criteo preprocessing for formats that cannot express a
  // missing value (LibSVM). The teacher then sees those values like any other.
  bool fill_missing = false;
  // Concept drift between "days" (daily retraining, docs/DATAGEN.md "Drift"): the teacher of day
  // `day` is cos(day x a) T0 + sin(day x a) T1 of two independent teachers' per-id parameters and
  // MLP weights (T0 the teacher of teacher_seed, T1 another from the same seed), with
  // a = acos(1 - drift): consecutive days' parameters have correlation 1 - drift, and their
  // spread stays the same. Each day's teacher is calibrated on its own. drift in [0, 1], day >= 0;
  // drift 0 or day 0 is the plain teacher, exactly.
  double drift = 0;
  int day = 0;
  // Ids that come and go over days (docs/DATAGEN.md "Ids that come and go"): with id_churn c > 0
  // each categorical field's id of popularity rank r is retired on each day 1, 2, ... with
  // probability c (a coin of (teacher_seed, field, rank, day)), and a NEW id takes its rank from
  // that day on: on `day`, rank r holds its g-th id, g the number of retirements up to `day`
  // (KeyOnDay). So a fraction c of a day's ids (and of its draws) are new the next day, retired
  // ids never come back, the population and its popularity law stay the same, and the teacher
  // follows: a new id's parameters are a hash of its key like any id's. Needs
  // (day + 1) x cardinality <= 2^32 per field (the ids of every generation are distinct 32-bit
  // keys). 0 (the default) or day 0: the data are bit for bit those of the other options.
  double id_churn = 0;
  // High cardinality (docs/DATAGEN.md "High-cardinality fields"): the categorical fields listed
  // (0-based: 0 is C1; each at most once) take `high_cardinality` ids each, in [1, 2^32], drawn
  // with `high_cardinality_zipf_exponent` (in (0, 10]), instead of min(Criteo's cardinality,
  // max_cardinality) ids drawn with zipf_exponent. Empty (the default): every field as above, and
  // the data are bit for bit those of the other options alone.
  std::vector<int> high_cardinality_fields;
  uint64_t high_cardinality = 0;
  double high_cardinality_zipf_exponent = 0.5;
  // A history list field (docs/DATAGEN.md "A history field"): with history_mean_length > 0 every
  // row gets a 40th field, SyntheticData::kHistoryName, the list of ids a user "clicked before":
  // ids of categorical field history_item_field (0-based: 2 is C3) drawn from that field's
  // popularity law, as many as a geometric law with this mean gives, capped at
  // history_max_length (1..4096). The teacher pools the list, the MEAN of the item field's per-id
  // parameters times history_importance, into its first-order and FM terms (not the MLP's
  // input); the trainee's field shares the item field's rows (SyntheticData::Features()).
  // 0 (the default): no history field, and the data are bit for bit those of the other options.
  double history_mean_length = 0;
  int history_max_length = 50;
  int history_item_field = 2;
  double history_importance = 2.0;
  // How the teacher pools the history. false (MEAN, the default): as above, bit for bit.
  // true (attention, `--history_pooling attention`): id i's parameters p_i are weighted by
  // w_i = 2 max(0, cos(p_i, p_c)) over their FM part (dims 8..15), p_c the row's item field's
  // parameters, pooled = importance * sum_i w_i p_i / n: ids like the candidate count, the others
  // not, which no fixed combiner can express (DIN's target attention can).
  bool history_attention = false;
  // The teacher's second-order term; kFm: the data are bit for bit those without this option.
  TeacherInteraction interaction = TeacherInteraction::kFm;
  // The interaction term's share of the logit's variance, in [0, 1); the first-order and MLP
  // terms split the rest in the default ratio (2:1, the FM teacher's 3:1). 0 (the default): the
  // default shares (FM 20%, the other teachers 40%), bit for bit.
  double interaction_share = 0;
};

// Parses "C3,C12" (categorical field names of the CRITEO preset) into 0-based categorical field
// indices (2, 11) for DatagenOptions::high_cardinality_fields. INVALID_ARGUMENT naming an entry
// that is not C1..C26 (a repeated name is SyntheticData::Create's to refuse).
absl::StatusOr<std::vector<int>> ParseCategoricalFields(const std::string& names);

// The three terms of the teacher's logit for one row (already scaled by a1, a2, a3).
struct TeacherTerms {
  double first_order = 0;
  double fm = 0;
  double mlp = 0;
};

// Immutable after Create(); every method is const and thread-safe.
class SyntheticData {
 public:
  static constexpr int kNumNumeric = 13;
  static constexpr int kNumCategorical = 26;
  static constexpr int kNumFields = kNumNumeric + kNumCategorical;
  static constexpr int kFmDim = 8;
  static constexpr int kEmbDim = 4;
  static constexpr int kHidden = 16;
  // The categorical key of a filled missing value: above every 32-bit key the generator draws.
  static constexpr uint64_t kMissingKey = uint64_t{1} << 32;
  // The history list field (DatagenOptions::history_mean_length > 0): field kNumFields.
  static constexpr char kHistoryName[] = "history";

  // Validates the options (INVALID_ARGUMENT naming the option), builds the samplers and
  // calibrates the teacher (tens of milliseconds with the defaults).
  static absl::StatusOr<SyntheticData> Create(const DatagenOptions& options);

  // Criteo Kaggle's distinct values per categorical field C1..C26 (as DLRM and TorchRec list them).
  static const std::vector<uint64_t>& CriteoCardinalities();
  // "I1".."I13", "C1".."C26" (the CRITEO preset's field names, in field order).
  static std::string FieldName(int f);

  const DatagenOptions& options() const { return options_; }
  // Fields per row: kNumFields, plus the history list field when there is one.
  int num_fields() const { return stride_; }
  bool has_history() const { return stride_ > kNumFields; }
  // The features the rows are written and read with: the CRITEO preset, plus the history field
  // (a MEAN list sharing the item field's rows) when there is one.
  FeatureConfig Features() const;
  // Ids per categorical field after the cap, or high_cardinality for the high-cardinality fields
  // (26 entries, C1..C26).
  const std::vector<uint64_t>& cardinalities() const { return cardinalities_; }
  double bias() const { return bias_; }

  // Replaces *rows with rows [0, num_rows) of chunk `chunk` (num_rows <= chunk_rows), and *probs
  // with the teacher's probability of each row. Labels are drawn from those probabilities.
  void GenerateChunk(int64_t chunk, int num_rows, RawRows* rows, std::vector<float>* probs) const;

  // Generates rows [0, num_rows) chunk by chunk on `threads` threads and hands the chunks to
  // `sink` in order, on the calling thread, while the next ones are generated (threads <= 1: all
  // on the calling thread). Stops at the first sink error and returns it.
  using Sink = std::function<absl::Status(const RawRows& rows, absl::Span<const float> probs)>;
  absl::Status Generate(int64_t num_rows, int threads, const Sink& sink) const;

  // The teacher on row r of any RawRows in the CRITEO layout (e.g. rows read back from a file):
  // only present/key/value are used, so a file that round-trips exactly gives the same numbers.
  double TeacherLogit(const RawRows& rows, int r) const;
  TeacherTerms Terms(const RawRows& rows, int r) const;

  // The key of rank r (1-based) of categorical field c (0-based: 0 is C1). A bijection of
  // [1, 2^32] onto the 32-bit keys, so distinct ranks never collide (hence the 2^32 bound on
  // high_cardinality).
  uint32_t RankToKey(int categorical_field, uint64_t rank) const;
  // The key rank r of categorical field c holds on `day` (DatagenOptions::id_churn): the rank's
  // id of generation IdGeneration(c, r, day). RankToKey(c, r) with no churn or on day 0.
  uint32_t KeyOnDay(int categorical_field, uint64_t rank, int day) const;
  // How many times rank r's id has been retired up to `day`: O(1 + id_churn x day).
  uint64_t IdGeneration(int categorical_field, uint64_t rank, int day) const;

  // 16 floats (GCC/Clang vector extension: two AVX2 registers, the build's baseline).
  typedef float V16 __attribute__((vector_size(64)));

  SyntheticData(SyntheticData&&) = default;
  SyntheticData& operator=(SyntheticData&&) = default;

 private:
  SyntheticData() = default;
  // Draws the features of rows [begin, end) (already sized) from *rng.
  void FillRows(Rng* rng, RawRows* rows, int begin, int end) const;
  // The unscaled terms (before a1, a2, a3 and the bias) of rows [begin, end), into
  // out[0 .. end - begin).
  void RawTerms(const RawRows& rows, int begin, int end, TeacherTerms* out) const;
  double Logit(const TeacherTerms& raw) const;
  // The history list of row r pooled as the teacher sees it (zero for an empty list).
  // With history_attention, `candidate` (the item field's parameters) weights the ids. Written
  // through `out`: a V16 returned by value changes ABI between ISA builds (-Wpsabi).
  void HistoryParams(const RawRows& rows, int r, const V16& candidate, V16* out) const;
  // The kCross, kDot or kCross3 interaction term of one row's per-field parameters.
  double SecondOrder(const V16* params) const;

  DatagenOptions options_;
  int stride_ = kNumFields;  // fields per row
  std::vector<uint64_t> cardinalities_;
  std::vector<ZipfSampler> zipf_;
  // Teacher parameters.
  uint64_t salt_[kNumFields][2] = {};
  // Drift (DatagenOptions::drift): the second teacher's salts and the mixing weights of the
  // per-id parameters (rotate_ false: the plain teacher, salt_ only).
  bool rotate_ = false;
  float rot_cos_ = 1, rot_sin_ = 0;
  uint64_t drift_salt_[kNumFields][2] = {};
  uint32_t key_salt_[kNumCategorical][2] = {};
  // The drawn rank's key: KeyOnDay of options_.day with id churn, else RankToKey.
  uint32_t DrawnKey(int categorical_field, uint64_t rank) const {
    return churn_ ? KeyOnDay(categorical_field, rank, options_.day)
                  : RankToKey(categorical_field, rank);
  }
  bool churn_ = false;  // id_churn > 0 and day > 0
  // Field f's parameters are the 16 signed bytes of two hashes of its id, times param_scale_[f]:
  // byte 0 first order, bytes 1..4 MLP embedding, 5..7 unused, 8..15 FM vector.
  V16 param_scale_[kNumFields] = {};
  std::vector<V16> w1_;  // [kNumFields * kEmbDim] rows of kHidden = 16 weights
  V16 b1_ = {};
  float w2_[kHidden] = {};
  double scale_first_ = 1, scale_fm_ = 1, scale_mlp_ = 1, bias_ = 0;
  // kCross: V and U, [kCrossRank][kFields * kFmDim] each; kDot: c, [kFields][kFields];
  // kCross3: V, U as kCross's and the second layer's V2, U2 (the same shapes);
  // kCrossFull: W, [kFields * kFmDim][kFields * kFmDim] row-major (in cross_v_).
  static constexpr int kCrossRank = 16;
  std::vector<float> cross_v_, cross_u_, pair_weight_, cross2_v_, cross2_u_;
};

// `count` batches of exactly `rows` examples each from the datagen distribution, encoded by
// `spec`, to be cycled through in memory (benchmarks and `pstrain tune`: the input pipeline is
// then not what is measured).
std::vector<Batch> DatagenBatches(const SyntheticData& data, const FeatureSpec& spec, int count,
                                  int rows);

// Where and how `pstrain datagen` writes a data set.
struct DatagenOutput {
  std::string dir;  // created if missing
  DataFormat format = CRITEO_TSV;
  int64_t rows = 0;
  int files = 1;    // rows are split into `files` contiguous, near-equal parts
  int threads = 1;  // generation threads (the output does not depend on it)
};

struct DatagenResult {
  std::vector<std::string> files;  // dir/part-00000<ext>, ...
  uint64_t bytes = 0;
  // Over every row written: the teacher's probabilities against the drawn labels.
  double bayes_auc = 0;
  double bayes_logloss = 0;
  double positive_rate = 0;     // mean label
  double mean_probability = 0;  // mean teacher probability
};

// Generates out.rows rows, writes them through CreateRecordWriter (FeatureSpec of the default
// FeatureConfig: the CRITEO preset) and writes dir/teacher.json (TeacherJson). Keeps 8 bytes per
// row in memory for the exact Bayes AUC (360 MB for Criteo's 45M rows).
absl::StatusOr<DatagenResult> WriteSyntheticData(const SyntheticData& data,
                                                 const DatagenOutput& out);

// teacher.json: rows, files, format, seed, teacher_seed, the generator options, bias,
// cardinalities (C1..C26), bayes_auc, bayes_logloss, positive_rate, mean_probability.
std::string TeacherJson(const SyntheticData& data, const DatagenOutput& out,
                        const DatagenResult& result);

}  // namespace pstrain
