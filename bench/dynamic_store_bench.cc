// The dynamic embedding store (rows keyed by a 64-bit key, ps/store/dynamic_store.h) against the
// fixed EmbeddingStore on the same work: the unique rows of one DeepFM-on-Criteo batch (~38.6k
// rows of 17 floats, Adagrad, Zipf popularity as bench/optimizer_bench.cc draws them), a Gather
// then an Apply (the PS's whole step for a table), with both stores already holding the batch's
// rows and 1M others, created in a shuffled order (steady state: the batch is looked up among
// many rows, and its rows lie scattered in memory).
//   fixed:   ids are hashed into a 26M-row table (the hashing trick), rows found by index;
//   dynamic: the same ranks as full 64-bit keys, rows found through the stripes' hash maps;
//            admission kAlways (every key already admitted: admission only matters for new keys).
// The target: dynamic >= 0.9 x fixed (docs/PERFORMANCE.md "Dynamic rows: speed").
//
// BM_Interleaved runs a step of each store in turn in one loop and reports their ratio: the
// number to quote on a shared machine (see there).
//
//   cmake --build build/release -j2 --target dynamic_store_bench
//   build/release/bench/dynamic_store_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true     (one command line)
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>
#include <vector>

#include "common/hash.h"
#include "common/random.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/optimizer.h"

namespace pstrain {
namespace {

constexpr int kDim = 17;
constexpr int64_t kTableRows = 26000000;
constexpr int64_t kUniqueRows = 38600;
constexpr int64_t kOtherRows = 1000000;

// Distinct ranks of one batch (log-uniform rank, Zipf with s = 1), then kOtherRows more ranks
// for the rows the stores already hold; each rank is an id's identity.
const std::vector<uint64_t>& Ranks(bool batch) {
  static const std::vector<uint64_t>* const all = [] {
    Rng rng(2024);
    std::unordered_set<uint64_t> seen;
    auto* out = new std::vector<uint64_t>;
    while (static_cast<int64_t>(out->size()) < kUniqueRows) {
      const auto rank = static_cast<uint64_t>(std::exp(rng.UniformDouble() * std::log(1e9)));
      if (seen.insert(rank).second) out->push_back(rank);
    }
    while (static_cast<int64_t>(out->size()) < kUniqueRows + kOtherRows) {
      const uint64_t rank = rng.Uniform(uint64_t{1} << 40);
      if (seen.insert(rank).second) out->push_back(rank);
    }
    return out;
  }();
  static const std::vector<uint64_t> b(all->begin(), all->begin() + kUniqueRows);
  static const std::vector<uint64_t> o(all->begin() + kUniqueRows, all->end());
  return batch ? b : o;
}

// The fixed table's row of a rank (sorted like the worker's dedup output).
std::vector<int64_t> FixedIds(const std::vector<uint64_t>& ranks) {
  std::vector<int64_t> ids(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    ids[i] = static_cast<int64_t>(Fmix64(ranks[i]) % kTableRows);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The dynamic table's key of a rank: the 64-bit hash of the raw id, no modulo.
std::vector<uint64_t> DynamicKeys(const std::vector<uint64_t>& ranks) {
  std::vector<uint64_t> keys(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) keys[i] = Fmix64(ranks[i]);
  std::sort(keys.begin(), keys.end());
  return keys;
}

// The warm-up: the batch's ranks and the others, shuffled and applied in batches of
// kUniqueRows (each sorted, as the worker sends them), so that rows are created in an order
// unrelated to the measured batch's: its rows lie scattered in memory, as after many steps.
// shuffled false: the others first, then the batch's own rows, in one batch, in order (what a
// store that just created the batch's rows looks like: they lie in the batch's order in memory,
// which favours the fixed store's walk of sorted ids).
std::vector<std::vector<uint64_t>> WarmupRanks(bool shuffled = true) {
  if (!shuffled) return {Ranks(false), Ranks(true)};
  std::vector<uint64_t> all = Ranks(true);
  all.insert(all.end(), Ranks(false).begin(), Ranks(false).end());
  Rng rng(7);
  for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng.Uniform(i + 1)]);
  std::vector<std::vector<uint64_t>> batches;
  for (size_t b = 0; b < all.size(); b += kUniqueRows) {
    batches.emplace_back(all.begin() + b, all.begin() + std::min(all.size(), b + kUniqueRows));
  }
  return batches;
}

std::vector<float> Grads(int64_t n) {
  Rng rng(1);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal() * 0.01);
  return v;
}

std::shared_ptr<const Optimizer> Adagrad() {
  OptimizerConfig c;
  c.set_type(ADAGRAD);
  c.set_learning_rate(0.01f);
  return std::shared_ptr<const Optimizer>(std::move(Optimizer::Create(c)).value());
}

void Init(int64_t row, float* out) {
  Rng rng(static_cast<uint64_t>(row));
  for (int j = 0; j < kDim; ++j) out[j] = static_cast<float>(rng.Normal() * 0.01);
}

void SetCounters(benchmark::State& state, int64_t rows) {
  state.SetItemsProcessed(state.iterations() * rows);
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

// mode: 0 the whole step (Gather + Apply), 1 Gather only, 2 Apply only.
void BM_Fixed(benchmark::State& state, int mode) {
  const int threads = static_cast<int>(state.range(0));
  EmbeddingStore::Options o;
  o.end = kTableRows;
  o.dim = kDim;
  o.optimizer = Adagrad();
  o.threads = threads;
  o.row_init = Init;
  auto store = std::move(EmbeddingStore::Create(std::move(o))).value();
  const std::vector<int64_t> ids = FixedIds(Ranks(true));
  for (const std::vector<uint64_t>& batch : WarmupRanks()) {
    const std::vector<int64_t> warm = FixedIds(batch);
    const std::vector<float> g = Grads(warm.size() * kDim);
    benchmark::DoNotOptimize(store->Apply(warm, g.data(), 1));
  }
  const std::vector<float> grads = Grads(ids.size() * kDim);
  std::vector<float> out(ids.size() * kDim);
  int64_t step = 1;
  benchmark::DoNotOptimize(store->Apply(ids, grads.data(), ++step));
  for (auto _ : state) {
    if (mode != 2) benchmark::DoNotOptimize(store->Gather(ids, out.data()));
    if (mode != 1) benchmark::DoNotOptimize(store->Apply(ids, grads.data(), ++step));
    benchmark::ClobberMemory();
  }
  SetCounters(state, ids.size());
}

void BM_Dynamic(benchmark::State& state, int mode) {
  const int threads = static_cast<int>(state.range(0));
  DynamicEmbeddingStore::Options o;
  o.dim = kDim;
  o.optimizer = Adagrad();
  o.threads = threads;
  o.row_init = Init;
  auto store = std::move(DynamicEmbeddingStore::Create(std::move(o))).value();
  const std::vector<uint64_t> keys = DynamicKeys(Ranks(true));
  for (const std::vector<uint64_t>& batch : WarmupRanks()) {
    const std::vector<uint64_t> warm = DynamicKeys(batch);
    const std::vector<float> g = Grads(warm.size() * kDim);
    store->Apply(warm, g.data(), 1);
  }
  const std::vector<float> grads = Grads(keys.size() * kDim);
  std::vector<float> out(keys.size() * kDim);
  int64_t step = 1;
  store->Apply(keys, grads.data(), ++step);
  for (auto _ : state) {
    if (mode != 2) store->Gather(keys, out.data());
    if (mode != 1) store->Apply(keys, grads.data(), ++step);
    benchmark::ClobberMemory();
  }
  SetCounters(state, keys.size());
  state.counters["bytes_per_row"] =
      static_cast<double>(store->metrics().bytes) / store->metrics().rows_live;
}

// Both stores in one loop, a step of each in turn, each step timed on its own: on a shared,
// noisy machine both see the same interference, so their ratio is steadier than the ratio of two
// separate benchmarks. Counters: dynamic_over_fixed = (fixed step time) / (dynamic step time),
// the dynamic store's relative speed (>= 0.9 is the target), by wall-clock time, by the
// calling thread's CPU time (threads = 1 only: a thread team's CPU time is not the caller's) and
// by each store's fastest step (_best: the steps least disturbed by other load).
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Args: threads, and 1 for the shuffled row layout (0: the batch's rows created in its order).
void BM_Interleaved(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool shuffled = state.range(1) != 0;
  EmbeddingStore::Options fo;
  fo.end = kTableRows;
  fo.dim = kDim;
  fo.optimizer = Adagrad();
  fo.threads = threads;
  fo.row_init = Init;
  auto fixed = std::move(EmbeddingStore::Create(std::move(fo))).value();
  DynamicEmbeddingStore::Options dop;
  dop.dim = kDim;
  dop.optimizer = Adagrad();
  dop.threads = threads;
  dop.row_init = Init;
  auto dynamic = std::move(DynamicEmbeddingStore::Create(std::move(dop))).value();
  const std::vector<int64_t> ids = FixedIds(Ranks(true));
  const std::vector<uint64_t> keys = DynamicKeys(Ranks(true));
  for (const std::vector<uint64_t>& batch : WarmupRanks(shuffled)) {
    const std::vector<int64_t> warm_ids = FixedIds(batch);
    const std::vector<uint64_t> warm_keys = DynamicKeys(batch);
    const std::vector<float> g = Grads(warm_keys.size() * kDim);
    benchmark::DoNotOptimize(fixed->Apply(warm_ids, g.data(), 1));
    dynamic->Apply(warm_keys, g.data(), 1);
  }
  const std::vector<float> grads = Grads(keys.size() * kDim);
  std::vector<float> out(keys.size() * kDim);
  int64_t step = 1;
  benchmark::DoNotOptimize(fixed->Apply(ids, grads.data(), ++step));
  dynamic->Apply(keys, grads.data(), step);
  double fixed_wall = 0, dynamic_wall = 0, fixed_cpu = 0, dynamic_cpu = 0;
  double fixed_min = 1e9, dynamic_min = 1e9;
  for (auto _ : state) {
    ++step;
    double w = WallSeconds(), c = ThreadCpuSeconds();
    benchmark::DoNotOptimize(fixed->Gather(ids, out.data()));
    benchmark::DoNotOptimize(fixed->Apply(ids, grads.data(), step));
    benchmark::ClobberMemory();
    fixed_min = std::min(fixed_min, WallSeconds() - w);
    fixed_wall += WallSeconds() - w;
    fixed_cpu += ThreadCpuSeconds() - c;
    w = WallSeconds();
    c = ThreadCpuSeconds();
    dynamic->Gather(keys, out.data());
    dynamic->Apply(keys, grads.data(), step);
    benchmark::ClobberMemory();
    dynamic_min = std::min(dynamic_min, WallSeconds() - w);
    dynamic_wall += WallSeconds() - w;
    dynamic_cpu += ThreadCpuSeconds() - c;
  }
  state.counters["fixed_ms"] = 1e3 * fixed_wall / state.iterations();
  state.counters["dynamic_ms"] = 1e3 * dynamic_wall / state.iterations();
  state.counters["dynamic_over_fixed"] = fixed_wall / dynamic_wall;
  // The fastest step of each: the least disturbed by the machine's other load.
  state.counters["dynamic_over_fixed_best"] = fixed_min / dynamic_min;
  if (threads == 1) state.counters["dynamic_over_fixed_cpu"] = fixed_cpu / dynamic_cpu;
}

constexpr auto kMs = benchmark::kMillisecond;
BENCHMARK(BM_Interleaved)
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({1, 0})
    ->Args({2, 0})
    ->UseRealTime()
    ->Unit(kMs);
BENCHMARK_CAPTURE(BM_Fixed, step, 0)->Arg(1)->Arg(2)->UseRealTime()->Unit(kMs);
BENCHMARK_CAPTURE(BM_Dynamic, step, 0)->Arg(1)->Arg(2)->UseRealTime()->Unit(kMs);
BENCHMARK_CAPTURE(BM_Fixed, gather, 1)->Arg(1)->UseRealTime()->Unit(kMs);
BENCHMARK_CAPTURE(BM_Dynamic, gather, 1)->Arg(1)->UseRealTime()->Unit(kMs);
BENCHMARK_CAPTURE(BM_Fixed, apply, 2)->Arg(1)->UseRealTime()->Unit(kMs);
BENCHMARK_CAPTURE(BM_Dynamic, apply, 2)->Arg(1)->UseRealTime()->Unit(kMs);

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
