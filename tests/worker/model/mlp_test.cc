// The oneDNN MLP against its double-precision twin (ReferenceMlp), in f32 and in bf16 (against
// a twin that rounds to bf16 at the same points), over batch sizes, depths and thread counts.
#include "worker/model/mlp.h"

#include <omp.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "worker/model/reference.h"
#include "worker/model/simd.h"

namespace pstrain {
namespace {

// Relative L2 distance of a (float) from b (double).
template <typename A>
double RelDiff(const A* a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

using MlpParam = std::tuple<bool /*bf16*/, int /*n*/, std::vector<int> /*widths*/, int /*threads*/>;

class MlpTest : public ::testing::TestWithParam<MlpParam> {};

TEST_P(MlpTest, MatchesReference) {
  const auto& [bf16, n, widths, threads] = GetParam();
  if (bf16) PSTRAIN_SKIP_UNLESS_BF16();
  Mlp::Options opt;
  opt.bf16 = bf16;
  opt.max_batch = n;
  opt.threads = threads;
  // Dense vector: [pad, then per layer W, b, then out/w, out/b], as in Model's layout.
  int64_t offset = 3;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    opt.hidden.push_back({widths[l], widths[l + 1], offset, offset + widths[l] * widths[l + 1]});
    offset += widths[l] * widths[l + 1] + widths[l + 1];
  }
  opt.out_w = offset;
  opt.out_b = offset + widths.back();
  const int64_t dense_size = opt.out_b + 1;

  Rng rng(n * 31 + widths.size());
  std::vector<float> dense(dense_size), x0(static_cast<size_t>(n) * widths[0]), g(n);
  for (float& v : dense) v = static_cast<float>(0.3 * rng.Normal());
  for (float& v : x0) v = static_cast<float>(rng.Normal());
  for (float& v : g) v = static_cast<float>(rng.UniformDouble() - 0.5);

  omp_set_num_threads(threads);
  auto mlp = Mlp::Create(opt);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  if (bf16) {
    FloatToBf16(x0.data(), (*mlp)->input_bf16(), x0.size());
  } else {
    std::copy(x0.begin(), x0.end(), (*mlp)->input_f32());
  }
  std::vector<float> logits(n, 0.5f), grad(dense_size, 0.25f);
  ASSERT_TRUE((*mlp)->Forward(n, dense.data(), logits.data()).ok());
  ASSERT_TRUE((*mlp)->Backward(n, dense.data(), g.data(), grad.data()).ok());
  for (float& v : logits) v -= 0.5f;  // Forward adds
  for (float& v : grad) v -= 0.25f;   // Backward adds

  const ReferenceMlpResult ref =
      ReferenceMlp(opt, n, x0.data(), dense.data(), dense_size, g.data(), bf16);
  const double tol = bf16 ? 2e-3 : 2e-6;
  EXPECT_LT(RelDiff(logits.data(), ref.logits), tol);
  EXPECT_LT(RelDiff(grad.data(), ref.dense_grad), tol);
  EXPECT_LT(RelDiff((*mlp)->input_grad(), ref.input_grad), tol);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(grad[i], 0.f) << "touched a non-MLP tensor";
  auto impl = (*mlp)->ImplInfo(n);
  ASSERT_TRUE(impl.ok());
  RecordProperty("impl", *impl);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlpTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 7, 256),
                                            ::testing::Values(std::vector<int>{20, 16},
                                                              std::vector<int>{80, 24, 12, 8},
                                                              std::vector<int>{64, 48, 48},
                                                              // 3 of the f32 backward's 32-column
                                                              // blocks and an 8-column tail
                                                              std::vector<int>{40, 104}),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           std::string widths;
                           for (int w : std::get<2>(info.param)) absl::StrAppend(&widths, "_", w);
                           return absl::StrCat(std::get<0>(info.param) ? "bf16" : "f32", "_n",
                                               std::get<1>(info.param), widths, "_t",
                                               std::get<3>(info.param));
                         });

TEST(MlpTest, RejectsBadShapes) {
  Mlp::Options opt;
  opt.max_batch = 4;
  EXPECT_FALSE(Mlp::Create(opt).ok());  // no layers
  opt.hidden = {{8, 4, 0, 32}, {5, 2, 36, 46}};
  EXPECT_FALSE(Mlp::Create(opt).ok());  // layer 1's input is not layer 0's output
  opt.hidden = {{8, 4, 0, 32}};
  opt.out_w = 36;
  opt.out_b = 40;
  auto mlp = Mlp::Create(opt);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  std::vector<float> dense(41, 0.1f), grad(41), logits(5), g(5);
  EXPECT_EQ((*mlp)->Forward(5, dense.data(), logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*mlp)->Backward(5, dense.data(), g.data(), grad.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*mlp)->Forward(0, dense.data(), logits.data()).ok());
}

// The f32 forward reads a misaligned W_l from an aligned copy (mlp.h): the floats must not
// depend on where the dense vector puts the weights. The same model with every tensor 64-byte
// aligned (no copies) and shifted by one float (every W_l copied) gives the same bits.
TEST(MlpTest, WeightsAlignmentDoesNotChangeTheFloats) {
  const int n = 33;
  const std::vector<int> widths{48, 32, 16};
  Mlp::Options opt;
  opt.max_batch = n;
  int64_t offset = 0;  // each tensor at a multiple of 16 floats
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    opt.hidden.push_back({widths[l], widths[l + 1], offset, offset + widths[l] * widths[l + 1]});
    offset += (widths[l] * widths[l + 1] + widths[l + 1] + 15) / 16 * 16;
  }
  opt.out_w = offset;
  opt.out_b = offset + widths.back();
  const int64_t dense_size = opt.out_b + 1;
  Rng rng(5);
  std::vector<float> values(dense_size), x0(static_cast<size_t>(n) * widths[0]), g(n);
  for (float& v : values) v = static_cast<float>(0.3 * rng.Normal());
  for (float& v : x0) v = static_cast<float>(rng.Normal());
  for (float& v : g) v = static_cast<float>(rng.UniformDouble() - 0.5);
  struct Out {
    std::vector<float> logits, grad, input_grad;
  };
  auto run = [&](int shift) {
    AlignedArray<float> dense(dense_size + 16);
    float* d = dense.data() + shift;
    std::copy(values.begin(), values.end(), d);
    auto mlp = Mlp::Create(opt);
    EXPECT_TRUE(mlp.ok()) << mlp.status();
    std::copy(x0.begin(), x0.end(), (*mlp)->input_f32());
    Out out{std::vector<float>(n, 0.f), std::vector<float>(dense_size, 0.f), {}};
    EXPECT_TRUE((*mlp)->Forward(n, d, out.logits.data()).ok());
    EXPECT_TRUE((*mlp)->Backward(n, d, g.data(), out.grad.data()).ok());
    out.input_grad.assign((*mlp)->input_grad(), (*mlp)->input_grad() + x0.size());
    return out;
  };
  const Out aligned = run(0), shifted = run(1);
  EXPECT_EQ(aligned.logits, shifted.logits);
  EXPECT_EQ(aligned.grad, shifted.grad);
  EXPECT_EQ(aligned.input_grad, shifted.input_grad);
  // Not vacuous: the model computed something.
  EXPECT_NE(aligned.logits, std::vector<float>(n, 0.f));
}

}  // namespace
}  // namespace pstrain
