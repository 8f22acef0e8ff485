// Lists of ids against single ids (issue 27's speed target: with lists of mean length 10, the
// step's examples/s per id looked up is >= 0.7 of the single-valued path's, same run).
//
// Schema: 13 numeric-like fields (one id each) and 26 categorical fields; DeepFM k = 16, MLP
// 400-400-400, 1024 examples a step. "Single": each categorical field holds one id (39 ids an
// example). "Lists": each categorical field is a MEAN list of geometric length, mean 10, at most
// 64 (about 13 + 26 x 10 = 273 ids an example); an empty list is the field's missing row.
// Ids are skewed (u^3 over each field's 20k values), as the dedup of real batches sees them.
//
//   BM_Tower/{0,1}: one tower's ForwardBackward on the deduplicated slice (the sparse kernels
//                   and the MLP), 2 threads.
//   BM_Step/{0,1}:  the whole in-process training step (TrainStep on LocalParams, 2 towers of 512):
//                   dedup, gather, towers, update.
// Counters: items_per_second = examples/s; ids_per_second = ids looked up per second (entries,
// before dedup). The target compares ids_per_second of /1 with /0.
//   list_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"

#include <cmath>
#include <memory>
#include <vector>

#include "common/random.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/dedup.h"
#include "worker/params/local_params.h"
#include "worker/train/train_step.h"

namespace pstrain {
namespace {

constexpr int kNumeric = 13, kCategorical = 26, kBatch = 1024, kValues = 20000;

Config MakeConfig(bool lists) {
  Config c;
  FeatureConfig* f = c.mutable_features();
  f->set_preset(NO_PRESET);
  for (int i = 0; i < kNumeric + kCategorical; ++i) {
    FieldSpec* fs = f->add_field();
    fs->set_name(i < kNumeric ? "I" + std::to_string(i + 1) : "C" + std::to_string(i - kNumeric + 1));
    fs->set_vocab_size(i < kNumeric ? 1024 : 100000);
    if (lists && i >= kNumeric) fs->mutable_list()->set_max_length(64);
  }
  c.mutable_model()->set_embedding_dim(16);
  c.mutable_dense_optimizer()->set_type(ADAM);
  c.mutable_dense_optimizer()->set_learning_rate(1e-3f);
  return c;
}

Batch MakeBatch(const FeatureSpec& spec, bool lists, uint64_t seed) {
  Rng rng(seed);
  RawRows raw;
  raw.Clear(spec.num_fields());
  const double log_q = std::log(10.0 / 11.0);
  auto skewed = [&] {
    const double u = rng.UniformDouble();
    return static_cast<uint64_t>(kValues * u * u * u);
  };
  for (int r = 0; r < kBatch; ++r) {
    const int row = raw.AddRow(static_cast<float>(rng.Uniform(4) == 0));
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (f < kNumeric || !lists) {
        raw.SetCategorical(row, f, skewed());
        continue;
      }
      raw.StartList(row, f);
      const double len = std::floor(std::log(1.0 - rng.UniformDouble()) / log_q);
      for (int i = 0; i < std::min(len, 64.0); ++i) raw.AddToList(row, f, skewed());
    }
  }
  Batch b;
  b.Clear(spec.num_fields());
  spec.Encode(raw, &b);
  return b;
}

struct Setup {
  Config config;
  std::unique_ptr<FeatureSpec> spec;
  std::unique_ptr<Model> model;
  std::vector<Batch> batches;
  explicit Setup(bool lists) : config(MakeConfig(lists)) {
    spec = std::make_unique<FeatureSpec>(*FeatureSpec::Create(config.features()));
    model = *Model::Create(config.model(), spec->num_fields());
    for (int i = 0; i < 8; ++i) batches.push_back(MakeBatch(*spec, lists, 1 + i));
  }
  double ids_per_example() const {
    double ids = 0;
    for (const Batch& b : batches) ids += static_cast<double>(b.ids.size()) / b.size;
    return ids / batches.size();
  }
};

void BM_Tower(benchmark::State& state) {
  const bool lists = state.range(0) != 0;
  Setup s(lists);
  const Batch& b = s.batches[0];
  Deduper dedup;
  std::vector<int64_t> unique;
  std::vector<int32_t> slots;
  dedup.Run(b.ids, &unique, &slots);
  const int D = s.model->row_dim();
  std::vector<float> rows(unique.size() * D), dense(s.model->dense_size());
  for (size_t u = 0; u < unique.size(); ++u) s.model->InitRow(unique[u], 7, rows.data() + u * D);
  s.model->InitDense(7, dense.data());
  std::vector<float> row_grads(rows.size()), dense_grad(dense.size());
  auto tower = *s.model->CreateTower(kBatch, 2);
  Tower::Input in;
  in.n = b.size;
  in.slots = slots.data();
  in.scales = b.values.data();
  in.labels = b.labels.data();
  in.rows = rows.data();
  in.dense = dense.data();
  in.offsets = lists ? b.offsets.data() : nullptr;
  for (auto _ : state) {
    auto loss = tower->ForwardBackward(in, row_grads.data(), dense_grad.data(), nullptr);
    benchmark::DoNotOptimize(loss);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["ids_per_example"] = static_cast<double>(b.ids.size()) / b.size;
  state.counters["ids_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * b.ids.size(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Tower)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Step(benchmark::State& state) {
  const bool lists = state.range(0) != 0;
  Setup s(lists);
  auto params = *LocalParams::Create(*s.model, s.spec->total_rows(), s.config, 2);
  auto step = *TrainStep::Create(*s.model, 2, kBatch / 2, 1);
  int64_t i = 0;
  for (auto _ : state) {
    auto r = step->Run(s.batches[i % s.batches.size()], i + 1, params.get());
    benchmark::DoNotOptimize(r);
    ++i;
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["ids_per_example"] = s.ids_per_example();
  state.counters["ids_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kBatch * s.ids_per_example(),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Step)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
