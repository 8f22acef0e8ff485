// DLRM's dot interaction kernel (worker/model/dot_interaction.h) against its double twin
// (ReferenceDot): with and without the front (bottom MLP) vector, strided outputs, threads, on
// each kernel path the CPU has (AVX2; AVX-512 for k = 16), and the paths against each other.
#include "worker/model/dot_interaction.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "worker/model/reference.h"

namespace pstrain {
namespace {

class DotPathTest : public ::testing::TestWithParam<Isa> {};

// m = F + front crosses the AVX-512 kernels' blocks of 16 columns (m = 15, 16, 17, 32, 33) and
// of 4 and 8 rows; 27 is DLRM's (26 fields and the bottom MLP's vector).
TEST_P(DotPathTest, MatchesReference) {
  PSTRAIN_SCOPED_KERNEL_ISA(GetParam());
  for (bool front : {false, true}) {
    for (int F : {1, 2, 5, 15, 16, 26, 32, 39, 70}) {
      for (int k : {1, 4, 16}) {
        if (!front && F == 1) continue;  // no pairs
        // Only the AVX-512 kernels (k = 16) have blocks of 16 columns (kept off the AVX2 path,
        // which CI also runs under QEMU).
        const bool block_edge = F == 15 || F == 16 || F == 26 || F == 32;
        if (block_edge && (k != 16 || GetParam() == Isa::kAvx2)) continue;
        SCOPED_TRACE(testing::Message() << "front " << front << " F " << F << " k " << k);
        const DotShape shape{F, k, front};
        const int n = 37, m = F + (front ? 1 : 0);
        ASSERT_EQ(shape.pairs(), m * (m - 1) / 2);
        const int64_t P = shape.pairs(), stride = P + 3;  // outputs inside a wider row
        Rng rng(F * 100 + k);
        std::vector<float> f(n * k), x0(n * F * k), d(n * stride);
        for (float& v : f) v = static_cast<float>(rng.Normal());
        for (float& v : x0) v = static_cast<float>(rng.Normal());
        for (float& v : d) v = static_cast<float>(rng.Normal());
        std::vector<float> dots(n * stride, 7.f), dfront(n * k, 9.f), dx0(n * F * k, 9.f);
        DotForward(shape, n, front ? f.data() : nullptr, x0.data(), dots.data(), stride, 2);
        DotBackward(shape, n, front ? f.data() : nullptr, x0.data(), d.data(), stride,
                    front ? dfront.data() : nullptr, dx0.data(), 2);
        std::vector<float> packed(n * P);
        for (int b = 0; b < n; ++b) {
          for (int64_t p = 0; p < P; ++p) packed[b * P + p] = d[b * stride + p];
        }
        const ReferenceDotResult ref =
            ReferenceDot(shape, n, front ? f.data() : nullptr, x0.data(), packed.data());
        for (int b = 0; b < n; ++b) {
          for (int64_t p = 0; p < P; ++p) {
            const double want = ref.dots[b * P + p];
            ASSERT_NEAR(dots[b * stride + p], want, 1e-5 * (1 + std::fabs(want)));
          }
          for (int64_t p = P; p < stride; ++p) ASSERT_EQ(dots[b * stride + p], 7.f);  // untouched
        }
        for (size_t i = 0; i < dx0.size(); ++i) {
          ASSERT_NEAR(dx0[i], ref.input_grad[i], 1e-5 * (1 + std::fabs(ref.input_grad[i])));
        }
        if (front) {
          for (size_t i = 0; i < dfront.size(); ++i) {
            ASSERT_NEAR(dfront[i], ref.front_grad[i], 1e-5 * (1 + std::fabs(ref.front_grad[i])));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, DotPathTest, ::testing::Values(Isa::kAvx2, Isa::kAvx512Core),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

// The AVX-512 kernels sum in the AVX2 kernels' order (over d from 0 forward; over j in
// increasing order backward), so both paths give the same floats: a model trained on one path
// scores the same on the other.
TEST(DotInteractionTest, Avx512PathGivesTheAvx2PathsFloats) {
  const DotShape shape{26, 16, true};
  const int n = 9, m = 27;
  const int64_t P = shape.pairs();
  Rng rng(3);
  std::vector<float> f(n * 16), x0(n * 26 * 16), d(n * P);
  for (float& v : f) v = static_cast<float>(rng.Normal());
  for (float& v : x0) v = static_cast<float>(rng.Normal());
  for (float& v : d) v = static_cast<float>(rng.Normal());
  auto run = [&](Isa isa, std::vector<float>* dots, std::vector<float>* grads) {
    ScopedKernelIsa path(isa);
    if (!path.status().ok()) return false;
    dots->assign(n * P, 0.f);
    grads->assign(n * m * 16, 0.f);
    DotForward(shape, n, f.data(), x0.data(), dots->data(), P, 1);
    DotBackward(shape, n, f.data(), x0.data(), d.data(), P, grads->data(),
                grads->data() + n * 16, 1);
    return true;
  };
  std::vector<float> dots2, grads2, dots512, grads512;
  ASSERT_TRUE(run(Isa::kAvx2, &dots2, &grads2));
  if (!run(Isa::kAvx512Core, &dots512, &grads512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  EXPECT_EQ(dots512, dots2);
  EXPECT_EQ(grads512, grads2);
}

// dots(i, j) = <e_i, e_j> in the documented order: (0,1), (0,2), (1,2) for three vectors.
TEST(DotInteractionTest, PairOrderIsTheUpperTriangleByRows) {
  const DotShape shape{2, 2, true};
  const std::vector<float> front{1, 2}, x0{3, 4, 5, 6};
  std::vector<float> dots(3);
  DotForward(shape, 1, front.data(), x0.data(), dots.data(), 3, 1);
  EXPECT_EQ(dots, (std::vector<float>{1 * 3 + 2 * 4, 1 * 5 + 2 * 6, 3 * 5 + 4 * 6}));
}

}  // namespace
}  // namespace pstrain
