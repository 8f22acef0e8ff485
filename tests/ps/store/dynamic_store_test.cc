#include "ps/store/dynamic_store.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/hash.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "ps/store/embedding_store.h"

namespace pstrain {
namespace {

using Store = DynamicEmbeddingStore;

std::shared_ptr<const Optimizer> MakeOptimizer(OptimizerType type, float lr) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(lr);
  auto o = Optimizer::Create(c);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::shared_ptr<const Optimizer>(std::move(o).value());
}

// A recognizable pure initializer: element j of key k is (k mod 1000) + j / 1000.
void TestInit(int64_t key, float* out, int dim) {
  for (int j = 0; j < dim; ++j) {
    out[j] = static_cast<float>(static_cast<uint64_t>(key) % 1000) + j * 0.001f;
  }
}

Store::Options BaseOptions(int dim, OptimizerType type = ADAGRAD, float lr = 0.1f) {
  Store::Options o;
  o.dim = dim;
  o.optimizer = MakeOptimizer(type, lr);
  o.row_init = [dim](int64_t key, float* out) { TestInit(key, out, dim); };
  return o;
}

std::unique_ptr<Store> Make(Store::Options o) {
  auto s = Store::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

std::vector<float> Grads(Rng* rng, size_t n) {
  std::vector<float> g(n);
  for (auto& x : g) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return g;
}

std::vector<float> GatherAll(const Store& s, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * s.dim());
  s.Gather(keys, out.data());
  return out;
}

DynamicSnapshot Full(const Store& s) {
  auto snap = s.Snapshot();
  EXPECT_TRUE(snap.ok()) << snap.status();
  return std::move(snap).value();
}

// Every field of two snapshots, exactly.
void ExpectSameState(const DynamicSnapshot& a, const DynamicSnapshot& b) {
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.last_pass, b.last_pass);
  EXPECT_EQ(a.last_step_of, b.last_step_of);
  EXPECT_EQ(a.sketch, b.sketch);
  EXPECT_EQ(a.last_step, b.last_step);
  EXPECT_EQ(a.pass, b.pass);
  EXPECT_EQ(a.admitted, b.admitted);
  EXPECT_EQ(a.rejected, b.rejected);
  EXPECT_EQ(a.seen, b.seen);
  EXPECT_EQ(a.evicted_ttl, b.evicted_ttl);
  EXPECT_EQ(a.evicted_capacity, b.evicted_capacity);
}

TEST(DynamicStore, CreateRejectsBadOptions) {
  Store::Options o = BaseOptions(4);
  o.dim = 0;
  EXPECT_EQ(Store::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions(4);
  o.optimizer = nullptr;
  EXPECT_EQ(Store::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions(4);
  o.chunk_rows = 4;
  EXPECT_EQ(Store::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions(4);
  o.admission = Store::Admission::kProbability;
  o.admit_probability = 0;
  auto st = Store::Create(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("admit_probability"), std::string::npos) << st;
  o = BaseOptions(4);
  o.admission = Store::Admission::kCount;
  o.sketch_depth = 0;
  EXPECT_EQ(Store::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions(4);
  o.ttl_steps = -1;
  EXPECT_EQ(Store::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// With every key admitted, the rows follow exactly the fixed store's rows of the same ids: the
// same optimizer, initializer and update order.
TEST(DynamicStore, AlwaysAdmittedRowsEqualTheFixedStore) {
  constexpr int kDim = 5;
  for (OptimizerType type : {SGD, ADAGRAD, ADAM, FTRL}) {
    auto dyn = Make(BaseOptions(kDim, type));
    EmbeddingStore::Options eo;
    eo.begin = 0;
    eo.end = 1000;
    eo.dim = kDim;
    eo.optimizer = MakeOptimizer(type, 0.1f);
    eo.row_init = [](int64_t row, float* out) { TestInit(row, out, kDim); };
    auto fixed = std::move(EmbeddingStore::Create(eo)).value();
    Rng rng(7);
    for (int step = 1; step <= 20; ++step) {
      std::set<uint64_t> pick;
      while (pick.size() < 30) pick.insert(rng.Uniform(200));
      const std::vector<uint64_t> keys(pick.begin(), pick.end());
      const std::vector<int64_t> ids(keys.begin(), keys.end());
      const std::vector<float> g = Grads(&rng, keys.size() * kDim);
      dyn->Apply(keys, g.data(), step);
      ASSERT_TRUE(fixed->Apply(ids, g.data(), step).ok());
    }
    std::vector<uint64_t> all(300);
    std::vector<int64_t> all_ids(300);
    for (int i = 0; i < 300; ++i) all[i] = all_ids[i] = i;
    std::vector<float> want(300 * kDim);
    ASSERT_TRUE(fixed->Gather(all_ids, want.data()).ok());
    EXPECT_EQ(GatherAll(*dyn, all), want) << OptimizerType_Name(type);
    EXPECT_EQ(dyn->metrics().rows_live, fixed->stats().rows_initialized);
  }
}

TEST(DynamicStore, AdmissionByCountDropsUpdatesUntilTheKthSight) {
  constexpr int kDim = 3;
  Store::Options o = BaseOptions(kDim, SGD, 1.0f);
  o.admission = Store::Admission::kCount;
  o.admit_count = 3;
  o.sketch_width = 1 << 16;
  auto s = Make(o);
  const std::vector<uint64_t> key = {0xdeadbeefcafe1234ull};
  const std::vector<float> g = {1, 2, 3};
  s->Apply(key, g.data(), 1);
  s->Apply(key, g.data(), 2);
  // Not admitted: reads zeros (not row_init's value), stores nothing, the updates are dropped.
  EXPECT_EQ(GatherAll(*s, key), std::vector<float>(kDim, 0.0f));
  Store::Metrics m = s->metrics();
  EXPECT_EQ(m.rows_live, 0);
  EXPECT_EQ(m.rejected, 2);
  EXPECT_EQ(m.seen, 2);
  EXPECT_EQ(m.admitted, 0);
  // The third sight creates the row from row_init and applies only that update.
  s->Apply(key, g.data(), 3);
  std::vector<float> want(kDim);
  TestInit(static_cast<int64_t>(key[0]), want.data(), kDim);
  for (int j = 0; j < kDim; ++j) want[j] -= g[j];
  EXPECT_EQ(GatherAll(*s, key), want);
  m = s->metrics();
  EXPECT_EQ(m.rows_live, 1);
  EXPECT_EQ(m.admitted, 1);
  EXPECT_EQ(m.rejected, 2);
  EXPECT_EQ(m.new_keys_last_step, 1);
  // An admitted key is not counted any more: its updates all apply.
  s->Apply(key, g.data(), 4);
  for (int j = 0; j < kDim; ++j) want[j] -= g[j];
  EXPECT_EQ(GatherAll(*s, key), want);
  EXPECT_EQ(s->metrics().new_keys_last_step, 0);
}

// Aging halves the counts: a key seen K - 1 times before the aging needs more sightings after.
TEST(DynamicStore, AgingTheAdmissionCountsHalvesThem) {
  Store::Options o = BaseOptions(2, SGD, 1.0f);
  o.admission = Store::Admission::kCount;
  o.admit_count = 4;
  o.sketch_width = 1 << 14;
  auto s = Make(o);
  const std::vector<uint64_t> key = {77};
  const std::vector<float> g = {1, 1};
  for (int step = 1; step <= 3; ++step) s->Apply(key, g.data(), step);
  s->AgeAdmissionCounts();  // 3 -> 1
  s->Apply(key, g.data(), 4);
  s->Apply(key, g.data(), 5);
  EXPECT_EQ(s->metrics().rows_live, 0);  // 3 counted, not 5
  s->Apply(key, g.data(), 6);
  EXPECT_EQ(s->metrics().rows_live, 1);
  EXPECT_EQ(s->metrics().rejected, 5);
}

// The count-min sketch's guarantee, checked on a fixed stream: it never undercounts, and it
// overcounts by more than eps x N = e / W x N for at most a fraction delta = e^-d of the keys.
TEST(DynamicStore, CountMinSketchErrorBound) {
  constexpr int64_t kWidth = 2000;
  constexpr int kDepth = 4;
  CountMinSketch sketch(kWidth, kDepth, /*parts=*/1, /*seed=*/3);
  Rng rng(11);
  std::map<uint64_t, uint32_t> truth;
  int64_t n = 0;
  for (int i = 0; i < 200000; ++i) {
    // Zipf-like: a log-uniform rank over 40k keys.
    const auto rank = static_cast<uint64_t>(std::exp(rng.UniformDouble() * std::log(40000.0)));
    const uint64_t key = Fmix64(rank);
    sketch.Add(key, 0);
    ++truth[key];
    ++n;
  }
  const double bound = std::exp(1.0) / kWidth * n;
  int64_t over = 0;
  double total_error = 0;
  for (const auto& [key, count] : truth) {
    const uint32_t est = sketch.Estimate(key, 0);
    ASSERT_GE(est, count);
    if (est - count > bound) ++over;
    total_error += est - count;
  }
  const double delta = std::exp(-static_cast<double>(kDepth));
  EXPECT_LE(static_cast<double>(over) / truth.size(), delta)
      << over << " of " << truth.size() << " keys above the bound " << bound;
  // One row of a plain count-min overcounts a key by N / W on average; the minimum over rows
  // with conservative update does much better.
  const double mean_error = total_error / truth.size();
  EXPECT_LT(mean_error, 0.5 * n / kWidth) << mean_error;
  EXPECT_EQ(sketch.bytes(), kWidth * kDepth * 4);
}

TEST(DynamicStore, AdmissionByProbabilityIsADeterministicCoin) {
  constexpr int kDim = 2;
  Store::Options o = BaseOptions(kDim, SGD, 1.0f);
  o.admission = Store::Admission::kProbability;
  o.admit_probability = 0.25;
  o.seed = 5;
  auto a = Make(o), b = Make(o);
  std::vector<uint64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Fmix64(i + 1);
  const std::vector<float> g(keys.size() * kDim, 1.0f);
  a->Apply(keys, g.data(), 1);
  b->Apply(keys, g.data(), 1);
  const double frac = static_cast<double>(a->metrics().rows_live) / keys.size();
  EXPECT_NEAR(frac, 0.25, 0.015);  // binomial sd 0.003
  EXPECT_EQ(a->metrics().rejected, static_cast<int64_t>(keys.size()) - a->metrics().rows_live);
  // Reproducible: the same rows in a second store.
  EXPECT_EQ(Full(*a).keys, Full(*b).keys);
  // Non-admitted keys read zeros (admitted ones row_init - 1 each).
  const std::vector<float> got = GatherAll(*a, keys);
  const std::vector<uint64_t> live = Full(*a).keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool admitted = std::binary_search(live.begin(), live.end(), keys[i]);
    if (!admitted) {
      ASSERT_EQ(got[i * kDim], 0.0f);
      ASSERT_EQ(got[i * kDim + 1], 0.0f);
    }
  }
  // A key seen at later steps gets further coins: each is admitted eventually.
  for (int step = 2; step <= 40; ++step) a->Apply(keys, g.data(), step);
  EXPECT_GT(a->metrics().rows_live, static_cast<int64_t>(keys.size() * 0.99));
}

TEST(DynamicStore, TtlBySteps) {
  Store::Options o = BaseOptions(2, SGD, 1.0f);
  o.ttl_steps = 3;
  auto s = Make(o);
  const std::vector<float> g = {1, 1};
  s->Apply({{1}}, g.data(), 1);
  s->Apply({{2}}, g.data(), 2);
  s->Apply({{3}}, g.data(), 4);
  s->Apply({{1}}, g.data(), 2);  // an older step does not lower the clock; key 1's is now 2
  // now = 4: key 1 and 2 last updated at 2 (4 - 2 < 3: kept), key 3 at 4.
  EXPECT_EQ(s->Evict().ttl, 0);
  s->Apply({{3}}, g.data(), 5);
  const Store::EvictionResult r = s->Evict();  // now = 5: keys 1, 2 (5 - 2 >= 3) go
  EXPECT_EQ(r.ttl, 2);
  EXPECT_EQ(r.capacity, 0);
  EXPECT_EQ(Full(*s).keys, std::vector<uint64_t>({3}));
  const Store::Metrics m = s->metrics();
  EXPECT_EQ(m.evicted_ttl, 2);
  EXPECT_EQ(m.rows_live, 1);
  // An evicted key reads its initial value again and starts over when updated.
  std::vector<float> init(2);
  TestInit(1, init.data(), 2);
  EXPECT_EQ(GatherAll(*s, {1}), init);
}

TEST(DynamicStore, TtlByPasses) {
  Store::Options o = BaseOptions(2, SGD, 1.0f);
  o.ttl_passes = 2;
  auto s = Make(o);
  const std::vector<float> g = {1, 1};
  int64_t step = 0;
  for (int32_t pass = 0; pass < 4; ++pass) {
    s->SetPass(pass);
    s->Apply({{100 + static_cast<uint64_t>(pass)}}, g.data(), ++step);
    s->Apply({{7}}, g.data(), ++step);  // seen every day
  }
  // Pass 3: keys of passes 0 and 1 were not updated in the last 2 passes.
  EXPECT_EQ(s->Evict().ttl, 2);
  EXPECT_EQ(Full(*s).keys, std::vector<uint64_t>({7, 102, 103}));
}

std::unique_ptr<Store> CapStore(Store::CapacityPolicy policy) {
  Store::Options o = BaseOptions(2, SGD, 1.0f);
  o.max_rows = 3;
  o.capacity_policy = policy;
  auto s = Make(o);
  const std::vector<float> g = {1, 1};
  // Key k: last updated at step 10 + k; counts: key 1: 5, key 2: 1, key 3: 4, key 4: 2, key 5: 3.
  const int counts[] = {0, 5, 1, 4, 2, 3};
  int64_t step = 0;
  for (int k = 1; k <= 5; ++k) {
    for (int c = 1; c < counts[k]; ++c) s->Apply({{static_cast<uint64_t>(k)}}, g.data(), ++step);
  }
  for (int k = 1; k <= 5; ++k) s->Apply({{static_cast<uint64_t>(k)}}, g.data(), 10 + k);
  return s;
}

TEST(DynamicStore, LruAtTheRowCap) {
  auto s = CapStore(Store::CapacityPolicy::kLru);
  const Store::EvictionResult r = s->Evict();
  EXPECT_EQ(r.capacity, 2);
  EXPECT_EQ(Full(*s).keys, std::vector<uint64_t>({3, 4, 5}));  // the 3 most recent
  EXPECT_EQ(s->metrics().evicted_capacity, 2);
}

TEST(DynamicStore, LfuAtTheRowCap) {
  auto s = CapStore(Store::CapacityPolicy::kLfu);
  EXPECT_EQ(s->Evict().capacity, 2);
  EXPECT_EQ(Full(*s).keys, std::vector<uint64_t>({1, 3, 5}));  // the 3 most frequent
}

TEST(DynamicStore, ByteCapIsARowCapAtTheRowsCost) {
  Store::Options o = BaseOptions(4, ADAGRAD);
  auto probe = Make(o);
  o.max_bytes = 10 * probe->bytes_per_row() + 1;
  auto s = Make(o);
  std::vector<uint64_t> keys(25);
  for (int i = 0; i < 25; ++i) keys[i] = 1000 + i;
  const std::vector<float> g(25 * 4, 0.5f);
  s->Apply(keys, g.data(), 1);
  EXPECT_EQ(s->Evict().capacity, 15);
  EXPECT_EQ(s->metrics().rows_live, 10);
}

// Memory is measured from the arena and the maps, and an evicted row's slot is reused: the same
// number of live rows over different keys costs no new arena memory.
TEST(DynamicStore, MetricsBytesGrowWithRowsAndSlotsAreReused) {
  Store::Options o = BaseOptions(8, ADAGRAD);
  o.ttl_steps = 1;
  auto s = Make(o);
  const int64_t empty = s->metrics().bytes;
  std::vector<uint64_t> keys(40000);
  std::vector<float> g(keys.size() * 8, 0.1f);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Fmix64(i);
  s->Apply(keys, g.data(), 1);
  const Store::Metrics day1 = s->metrics();
  EXPECT_GE(day1.bytes - empty, 40000 * (8 + 8) * 4);
  EXPECT_GT(day1.map_bytes, 40000 * 16);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Fmix64(i + 1000000);
  s->Apply(keys, g.data(), 2);  // the new keys first: day 1's rows are still live
  const int64_t two_days = s->metrics().arena_bytes;
  EXPECT_GT(two_days, day1.arena_bytes);
  EXPECT_EQ(s->Evict().ttl, 40000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Fmix64(i + 2000000);
  s->Apply(keys, g.data(), 3);
  // Day 3 lives in day 1's slots, but per stripe: a stripe that draws more of day 3's keys than
  // it freed grows (40 rows a stripe here; the excess shrinks relative to the rows as they grow).
  EXPECT_LT(s->metrics().arena_bytes - two_days, (two_days - day1.arena_bytes) / 4);
  EXPECT_EQ(s->metrics().new_keys_last_step, 40000);
}

// Drives a store through a day of drifting keys: day d's keys are the identities
// [d x R, d x R + live), R = live x churn: each day R new keys appear and R stop. `batches`
// batches of `batch` distinct keys, uniform over the day's keys.
void TrainDay(Store* s, int day, int live, double churn, int64_t* step, Rng* rng,
              int batches = 20, size_t batch_keys = 100) {
  s->SetPass(day);
  const uint64_t first = static_cast<uint64_t>(day) * static_cast<uint64_t>(live * churn);
  for (int b = 0; b < batches; ++b) {
    std::set<uint64_t> batch;
    while (batch.size() < batch_keys) batch.insert(Fmix64(first + rng->Uniform(live)));
    const std::vector<uint64_t> keys(batch.begin(), batch.end());
    const std::vector<float> g = Grads(rng, keys.size() * s->dim());
    s->Apply(keys, g.data(), ++*step);
  }
}

// Full + delta + delta, with evictions (tombstones) between them, restore exactly the store of
// an uninterrupted run, and the same training afterwards gives the same store.
TEST(DynamicStore, FullPlusDeltasWithEvictionsRestoreExactly) {
  Store::Options o = BaseOptions(4, ADAM);
  o.admission = Store::Admission::kCount;
  o.admit_count = 2;
  o.sketch_width = 1 << 12;
  o.ttl_passes = 2;
  o.max_rows = 900;
  o.capacity_policy = Store::CapacityPolicy::kLfu;
  auto live = Make(o);
  Rng rng(3);
  int64_t step = 0;
  TrainDay(live.get(), 0, 1000, 0.3, &step, &rng);
  TrainDay(live.get(), 1, 1000, 0.3, &step, &rng);
  live->Evict();
  // Full checkpoint: generation 2 begins, the full holds everything before it.
  live->BeginGeneration(2, 2);
  const DynamicSnapshot full = Full(*live);
  TrainDay(live.get(), 2, 1000, 0.3, &step, &rng);
  Store::EvictionResult e1 = live->Evict();
  live->BeginGeneration(3, 2);
  auto d1 = live->Snapshot(2);
  ASSERT_TRUE(d1.ok()) << d1.status();
  TrainDay(live.get(), 3, 1000, 0.3, &step, &rng, /*batches=*/3);
  Store::EvictionResult e2 = live->Evict();
  live->BeginGeneration(4, 3);
  auto d2 = live->Snapshot(3);
  ASSERT_TRUE(d2.ok()) << d2.status();
  // The test means something only if rows were evicted and tombstoned in both deltas.
  ASSERT_GT(e1.ttl + e1.capacity, 0);
  ASSERT_GT(e2.ttl + e2.capacity, 0);
  ASSERT_FALSE(d1->deleted.empty());
  ASSERT_FALSE(d2->deleted.empty());
  ASSERT_LT(d2->rows(), live->metrics().rows_live);  // a delta, not a full

  auto resumed = Make(o);
  ASSERT_TRUE(resumed->Restore(full).ok());
  ASSERT_TRUE(resumed->Restore(*d1).ok());
  ASSERT_TRUE(resumed->Restore(*d2).ok());
  ExpectSameState(Full(*resumed), Full(*live));
  EXPECT_EQ(resumed->metrics().rows_live, live->metrics().rows_live);

  // The same subsequent training, admissions and evictions included.
  Rng rng_a(99), rng_b(99);
  int64_t step_a = step, step_b = step;
  for (int day = 5; day < 7; ++day) {
    TrainDay(live.get(), day, 1000, 0.3, &step_a, &rng_a);
    TrainDay(resumed.get(), day, 1000, 0.3, &step_b, &rng_b);
    const Store::EvictionResult ea = live->Evict(), eb = resumed->Evict();
    EXPECT_EQ(ea.ttl, eb.ttl);
    EXPECT_EQ(ea.capacity, eb.capacity);
  }
  ExpectSameState(Full(*resumed), Full(*live));

  // Without the tombstones the resumed store would hold rows the live one evicted.
  auto no_tombstones = Make(o);
  DynamicSnapshot d2_bad = *d2;
  d2_bad.deleted.clear();
  ASSERT_TRUE(no_tombstones->Restore(full).ok());
  ASSERT_TRUE(no_tombstones->Restore(*d1).ok());
  ASSERT_TRUE(no_tombstones->Restore(d2_bad).ok());
  EXPECT_GT(no_tombstones->metrics().rows_live, resumed->metrics().rows_live);
}

TEST(DynamicStore, DeltaNeedsItsLogs) {
  auto s = Make(BaseOptions(2));
  const std::vector<float> g = {1, 1};
  s->Apply({{1}}, g.data(), 1);
  s->BeginGeneration(5, 5);
  const auto d = s->Snapshot(2);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("full snapshot"), std::string::npos) << d.status();
  EXPECT_TRUE(s->Snapshot(5).ok());
}

TEST(DynamicStore, HostileRestoreIsRefusedAndChangesNothing) {
  Store::Options o = BaseOptions(3, ADAGRAD);
  o.admission = Store::Admission::kCount;
  o.sketch_width = 2048;
  o.sketch_depth = 2;
  auto s = Make(o);
  std::vector<uint64_t> keys = {5, 9, 12};
  const std::vector<float> g(9, 0.5f);
  s->Apply(keys, g.data(), 1);
  const DynamicSnapshot good = Full(*s);
  ASSERT_EQ(good.rows(), 3);

  const auto refused = [&](DynamicSnapshot bad, absl::StatusCode code, const std::string& text) {
    const absl::Status st = s->Restore(bad);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st;
    ExpectSameState(Full(*s), good);
  };
  DynamicSnapshot bad = good;
  bad.weights.pop_back();
  refused(bad, absl::StatusCode::kInvalidArgument, "weights");
  bad = good;
  bad.state.push_back(1);
  refused(bad, absl::StatusCode::kInvalidArgument, "state");
  bad = good;
  bad.counts.pop_back();
  refused(bad, absl::StatusCode::kInvalidArgument, "counts");
  bad = good;
  bad.keys[2] = bad.keys[1];  // a duplicate key
  refused(bad, absl::StatusCode::kInvalidArgument, "keys[2]");
  bad = good;
  std::swap(bad.keys[0], bad.keys[1]);
  refused(bad, absl::StatusCode::kInvalidArgument, "keys[1]");
  bad = good;
  bad.changed_since = 2;
  bad.deleted = {7, 7};
  refused(bad, absl::StatusCode::kInvalidArgument, "deleted[1]");
  bad.deleted = {9};
  refused(bad, absl::StatusCode::kInvalidArgument, "also a live row");
  bad = good;
  bad.deleted = {1};
  refused(bad, absl::StatusCode::kInvalidArgument, "full snapshot");
  bad = good;
  bad.sketch.pop_back();
  refused(bad, absl::StatusCode::kInvalidArgument, "sketch");
  bad = good;
  bad.sketch_width = 1024;
  refused(bad, absl::StatusCode::kFailedPrecondition, "sketch");
  bad = good;
  bad.dim = 4;
  refused(bad, absl::StatusCode::kFailedPrecondition, "dim");
  bad = good;
  bad.optimizer = ADAM;
  refused(bad, absl::StatusCode::kFailedPrecondition, "ADAM");
}

// Concurrent Apply calls on overlapping keys, with Gather and Snapshot running: every update is
// applied whole. With SGD at learning rate 1, zero initial rows and gradients that are small
// multiples of 1/2 every sum is exact in any order, so the result must equal the serial run's.
TEST(DynamicStore, ConcurrentApplyOnOverlappingKeysEqualsSerial) {
  constexpr int kDim = 4, kThreads = 4, kSteps = 50;
  Store::Options o = BaseOptions(kDim, SGD, 1.0f);
  o.row_init = nullptr;
  auto concurrent = Make(o), serial = Make(o);
  const auto batch = [](int t, int step, std::vector<uint64_t>* keys, std::vector<float>* g) {
    Rng rng(static_cast<uint64_t>(t * 1000 + step));
    std::set<uint64_t> pick;
    while (pick.size() < 64) pick.insert(rng.Uniform(300));  // overlapping between threads
    keys->assign(pick.begin(), pick.end());
    g->resize(keys->size() * kDim);
    for (auto& x : *g) x = static_cast<float>(static_cast<int>(rng.Uniform(9)) - 4) * 0.5f;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> keys;
      std::vector<float> g, out;
      for (int step = 1; step <= kSteps; ++step) {
        batch(t, step, &keys, &g);
        concurrent->Apply(keys, g.data(), step);
        out.resize(keys.size() * kDim);
        concurrent->Gather(keys, out.data());
        if (step % 10 == 0) {
          ASSERT_TRUE(concurrent->Snapshot().ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<uint64_t> keys;
  std::vector<float> g;
  for (int t = 0; t < kThreads; ++t) {
    for (int step = 1; step <= kSteps; ++step) {
      batch(t, step, &keys, &g);
      serial->Apply(keys, g.data(), step);
    }
  }
  const DynamicSnapshot a = Full(*concurrent), b = Full(*serial);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(concurrent->metrics().seen, serial->metrics().seen);
  EXPECT_EQ(concurrent->metrics().admitted, serial->metrics().admitted);
}

// One call split over a thread team (stripes split between the threads) gives exactly the
// single-threaded result, repeated keys included (a key's occurrences stay in batch order).
TEST(DynamicStore, ThreadTeamGivesTheSingleThreadResult) {
  constexpr int kDim = 3;
  Store::Options o = BaseOptions(kDim, ADAM);
  o.admission = Store::Admission::kCount;
  o.admit_count = 2;
  o.sketch_width = 1 << 14;
  auto one = Make(o);
  o.threads = 2;
  auto two = Make(o);
  Rng rng(5);
  for (int step = 1; step <= 4; ++step) {
    std::vector<uint64_t> keys(12000);
    for (auto& k : keys) k = Fmix64(rng.Uniform(6000));  // repeats within the batch
    const std::vector<float> g = Grads(&rng, keys.size() * kDim);
    one->Apply(keys, g.data(), step);
    two->Apply(keys, g.data(), step);
    const std::vector<float> a = GatherAll(*one, keys);
    std::vector<float> b(keys.size() * kDim);
    two->Gather(keys, b.data(), 2);
    ASSERT_EQ(a, b) << "step " << step;
  }
  ExpectSameState(Full(*one), Full(*two));
  EXPECT_GT(one->metrics().rejected, 0);
}

// GatherAt / ApplyAt (rows at the caller's places, at a wider stride) do what Gather / Apply do
// through a packed buffer: the same rows, the same state, and the floats past dim untouched.
TEST(DynamicStore, RowsAtPlacesEqualPackedRows) {
  constexpr int kDim = 3, kStride = 5;
  Store::Options o = BaseOptions(kDim, ADAM);
  o.admission = Store::Admission::kCount;
  o.admit_count = 2;
  auto packed = Make(o);
  auto placed = Make(o);
  Rng rng(11);
  for (int step = 1; step <= 3; ++step) {
    std::vector<uint64_t> keys(200);
    for (auto& k : keys) k = Fmix64(rng.Uniform(300));  // repeats within the batch
    // The caller's rows in reverse order of the keys, at kStride floats a row.
    std::vector<int32_t> at(keys.size());
    for (size_t i = 0; i < at.size(); ++i) at[i] = static_cast<int32_t>(at.size() - 1 - i);
    const std::vector<float> g = Grads(&rng, keys.size() * kDim);
    std::vector<float> spread(keys.size() * kStride, 7.f);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::copy_n(g.data() + i * kDim, kDim, spread.data() + at[i] * kStride);
    }
    packed->Apply(keys, g.data(), step);
    placed->ApplyAt(keys, at.data(), kStride, spread.data(), step);
    const std::vector<float> want = GatherAll(*packed, keys);
    std::vector<float> got(keys.size() * kStride, -1.f);
    placed->GatherAt(keys, at.data(), kStride, got.data(), /*threads=*/2);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* row = got.data() + at[i] * kStride;
      ASSERT_EQ(std::vector<float>(row, row + kDim),
                std::vector<float>(want.begin() + i * kDim, want.begin() + (i + 1) * kDim))
          << "step " << step << " key " << i;
      EXPECT_EQ(row[kDim], -1.f);
      EXPECT_EQ(row[kStride - 1], -1.f);
    }
  }
  ExpectSameState(Full(*packed), Full(*placed));
}

// Evict racing with Apply and Gather: no torn state, and the counters agree with the rows.
TEST(DynamicStore, ConcurrentEvictKeepsTheCountersTrue) {
  constexpr int kDim = 4;
  Store::Options o = BaseOptions(kDim, ADAGRAD);
  o.max_rows = 150;
  o.threads = 2;
  auto s = Make(o);
  std::atomic<bool> done{false};
  std::thread evictor([&] {
    while (!done.load()) s->Evict();
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      Rng rng(static_cast<uint64_t>(t + 1));
      std::vector<float> out;
      for (int step = 1; step <= 60; ++step) {
        std::set<uint64_t> pick;
        while (pick.size() < 80) pick.insert(rng.Uniform(400));
        const std::vector<uint64_t> keys(pick.begin(), pick.end());
        const std::vector<float> g = Grads(&rng, keys.size() * kDim);
        s->Apply(keys, g.data(), step);
        out.resize(keys.size() * kDim);
        s->Gather(keys, out.data());
      }
    });
  }
  for (auto& w : workers) w.join();
  done.store(true);
  evictor.join();
  s->Evict();
  const Store::Metrics m = s->metrics();
  EXPECT_EQ(m.rows_live, Full(*s).rows());
  EXPECT_LE(m.rows_live, 150);
  EXPECT_EQ(m.rows_live, m.admitted - m.evicted_capacity);
}

// Component-level memory flatness: 10 days of drifting keys (30% new a day). With a TTL of 2
// passes the live rows and the measured bytes stay within 20% from day 3 to day 10; without
// eviction they grow every day.
TEST(DynamicStore, MemoryIsFlatOverDriftingDaysWithTtlAndGrowsWithout) {
  Store::Options o = BaseOptions(8, ADAGRAD);
  Store::Options ttl = o;
  ttl.ttl_passes = 2;
  auto with = Make(ttl), without = Make(o);
  Rng rng_a(1), rng_b(1);
  int64_t step_a = 0, step_b = 0;
  std::vector<int64_t> rows_with, bytes_with, rows_without, bytes_without;
  for (int day = 0; day < 10; ++day) {
    // 20k keys a day: enough rows per stripe (~20) that the stores' fixed costs (1024 stripes
    // and their first chunks) do not hide the rows' memory.
    TrainDay(with.get(), day, 20000, 0.3, &step_a, &rng_a, 20, 1000);
    TrainDay(without.get(), day, 20000, 0.3, &step_b, &rng_b, 20, 1000);
    with->Evict();
    without->Evict();
    // A checkpoint a day (a full one: no delta will ask for older logs), as the trainer will
    // take them: the change logs and tombstones of older generations are dropped. Without
    // checkpoints the logs would grow by a key per row created or evicted.
    with->BeginGeneration(day + 2, day + 2);
    without->BeginGeneration(day + 2, day + 2);
    rows_with.push_back(with->metrics().rows_live);
    bytes_with.push_back(with->metrics().bytes);
    rows_without.push_back(without->metrics().rows_live);
    bytes_without.push_back(without->metrics().bytes);
  }
  const auto flat = [](const std::vector<int64_t>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin() + 2, v.end());
    return static_cast<double>(*hi) <= 1.2 * static_cast<double>(*lo);
  };
  const auto show = [](const std::vector<int64_t>& v) {
    std::string out;
    for (int64_t x : v) out += " " + std::to_string(x);
    return out;
  };
  EXPECT_TRUE(flat(rows_with)) << show(rows_with);
  EXPECT_TRUE(flat(bytes_with)) << show(bytes_with) << " without:" << show(bytes_without);
  for (int day = 1; day < 10; ++day) {
    EXPECT_GT(rows_without[day], rows_without[day - 1]) << day;
    EXPECT_GE(bytes_without[day], bytes_without[day - 1]) << day;
  }
  EXPECT_GT(bytes_without[9], 3 * bytes_with[9] / 2);
}

}  // namespace
}  // namespace pstrain
