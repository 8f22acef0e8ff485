// Model kernels and the whole tower at DeepFM's Criteo shape: F = 39 fields, k = 16, MLP
// 400-400-400, 1024 examples per slice, ~16k unique rows per slice (skewed ids, as after dedup).
// The kernel benchmarks mirror the kernel names (worker/model/fm.h, worker/model/mlp.h), so the
// tower's time can be split into its parts:
//   model_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Counters: items_per_second = examples/s; GFLOP/s where a FLOP count is meaningful.
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "bench/gemm_peak.h"
#include "common/parallel.h"
#include "common/random.h"
#include "worker/model/dot_interaction.h"
#include "worker/model/fm.h"
#include "worker/model/isa.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

constexpr int kFields = 39, kDim = 16, kBatch = 1024, kUnique = 16384;

// A slice of kBatch examples over kUnique rows; low slots are hot (u^3 skew), like the frequent
// ids that dedup puts first.
struct Data {
  std::vector<int32_t> slots;
  std::vector<float> scales, labels, rows, dense;
  Tower::Input input() const {
    Tower::Input in;
    in.n = kBatch;
    in.slots = slots.data();
    in.scales = scales.data();
    in.labels = labels.data();
    in.rows = rows.data();
    in.dense = dense.data();
    return in;
  }
};

Data MakeData(const Model& model) {
  Data d;
  Rng rng(1);
  for (int e = 0; e < kBatch * kFields; ++e) {
    const double u = rng.UniformDouble();
    d.slots.push_back(static_cast<int32_t>(kUnique * u * u * u));
    d.scales.push_back(e % kFields < 13 ? static_cast<float>(rng.UniformDouble()) : 1.f);
  }
  for (int b = 0; b < kBatch; ++b) d.labels.push_back(static_cast<float>(rng.Uniform(4) == 0));
  d.rows.resize(static_cast<size_t>(kUnique) * model.row_dim());
  for (int64_t r = 0; r < kUnique; ++r) model.InitRow(r, 7, d.rows.data() + r * model.row_dim());
  d.dense.resize(model.dense_size());
  model.InitDense(7, d.dense.data());
  return d;
}

// Null when the process's ISA path cannot run bf16 (worker/model/isa.h): the benchmark then skips
// with that reason.
std::unique_ptr<Model> MakeModel(ModelType type, bool bf16) {
  ModelConfig config;
  config.set_type(type);
  config.set_embedding_dim(kDim);
  config.set_precision(bf16 ? BF16 : F32);
  config.set_embedding_l2(1e-5f);
  auto model = Model::Create(config, kFields);
  return model.ok() ? *std::move(model) : nullptr;
}

// True (and the benchmark marked skipped, with the reason) when bf16 cannot run on this path.
bool SkipBf16(benchmark::State& state, bool bf16) {
  if (!bf16) return false;
  const absl::Status s = CheckPrecisionSupported(BF16, KernelIsa());
  if (s.ok()) return false;
  state.SkipWithError(std::string(s.message()).c_str());
  return true;
}

SparseShape Shape(bool fm, bool deep) {
  SparseShape s;
  s.num_fields = kFields;
  s.dim = kDim;
  s.fm = fm;
  s.deep = deep;
  return s;
}

// ---- Sparse kernels (one thread) --------------------------------------------------------------

// Gather rows into the MLP input x0 [n, F*k] (with the first-order term), f32 or bf16.
void BM_EmbeddingGather(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;  // the x0 buffer; the kernel converts on any path
  auto model = MakeModel(WIDE_DEEP, false);
  const Data d = MakeData(*model);
  std::vector<float> logits(kBatch), x0f(kBatch * kFields * kDim);
  std::vector<uint16_t> x0b(kBatch * kFields * kDim);
  for (auto _ : state) {
    SparseForward(Shape(false, true), d.input(), 0.f, 0, kBatch, logits.data(), nullptr,
                  bf16 ? nullptr : x0f.data(), bf16 ? x0b.data() : nullptr);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_EmbeddingGather)->ArgName("bf16")->Arg(0)->Arg(1);

// First-order and FM terms, keeping sum_v for backward (FM model: no x0).
void BM_FmForward(benchmark::State& state) {
  auto model = MakeModel(FM, false);
  const Data d = MakeData(*model);
  std::vector<float> logits(kBatch), sum_v(kBatch * kDim);
  for (auto _ : state) {
    SparseForward(Shape(true, false), d.input(), 0.f, 0, kBatch, logits.data(), sum_v.data(),
                  nullptr, nullptr);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_FmForward);

// DeepFM's fused sparse forward: gather + first order + FM, f32 or bf16 x0.
void BM_DeepFmSparseForward(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;  // the x0 buffer; the kernel converts on any path
  auto model = MakeModel(DEEPFM, false);
  const Data d = MakeData(*model);
  std::vector<float> logits(kBatch), sum_v(kBatch * kDim), x0f(kBatch * kFields * kDim);
  std::vector<uint16_t> x0b(kBatch * kFields * kDim);
  for (auto _ : state) {
    SparseForward(Shape(true, true), d.input(), 0.f, 0, kBatch, logits.data(), sum_v.data(),
                  bf16 ? nullptr : x0f.data(), bf16 ? x0b.data() : nullptr);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DeepFmSparseForward)->ArgName("bf16")->Arg(0)->Arg(1);

// Scatter of the row gradients: FM only (fm=1, deep=0) or DeepFM (fm=1, deep=1, reads dx0).
void BM_FmBackward(benchmark::State& state) {
  const bool deep = state.range(0) != 0;
  auto model = MakeModel(deep ? DEEPFM : FM, false);
  const Data d = MakeData(*model);
  std::vector<float> g(kBatch, 0.1f), sum_v(kBatch * kDim, 0.5f),
      dx0(kBatch * kFields * kDim, 0.01f), row_grads(d.rows.size());
  for (auto _ : state) {
    SparseBackward(Shape(true, deep), d.input(), g.data(), sum_v.data(), dx0.data(), 1e-5f, nullptr,
                   int64_t{kBatch} * kFields, row_grads.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_FmBackward)->ArgName("deep")->Arg(0)->Arg(1);

void BM_SigmoidCrossEntropy(benchmark::State& state) {
  std::vector<float> z(kBatch), y(kBatch), g(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    z[b] = std::sin(b * 0.37f) * 4;
    y[b] = b % 3 == 0;
  }
  for (auto _ : state)
    benchmark::DoNotOptimize(SigmoidCrossEntropy(z.data(), y.data(), 0, kBatch, g.data()));
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_SigmoidCrossEntropy);

// ---- One MLP layer (K -> 400, then the 1-unit output), f32 or bf16 ----------------------------

std::unique_ptr<Mlp> MakeLayer(bool bf16, int in, int threads, std::vector<float>* dense) {
  Mlp::Options opt;
  opt.hidden = {{in, 400, 0, int64_t{in} * 400}};
  opt.out_w = int64_t{in} * 400 + 400;
  opt.out_b = opt.out_w + 400;
  opt.bf16 = bf16;
  opt.max_batch = kBatch;
  opt.threads = threads;
  dense->assign(opt.out_b + 1, 0.01f);
  omp_set_num_threads(threads);
  auto mlp = std::move(Mlp::Create(opt)).value();
  if (bf16) {
    std::fill(mlp->input_bf16(), mlp->input_bf16() + kBatch * in, uint16_t{0x3c00});
  } else {
    std::fill(mlp->input_f32(), mlp->input_f32() + kBatch * in, 0.5f);
  }
  return mlp;
}

void SetLayerCounters(benchmark::State& state, double flops_per_example) {
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_example * kBatch * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MlpLayerForward(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const int in = static_cast<int>(state.range(1)), threads = static_cast<int>(state.range(2));
  if (SkipBf16(state, bf16)) return;
  std::vector<float> dense, logits(kBatch);
  auto mlp = MakeLayer(bf16, in, threads, &dense);
  for (auto _ : state) {
    if (!mlp->Forward(kBatch, dense.data(), logits.data()).ok()) state.SkipWithError("forward");
  }
  SetLayerCounters(state, 2.0 * in * 400);
  state.SetLabel(mlp->ImplInfo(kBatch).value_or("?"));
}
BENCHMARK(BM_MlpLayerForward)
    ->ArgNames({"bf16", "K", "threads"})
    ->ArgsProduct({{0, 1}, {624, 400}, {1, 2}})
    ->UseRealTime();

// Backward of the same layer: dW (into dense_grad), dx, the output layer and bias gradients.
void BM_MlpLayerBackward(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const int in = static_cast<int>(state.range(1)), threads = static_cast<int>(state.range(2));
  if (SkipBf16(state, bf16)) return;
  std::vector<float> dense, logits(kBatch), g(kBatch, 0.1f);
  auto mlp = MakeLayer(bf16, in, threads, &dense);
  std::vector<float> grad(dense.size());
  if (!mlp->Forward(kBatch, dense.data(), logits.data()).ok()) state.SkipWithError("forward");
  for (auto _ : state) {
    if (!mlp->Backward(kBatch, dense.data(), g.data(), grad.data()).ok()) {
      state.SkipWithError("backward");
    }
  }
  SetLayerCounters(state, 4.0 * in * 400);
}
BENCHMARK(BM_MlpLayerBackward)
    ->ArgNames({"bf16", "K", "threads"})
    ->ArgsProduct({{0, 1}, {624, 400}, {1, 2}})
    ->UseRealTime();

// ---- DLRM's dot interaction (worker/model/dot_interaction.h), at DLRM's Criteo shape ---------
// m = 40 vectors (the bottom MLP's output and 39 fields) of k = 16: 780 dots an example.

struct DotData {
  DotShape shape{kFields, kDim, /*front=*/true};
  std::vector<float> front, x0, dots, d_front, dx0;
  DotData() {
    Rng rng(7);
    front.resize(kBatch * kDim);
    x0.resize(kBatch * kFields * kDim);
    for (float& v : front) v = static_cast<float>(rng.Normal());
    for (float& v : x0) v = static_cast<float>(rng.Normal());
    dots.resize(kBatch * shape.pairs());
    for (float& v : dots) v = static_cast<float>(rng.Normal());
    d_front.resize(front.size());
    dx0.resize(x0.size());
  }
};

void BM_DotForward(benchmark::State& state) {
  DotData d;
  for (auto _ : state) {
    DotForward(d.shape, kBatch, d.front.data(), d.x0.data(), d.dots.data(), d.shape.pairs(), 1);
    benchmark::DoNotOptimize(d.dots.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DotForward);

void BM_DotBackward(benchmark::State& state) {
  DotData d;
  for (auto _ : state) {
    DotBackward(d.shape, kBatch, d.front.data(), d.x0.data(), d.dots.data(), d.shape.pairs(),
                d.d_front.data(), d.dx0.data(), 1);
    benchmark::DoNotOptimize(d.dx0.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DotBackward);

// ---- The whole tower ----------------------------------------------------------------------

// Per-iteration times as well: on a shared machine the fastest step ("best_ex/s") shows what the
// code does when it has its cores, the mean what it got.
struct StepTimes {
  double best = 1e30;  // seconds
  double mean = 0;
};

// Runs step() once per iteration.
template <typename Step>
StepTimes TimeSteps(benchmark::State& state, Step&& step) {
  StepTimes t;
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (!step()) state.SkipWithError("tower call failed");
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.best = std::min(t.best, s);
    total += s;
  }
  t.mean = total / std::max<int64_t>(1, state.iterations());
  return t;
}

void TowerCounters(benchmark::State& state, const Model& model, int threads, StepTimes t) {
  const double gflop = model.flops_per_example() * kBatch * 1e-9;
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["GFLOP/s"] = gflop / t.mean;
  state.counters["ex/s/thread"] = kBatch / t.mean / threads;
  state.counters["best_ex/s"] = kBatch / t.best;
  state.counters["best_GFLOP/s"] = gflop / t.best;
}

// DeepFM (type 0), LR (1), FM (2), Wide&Deep (3), DCN_V2 (4), DLRM (5), as in
// proto/pstrain/config.proto.
void BM_TowerForwardBackward(benchmark::State& state) {
  const auto type = static_cast<ModelType>(state.range(0));
  const bool bf16 = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  if (SkipBf16(state, bf16)) return;
  auto model = MakeModel(type, bf16);
  const Data d = MakeData(*model);
  auto tower = std::move(model->CreateTower(kBatch, threads)).value();
  std::vector<float> row_grads(d.rows.size()), dense_grad(d.dense.size()), logits(kBatch);
  // The GEMM roof measured just before, under the same machine load: of_roof is the tower's
  // GFLOP/s (MLP + sparse FLOPs) over the rate its GEMMs would reach at oneDNN's peak.
  const double roof = type == DEEPFM ? DeepFmMlpRoofGflops(bf16, threads) : 0.0;
  omp_set_num_threads(threads);
  const StepTimes t = TimeSteps(state, [&] {
    return tower->ForwardBackward(d.input(), row_grads.data(), dense_grad.data(), logits.data())
        .ok();
  });
  TowerCounters(state, *model, threads, t);
  if (roof > 0) {
    state.counters["roof_GFLOP/s"] = roof;
    state.counters["of_roof"] = model->flops_per_example() * kBatch * 1e-9 / t.mean / roof;
  }
}
BENCHMARK(BM_TowerForwardBackward)
    ->ArgNames({"type", "bf16", "threads"})
    ->ArgsProduct({{DEEPFM}, {0, 1}, {1, 2}})
    ->Args({LR, 0, 1})
    ->Args({FM, 0, 1})
    ->Args({WIDE_DEEP, 0, 1})
    ->Args({DCN_V2, 0, 1})  // the blocks' presets at their defaults (DLRM: no DENSE fields, so
    ->Args({DLRM, 0, 1})    // no bottom MLP; 39 vectors, 741 dots)
    ->UseRealTime();

// Per-field dims (ModelInputs::field_dims) at DeepFM's shape, one thread, f32. layout 0: every
// field k = 16 (the fixed-k kernels); 1: the same shapes with one field out of the FM term, which
// sends the sparse kernels down the general path (fm.h FieldLayout) at equal work; 2: mixed dims,
// fields cycling 16 (in the FM term), 8 and 4 (excluded), x0 of 364 floats instead of 624.
void BM_TowerFieldDims(benchmark::State& state) {
  const int layout = static_cast<int>(state.range(0));
  ModelConfig config;
  config.set_type(DEEPFM);
  config.set_embedding_dim(kDim);
  config.set_embedding_l2(1e-5f);
  ModelInputs inputs;
  inputs.num_fields = kFields;
  if (layout == 1) {
    inputs.fm_excluded.assign(kFields, 0);
    inputs.fm_excluded[kFields - 1] = 1;
  } else if (layout == 2) {
    for (int f = 0; f < kFields; ++f) {
      inputs.field_dims.push_back(f % 3 == 0 ? 16 : f % 3 == 1 ? 8 : 4);
      inputs.fm_excluded.push_back(f % 3 != 0);
    }
  }
  auto model = std::move(Model::Create(config, inputs)).value();
  const Data d = MakeData(*model);
  auto tower = std::move(model->CreateTower(kBatch, 1)).value();
  std::vector<float> row_grads(d.rows.size()), dense_grad(d.dense.size()), logits(kBatch);
  omp_set_num_threads(1);
  const StepTimes t = TimeSteps(state, [&] {
    return tower->ForwardBackward(d.input(), row_grads.data(), dense_grad.data(), logits.data())
        .ok();
  });
  TowerCounters(state, *model, 1, t);
}
BENCHMARK(BM_TowerFieldDims)->ArgName("layout")->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

// Evaluation: forward only.
void BM_TowerForward(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  if (SkipBf16(state, bf16)) return;
  auto model = MakeModel(DEEPFM, bf16);
  const Data d = MakeData(*model);
  auto tower = std::move(model->CreateTower(kBatch, threads)).value();
  std::vector<float> logits(kBatch);
  const StepTimes t =
      TimeSteps(state, [&] { return tower->Forward(d.input(), logits.data()).ok(); });
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["best_ex/s"] = kBatch / t.best;
}
BENCHMARK(BM_TowerForward)
    ->ArgNames({"bf16", "threads"})
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->UseRealTime();

// DIN's tower at configs/din.textproto's shape: the 39 Criteo fields plus a history (field 39)
// attended against C3 (field 15) through 36 ReLU units, lengths uniform in [1, 50] (the step
// bench's lists: ~25.5 entries an example), MLP 400-400-400 over 40 x 16 inputs. The attention's
// elementwise work is what this isolates from train_throughput_app's step (no PS, no dedup).
void BM_DinTowerForwardBackward(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr int kDinFields = kFields + 1, kHistory = kFields, kTarget = 15, kMaxLength = 50;
  ModelConfig config;
  config.set_type(DIN);
  config.set_embedding_dim(kDim);
  for (int h : {400, 400, 400}) config.add_hidden(h);
  ModelInputs inputs;
  inputs.num_fields = kDinFields;
  inputs.attention.push_back({kHistory, kTarget, {36}});
  auto model = std::move(Model::Create(config, inputs)).value();
  Data d;
  std::vector<int32_t> offsets = {0};
  Rng rng(1);
  for (int e = 0; e < kBatch * kDinFields; ++e) {
    const int len = e % kDinFields == kHistory ? 1 + static_cast<int>(rng.Uniform(kMaxLength)) : 1;
    for (int i = 0; i < len; ++i) {
      const double u = rng.UniformDouble();
      d.slots.push_back(static_cast<int32_t>(kUnique * u * u * u));
      d.scales.push_back(e % kDinFields == kHistory ? 1.f / len : 1.f);
    }
    offsets.push_back(static_cast<int32_t>(d.slots.size()));
  }
  for (int b = 0; b < kBatch; ++b) d.labels.push_back(static_cast<float>(rng.Uniform(4) == 0));
  d.rows.resize(static_cast<size_t>(kUnique) * model->row_dim());
  for (int64_t r = 0; r < kUnique; ++r) model->InitRow(r, 7, d.rows.data() + r * model->row_dim());
  d.dense.resize(model->dense_size());
  model->InitDense(7, d.dense.data());
  Tower::Input in = d.input();
  in.offsets = offsets.data();
  auto tower = std::move(model->CreateTower(kBatch, threads)).value();
  std::vector<float> row_grads(d.rows.size()), dense_grad(d.dense.size()), logits(kBatch);
  omp_set_num_threads(threads);
  const StepTimes t = TimeSteps(state, [&] {
    return tower->ForwardBackward(in, row_grads.data(), dense_grad.data(), logits.data()).ok();
  });
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["best_ex/s"] = kBatch / t.best;
  state.counters["entries/ex"] = static_cast<double>(d.slots.size()) / kBatch - kFields;
}
BENCHMARK(BM_DinTowerForwardBackward)->ArgName("threads")->Arg(1)->UseRealTime();

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
