// Optimizer and parameter-store microbenchmarks, on the shapes of DeepFM on Criteo:
//   sparse: the unique rows of one 1024 x 39 batch, ~38.6k rows of 17 floats ([w, v_0..v_15]),
//           drawn with Zipf-like popularity from a 26M-row table (26 x 1M categorical + numeric);
//   dense:  ~600k floats (the MLP 400-400-400 over 39 x 16 inputs).
// Each store benchmark has a peer in the same run: the bare kernel over packed rows (no store,
// no locks), the reference twin, and a plain memcpy of the same bytes (the memory ceiling).
//
//   ninja -C build/release optimizer_bench
//   build/release/bench/optimizer_bench --benchmark_out=optimizer_bench.json
//       --benchmark_out_format=json     (one command line)
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "common/hash.h"
#include "common/random.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/optimizer.h"
#include "ps/store/optimizer_ref.h"

namespace pstrain {
namespace {

constexpr int kDim = 17;
constexpr int64_t kTableRows = 26000000;
constexpr int64_t kUniqueRows = 38600;
constexpr int64_t kDenseSize = 600000;

// The batch: kUniqueRows distinct ids, popular ranks first (log-uniform rank, i.e. Zipf with
// s = 1), scattered over the table by a hash as the hashing trick does; sorted like the
// worker's dedup output.
const std::vector<int64_t>& BatchIds() {
  static const std::vector<int64_t> ids = [] {
    Rng rng(2024);
    std::unordered_set<int64_t> seen;
    std::vector<int64_t> out;
    while (static_cast<int64_t>(out.size()) < kUniqueRows) {
      const auto rank = static_cast<uint64_t>(std::exp(rng.UniformDouble() * std::log(1e9)));
      const auto id = static_cast<int64_t>(Fmix64(rank) % kTableRows);
      if (seen.insert(id).second) out.push_back(id);
    }
    std::sort(out.begin(), out.end());
    return out;
  }();
  return ids;
}

std::vector<float> RandomFloats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal() * 0.01);
  return v;
}

OptimizerConfig Config(OptimizerType type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(0.01f);
  return c;
}

std::shared_ptr<const Optimizer> Make(OptimizerType type) {
  return std::shared_ptr<const Optimizer>(std::move(Optimizer::Create(Config(type))).value());
}

std::unique_ptr<EmbeddingStore> MakeStore(OptimizerType type, int threads) {
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = kTableRows;
  o.dim = kDim;
  o.optimizer = Make(type);
  o.threads = threads;
  o.row_init = [](int64_t row, float* out) {
    Rng rng(static_cast<uint64_t>(row));
    for (int j = 0; j < kDim; ++j) out[j] = static_cast<float>(rng.Normal() * 0.01);
  };
  return std::move(EmbeddingStore::Create(std::move(o))).value();
}

void SetRowCounters(benchmark::State& state, int64_t rows, int64_t bytes_per_row) {
  state.SetItemsProcessed(state.iterations() * rows);
  state.SetBytesProcessed(state.iterations() * rows * bytes_per_row);
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

// Store Apply of one batch's unique rows (all rows already initialized, as in steady state).
// Bytes: the row and its state read and written, plus the gradient read.
// With new_generation, the change log's worst case: every Apply in a new generation (as if a
// checkpoint began between any two pushes), so every row is a first update of its generation
// and is appended to its stripe's log; the previous generation's log is dropped (BeginGeneration,
// a full checkpoint's call) outside the timing. Against the plain case: the cost of the appends.
void BM_StoreApply(benchmark::State& state, OptimizerType type, bool new_generation = false) {
  auto store = MakeStore(type, static_cast<int>(state.range(0)));
  const std::vector<int64_t>& ids = BatchIds();
  const std::vector<float> grads = RandomFloats(ids.size() * kDim, 1);
  int64_t step = 0;
  benchmark::DoNotOptimize(store->Apply(ids, grads.data(), ++step));  // first touch
  for (auto _ : state) {
    if (new_generation) {
      state.PauseTiming();
      const uint32_t g = store->generation() + 1;
      store->BeginGeneration(g, g);
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(store->Apply(ids, grads.data(), ++step));
  }
  SetRowCounters(state, ids.size(), (2 * (kDim + store->state_floats()) + kDim) * 4);
}

// Store Gather of the same rows (initialized).
void BM_StoreGather(benchmark::State& state) {
  auto store = MakeStore(ADAGRAD, static_cast<int>(state.range(0)));
  const std::vector<int64_t>& ids = BatchIds();
  const std::vector<float> grads = RandomFloats(ids.size() * kDim, 1);
  benchmark::DoNotOptimize(store->Apply(ids, grads.data(), 1));
  std::vector<float> out(ids.size() * kDim);
  for (auto _ : state) {
    benchmark::DoNotOptimize(store->Gather(ids, out.data()));
    benchmark::ClobberMemory();
  }
  SetRowCounters(state, ids.size(), 2 * kDim * 4);
}

// Peer: the bare kernel over the same number of rows packed contiguously (no ids, no locks).
void BM_KernelApplyRows(benchmark::State& state, OptimizerType type) {
  auto opt = Make(type);
  const int64_t rows = kUniqueRows, sf = opt->StateFloats(kDim);
  std::vector<float> w = RandomFloats(rows * kDim, 2), s(rows * sf);
  for (int64_t r = 0; r < rows; ++r) opt->InitState(s.data() + r * sf, kDim);
  const std::vector<float> grads = RandomFloats(rows * kDim, 1);
  std::vector<float*> wp(rows), sp(rows);
  for (int64_t r = 0; r < rows; ++r) {
    wp[r] = &w[r * kDim];
    sp[r] = s.data() + r * sf;
  }
  for (auto _ : state) {
    opt->ApplyRows(rows, wp.data(), sp.data(), grads.data(), kDim, opt->LearningRate(1));
    benchmark::ClobberMemory();
  }
  SetRowCounters(state, rows, (2 * (kDim + sf) + kDim) * 4);
}

// Peer: the reference twin (double arithmetic, element by element) on the same packed rows.
void BM_RefApplyRows(benchmark::State& state, OptimizerType type) {
  const OptimizerConfig config = Config(type);
  const int64_t rows = kUniqueRows, sf = ref::StateFloats(config, kDim);
  std::vector<float> w = RandomFloats(rows * kDim, 2), s(rows * sf);
  for (int64_t r = 0; r < rows; ++r) ref::InitState(config, s.data() + r * sf, kDim);
  const std::vector<float> grads = RandomFloats(rows * kDim, 1);
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) {
      ref::ApplyRow(config, &w[r * kDim], s.data() + r * sf, &grads[r * kDim], kDim, 1);
    }
    benchmark::ClobberMemory();
  }
  SetRowCounters(state, rows, (2 * (kDim + sf) + kDim) * 4);
}

// Ceiling: memcpy of the batch's rows, contiguous, in and out.
void BM_MemcpyRows(benchmark::State& state) {
  const std::vector<float> src = RandomFloats(kUniqueRows * kDim, 3);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  SetRowCounters(state, kUniqueRows, 2 * kDim * 4);
}

// Dense Adam over the MLP's ~600k floats: w, m, v read and written, g read.
void BM_DenseAdam(benchmark::State& state) {
  DenseStore::Options o;
  o.size = kDenseSize;
  o.optimizer = Make(ADAM);
  o.threads = static_cast<int>(state.range(0));
  auto store = std::move(DenseStore::Create(o)).value();
  const std::vector<float> grad = RandomFloats(kDenseSize, 4);
  int64_t step = 0;
  for (auto _ : state) store->Apply(grad.data(), ++step);
  state.SetItemsProcessed(state.iterations() * kDenseSize);
  state.SetBytesProcessed(state.iterations() * kDenseSize * 7 * 4);
}

// Ceiling for the dense update: memcpy of the same 7 x 4 bytes per float (3.5 copies).
void BM_DenseMemcpy(benchmark::State& state) {
  const std::vector<float> src = RandomFloats(kDenseSize * 7 / 2, 5);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kDenseSize);
  state.SetBytesProcessed(state.iterations() * src.size() * 4 * 2);
}

BENCHMARK_CAPTURE(BM_StoreApply, adagrad, ADAGRAD)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_StoreApply, adagrad_new_generation, ADAGRAD, true)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_StoreApply, adam, ADAM)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_StoreApply, ftrl, FTRL)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_StoreApply, sgd, SGD)->Arg(1)->UseRealTime();
BENCHMARK(BM_StoreGather)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_KernelApplyRows, adagrad, ADAGRAD);
BENCHMARK_CAPTURE(BM_KernelApplyRows, adam, ADAM);
BENCHMARK_CAPTURE(BM_RefApplyRows, adagrad, ADAGRAD);
BENCHMARK_CAPTURE(BM_RefApplyRows, adam, ADAM);
BENCHMARK(BM_MemcpyRows);
BENCHMARK(BM_DenseAdam)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_DenseMemcpy);

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
