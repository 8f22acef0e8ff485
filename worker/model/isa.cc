#include "worker/model/isa.h"

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {
namespace {

dnnl::cpu_isa ToDnnl(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return dnnl::cpu_isa::avx2;
    case Isa::kAvx512Core: return dnnl::cpu_isa::avx512_core;
    case Isa::kAvx512CoreBf16: return dnnl::cpu_isa::avx512_core_bf16;
    case Isa::kAvx512CoreAmx: return dnnl::cpu_isa::avx512_core_amx;
  }
  return dnnl::cpu_isa::avx2;
}

// The pstrain path that runs within oneDNN's effective ISA.
Isa FromDnnl(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx: return Isa::kAvx512CoreAmx;
    case dnnl::cpu_isa::avx512_core_bf16: return Isa::kAvx512CoreBf16;
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni: return Isa::kAvx512Core;
    default: return Isa::kAvx2;
  }
}

}  // namespace

std::string OneDnnIsaName() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

absl::StatusOr<Isa> SelectProcessIsa(std::optional<Isa> requested) {
  const CpuFeatures cpu = DetectCpuFeatures();
  const std::optional<Isa> best = BestIsa(cpu);
  if (!best) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU (", cpu.model, ") lacks ", MissingFeatures(Isa::kAvx2, cpu),
        ": pstrain needs AVX2 and FMA (x86-64-v3)"));
  }
  const Isa want = requested.value_or(*best);
  if (want > *best) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the requested ISA path ", IsaName(want), " needs ", MissingFeatures(want, cpu),
        ", which this CPU (", cpu.model, ") lacks; its best path is ", IsaName(*best)));
  }
  // A library built without DNNL_ENABLE_MAX_CPU_ISA refuses; its effective ISA is read below.
  (void)dnnl::set_max_cpu_isa(ToDnnl(want));
  const Isa effective = std::min(want, FromDnnl(dnnl::get_effective_cpu_isa()));
  if (absl::Status s = SetKernelIsa(effective); !s.ok()) return s;
  return effective;
}

absl::Status CheckPrecisionSupported(Precision precision, Isa isa) {
  if (precision != BF16 || isa >= Isa::kAvx512CoreBf16) return absl::OkStatus();
  const CpuFeatures cpu = DetectCpuFeatures();
  const std::optional<Isa> best = BestIsa(cpu);
  std::string why;
  if (best && *best >= Isa::kAvx512CoreBf16) {
    why = absl::StrCat("this CPU (", cpu.model, ") has ", IsaName(*best),
                       ", but the process runs the ", IsaName(isa),
                       " path (lowered by PSTRAIN_ISA or ONEDNN_MAX_CPU_ISA)");
  } else {
    why = absl::StrCat("this CPU (", cpu.model, ") lacks ",
                       MissingFeatures(Isa::kAvx512CoreBf16, cpu),
                       best ? absl::StrCat(" (its best path is ", IsaName(*best), ")") : "");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "model.precision: BF16 needs a CPU with AVX512-BF16 or AMX (oneDNN has no bf16 matmul "
      "without them); ", why, ". Train in f32 instead: --set model.precision=F32"));
}

}  // namespace pstrain
