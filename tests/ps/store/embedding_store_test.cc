#include "ps/store/embedding_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::shared_ptr<const Optimizer> MakeOptimizer(OptimizerType type, float lr) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(lr);
  auto o = Optimizer::Create(c);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::shared_ptr<const Optimizer>(std::move(o).value());
}

// A recognizable pure initializer: element j of row r is r + j / 1000.
void TestInit(int64_t row, float* out, int dim) {
  for (int j = 0; j < dim; ++j) out[j] = static_cast<float>(row) + j * 0.001f;
}

std::unique_ptr<EmbeddingStore> MakeStore(int64_t begin, int64_t end, int dim,
                                          std::shared_ptr<const Optimizer> opt, int threads = 1) {
  EmbeddingStore::Options o;
  o.begin = begin;
  o.end = end;
  o.dim = dim;
  o.optimizer = std::move(opt);
  o.row_init = [dim](int64_t row, float* out) { TestInit(row, out, dim); };
  o.threads = threads;
  auto s = EmbeddingStore::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

std::vector<float> RandomGrads(Rng* rng, size_t n) {
  std::vector<float> g(n);
  for (auto& x : g) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return g;
}

TEST(EmbeddingStore, CreateRejectsBadOptions) {
  EmbeddingStore::Options o;
  o.begin = 10;
  o.end = 10;
  o.dim = 4;
  o.optimizer = MakeOptimizer(SGD, 1);
  EXPECT_EQ(EmbeddingStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.end = 20;
  o.dim = 0;
  EXPECT_EQ(EmbeddingStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.dim = 4;
  o.chunk_rows = 100;
  EXPECT_EQ(EmbeddingStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.chunk_rows = 4096;
  o.end = o.begin + (int64_t{1} << 32);  // slots are 32-bit
  EXPECT_EQ(EmbeddingStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.end = 20;
  o.optimizer = nullptr;
  EXPECT_EQ(EmbeddingStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingStore, GatherOfUntrainedRowsIsRowInitAndCostsNoMemory) {
  auto store = MakeStore(100, 1000000, 5, MakeOptimizer(ADAGRAD, 0.1f));
  const std::vector<int64_t> ids = {100, 999999, 5000, 100};
  std::vector<float> out(ids.size() * 5);
  ASSERT_TRUE(store->Gather(ids, out.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < 5; ++j) EXPECT_FLOAT_EQ(out[i * 5 + j], ids[i] + j * 0.001f);
  }
  EXPECT_EQ(store->stats().rows_initialized, 0);
  EXPECT_LT(store->stats().bytes, 100000);  // the stripes and the (empty) page tables
}

// Apply initializes a row on first touch (row_init + InitState) and then runs the optimizer: the
// result equals the optimizer applied by hand to the initial row, bit for bit.
TEST(EmbeddingStore, ApplyEqualsOptimizerOnInitialRows) {
  for (OptimizerType type : {SGD, ADAGRAD, ADAM, FTRL}) {
    auto opt = MakeOptimizer(type, 0.05f);
    const int dim = 17;
    auto store = MakeStore(0, 100000, dim, opt, /*threads=*/2);
    Rng rng(type);
    std::vector<int64_t> ids;
    for (int i = 0; i < 5000; ++i) ids.push_back(static_cast<int64_t>(i * 19 % 100000));
    std::vector<float> g1 = RandomGrads(&rng, ids.size() * dim);
    std::vector<float> g2 = RandomGrads(&rng, ids.size() * dim);
    ASSERT_TRUE(store->Apply(ids, g1.data(), 1).ok());
    ASSERT_TRUE(store->Apply(ids, g2.data(), 2).ok());
    std::vector<float> got(ids.size() * dim);
    ASSERT_TRUE(store->Gather(ids, got.data()).ok());
    std::vector<float> w(dim), s(opt->StateFloats(dim));
    for (size_t i = 0; i < ids.size(); ++i) {
      TestInit(ids[i], w.data(), dim);
      opt->InitState(s.data(), dim);
      opt->ApplyRow(w.data(), s.data(), &g1[i * dim], dim, opt->LearningRate(1));
      opt->ApplyRow(w.data(), s.data(), &g2[i * dim], dim, opt->LearningRate(1));
      for (int j = 0; j < dim; ++j) ASSERT_EQ(got[i * dim + j], w[j]) << type << " row " << ids[i];
    }
    const EmbeddingStore::Stats st = store->stats();
    EXPECT_EQ(st.rows_initialized, 5000);
    EXPECT_EQ(st.last_step, 2);
    EXPECT_GT(st.bytes, 5000 * (dim + opt->StateFloats(dim)) * 4);
  }
}

TEST(EmbeddingStore, OutOfRangeIdsAreInvalidArgumentAndChangeNothing) {
  auto store = MakeStore(1000, 2000, 3, MakeOptimizer(SGD, 1));
  std::vector<float> buf(3 * 3, 1.0f);
  for (int64_t bad : {int64_t{999}, int64_t{2000}, int64_t{-5}, int64_t{1} << 62}) {
    const std::vector<int64_t> ids = {1500, bad, 1600};
    for (const absl::Status& s : {store->Gather(ids, buf.data()), store->Apply(ids, buf.data(), 1),
                                  store->RestoreRows(ids, buf.data(), nullptr)}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find(std::to_string(bad)), absl::string_view::npos) << s;
      EXPECT_NE(s.message().find("index 1"), absl::string_view::npos) << s;
    }
  }
  EXPECT_EQ(store->stats().rows_initialized, 0);  // the valid ids were not applied either
}

// A repeated id is applied once per occurrence.
TEST(EmbeddingStore, DuplicateIdsApplySequentially) {
  auto store = MakeStore(0, 100, 2, MakeOptimizer(SGD, 1.0f));
  const std::vector<int64_t> ids = {7, 7, 3, 7};
  const std::vector<float> g = {1, 10, 2, 20, 5, 50, 3, 30};
  ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
  std::vector<float> out(4);
  ASSERT_TRUE(store->Gather(std::vector<int64_t>{7, 3}, out.data()).ok());
  EXPECT_FLOAT_EQ(out[0], 7.0f - 6.0f);
  EXPECT_FLOAT_EQ(out[1], 7.001f - 60.0f);
  EXPECT_FLOAT_EQ(out[2], 3.0f - 5.0f);
  EXPECT_FLOAT_EQ(out[3], 3.001f - 50.0f);
  EXPECT_EQ(store->stats().rows_initialized, 2);
}

// Several threads push overlapping rows at once (each push itself split over 2 OpenMP threads).
// With SGD, lr 1, integer gradients and an all-integer start, every sum is exact, so the result
// must equal the sequential one exactly.
TEST(EmbeddingStore, ConcurrentSgdApplyEqualsSequential) {
  constexpr int dim = 8, kThreads = 4, kPushes = 40, kRows = 6000;
  auto make = [&](int threads) {
    EmbeddingStore::Options o;
    o.begin = 0;
    o.end = 8000;
    o.dim = dim;
    o.optimizer = MakeOptimizer(SGD, 1.0f);
    o.threads = threads;
    o.row_init = [=](int64_t row, float* out) {
      for (int j = 0; j < dim; ++j) out[j] = static_cast<float>(row % 100);
    };
    return std::move(EmbeddingStore::Create(o)).value();
  };
  // Push p of thread t: kRows unique ids from a shifted window, integer grads in [-3, 3].
  std::vector<std::vector<int64_t>> ids(kThreads * kPushes);
  std::vector<std::vector<float>> grads(ids.size());
  Rng rng(11);
  for (size_t p = 0; p < ids.size(); ++p) {
    const int64_t shift = rng.Uniform(2000);
    for (int i = 0; i < kRows; ++i) ids[p].push_back(shift + i);
    for (int i = 0; i < kRows * dim; ++i) {
      grads[p].push_back(static_cast<float>(static_cast<int>(rng.Uniform(7)) - 3));
    }
  }
  auto concurrent = make(2);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int p = t; p < kThreads * kPushes; p += kThreads) {
        if (!concurrent->Apply(ids[p], grads[p].data(), p).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto sequential = make(1);
  for (size_t p = 0; p < ids.size(); ++p)
    ASSERT_TRUE(sequential->Apply(ids[p], grads[p].data(), p).ok());
  const EmbeddingSnapshot a = concurrent->Snapshot(), b = sequential->Snapshot();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.last_step, kThreads * kPushes - 1);
}

// A test optimizer whose rows keep an invariant that any torn update breaks: every weight of a
// row equals the row's update count, and so does every state float. It writes element by
// element with compiler barriers, leaving a wide window for a torn read or write if a row were
// not locked.
class CountingOptimizer : public Optimizer {
 public:
  CountingOptimizer() : Optimizer(OptimizerConfig()) {}
  int state_slots() const override { return 1; }
  void InitState(float* state, int64_t n) const override { std::fill(state, state + n, 0.0f); }

 protected:
  void Update(float* w, float* state, const float*, int64_t n, int64_t b, int64_t e,
              const Step&) const override {
    const float next = state[0] + 1.0f;
    for (int64_t i = b; i < e; ++i) {
      w[i] = next;
      asm volatile("" ::: "memory");
    }
    for (int64_t i = b; i < e; ++i) {
      state[i] = next;
      asm volatile("" ::: "memory");
    }
  }
};

bool RowIsWhole(const float* w, const float* state, int dim) {
  for (int j = 0; j < dim; ++j) {
    if (w[j] != w[0] || (state != nullptr && state[j] != w[0])) return false;
  }
  return true;
}

TEST(EmbeddingStore, ConcurrentApplyGatherAndSnapshotNeverSeeATornRow) {
  const int dim = 64, kRows = 64, kAppliers = 3, kPushes = 300;
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = kRows;
  o.dim = dim;
  o.optimizer = std::make_shared<CountingOptimizer>();
  auto store = std::move(EmbeddingStore::Create(o)).value();
  std::vector<int64_t> all(kRows);
  for (int i = 0; i < kRows; ++i) all[i] = i;
  const std::vector<float> zeros(kRows * dim, 0.0f);

  std::atomic<bool> done{false};
  std::atomic<int64_t> torn_gathers{0}, torn_snapshots{0}, snapshots{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kAppliers; ++t) {
    threads.emplace_back([&] {
      for (int p = 0; p < kPushes; ++p) ASSERT_TRUE(store->Apply(all, zeros.data(), p).ok());
    });
  }
  threads.emplace_back([&] {
    std::vector<float> out(kRows * dim);
    // do-while: on a loaded machine the appliers may finish before this thread first runs.
    do {
      ASSERT_TRUE(store->Gather(all, out.data()).ok());
      for (int i = 0; i < kRows; ++i) torn_gathers += !RowIsWhole(&out[i * dim], nullptr, dim);
    } while (!done.load());
  });
  threads.emplace_back([&] {
    do {
      const EmbeddingSnapshot s = store->Snapshot();
      ++snapshots;
      for (int64_t i = 0; i < s.rows(); ++i) {
        torn_snapshots += !RowIsWhole(&s.weights[i * dim], &s.state[i * dim], dim);
      }
    } while (!done.load());
  });
  for (int t = 0; t < kAppliers; ++t) threads[t].join();
  done = true;
  for (size_t t = kAppliers; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(torn_gathers.load(), 0);
  EXPECT_EQ(torn_snapshots.load(), 0);
  EXPECT_GT(snapshots.load(), 0);
  // No update was lost either: every row counted every push.
  const EmbeddingSnapshot s = store->Snapshot();
  ASSERT_EQ(s.rows(), kRows);
  for (int64_t i = 0; i < s.rows(); ++i) {
    EXPECT_EQ(s.weights[i * dim], kAppliers * kPushes);
    EXPECT_TRUE(RowIsWhole(&s.weights[i * dim], &s.state[i * dim], dim));
  }
}

TEST(EmbeddingStore, LazyAdamKeepsAStepCountPerRow) {
  auto opt = MakeOptimizer(ADAM, 0.01f);
  const int dim = 3;
  auto store = MakeStore(0, 10, dim, opt);
  const std::vector<float> g(2 * dim, 0.5f);
  ASSERT_TRUE(store->Apply(std::vector<int64_t>{1}, g.data(), 1).ok());
  ASSERT_TRUE(store->Apply(std::vector<int64_t>{1}, g.data(), 2).ok());
  ASSERT_TRUE(store->Apply(std::vector<int64_t>{1, 4}, g.data(), 3).ok());
  const EmbeddingSnapshot s = store->Snapshot();
  ASSERT_EQ(s.ids, (std::vector<int64_t>{1, 4}));
  ASSERT_EQ(s.state_floats, 2 * dim + 1);
  EXPECT_EQ(s.state[2 * dim], 3.0f);                   // row 1: three updates
  EXPECT_EQ(s.state[s.state_floats + 2 * dim], 1.0f);  // row 4: one, at global step 3
  // Row 4's first update is a bias-corrected step 1: each weight moves by lr.
  EXPECT_NEAR(s.weights[dim], 4.0f - 0.01f, 1e-5);
  EXPECT_EQ(s.last_step, 3);
}

TEST(EmbeddingStore, MemoryGrowsWithTrainedRowsNotTableSize) {
  const int dim = 17;
  auto store = MakeStore(0, int64_t{100} * 1000 * 1000, dim, MakeOptimizer(ADAGRAD, 0.1f));
  Rng rng(5);
  std::set<int64_t> uniq;
  while (uniq.size() < 1000) uniq.insert(static_cast<int64_t>(rng.Uniform(100000000)));
  const std::vector<int64_t> ids(uniq.begin(), uniq.end());
  const std::vector<float> g(ids.size() * dim, 0.1f);
  ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
  const EmbeddingStore::Stats st = store->stats();
  EXPECT_EQ(st.rows_initialized, 1000);
  // At most 1000 index pages of 16 KB and one arena chunk of 4096 rows x 34 floats, plus the
  // page tables: under 20 MB, against 13.6 GB for every row of the table.
  EXPECT_GT(st.bytes, 1000 * 34 * 4);
  EXPECT_LT(st.bytes, int64_t{20} << 20);
  // Snapshot finds exactly the stored rows.
  EXPECT_EQ(store->Snapshot().ids, ids);
}

TEST(EmbeddingStore, SnapshotOfARangeHoldsOnlyItsRowsAscending) {
  auto store = MakeStore(0, 5000, 2, MakeOptimizer(ADAGRAD, 0.1f));
  const std::vector<int64_t> ids = {4000, 3, 700, 701, 2999, 3000};
  const std::vector<float> g(ids.size() * 2, 0.5f);
  ASSERT_TRUE(store->Apply(ids, g.data(), 9).ok());
  EXPECT_EQ(store->Snapshot(700, 3000).ids, (std::vector<int64_t>{700, 701, 2999}));
  EXPECT_EQ(store->Snapshot().ids, (std::vector<int64_t>{3, 700, 701, 2999, 3000, 4000}));
  EXPECT_TRUE(store->Snapshot(4001, 100000).ids.empty());
}

// Snapshot, restore into fresh stores (one store, and two stores splitting the range), then keep
// training all of them the same way: bit-identical results.
TEST(EmbeddingStore, SnapshotRestoreThenContinuedTrainingIsBitIdentical) {
  auto opt = MakeOptimizer(ADAM, 0.01f);
  const int dim = 17;
  auto original = MakeStore(0, 20000, dim, opt, 2);
  Rng rng(21);
  auto random_ids = [&] {
    std::set<int64_t> u;
    while (u.size() < 3000) u.insert(static_cast<int64_t>(rng.Uniform(20000)));
    return std::vector<int64_t>(u.begin(), u.end());
  };
  for (int step = 1; step <= 3; ++step) {
    const std::vector<int64_t> ids = random_ids();
    ASSERT_TRUE(original->Apply(ids, RandomGrads(&rng, ids.size() * dim).data(), step).ok());
  }
  const EmbeddingSnapshot snap = original->Snapshot();

  auto whole = MakeStore(0, 20000, dim, opt);
  auto left = MakeStore(0, 12345, dim, opt), right = MakeStore(12345, 20000, dim, opt);
  ASSERT_TRUE(whole->Restore(snap).ok());
  for (EmbeddingStore* part : {left.get(), right.get()}) {
    EmbeddingSnapshot mine = snap;
    mine.ids.clear();
    mine.weights.clear();
    mine.state.clear();
    for (int64_t i = 0; i < snap.rows(); ++i) {
      if (!part->Owns(snap.ids[i])) continue;
      mine.ids.push_back(snap.ids[i]);
      mine.weights.insert(mine.weights.end(), &snap.weights[i * dim], &snap.weights[(i + 1) * dim]);
      mine.state.insert(mine.state.end(), &snap.state[i * snap.state_floats],
                        &snap.state[(i + 1) * snap.state_floats]);
    }
    ASSERT_TRUE(part->Restore(mine).ok());
  }
  EXPECT_EQ(whole->last_step(), 3);

  for (int step = 4; step <= 6; ++step) {
    const std::vector<int64_t> ids = random_ids();
    const std::vector<float> g = RandomGrads(&rng, ids.size() * dim);
    ASSERT_TRUE(original->Apply(ids, g.data(), step).ok());
    ASSERT_TRUE(whole->Apply(ids, g.data(), step).ok());
    const auto cut = std::lower_bound(ids.begin(), ids.end(), 12345) - ids.begin();
    ASSERT_TRUE(left->Apply(absl::MakeSpan(ids.data(), cut), g.data(), step).ok());
    ASSERT_TRUE(
        right->Apply(absl::MakeSpan(ids.data() + cut, ids.size() - cut), &g[cut * dim], step).ok());
  }
  const EmbeddingSnapshot a = original->Snapshot(), b = whole->Snapshot();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  const EmbeddingSnapshot l = left->Snapshot(), r = right->Snapshot();
  std::vector<float> split_weights = l.weights, split_state = l.state;
  split_weights.insert(split_weights.end(), r.weights.begin(), r.weights.end());
  split_state.insert(split_state.end(), r.state.begin(), r.state.end());
  EXPECT_EQ(split_weights, a.weights);
  EXPECT_EQ(split_state, a.state);
}

TEST(EmbeddingStore, RestoreRefusesAnotherLayout) {
  auto adam = MakeStore(0, 100, 4, MakeOptimizer(ADAM, 0.01f));
  ASSERT_TRUE(adam->Apply(std::vector<int64_t>{5}, std::vector<float>(4, 1.0f).data(), 1).ok());
  const EmbeddingSnapshot snap = adam->Snapshot();
  auto adagrad = MakeStore(0, 100, 4, MakeOptimizer(ADAGRAD, 0.01f));
  const absl::Status s = adagrad->Restore(snap);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("ADAM"), absl::string_view::npos) << s;
  auto wide = MakeStore(0, 100, 5, MakeOptimizer(ADAM, 0.01f));
  EXPECT_EQ(wide->Restore(snap).code(), absl::StatusCode::kFailedPrecondition);
  // Weights alone may move to another optimizer, starting from a fresh state.
  ASSERT_TRUE(adagrad->RestoreRows(snap.ids, snap.weights.data(), nullptr).ok());
  const EmbeddingSnapshot moved = adagrad->Snapshot();
  EXPECT_EQ(moved.weights, snap.weights);
  EXPECT_EQ(moved.state, std::vector<float>(4, 1e-4f));  // Adagrad's initial accumulator
}

// Dirty rows for incremental checkpoints: a snapshot with changed_since holds exactly the rows
// Apply updated at or after that generation (with their current values and slots), across
// chunks, index pages and threads; restored rows count as unchanged.
TEST(EmbeddingStore, SnapshotChangedSinceHoldsExactlyTheRowsUpdatedSinceAGeneration) {
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    auto store = MakeStore(0, 50000, 3, MakeOptimizer(ADAM, 0.01f), threads);
    Rng rng(5);
    auto apply = [&](const std::vector<int64_t>& ids) {
      const std::vector<float> g = RandomGrads(&rng, ids.size() * 3);
      ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
    };
    std::vector<int64_t> first, second;
    for (int64_t r = 0; r < 50000; r += 3) first.push_back(r);       // pages and chunks
    for (int64_t r = 7; r < 50000; r += 1001) second.push_back(r);   // a few, some in `first`
    EXPECT_EQ(store->generation(), 1u);
    apply(first);
    store->BeginGeneration(2, /*keep_from=*/1);
    EXPECT_EQ(store->Snapshot(0, 50000, 2).rows(), 0);
    apply(second);
    const EmbeddingSnapshot changed = store->Snapshot(0, 50000, 2);
    EXPECT_EQ(changed.ids, second);
    // The rows' current values and slots, as a full snapshot has them.
    const EmbeddingSnapshot all = store->Snapshot();
    EXPECT_EQ(store->Snapshot(0, 50000, 1).ids, all.ids);
    EXPECT_EQ(store->Snapshot(0, 50000, 0).ids, all.ids);
    for (size_t i = 0; i < changed.ids.size(); ++i) {
      const size_t j = std::lower_bound(all.ids.begin(), all.ids.end(), changed.ids[i]) -
                       all.ids.begin();
      ASSERT_EQ(all.ids[j], changed.ids[i]);
      EXPECT_TRUE(std::equal(changed.weights.begin() + i * 3, changed.weights.begin() + i * 3 + 3,
                             all.weights.begin() + j * 3));
      EXPECT_TRUE(std::equal(changed.state.begin() + i * all.state_floats,
                             changed.state.begin() + (i + 1) * all.state_floats,
                             all.state.begin() + j * all.state_floats));
    }
    // A range clamps as usual.
    EXPECT_EQ(store->Snapshot(1000, 3000, 2).ids, (std::vector<int64_t>{1008, 2009}));
    // Restored rows are stamped 0: unchanged since any checkpoint until updated again.
    auto copy = MakeStore(0, 50000, 3, MakeOptimizer(ADAM, 0.01f), threads);
    ASSERT_TRUE(copy->Restore(all).ok());
    EXPECT_EQ(copy->Snapshot(0, 50000, 1).rows(), 0);
    EXPECT_EQ(copy->Snapshot().rows(), all.rows());
  }
}

void ExpectSameSnapshot(const EmbeddingSnapshot& a, const EmbeddingSnapshot& b) {
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.last_step, b.last_step);
}

// Every id in [from, to) with step `every`.
std::vector<int64_t> Ids(int64_t from, int64_t to, int64_t every) {
  std::vector<int64_t> ids;
  for (int64_t r = from; r < to; r += every) ids.push_back(r);
  return ids;
}

// The image's rows [0, rows), read range by range as a checkpoint writer streams them.
EmbeddingSnapshot ReadInRanges(const EmbeddingStore::Image& image, int64_t rows, int64_t range) {
  EmbeddingSnapshot all;
  for (int64_t from = 0; from < rows; from += range) {
    const EmbeddingSnapshot piece = image.Snapshot(from, from + range);
    all.ids.insert(all.ids.end(), piece.ids.begin(), piece.ids.end());
    all.weights.insert(all.weights.end(), piece.weights.begin(), piece.weights.end());
    all.state.insert(all.state.end(), piece.state.begin(), piece.state.end());
    all.last_step = piece.last_step;
  }
  return all;
}

// A copy-on-write Image (a PS checkpoint's instant) reads as the store did at Freeze while the
// store goes on: rows updated since are their pre-images, rows stored since are absent, and only
// the updated rows cost memory. Destroying it ends the copy-on-write.
TEST(EmbeddingStoreImage, HoldsTheInstantWhileUpdatesGoOn) {
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    auto store = MakeStore(0, 100000, 4, MakeOptimizer(ADAM, 0.01f), threads);
    Rng rng(11);
    auto apply = [&](const std::vector<int64_t>& ids, int64_t step) {
      const std::vector<float> g = RandomGrads(&rng, ids.size() * 4);
      ASSERT_TRUE(store->Apply(ids, g.data(), step).ok());
    };
    const std::vector<int64_t> before = Ids(0, 60000, 3);
    apply(before, 1);
    const EmbeddingSnapshot at_freeze = store->Snapshot();
    {
      std::unique_ptr<EmbeddingStore::Image> image = store->Freeze(2, 2);
      EXPECT_EQ(store->generation(), 2u);
      ExpectSameSnapshot(image->Snapshot(0, 100000), at_freeze);
      EXPECT_EQ(image->preserved_rows(), 0);
      const std::vector<int64_t> again = Ids(0, 60000, 9);      // a third of `before`
      const std::vector<int64_t> fresh = Ids(60000, 100000, 7);  // stored since the instant
      apply(again, 2);
      apply(again, 3);  // a second update keeps the first pre-image
      apply(fresh, 3);
      EXPECT_EQ(image->preserved_rows(), static_cast<int64_t>(again.size()));
      EXPECT_EQ(image->preserved_bytes(),
                static_cast<int64_t>(again.size()) * (1 + 4 + store->state_floats()) * 4);
      ExpectSameSnapshot(image->Snapshot(0, 100000), at_freeze);
      // In ranges, as a writer streams it; and by rows.
      ExpectSameSnapshot(ReadInRanges(*image, 100000, 12345), at_freeze);
      std::vector<int64_t> listed = before;
      listed.insert(listed.end(), fresh.begin(), fresh.end());
      ExpectSameSnapshot(image->SnapshotRows(listed, 0), at_freeze);
      // The live store has moved on.
      EXPECT_NE(store->Snapshot().weights, at_freeze.weights);
      EXPECT_EQ(store->Snapshot().rows(), at_freeze.rows() + static_cast<int64_t>(fresh.size()));
    }
    // Ended: the next update of a row frozen before keeps no pre-image, and another Image may
    // be taken.
    const EmbeddingSnapshot now = store->Snapshot();
    std::unique_ptr<EmbeddingStore::Image> next = store->Freeze(3, 3);
    ExpectSameSnapshot(next->Snapshot(0, 100000), now);
    apply(Ids(1, 100000, 5), 4);
    ExpectSameSnapshot(next->Snapshot(0, 100000), now);
  }
}

// A delta of an Image holds the rows stamped since `changed_since` at the instant, as they were
// then: from the change logs, or by the stamp scan when the logs were dropped.
TEST(EmbeddingStoreImage, DeltaOfAnImageIsTheDeltaOfTheInstant) {
  for (const uint32_t keep_from : {2u, 3u}) {  // the logs of generation 2 kept / dropped
    SCOPED_TRACE(keep_from);
    auto store = MakeStore(0, 50000, 3, MakeOptimizer(ADAGRAD, 0.1f), 2);
    Rng rng(12);
    auto apply = [&](const std::vector<int64_t>& ids) {
      const std::vector<float> g = RandomGrads(&rng, ids.size() * 3);
      ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
    };
    apply(Ids(0, 50000, 2));
    store->Freeze(2, 2).reset();  // a full checkpoint's instant, written
    apply(Ids(0, 50000, 101));    // generation 2: the delta's rows
    apply(Ids(1, 50000, 202));    // some of them new to the store
    const EmbeddingSnapshot delta = store->Snapshot(0, 50000, 2);
    ASSERT_GT(delta.rows(), 300);
    std::unique_ptr<EmbeddingStore::Image> image = store->Freeze(3, keep_from);
    EXPECT_EQ(store->ChangedRows(0, 50000, 2).has_value(), keep_from == 2u);
    apply(Ids(0, 50000, 303));   // rows of the delta and of the full checkpoint, updated again
    apply(Ids(3, 50000, 1000));  // and rows new to the store
    ExpectSameSnapshot(image->Snapshot(0, 50000, 2), delta);
    if (auto listed = store->ChangedRows(0, 50000, 2)) {
      ExpectSameSnapshot(image->SnapshotRows(*listed, 2), delta);
    }
    EXPECT_EQ(image->Snapshot(0, 50000, 3).rows(), 0);  // nothing at the instant is that new
  }
}

// Training threads update the store while the Image is read range by range: every range holds
// the instant's rows exactly, and no row is torn.
TEST(EmbeddingStoreImage, ConcurrentUpdatesNeverReachTheImage) {
  auto store = MakeStore(0, 200000, 8, MakeOptimizer(ADAGRAD, 0.1f), 1);
  Rng rng(13);
  {
    const std::vector<int64_t> ids = Ids(0, 200000, 2);
    const std::vector<float> g = RandomGrads(&rng, ids.size() * 8);
    ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
  }
  const EmbeddingSnapshot at_freeze = store->Snapshot();
  std::unique_ptr<EmbeddingStore::Image> image = store->Freeze(2, 2);
  std::atomic<bool> stop{false};
  std::vector<std::thread> trainers;
  for (int t = 0; t < 3; ++t) {
    trainers.emplace_back([&, t] {
      Rng r(100 + t);
      while (!stop.load()) {
        std::vector<int64_t> ids(256);
        for (auto& id : ids) id = static_cast<int64_t>(r.Uniform(200000));
        const std::vector<float> g = RandomGrads(&r, ids.size() * 8);
        EXPECT_TRUE(store->Apply(ids, g.data(), 2).ok());
      }
    });
  }
  // The read starts once training has changed rows of the instant (bounded wait).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (image->preserved_rows() < 1000 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const EmbeddingSnapshot read = ReadInRanges(*image, 200000, 1000);
  stop = true;
  for (auto& t : trainers) t.join();
  EXPECT_GT(image->preserved_rows(), 0);
  ExpectSameSnapshot(read, at_freeze);
}

// The change log (incremental checkpoints' fast path): within a generation a row is logged once
// however often it is updated, a row new to the store counts as changed, and a delta snapshot
// from the logs holds exactly the rows stamped since.
TEST(EmbeddingStoreChangeLog, LogsEachRowOncePerGeneration) {
  auto store = MakeStore(0, 20000, 2, MakeOptimizer(ADAGRAD, 0.1f));
  Rng rng(3);
  const std::vector<int64_t> ids = {5, 4099, 8200, 19999};
  for (int i = 0; i < 5; ++i) {
    const std::vector<float> g = RandomGrads(&rng, ids.size() * 2);
    ASSERT_TRUE(store->Apply(ids, g.data(), i).ok());
  }
  EXPECT_EQ(store->change_log_entries(), 4);  // created rows, logged once in generation 1
  store->BeginGeneration(2, /*keep_from=*/1);
  EXPECT_EQ(store->Snapshot(0, 20000, 2).rows(), 0);
  const std::vector<int64_t> again = {8200, 5, 7};  // unsorted; 7 is new
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> g = RandomGrads(&rng, again.size() * 2);
    ASSERT_TRUE(store->Apply(again, g.data(), 9).ok());
  }
  EXPECT_EQ(store->change_log_entries(), 4 + 3);
  EXPECT_EQ(store->Snapshot(0, 20000, 2).ids, (std::vector<int64_t>{5, 7, 8200}));
  // Generations 1 and 2 both logged 5 and 8200: a delta since 1 holds each row once.
  EXPECT_EQ(store->Snapshot(0, 20000, 1).ids, (std::vector<int64_t>{5, 7, 4099, 8200, 19999}));
  EXPECT_EQ(store->Snapshot(6, 8201, 2).ids, (std::vector<int64_t>{7, 8200}));
}

// BeginGeneration drops the logs below keep_from (a full checkpoint's: every older one), and a
// delta asked for since a dropped generation is still exact: it scans every stored row's stamp.
TEST(EmbeddingStoreChangeLog, BeginGenerationDropsOlderLogsAndOlderDeltasStillScan) {
  auto store = MakeStore(0, 50000, 2, MakeOptimizer(SGD, 0.1f));
  Rng rng(4);
  auto apply = [&](const std::vector<int64_t>& ids) {
    const std::vector<float> g = RandomGrads(&rng, ids.size() * 2);
    ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
  };
  apply({1, 2, 3});
  store->BeginGeneration(2, 2);  // a full checkpoint
  EXPECT_EQ(store->oldest_logged_generation(), 2u);
  EXPECT_EQ(store->change_log_entries(), 0);
  apply({3, 40000});
  store->BeginGeneration(3, 2);  // a delta since 2: keeps generation 2's log
  EXPECT_EQ(store->oldest_logged_generation(), 2u);
  EXPECT_EQ(store->change_log_entries(), 2);
  apply({2});
  EXPECT_EQ(store->Snapshot(0, 50000, 2).ids, (std::vector<int64_t>{2, 3, 40000}));
  EXPECT_EQ(store->Snapshot(0, 50000, 3).ids, (std::vector<int64_t>{2}));
  store->BeginGeneration(4, 4);
  EXPECT_EQ(store->change_log_entries(), 0);
  // Generation 2's log is gone; the scan finds the same rows.
  EXPECT_EQ(store->Snapshot(0, 50000, 2).ids, (std::vector<int64_t>{2, 3, 40000}));
  EXPECT_EQ(store->Snapshot(0, 50000, 3).ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(store->Snapshot(0, 50000, 4).rows(), 0);
  EXPECT_EQ(store->Snapshot(0, 50000, 1).ids, (std::vector<int64_t>{1, 2, 3, 40000}));
}

// A row restored after it was logged is stamped 0: no delta holds it until it is updated again
// (then once, though logged twice in its generation).
TEST(EmbeddingStoreChangeLog, ARestoredRowLeavesTheDeltaUntilUpdatedAgain) {
  auto store = MakeStore(0, 1000, 2, MakeOptimizer(ADAM, 0.01f));
  Rng rng(6);
  const std::vector<int64_t> ids = {10, 11, 12};
  std::vector<float> g = RandomGrads(&rng, 6);
  ASSERT_TRUE(store->Apply(ids, g.data(), 1).ok());
  const std::vector<int64_t> restored = {11};
  const std::vector<float> w = {0.5f, 0.25f};
  ASSERT_TRUE(store->RestoreRows(restored, w.data(), nullptr).ok());
  const EmbeddingSnapshot delta = store->Snapshot(0, 1000, 1);
  EXPECT_EQ(delta.ids, (std::vector<int64_t>{10, 12}));
  ASSERT_EQ(delta.weights.size(), 4u);
  ASSERT_EQ(delta.state.size(), 2u * delta.state_floats);
  const EmbeddingSnapshot all = store->Snapshot();
  ASSERT_EQ(all.ids, ids);
  // The kept rows' values (the compaction after the dropped row moved row 12's down).
  EXPECT_TRUE(std::equal(delta.weights.begin() + 2, delta.weights.end(), all.weights.begin() + 4));
  EXPECT_TRUE(std::equal(delta.state.begin() + delta.state_floats, delta.state.end(),
                         all.state.begin() + 2 * all.state_floats));
  ASSERT_TRUE(store->Apply(restored, g.data(), 2).ok());
  EXPECT_EQ(store->change_log_entries(), 4);
  EXPECT_EQ(store->Snapshot(0, 1000, 1).ids, ids);
}

// A delta in pieces (SaveEmbeddingStore's streaming): ChangedRows lists the logged rows of a
// range, SnapshotRows copies the listed rows still changed (not one restored since, nor an id not
// stored or outside the store), and ChangedRows says when the logs cannot answer.
TEST(EmbeddingStoreChangeLog, ChangedRowsAndSnapshotRowsMakeADeltaInPieces) {
  auto store = MakeStore(1000, 9000, 2, MakeOptimizer(ADAGRAD, 0.1f));
  Rng rng(8);
  std::vector<float> g = RandomGrads(&rng, 8);
  ASSERT_TRUE(store->Apply({1001, 5000, 8999}, g.data(), 1).ok());
  store->BeginGeneration(2, 2);
  ASSERT_TRUE(store->Apply({8999, 1001, 4000}, g.data(), 2).ok());
  EXPECT_EQ(store->ChangedRows(0, 100000, 2), (std::vector<int64_t>{1001, 4000, 8999}));
  EXPECT_EQ(store->ChangedRows(1002, 8999, 2), (std::vector<int64_t>{4000}));
  EXPECT_EQ(store->ChangedRows(0, 100000, 1), std::nullopt);  // generation 1's log was dropped
  EXPECT_EQ(store->ChangedRows(0, 100000, 0), std::nullopt);  // 0: every row, not a delta
  const std::vector<float> w = {1, 2};
  ASSERT_TRUE(store->RestoreRows({4000}, w.data(), nullptr).ok());
  const EmbeddingSnapshot piece = store->SnapshotRows({7, 1001, 1002, 4000, 5000, 8999}, 2);
  EXPECT_EQ(piece.ids, (std::vector<int64_t>{1001, 8999}));
  const EmbeddingSnapshot all = store->Snapshot();
  ASSERT_EQ(all.ids, (std::vector<int64_t>{1001, 4000, 5000, 8999}));
  EXPECT_EQ(piece.weights, (std::vector<float>{all.weights[0], all.weights[1], all.weights[6],
                                               all.weights[7]}));
  EXPECT_EQ(piece.state.size(), 2u * all.state_floats);
  EXPECT_EQ(store->Snapshot(0, 100000, 2).ids, piece.ids);
}

// The log path against its reference twin, the stamp scan: two stores get the same updates over
// several generations; one keeps every log, the other drops them at each generation (so it
// scans). Every delta since every generation, whole or in ranges, is identical in ids, weights
// and slots, single- and multi-threaded.
TEST(EmbeddingStoreChangeLog, DeltasFromTheLogsEqualTheStampScan) {
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    auto logged = MakeStore(100, 300000, 3, MakeOptimizer(ADAGRAD, 0.05f), threads);
    auto scanned = MakeStore(100, 300000, 3, MakeOptimizer(ADAGRAD, 0.05f), threads);
    Rng rng(11);
    for (uint32_t generation = 1; generation <= 6; ++generation) {
      if (generation > 1) {
        logged->BeginGeneration(generation, 1);
        scanned->BeginGeneration(generation, generation);
      }
      for (int batch = 0; batch < 4; ++batch) {
        std::set<int64_t> unique;
        const int n = generation == 1 ? 20000 : 2000;
        for (int i = 0; i < n; ++i) unique.insert(100 + rng() % 299900);
        std::vector<int64_t> ids(unique.begin(), unique.end());
        std::shuffle(ids.begin(), ids.end(), rng);
        const std::vector<float> g = RandomGrads(&rng, ids.size() * 3);
        ASSERT_TRUE(logged->Apply(ids, g.data(), generation).ok());
        ASSERT_TRUE(scanned->Apply(ids, g.data(), generation).ok());
      }
    }
    EXPECT_EQ(scanned->oldest_logged_generation(), 6u);
    for (uint32_t since = 1; since <= 7; ++since) {
      SCOPED_TRACE(since);
      for (auto [from, to] : {std::pair<int64_t, int64_t>{0, 400000}, {4096, 131072},
                              {299000, 300000}}) {
        const EmbeddingSnapshot a = logged->Snapshot(from, to, since);
        const EmbeddingSnapshot b = scanned->Snapshot(from, to, since);
        EXPECT_EQ(a.ids, b.ids);
        EXPECT_EQ(a.weights, b.weights);
        EXPECT_EQ(a.state, b.state);
        EXPECT_EQ(since == 7, a.rows() == 0) << from << " " << to;
      }
    }
    EXPECT_GT(logged->Snapshot(0, 400000, 6).rows(), 7000);
  }
}

// Concurrency: writers apply all the time while a checkpointer takes a full snapshot and then
// deltas, each after beginning a generation. Restoring the full and then each delta in order,
// and a last delta taken after the writers stopped, gives the store's final contents exactly:
// no update is lost between a delta's log walk and its copy.
TEST(EmbeddingStoreChangeLog, FullPlusDeltasTakenDuringUpdatesRestoreTheFinalStore) {
  auto store = MakeStore(0, 1 << 18, 2, MakeOptimizer(ADAGRAD, 0.05f), 2);
  {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < (1 << 18); r += 2) ids.push_back(r);
    const std::vector<float> g(ids.size() * 2, 0.5f);
    ASSERT_TRUE(store->Apply(ids, g.data(), 0).ok());
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      Rng rng(100 + t);
      // At least 100 updates each, however the threads are scheduled.
      for (int step = 0; step < 200000 && (step < 100 || !stop.load()); ++step) {
        std::vector<int64_t> ids(64);
        // Skewed: a few hot rows, many cold ones.
        for (auto& id : ids) id = rng() % 4 == 0 ? rng() % 256 : rng() % (1 << 18);
        const std::vector<float> g = RandomGrads(&rng, ids.size() * 2);
        ASSERT_TRUE(store->Apply(ids, g.data(), step).ok());
      }
    });
  }
  std::vector<EmbeddingSnapshot> chain;
  uint32_t since = 0;
  for (uint32_t generation = 2; generation <= 12; ++generation) {
    store->BeginGeneration(generation, since == 0 ? generation : since);
    chain.push_back(store->Snapshot(0, 1 << 18, since));
    since = generation;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the writers run
  }
  stop.store(true);
  for (auto& w : writers) w.join();
  store->BeginGeneration(13, since);
  chain.push_back(store->Snapshot(0, 1 << 18, since));
  EXPECT_GE(chain.front().rows(), 1 << 17);
  int64_t delta_rows = 0;
  for (size_t i = 1; i < chain.size(); ++i) delta_rows += chain[i].rows();
  EXPECT_GT(delta_rows, 0);
  auto copy = MakeStore(0, 1 << 18, 2, MakeOptimizer(ADAGRAD, 0.05f));
  for (const EmbeddingSnapshot& s : chain) ASSERT_TRUE(copy->Restore(s).ok());
  const EmbeddingSnapshot want = store->Snapshot(), got = copy->Snapshot();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.weights, want.weights);
  EXPECT_EQ(got.state, want.state);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Per-row staleness (row_versions): Gather reports each row's version (its updates); an Apply
// computed from older versions scales each row's learning rate by 1 / tau; a restored row starts
// again at version 0, and a version ahead of the row's counts as not stale.
TEST(EmbeddingStore, RowVersionsCountUpdatesAndScaleEachRowsLearningRate) {
  const float lr = 0.5f;
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 100;
  o.dim = 2;
  o.optimizer = MakeOptimizer(SGD, lr);
  o.row_versions = true;
  std::unique_ptr<EmbeddingStore> s = std::move(EmbeddingStore::Create(o)).value();
  const std::vector<int64_t> ids = {3, 4};
  const std::vector<float> g = {1, 2, 3, 4};
  std::vector<float> w(4);
  std::vector<uint32_t> v(2, 99);
  ASSERT_TRUE(s->Gather(ids, w.data(), v.data()).ok());
  EXPECT_EQ(v, (std::vector<uint32_t>{0, 0}));  // never trained
  const std::vector<uint32_t> pulled = v;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Apply({&ids[0], 1}, g.data(), i + 1).ok());
  ASSERT_TRUE(s->Gather(ids, w.data(), v.data()).ok());
  EXPECT_EQ(v, (std::vector<uint32_t>{3, 0}));
  const std::vector<float> before = w;
  ASSERT_TRUE(s->Apply(ids, g.data(), 4, pulled.data()).ok());  // row 3: tau 3; row 4: tau 0
  ASSERT_TRUE(s->Gather(ids, w.data(), v.data()).ok());
  EXPECT_EQ(v, (std::vector<uint32_t>{4, 1}));
  EXPECT_FLOAT_EQ(w[0], before[0] - lr / 3 * g[0]);
  EXPECT_FLOAT_EQ(w[1], before[1] - lr / 3 * g[1]);
  EXPECT_FLOAT_EQ(w[2], before[2] - lr * g[2]);
  EXPECT_FLOAT_EQ(w[3], before[3] - lr * g[3]);
  EmbeddingStore::Staleness tau = s->staleness();
  EXPECT_EQ(tau.updates, 2);
  EXPECT_EQ(tau.sum, 3);
  EXPECT_EQ(tau.max, 3);

  // A restore starts the rows at version 0: versions pulled before count as not stale.
  ASSERT_TRUE(s->Restore(s->Snapshot()).ok());
  ASSERT_TRUE(s->Gather(ids, w.data(), v.data()).ok());
  EXPECT_EQ(v, (std::vector<uint32_t>{0, 0}));
  const std::vector<uint32_t> ahead = {4, 1};
  const std::vector<float> restored = w;
  ASSERT_TRUE(s->Apply(ids, g.data(), 5, ahead.data()).ok());
  ASSERT_TRUE(s->Gather(ids, w.data(), nullptr).ok());
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(w[j], restored[j] - lr * g[j]) << j;
  EXPECT_EQ(s->staleness().max, 3);
}

}  // namespace
}  // namespace pstrain
