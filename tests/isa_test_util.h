// Test helpers for the ISA paths (common/cpu.h): skip what the path the process runs cannot do,
// with the reason, and run a block on each kernel path the CPU has.
#pragma once

#include <ostream>
#include <string>

#include "common/cpu.h"
#include "gtest/gtest.h"
#include "worker/model/isa.h"

// Skips the test when the process's path cannot run bf16 (no AVX512-BF16 / AMX, or forced lower
// by PSTRAIN_ISA), printing CheckPrecisionSupported's reason.
#define PSTRAIN_SKIP_UNLESS_BF16()                                                             \
  do {                                                                                         \
    if (absl::Status _s = ::pstrain::CheckPrecisionSupported(::pstrain::BF16,                  \
                                                             ::pstrain::KernelIsa());          \
        !_s.ok()) {                                                                            \
      GTEST_SKIP() << _s.message();                                                            \
    }                                                                                          \
  } while (0)

namespace pstrain {

// gtest prints a parameter of type Isa by its name.
inline void PrintTo(Isa isa, std::ostream* os) { *os << IsaName(isa); }

// Sets the kernel path for a scope and restores the previous one. Use through
// PSTRAIN_SCOPED_KERNEL_ISA, which skips the test when the CPU lacks the path.
class ScopedKernelIsa {
 public:
  explicit ScopedKernelIsa(Isa isa) : previous_(KernelIsa()), status_(SetKernelIsa(isa)) {}
  ~ScopedKernelIsa() { (void)SetKernelIsa(previous_); }
  const absl::Status& status() const { return status_; }

 private:
  Isa previous_;
  absl::Status status_;
};

}  // namespace pstrain

// Runs the rest of the test with pstrain's kernels on `isa`; skips it (with the missing CPU
// features) when this CPU cannot run that path. oneDNN is not affected: its path is fixed per
// process (CTest runs the model tests once per path, tests/CMakeLists.txt).
#define PSTRAIN_SCOPED_KERNEL_ISA(isa)                                       \
  ::pstrain::ScopedKernelIsa _pstrain_scoped_isa(isa);                       \
  if (!_pstrain_scoped_isa.status().ok()) {                                  \
    GTEST_SKIP() << _pstrain_scoped_isa.status().message();                  \
  }
