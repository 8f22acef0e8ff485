// DLRM's bottom MLP (worker/model/bottom_mlp.h) under precision BF16 against the same MLP in f32:
// its GEMMs take bf16 operands (Options::bf16), so its output and weight gradients are within
// bf16 rounding of f32's, and not equal to them (bf16 really ran). Skipped, with the reason,
// where the path has no bf16.
#include "worker/model/bottom_mlp.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"

namespace pstrain {
namespace {

// ||a - b|| / ||b|| over the first n floats.
double RelativeL2(const float* a, const float* b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

TEST(BottomMlpTest, Bf16IsWithinBf16RoundingOfF32) {
  PSTRAIN_SKIP_UNLESS_BF16();
  // 13 numeric fields -> 64 -> 32 -> 16 (DLRM's shape, narrower), 50 examples.
  BottomMlp::Options opt;
  int64_t offset = 0;
  int in = 13;
  for (int out : {64, 32, 16}) {
    opt.layers.push_back({in, out, offset, offset + int64_t{in} * out});
    offset += int64_t{in} * out + out;
    in = out;
  }
  const int n = 50;
  opt.max_batch = n;
  Rng rng(5);
  std::vector<float> dense(offset), x(n * 13), g(n * 16);
  // Weights N(0, 0.09 / in) and biases of 3 keep the pre-activations near 3 +- 1, away from
  // ReLU's kink: there one rounding flips a unit, which moves a bias gradient (a column sum of
  // random-sign gradients over 50 examples) by a whole term, and both paths would be right and
  // 10% apart (as they were with weights N(0, 0.09) and biases of 0).
  for (const Mlp::Layer& l : opt.layers) {
    for (int64_t i = 0; i < int64_t{l.in} * l.out; ++i) {
      dense[l.w + i] = static_cast<float>(0.3 / std::sqrt(l.in) * rng.Normal());
    }
    for (int j = 0; j < l.out; ++j) dense[l.b + j] = 3.f;
  }
  for (float& v : x) v = static_cast<float>(rng.Normal());
  for (float& v : g) v = static_cast<float>(rng.Normal());

  auto run = [&](bool bf16, std::vector<float>* out, std::vector<float>* grad) {
    BottomMlp::Options o = opt;
    o.bf16 = bf16;
    auto mlp = BottomMlp::Create(o);
    ASSERT_TRUE(mlp.ok()) << mlp.status();
    std::copy(x.begin(), x.end(), (*mlp)->input());
    ASSERT_TRUE((*mlp)->Forward(n, dense.data()).ok());
    out->assign((*mlp)->output(), (*mlp)->output() + n * 16);
    grad->assign(dense.size(), 0.f);
    ASSERT_TRUE((*mlp)->Backward(n, dense.data(), g.data(), grad->data()).ok());
  };
  std::vector<float> out32, grad32, out16, grad16;
  run(false, &out32, &grad32);
  run(true, &out16, &grad16);
  const double out_err = RelativeL2(out16.data(), out32.data(), out32.size());
  const double grad_err = RelativeL2(grad16.data(), grad32.data(), grad32.size());
  std::printf("bf16 against f32, relative L2: output %.3g, gradients %.3g\n", out_err, grad_err);
  EXPECT_LT(out_err, 1e-2);
  EXPECT_LT(grad_err, 1e-2);
  EXPECT_GT(out_err, 1e-5);  // the bf16 path ran, not the f32 one
  EXPECT_GT(grad_err, 1e-5);
}

}  // namespace
}  // namespace pstrain
