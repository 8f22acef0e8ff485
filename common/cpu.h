// What this CPU can do, which instruction-set path pstrain's own kernels take, and how many CPUs
// this process may use.
//
// ISA paths. pstrain builds for x86-64-v3 (AVX2 + FMA) and reaches wider code only through
// runtime dispatch, as oneDNN does (src/cpu/x64/cpu_isa_traits.hpp, mayiuse()):
//   - the process path starts at the best the CPU supports (BestIsa(DetectCpuFeatures()));
//   - a launcher may lower it once, for every kernel and for oneDNN (worker/model/isa.h);
//   - a kernel asks KernelIsa() at each call and takes the widest variant at or below it.
// Code compiled for AVX-512 lives only in functions that such a dispatch reaches; the test
// tests/common/isa_objects_test checks the built binary for that.
//
// CPU budget. The CPUs this process may use are the affinity mask (taskset, numactl, Kubernetes
// CPU pinning) capped by the cgroup CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us /
// cpu.cfs_period_us), rounded down: a quota of 1.5 CPUs gives 1 thread per core-bound role, as
// Go's automaxprocs does, because threads beyond the quota are throttled together.
//
// Thread-safety: every function is safe to call from any thread. SetKernelIsa is meant for the
// launcher and for tests, before (or between) kernel calls.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// The kernel paths, in increasing order. The names are oneDNN's (dnnl::cpu_isa), which users
// also meet in ONEDNN_MAX_CPU_ISA and oneDNN's verbose output.
enum class Isa : int {
  kAvx2 = 0,            // "avx2": AVX2 + FMA (x86-64-v3); every build needs it
  kAvx512Core = 1,      // "avx512_core": AVX-512 F, BW, VL, DQ
  kAvx512CoreBf16 = 2,  // "avx512_core_bf16": + AVX512-BF16 (bf16 dot products, conversions)
  kAvx512CoreAmx = 3,   // "avx512_core_amx": + AMX-BF16 tiles (oneDNN's bf16 matmul)
};
inline constexpr Isa kAllIsas[] = {Isa::kAvx2, Isa::kAvx512Core, Isa::kAvx512CoreBf16,
                                   Isa::kAvx512CoreAmx};

const char* IsaName(Isa isa);
// Accepts the names above, case-insensitively, and oneDNN's spellings of them
// ("AVX512_CORE_AMX", "avx512_core_vnni" -> avx512_core, "avx2_vnni" -> avx2).
absl::StatusOr<Isa> ParseIsa(absl::string_view name);

// The features the paths need, as CPUID and the OS (XCR0) report them.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi1 = false, bmi2 = false, lzcnt = false,
       movbe = false;                    // x86-64-v3
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  std::string model;  // "AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+", ...
};
CpuFeatures DetectCpuFeatures();

// The best path a CPU with these features supports; nullopt when it lacks even AVX2 + FMA.
std::optional<Isa> BestIsa(const CpuFeatures& cpu);
// The features that path `isa` needs and `cpu` lacks, in CPUID's names ("avx512_bf16, amx_bf16");
// empty when it has them all.
std::string MissingFeatures(Isa isa, const CpuFeatures& cpu);

// The path pstrain's kernels take now. Initially BestIsa(DetectCpuFeatures()).
Isa KernelIsa();
// Sets the kernel path. FAILED_PRECONDITION naming the missing features when the CPU cannot run
// it. Does not touch oneDNN: use SelectProcessIsa (worker/model/isa.h) for the whole process.
absl::Status SetKernelIsa(Isa isa);

// ---- CPU budget -----------------------------------------------------------------------------

// CPUs in this thread's affinity mask (sched_getaffinity); at least 1.
int AffinityCpus();

// The cgroup CPU quota of the cgroup a process is in, in CPUs (quota / period), or nullopt when
// there is none ("max", -1, or no cpu controller). Reads `proc_self_cgroup` (the format of
// /proc/self/cgroup) and the controller files under `cgroup_root` (normally /sys/fs/cgroup):
//   v2: <root>/<path>/cpu.max ("max 100000" or "150000 100000"), the smallest along the path
//       from the process's cgroup up to the root;
//   v1: <root>/cpu,cpuacct/<path>/cpu.cfs_quota_us and cpu.cfs_period_us (or <root>/cpu/...),
//       likewise.
// Inside a container the cgroup namespace makes the path "/", so <root>/cpu.max is read.
// A file that is present but malformed is an error naming it.
absl::StatusOr<std::optional<double>> CgroupCpuQuota(const std::string& proc_self_cgroup,
                                                     const std::string& cgroup_root);

struct CpuBudget {
  int cpus = 1;                  // min(affinity, floor(quota)), at least 1
  int affinity = 1;              // AffinityCpus()
  std::optional<double> quota;   // the cgroup quota in CPUs, if any
  std::string Describe() const;  // "2 CPUs (affinity 2)", "1 CPU (affinity 8, cgroup quota 1.5)"
};
// The budget of this process: the affinity mask and /proc/self/cgroup under /sys/fs/cgroup.
// An unreadable or malformed cgroup file is ignored with a warning (the affinity mask stands).
CpuBudget DetectCpuBudget();
CpuBudget MakeCpuBudget(int affinity, std::optional<double> quota);

}  // namespace pstrain
