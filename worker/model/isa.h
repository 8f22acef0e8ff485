// The instruction-set path of the whole process: pstrain's own kernels (common/cpu.h) and
// oneDNN's. oneDNN fixes its ISA at its first primitive, so a launcher chooses once, first thing
// (pstrain's main, the test main, the bench apps), and everything after follows.
//
// Thread-safety: SelectProcessIsa is called once, before other threads run model code.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cpu.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// Chooses the path: `requested` (PSTRAIN_ISA or ONEDNN_MAX_CPU_ISA, read by the launcher) or, when
// nullopt, the best the CPU supports; caps oneDNN at the same level and lowers pstrain's kernels
// to what oneDNN then reports as effective (e.g. when the kernel refuses AMX state). Returns the
// path taken. FAILED_PRECONDITION naming the missing features when `requested` is above what the
// CPU can do.
absl::StatusOr<Isa> SelectProcessIsa(std::optional<Isa> requested);

// The path oneDNN reports as effective, in oneDNN's words ("avx512_core_bf16").
std::string OneDnnIsaName();

// OK when the model's precision runs on path `isa`. bf16 needs AVX512-BF16 or AMX: oneDNN 2.6
// creates no bf16 matmul below them. Otherwise FAILED_PRECONDITION naming the CPU, the missing
// feature and the fix (model.precision=F32).
absl::Status CheckPrecisionSupported(Precision precision, Isa isa);

}  // namespace pstrain
