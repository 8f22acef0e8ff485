#include "common/cpu.h"

#include <cpuid.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cgroup.h"
#include "common/file.h"
#include "common/logging.h"

namespace pstrain {
namespace {

std::string BrandString() {
  unsigned int max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < 0x80000004u) return "unknown x86-64 CPU";
  char brand[49] = {};
  for (unsigned int leaf = 0; leaf < 3; ++leaf) {
    unsigned int r[4];
    __get_cpuid(0x80000002u + leaf, &r[0], &r[1], &r[2], &r[3]);
    std::memcpy(brand + 16 * leaf, r, 16);
  }
  return std::string(absl::StripAsciiWhitespace(brand));
}

std::optional<Isa> DetectedBestIsa() {
  static const std::optional<Isa> best = BestIsa(DetectCpuFeatures());
  return best;
}

// The kernel path; -1 until first read (then the detected best).
std::atomic<int> g_kernel_isa{-1};

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Core: return "avx512_core";
    case Isa::kAvx512CoreBf16: return "avx512_core_bf16";
    case Isa::kAvx512CoreAmx: return "avx512_core_amx";
  }
  return "unknown";
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  for (Isa isa : kAllIsas) {
    if (n == IsaName(isa)) return isa;
  }
  // oneDNN's other levels, mapped to the pstrain path that runs at or below them.
  if (n == "avx2_vnni") return Isa::kAvx2;
  if (n == "avx512_core_vnni") return Isa::kAvx512Core;
  if (n == "all") return Isa::kAvx512CoreAmx;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ISA '", name,
      "': expected one of avx2, avx512_core, avx512_core_bf16, avx512_core_amx"));
}

#if defined(__clang__)
// clang 14 (used only for the fuzz build, fuzz/) knows none of the feature names f16c, lzcnt,
// movbe, amx-tile, amx-bf16: CPUID answers for the first three; AMX, which also needs the OS's
// consent (XCR0), counts as absent there (the fuzz targets run no kernel).
bool CpuidBit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1;
}
#define PSTRAIN_CPU_F16C CpuidBit(1, 0, 2, 29)
#define PSTRAIN_CPU_LZCNT CpuidBit(0x80000001u, 0, 2, 5)
#define PSTRAIN_CPU_MOVBE CpuidBit(1, 0, 2, 22)
#define PSTRAIN_CPU_AMX_TILE false
#define PSTRAIN_CPU_AMX_BF16 false
#else
#define PSTRAIN_CPU_F16C __builtin_cpu_supports("f16c")
#define PSTRAIN_CPU_LZCNT __builtin_cpu_supports("lzcnt")
#define PSTRAIN_CPU_MOVBE __builtin_cpu_supports("movbe")
#define PSTRAIN_CPU_AMX_TILE __builtin_cpu_supports("amx-tile")
#define PSTRAIN_CPU_AMX_BF16 __builtin_cpu_supports("amx-bf16")
#endif

CpuFeatures DetectCpuFeatures() {
  __builtin_cpu_init();
  CpuFeatures c;
  c.avx2 = __builtin_cpu_supports("avx2");
  c.fma = __builtin_cpu_supports("fma");
  c.f16c = PSTRAIN_CPU_F16C;
  c.bmi1 = __builtin_cpu_supports("bmi");
  c.bmi2 = __builtin_cpu_supports("bmi2");
  c.lzcnt = PSTRAIN_CPU_LZCNT;
  c.movbe = PSTRAIN_CPU_MOVBE;
  c.avx512f = __builtin_cpu_supports("avx512f");
  c.avx512bw = __builtin_cpu_supports("avx512bw");
  c.avx512vl = __builtin_cpu_supports("avx512vl");
  c.avx512dq = __builtin_cpu_supports("avx512dq");
  c.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  c.amx_tile = PSTRAIN_CPU_AMX_TILE;
  c.amx_bf16 = PSTRAIN_CPU_AMX_BF16;
  c.model = BrandString();
  return c;
}

std::string MissingFeatures(Isa isa, const CpuFeatures& c) {
  std::vector<std::string> missing;
  auto need = [&](bool have, const char* name) {
    if (!have) missing.push_back(name);
  };
  need(c.avx2, "avx2");
  need(c.fma, "fma");
  need(c.f16c, "f16c");
  need(c.bmi1, "bmi1");
  need(c.bmi2, "bmi2");
  need(c.lzcnt, "lzcnt");
  need(c.movbe, "movbe");
  if (isa >= Isa::kAvx512Core) {
    need(c.avx512f, "avx512f");
    need(c.avx512bw, "avx512bw");
    need(c.avx512vl, "avx512vl");
    need(c.avx512dq, "avx512dq");
  }
  if (isa >= Isa::kAvx512CoreBf16) need(c.avx512_bf16, "avx512_bf16");
  if (isa >= Isa::kAvx512CoreAmx) {
    need(c.amx_tile, "amx_tile");
    need(c.amx_bf16, "amx_bf16");
  }
  return absl::StrJoin(missing, ", ");
}

std::optional<Isa> BestIsa(const CpuFeatures& cpu) {
  std::optional<Isa> best;
  for (Isa isa : kAllIsas) {
    if (MissingFeatures(isa, cpu).empty()) best = isa;
  }
  return best;
}

Isa KernelIsa() {
  int v = g_kernel_isa.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<Isa>(v);
  // A process that runs at all has AVX2 (the build's baseline; common/baseline_check.cc).
  const Isa best = DetectedBestIsa().value_or(Isa::kAvx2);
  int expected = -1;
  g_kernel_isa.compare_exchange_strong(expected, static_cast<int>(best));
  return static_cast<Isa>(g_kernel_isa.load(std::memory_order_relaxed));
}

absl::Status SetKernelIsa(Isa isa) {
  const std::optional<Isa> best = DetectedBestIsa();
  if (!best || isa > *best) {
    const CpuFeatures cpu = DetectCpuFeatures();
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", IsaName(isa), " path needs CPU features that this CPU (", cpu.model,
        ") lacks: ", MissingFeatures(isa, cpu), "; its best path is ",
        best ? IsaName(*best) : "none"));
  }
  g_kernel_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---- CPU budget -------------------------------------------------------------------------------

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

namespace {

// The quota in CPUs at one cgroup directory, or nullopt when it sets none. NOT_FOUND when the
// directory has no such files (not every level does).
absl::StatusOr<std::optional<double>> QuotaAt(const std::string& dir, bool v2) {
  if (v2) {
    const std::string path = dir + "/cpu.max";
    if (!PathExists(path)) return absl::NotFoundError(path);
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) return text.status();
    std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    double quota = 0, period = 0;
    if (parts.size() != 2 || (parts[0] != "max" && !absl::SimpleAtod(parts[0], &quota)) ||
        !absl::SimpleAtod(parts[1], &period) || period <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": expected '<quota|max> <period>' (cgroup v2 cpu.max), got '", *text, "'"));
    }
    if (parts[0] == "max") return std::optional<double>();
    if (quota <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": expected a positive quota, got '", *text, "'"));
    }
    return std::optional<double>(quota / period);
  }
  const std::string qpath = dir + "/cpu.cfs_quota_us", ppath = dir + "/cpu.cfs_period_us";
  if (!PathExists(qpath) || !PathExists(ppath)) return absl::NotFoundError(qpath);
  absl::StatusOr<std::string> q = ReadFileToString(qpath);
  if (!q.ok()) return q.status();
  absl::StatusOr<std::string> p = ReadFileToString(ppath);
  if (!p.ok()) return p.status();
  double quota = 0, period = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(*q), &quota)) {
    return absl::InvalidArgumentError(
        absl::StrCat(qpath, ": expected a number of microseconds or -1, got '", *q, "'"));
  }
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(*p), &period) || period <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ppath, ": expected a positive number of microseconds, got '", *p, "'"));
  }
  if (quota < 0) return std::optional<double>();
  return std::optional<double>(quota / period);
}

}  // namespace

absl::StatusOr<std::optional<double>> CgroupCpuQuota(const std::string& proc_self_cgroup,
                                                     const std::string& cgroup_root) {
  // From the process's own cgroup up to the root: the smallest quota on the way binds.
  return SmallestCgroupLimit<double>(proc_self_cgroup, cgroup_root, "cpu", QuotaAt);
}

CpuBudget MakeCpuBudget(int affinity, std::optional<double> quota) {
  CpuBudget b;
  b.affinity = std::max(1, affinity);
  b.quota = quota;
  b.cpus = b.affinity;
  if (quota) b.cpus = std::min(b.cpus, std::max(1, static_cast<int>(std::floor(*quota + 1e-9))));
  return b;
}

std::string CpuBudget::Describe() const {
  std::string s = absl::StrCat(cpus, cpus == 1 ? " CPU" : " CPUs", " (affinity ", affinity);
  if (quota) absl::StrAppend(&s, absl::StrFormat(", cgroup quota %.4g", *quota));
  return s + ")";
}

CpuBudget DetectCpuBudget() {
  absl::StatusOr<std::optional<double>> quota =
      CgroupCpuQuota("/proc/self/cgroup", "/sys/fs/cgroup");
  if (!quota.ok()) {
    PSTRAIN_LOG(WARNING) << "ignoring the cgroup CPU quota: " << quota.status().message();
    return MakeCpuBudget(AffinityCpus(), std::nullopt);
  }
  return MakeCpuBudget(AffinityCpus(), *quota);
}

}  // namespace pstrain
