#include "cmd/launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "worker/model/isa.h"

namespace pstrain {
namespace {

LaunchEnvironment& Mutable() {
  static LaunchEnvironment* env = [] {
    auto* e = new LaunchEnvironment;
    e->isa = KernelIsa();
    e->isa_reason = "the best this CPU has";
    e->cpus = MakeCpuBudget(AffinityCpus(), std::nullopt);
    return e;
  }();
  return *env;
}

}  // namespace

void ReexecWithPassiveOmpWaitPolicy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
}

std::string LaunchEnvironment::Describe() const {
  return absl::StrCat("isa ", IsaName(isa), " (", isa_reason, "; oneDNN ", OneDnnIsaName(), "), ",
                      cpus.Describe(),
                      omp_num_threads > 0 ? absl::StrCat(", OMP_NUM_THREADS=", omp_num_threads)
                                          : "");
}

absl::StatusOr<LaunchEnvironment> InitLaunchEnvironment() {
  LaunchEnvironment env;
  std::optional<Isa> requested;
  for (const char* name : {"PSTRAIN_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    absl::StatusOr<Isa> isa = ParseIsa(v);
    if (!isa.ok()) return Annotate(isa.status(), name);
    requested = *isa;
    env.isa_reason = absl::StrCat(name, "=", v);
    break;
  }
  absl::StatusOr<Isa> isa = SelectProcessIsa(requested);
  if (!isa.ok()) {
    return requested ? Annotate(isa.status(), env.isa_reason) : isa.status();
  }
  env.isa = *isa;
  if (!requested) env.isa_reason = "the best this CPU has";
  if (requested && *requested != *isa) {
    absl::StrAppend(&env.isa_reason, ", lowered to what oneDNN can use");
  }
  env.cpu_model = DetectCpuFeatures().model;
  env.cpus = DetectCpuBudget();
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v != nullptr && *v != '\0') {
    // A list ("4,2") sets the nested levels; the first is the one a tower's team uses.
    const absl::string_view first = absl::StripAsciiWhitespace(
        *absl::StrSplit(absl::string_view(v), ',').begin());
    int n = 0;
    if (!absl::SimpleAtoi(first, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OMP_NUM_THREADS='", v, "': expected a positive thread count (or a list of them)"));
    }
    env.omp_num_threads = n;
  }
  Mutable() = env;
  return env;
}

const LaunchEnvironment& Launch() { return Mutable(); }

}  // namespace pstrain
