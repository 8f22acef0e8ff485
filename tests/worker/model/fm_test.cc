// The sparse kernels on their own, on every ISA path this CPU has (AVX2 vectors for k a multiple
// of 8, AVX-512 for multiples of 16, the scalar loops for other k), against a double-precision
// twin; the slot-ownership split used for parallel scatter, the loss at extreme logits, and bf16
// rounding (vcvtneps2bf16 against the scalar rounding).
#include "worker/model/fm.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "worker/model/simd.h"

namespace pstrain {
namespace {

struct Slice {
  std::vector<int32_t> slots;
  std::vector<float> scales, rows;
  Tower::Input input(int n) const {
    Tower::Input in;
    in.n = n;
    in.slots = slots.data();
    in.scales = scales.data();
    in.rows = rows.data();
    return in;
  }
};

Slice MakeSlice(int n, int F, int k, int unique, uint64_t seed) {
  Slice s;
  Rng rng(seed);
  for (int e = 0; e < n * F; ++e) {
    s.slots.push_back(static_cast<int32_t>(rng.Uniform(unique)));
    s.scales.push_back(static_cast<float>(rng.UniformDouble() * 2 - 0.5));
  }
  s.rows.resize(static_cast<size_t>(unique) * (1 + k));
  for (float& v : s.rows) v = static_cast<float>(rng.Normal());
  return s;
}

// Scalar twin of SparseForward + SparseBackward for one shape, in double.
void Reference(const SparseShape& shape, const Slice& s, int n, const std::vector<float>& g,
               const std::vector<float>& dx0, float l2, std::vector<double>* logits,
               std::vector<double>* x0, std::vector<double>* row_grads) {
  const int F = shape.num_fields, k = shape.dim, rd = shape.row_dim();
  logits->assign(n, 0.0);
  x0->assign(static_cast<size_t>(n) * F * k, 0.0);
  row_grads->assign(s.rows.size(), 0.0);
  for (int b = 0; b < n; ++b) {
    std::vector<double> sum(k, 0.0), sq(k, 0.0);
    double z = 0.25;
    for (int f = 0; f < F; ++f) {
      const int e = b * F + f;
      const double sc = s.scales[e];
      const float* r = &s.rows[static_cast<size_t>(s.slots[e]) * rd];
      z += sc * r[0];
      for (int j = 0; j < k; ++j) {
        (*x0)[static_cast<size_t>(e) * k + j] = sc * r[1 + j];
        sum[j] += sc * r[1 + j];
        sq[j] += sc * r[1 + j] * sc * r[1 + j];
      }
    }
    for (int j = 0; j < k && shape.fm; ++j) z += 0.5 * (sum[j] * sum[j] - sq[j]);
    (*logits)[b] = z;
    for (int f = 0; f < F; ++f) {
      const int e = b * F + f;
      const double sc = s.scales[e];
      const float* r = &s.rows[static_cast<size_t>(s.slots[e]) * rd];
      double* gr = &(*row_grads)[static_cast<size_t>(s.slots[e]) * rd];
      gr[0] += g[b] * sc + l2 * r[0];
      for (int j = 0; j < k; ++j) {
        double d = 0;
        if (shape.fm) d += g[b] * (sum[j] - sc * r[1 + j]);
        if (shape.deep) d += dx0[static_cast<size_t>(e) * k + j];
        gr[1 + j] += sc * d + l2 * r[1 + j];
      }
    }
  }
}

class SparseKernelTest
    : public ::testing::TestWithParam<std::tuple<Isa, int, bool, bool, bool>> {};

TEST_P(SparseKernelTest, MatchesScalarTwin) {
  const auto [isa, dim, fm, deep, bf16] = GetParam();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  const int k = fm || deep ? dim : 0;  // without FM or MLP the rows are just [w] (LR)
  const int n = 37, F = 11, unique = 50;
  SparseShape shape;
  shape.num_fields = F;
  shape.dim = k;
  shape.fm = fm;
  shape.deep = deep;
  const Slice s = MakeSlice(n, F, k, unique, k * 4 + fm * 2 + deep);
  Rng rng(3);
  std::vector<float> g(n), dx0(static_cast<size_t>(n) * F * k);
  for (float& v : g) v = static_cast<float>(rng.UniformDouble() - 0.5);
  for (float& v : dx0) v = static_cast<float>(rng.Normal());

  std::vector<float> logits(n), sum_v(static_cast<size_t>(n) * k), x0(dx0.size(), -1.f);
  std::vector<uint16_t> x0b(dx0.size());
  // Two example ranges, as two threads would run them.
  for (auto [begin, end] : {std::pair<int, int>{0, 20}, {20, n}}) {
    SparseForward(shape, s.input(n), 0.25f, begin, end, logits.data(), sum_v.data(),
                  deep && !bf16 ? x0.data() : nullptr, deep && bf16 ? x0b.data() : nullptr);
  }
  std::vector<float> row_grads(s.rows.size(), 0.f);
  SparseBackward(shape, s.input(n), g.data(), sum_v.data(), dx0.data(), 0.1f, nullptr, n * F,
                 row_grads.data());

  std::vector<double> ref_logits, ref_x0, ref_grads;
  Reference(shape, s, n, g, dx0, 0.1f, &ref_logits, &ref_x0, &ref_grads);
  for (int b = 0; b < n; ++b) {
    ASSERT_NEAR(logits[b], ref_logits[b], 1e-4 * (1 + std::fabs(ref_logits[b]))) << b;
  }
  if (deep) {
    for (size_t i = 0; i < x0.size(); ++i) {
      const double got = bf16 ? Bf16ToFloat(x0b[i]) : x0[i];
      ASSERT_NEAR(got, ref_x0[i], (bf16 ? 4e-3 : 1e-6) * (1e-3 + std::fabs(ref_x0[i]))) << i;
    }
  }
  for (size_t i = 0; i < row_grads.size(); ++i) {
    ASSERT_NEAR(row_grads[i], ref_grads[i], 1e-4 * (1 + std::fabs(ref_grads[i]))) << i;
  }
}

// k = 8 and 24 take the AVX2 vectors on every path, 16 / 32 / 64 the widest one, 128 AVX-512
// only (AVX2 stops at 64), 1, 4, 5 the scalar loops.
INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseKernelTest,
    ::testing::Combine(::testing::ValuesIn(kAllIsas), ::testing::Values(1, 4, 5, 8, 16, 24, 32, 64, 128),
                       ::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      const auto& p = info.param;
      return absl::StrCat(IsaName(std::get<0>(p)), "_k", std::get<1>(p),
                          std::get<2>(p) ? "_fm" : "", std::get<3>(p) ? "_deep" : "",
                          std::get<4>(p) ? "_bf16" : "");
    });

TEST(SparseKernelTest, OwnersPartitionTheEntries) {
  const int num = 5000;
  Rng rng(1);
  std::vector<int32_t> slots(num);
  // Heavy duplication, with one very hot slot.
  for (auto& s : slots) s = rng.Uniform(4) == 0 ? 0 : static_cast<int32_t>(rng.Uniform(300));
  for (int owners : {1, 2, 3, 8}) {
    std::vector<int> seen(num, 0);
    std::vector<int32_t> out(num);
    for (int owner = 0; owner < owners; ++owner) {
      const int64_t count = SelectOwnedEntries(slots.data(), num, owner, owners, out.data());
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(OwnerOfSlot(slots[out[i]], owners), owner);
        if (i > 0) {
          ASSERT_LT(out[i - 1], out[i]);
        }
        ++seen[out[i]];
      }
    }
    for (int e = 0; e < num; ++e) ASSERT_EQ(seen[e], 1) << "entry " << e << " owners " << owners;
  }
  // Slots spread over the owners.
  std::vector<int> per_owner(4, 0);
  for (int32_t slot = 0; slot < 4000; ++slot) ++per_owner[OwnerOfSlot(slot, 4)];
  for (int c : per_owner) EXPECT_NEAR(c, 1000, 100);
}

TEST(SparseKernelTest, SigmoidCrossEntropyIsStable) {
  const std::vector<float> z = {-1000.f, -40.f, -1.f, 0.f, 1.f, 40.f, 1000.f};
  const std::vector<float> y = {1.f, 0.f, 1.f, 0.5f, 0.f, 1.f, 0.f};
  std::vector<float> g(z.size());
  double total = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double loss = SigmoidCrossEntropy(z.data(), y.data(), i, i + 1, g.data());
    const double zd = z[i], p = 1 / (1 + std::exp(-zd));
    // -y log p - (1-y) log(1-p), written to stay finite.
    const double expected = std::max(zd, 0.0) - zd * y[i] + std::log1p(std::exp(-std::fabs(zd)));
    EXPECT_NEAR(loss, expected, 1e-6 * (1 + expected)) << z[i];
    EXPECT_NEAR(g[i], p - y[i], 1e-6) << z[i];
    EXPECT_TRUE(std::isfinite(loss));
    total += loss;
  }
  EXPECT_NEAR(SigmoidCrossEntropy(z.data(), y.data(), 0, z.size(), g.data()), total, 1e-9);
  // 1000 + 0 + (1 + log1p(1/e)) + log 2 + (1 + log1p(1/e)) + 0 + 1000.
  EXPECT_NEAR(total, 2002 + 2 * std::log1p(std::exp(-1.0)) + std::log(2.0), 1e-3);
}

class Bf16Test : public ::testing::TestWithParam<Isa> {};

TEST_P(Bf16Test, RoundsToNearestEvenAndVectorMatchesScalar) {
  PSTRAIN_SCOPED_KERNEL_ISA(GetParam());
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  Rng rng(5);
  std::vector<float> x(1000);
  for (float& v : x) v = static_cast<float>(rng.Normal() * std::exp(rng.Normal() * 10));
  std::vector<uint16_t> vec(x.size());
  FloatToBf16(x.data(), vec.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(vec[i], FloatToBf16(x[i])) << x[i];
}

INSTANTIATE_TEST_SUITE_P(Paths, Bf16Test, ::testing::ValuesIn(kAllIsas),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

TEST(Transpose16Test, MatchesScalarTranspose) {
  for (auto [rows, cols] : {std::pair<int, int>{1, 1}, {8, 8}, {7, 13}, {16, 24}, {61, 40}}) {
    std::vector<uint16_t> src(rows * cols), dst((cols + 1) * (rows + 3), 0xffff);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7 + 1);
    const int ld = rows + 3;  // a wider destination: columns [rows, ld) stay untouched
    Transpose16(src.data(), rows, cols, dst.data(), ld);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) ASSERT_EQ(dst[c * ld + r], src[r * cols + c]) << r << "," << c;
    }
    for (int c = 0; c < cols; ++c) {
      for (int r = rows; r < ld; ++r) ASSERT_EQ(dst[c * ld + r], 0xffff);
    }
  }
}

}  // namespace
}  // namespace pstrain
