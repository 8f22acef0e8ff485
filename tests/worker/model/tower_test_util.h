// What the tower tests (model_test, list_model_test, target_attention_test, field_dims_test)
// share: a batch slice in the form the tower and its double twin take, one ForwardBackward run,
// and the central-difference check of a gradient. Each test keeps its own slice generator (the
// shapes it probes differ); they all fill a TowerSlice.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/reference.h"

namespace pstrain {

// A batch slice: n examples, the cells' slots into `rows` (rows_used rows at the model's stride)
// with their scales, and with lists, the cells' offsets into slots (empty: one entry a cell).
struct TowerSlice {
  int n = 0;
  int rows_used = 0;
  std::vector<int32_t> offsets, slots;
  std::vector<float> scales, labels, rows, dense;

  Tower::Input input() const {
    Tower::Input in;
    in.n = n;
    in.slots = slots.data();
    in.scales = scales.data();
    in.labels = labels.data();
    in.rows = rows.data();
    in.dense = dense.data();
    in.offsets = offsets.empty() ? nullptr : offsets.data();
    return in;
  }
  // The same slice for the double twin, over the caller's double copies of rows and dense.
  ReferenceInput ref(const std::vector<double>& r, const std::vector<double>& d) const {
    ReferenceInput in;
    in.n = n;
    in.slots = slots.data();
    in.scales = scales.data();
    in.labels = labels.data();
    in.rows = r.data();
    in.dense = d.data();
    in.offsets = offsets.empty() ? nullptr : offsets.data();
    return in;
  }
};

// The model's initial dense vector with every 1-D tensor (the biases) drawn from N(0, 0.1^2), so
// that no block starts at a point where its gradient is trivially zero.
inline void RandomDense(const Model& model, uint64_t seed, Rng* rng, std::vector<float>* dense) {
  dense->resize(model.dense_size());
  model.InitDense(seed, dense->data());
  for (const DenseTensor& t : model.dense_layout()) {
    if (t.shape.size() != 1) continue;
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      (*dense)[t.offset + i] = static_cast<float>(0.1 * rng->Normal());
    }
  }
}

struct TowerGrads {
  std::vector<float> logits, rows, dense;
  double loss = 0;
};

// ForwardBackward of one tower over the slice, on gradient buffers prefilled with `fill` (which
// the call must keep: a tower adds into them), returned with the fill taken off.
inline TowerGrads RunTower(const Model& model, const TowerSlice& s, int threads,
                           float fill = 0.f) {
  auto tower = model.CreateTower(std::max(s.n, 1), threads);
  EXPECT_TRUE(tower.ok()) << tower.status();
  TowerGrads g;
  g.logits.assign(s.n, 0.f);
  g.rows.assign(s.rows.size(), fill);
  g.dense.assign(s.dense.size(), fill);
  if (!tower.ok()) return g;
  auto loss = (*tower)->ForwardBackward(s.input(), g.rows.data(), g.dense.data(), g.logits.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  g.loss = loss.ok() ? *loss : 0;
  for (float& v : g.rows) v -= fill;
  for (float& v : g.dense) v -= fill;
  return g;
}

// grad[i] against the central difference of `objective` in (*params)[i], for i in [begin, end)
// that `skip` (if any) does not exclude; the first mismatch fails naming what[i]. Also fails when
// every difference is at most min_abs_grad: a check of zeros against zeros proves nothing.
inline void ExpectCentralDifferences(const std::function<double()>& objective,
                                     std::vector<double>* params, const std::vector<float>& grad,
                                     int64_t begin, int64_t end, const std::string& what,
                                     double min_abs_grad = 1e-2,
                                     const std::function<bool(int64_t)>& skip = {}) {
  const double h = 1e-6;
  double max_grad = 0;
  for (int64_t i = begin; i < end; ++i) {
    if (skip && skip(i)) continue;
    const double saved = (*params)[i];
    (*params)[i] = saved + h;
    const double up = objective();
    (*params)[i] = saved - h;
    const double down = objective();
    (*params)[i] = saved;
    const double fd = (up - down) / (2 * h);
    ASSERT_NEAR(grad[i], fd, 2e-4 + 1e-3 * std::fabs(fd)) << what << "[" << i << "]";
    max_grad = std::max(max_grad, std::fabs(fd));
  }
  EXPECT_GT(max_grad, min_abs_grad) << what << ": gradients are trivially zero";
}

inline void ExpectCentralDifferences(const std::function<double()>& objective,
                                     std::vector<double>* params, const std::vector<float>& grad,
                                     const std::string& what) {
  ExpectCentralDifferences(objective, params, grad, 0, static_cast<int64_t>(params->size()),
                           what);
}

}  // namespace pstrain
