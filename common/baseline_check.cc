// Refuses to run on a CPU below the build's baseline (x86-64-v3: AVX2, FMA, BMI1/2, F16C, LZCNT,
// MOVBE) with a message, instead of dying of SIGILL at the first AVX2 instruction.
//
// This file is compiled for plain x86-64 (common/CMakeLists.txt) and linked into every executable
// as an object (not through a static library, whose unreferenced objects the linker drops). Its
// constructor has priority 101, so it runs before the executable's other static initializers,
// which are compiled for the baseline. The shared libraries (libstdc++, protobuf, gRPC, oneDNN)
// initialize before it; Debian builds them for plain x86-64.
#include <unistd.h>

#include <cstring>

namespace {

void Say(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}

__attribute__((constructor(101))) void RequireBaselineIsa() {
  __builtin_cpu_init();
  const struct {
    const char* name;
    bool have;
  } features[] = {
      {"avx2", __builtin_cpu_supports("avx2") != 0}, {"fma", __builtin_cpu_supports("fma") != 0},
      {"f16c", __builtin_cpu_supports("f16c") != 0}, {"bmi1", __builtin_cpu_supports("bmi") != 0},
      {"bmi2", __builtin_cpu_supports("bmi2") != 0},
      {"lzcnt", __builtin_cpu_supports("lzcnt") != 0},
      {"movbe", __builtin_cpu_supports("movbe") != 0},
  };
  bool ok = true;
  for (const auto& f : features) ok = ok && f.have;
  if (ok) return;
  Say("pstrain: this CPU lacks the features this build needs (x86-64-v3: AVX2 and FMA):");
  for (const auto& f : features) {
    if (f.have) continue;
    Say(" ");
    Say(f.name);
  }
  Say(".\npstrain runs on x86-64 CPUs from Intel Haswell (2013) and AMD Zen (2017) on.\n");
  _exit(1);
}

}  // namespace
