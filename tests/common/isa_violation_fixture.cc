// A deliberately unportable program for IsaDispatch.CheckCatchesUndispatchedAvx512: compiled with
// -mavx512f (tests/CMakeLists.txt), its Scale loop is AVX-512 code outside any dispatched variant,
// which scripts/check_isa_dispatch.py must report. It is never run.
#include <cstdio>

__attribute__((noinline)) void Scale(float* x, int n, float s) {
  for (int i = 0; i < n; ++i) x[i] *= s;
}

int main(int argc, char**) {
  float x[64] = {};
  Scale(x, 64, static_cast<float>(argc));
  std::printf("%f\n", x[0]);
  return 0;
}
