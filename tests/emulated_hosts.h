// Test helper: emulated hosts (network namespaces on a bridge) built and removed by
// scripts/emulate_hosts.sh, the one place that knows how. Needs root (CAP_NET_ADMIN /
// CAP_SYS_ADMIN) and iproute2's `ip netns` (scripts/install_deps.sh); Create() says why not.
//
// Names carry a tag (the test's pid by default), so concurrent tests do not meet; the namespaces
// (and with them the veths and the bridge) are removed by the destructor whatever happens.
#pragma once

#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/shell.h"

namespace pstrain {
namespace testing {

class EmulatedHosts {
 public:
  // `hosts` namespaces; `options` more of the script's options (e.g. "--mbit 100").
  explicit EmulatedHosts(int hosts, std::string options = "")
      : hosts_(hosts), tag_(absl::StrCat(getpid() % 100000000)), options_(std::move(options)) {}
  ~EmulatedHosts() { Remove(); }
  EmulatedHosts(const EmulatedHosts&) = delete;
  EmulatedHosts& operator=(const EmulatedHosts&) = delete;

  // The script with this object's tag, host count and options, ready for a subcommand.
  std::string Script() const {
    return absl::StrCat(PSTRAIN_SOURCE_DIR, "/scripts/emulate_hosts.sh --tag ", tag_,
                        " --hosts ", hosts_, " ", options_);
  }
  // Host i's namespace (for `ip netns exec`) and address.
  std::string ns(int host) const { return absl::StrCat("pst", tag_, "h", host); }
  std::string address(int host) const { return absl::StrCat("10.77.0.", host + 1); }

  // Builds the hosts; "" on success, else why they cannot be built here (the script's words).
  std::string Create() {
    std::string out;
    if (RunShell("command -v ip", 10, &out) != 0) {
      return "iproute2's ip is not installed (scripts/install_deps.sh installs it)";
    }
    if (RunShell(Script() + " up", 120, &out) != 0) return "cannot build the emulated hosts: " + out;
    return "";
  }

  // Cuts (or restores) host h's link on the bridge side: packets to and from it are dropped,
  // without a reset; the processes on both ends keep running.
  bool SetLink(int h, bool up) {
    std::string out;
    return RunShell(absl::StrCat(Script(), " link ", h, up ? " up" : " down"), 20, &out) == 0;
  }

  // Ends whatever runs in the namespaces and removes them. Safe to call twice.
  void Remove() {
    std::string out;
    RunShell(Script() + " down", 60, &out);
  }

  // Whether any namespace with this tag is left.
  bool Exists() const {
    std::string out;
    RunShell("ip netns list", 10, &out);
    return out.find("pst" + tag_) != std::string::npos;
  }

  const std::string& tag() const { return tag_; }

 private:
  const int hosts_;
  const std::string tag_;
  const std::string options_;
};

}  // namespace testing
}  // namespace pstrain
