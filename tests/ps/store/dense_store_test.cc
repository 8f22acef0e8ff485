#include "ps/store/dense_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

std::shared_ptr<const Optimizer> MakeOptimizer(OptimizerType type, float lr) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(lr);
  return std::shared_ptr<const Optimizer>(std::move(Optimizer::Create(c)).value());
}

std::unique_ptr<DenseStore> MakeStore(int64_t begin, int64_t size,
                                      std::shared_ptr<const Optimizer> opt, int threads = 1) {
  DenseStore::Options o;
  o.begin = begin;
  o.size = size;
  o.optimizer = std::move(opt);
  o.threads = threads;
  auto s = DenseStore::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

std::vector<float> Random(Rng* rng, int64_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return v;
}

TEST(DenseStore, CreateRejectsBadOptions) {
  DenseStore::Options o;
  o.size = 0;
  o.optimizer = MakeOptimizer(SGD, 1);
  EXPECT_EQ(DenseStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.size = 4;
  o.begin = -1;
  EXPECT_EQ(DenseStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.begin = 0;
  o.optimizer = nullptr;
  EXPECT_EQ(DenseStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DenseStore, SetGetApplyEqualsTheOptimizer) {
  auto opt = MakeOptimizer(ADAM, 0.01f);
  const int64_t n = 40000;
  auto store = MakeStore(0, n, opt, 2);
  Rng rng(1);
  std::vector<float> w = Random(&rng, n), s(opt->StateFloats(n));
  opt->InitState(s.data(), n);
  store->Set(w.data());
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = Random(&rng, n);
    store->Apply(g.data(), step);
    opt->ApplyDense(w.data(), s.data(), g.data(), n, 1, opt->LearningRate(step));
  }
  std::vector<float> got(n);
  store->Get(got.data());
  EXPECT_EQ(got, w);
  const DenseSnapshot snap = store->Snapshot();
  EXPECT_EQ(snap.state, s);
  EXPECT_EQ(snap.state[2 * n], 3.0f);  // Adam counts the slice's updates
  EXPECT_EQ(snap.last_step, 3);
}

// Concurrent pushes of all-ones gradients with SGD lr 1: every update lands (exact integer
// sums), and a concurrent reader always sees whole updates (all elements equal).
TEST(DenseStore, ConcurrentApplyAndGetSeeWholeUpdates) {
  const int64_t n = 100000;
  auto store = MakeStore(0, n, MakeOptimizer(SGD, 1.0f), 2);
  const std::vector<float> ones(n, 1.0f);
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    std::vector<float> out(n);
    while (!done.load()) {
      store->Get(out.data());
      for (int64_t i = 0; i < n; ++i) torn += out[i] != out[0];
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      for (int p = 0; p < 50; ++p) store->Apply(ones.data(), t * 50 + p);
    });
  }
  for (auto& th : writers) th.join();
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  std::vector<float> out(n);
  store->Get(out.data());
  EXPECT_EQ(out, std::vector<float>(n, -150.0f));
}

// A 10-float vector saved as slices [0, 6) and [6, 10), restored onto slices [0, 3) and [3, 10),
// then trained on: bit-identical to the original unsplit vector.
TEST(DenseStore, RestoreOverlapRepartitionsSlices) {
  auto opt = MakeOptimizer(ADAM, 0.01f);
  Rng rng(2);
  const std::vector<float> init = Random(&rng, 10);
  auto whole = MakeStore(0, 10, opt);
  auto a = MakeStore(0, 6, opt), b = MakeStore(6, 4, opt);
  whole->Set(init.data());
  a->Set(init.data());
  b->Set(init.data() + 6);
  for (int step = 1; step <= 2; ++step) {
    const std::vector<float> g = Random(&rng, 10);
    whole->Apply(g.data(), step);
    a->Apply(g.data(), step);
    b->Apply(g.data() + 6, step);
  }
  auto c = MakeStore(0, 3, opt), d = MakeStore(3, 7, opt);
  for (const DenseSnapshot& s : {a->Snapshot(), b->Snapshot()}) {
    int64_t copied = 0;
    for (DenseStore* target : {c.get(), d.get()}) {
      auto n = target->RestoreOverlap(s);
      ASSERT_TRUE(n.ok()) << n.status();
      copied += *n;
    }
    EXPECT_EQ(copied, s.size);
  }
  EXPECT_EQ(d->last_step(), 2);
  for (int step = 3; step <= 4; ++step) {
    const std::vector<float> g = Random(&rng, 10);
    whole->Apply(g.data(), step);
    c->Apply(g.data(), step);
    d->Apply(g.data() + 3, step);
  }
  std::vector<float> expect(10), got(10);
  whole->Get(expect.data());
  c->Get(got.data());
  d->Get(got.data() + 3);
  EXPECT_EQ(got, expect);
  const DenseSnapshot ws = whole->Snapshot(), ds = d->Snapshot();
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(ds.state[i], ws.state[3 + i]);           // m
    EXPECT_EQ(ds.state[7 + i], ws.state[10 + 3 + i]);  // v
  }
  EXPECT_EQ(ds.state[14], ws.state[20]);  // t
}

TEST(DenseStore, RestoreRefusesAnotherSliceOrOptimizer) {
  auto adam = MakeStore(0, 8, MakeOptimizer(ADAM, 0.01f));
  const DenseSnapshot snap = adam->Snapshot();
  EXPECT_EQ(MakeStore(0, 9, MakeOptimizer(ADAM, 0.01f))->Restore(snap).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeStore(8, 8, MakeOptimizer(ADAM, 0.01f))->Restore(snap).code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::Status s = MakeStore(0, 8, MakeOptimizer(ADAGRAD, 0.01f))->Restore(snap);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("ADAGRAD"), absl::string_view::npos) << s;
  EXPECT_TRUE(MakeStore(0, 8, MakeOptimizer(ADAM, 0.5f))->Restore(snap).ok());
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Staleness (async PS): every Apply makes a version; an Apply computed from an older version is
// tau updates stale, counted, and with scale_lr_by_staleness its learning rate is lr / tau.
TEST(DenseStore, VersionsCountStalenessAndScaleTheLearningRate) {
  const float lr = 0.5f;
  DenseStore::Options o;
  o.size = 4;
  o.optimizer = MakeOptimizer(SGD, lr);
  o.scale_lr_by_staleness = true;
  std::unique_ptr<DenseStore> scaled = std::move(DenseStore::Create(o)).value();
  o.scale_lr_by_staleness = false;
  std::unique_ptr<DenseStore> plain = std::move(DenseStore::Create(o)).value();
  std::vector<float> w(4);
  const std::vector<float> g = {1, 2, 3, 4};
  for (DenseStore* s : {scaled.get(), plain.get()}) {
    EXPECT_EQ(s->Get(w.data()), 0);
    for (int i = 0; i < 4; ++i) s->Apply(g.data(), i + 1, /*computed_from=*/-1);  // unversioned
    EXPECT_EQ(s->Get(w.data()), 4);
    EXPECT_EQ(s->staleness().updates, 0);
  }
  // 4 updates since version 0: tau 4, lr / 4 when scaled; a version from the future counts 0.
  std::vector<float> before_scaled(4), before_plain(4), after(4);
  scaled->Get(before_scaled.data());
  plain->Get(before_plain.data());
  scaled->Apply(g.data(), 5, /*computed_from=*/0);
  plain->Apply(g.data(), 5, /*computed_from=*/0);
  scaled->Get(after.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(after[i], before_scaled[i] - lr / 4 * g[i]) << i;
  plain->Get(after.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(after[i], before_plain[i] - lr * g[i]) << i;
  scaled->Get(before_scaled.data());
  scaled->Apply(g.data(), 6, /*computed_from=*/1000);  // restored since: tau 0, the whole lr
  scaled->Get(after.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(after[i], before_scaled[i] - lr * g[i]) << i;
  const DenseStore::Staleness tau = scaled->staleness();
  EXPECT_EQ(tau.updates, 2);
  EXPECT_EQ(tau.sum, 4);
  EXPECT_EQ(tau.max, 4);
  EXPECT_EQ(scaled->version(), 6);
}

}  // namespace
}  // namespace pstrain
