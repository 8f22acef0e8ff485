#include "common/env.h"

#include <sys/stat.h>

#include <chrono>
#include <thread>

#include "absl/time/clock.h"

namespace pstrain {
namespace {

class PosixEnv final : public Env {
 public:
  absl::Duration MonotonicNow() override {
    return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }
  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  bool IsRealDirectory(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv;  // never destroyed: background work may outlive main
  return env;
}

}  // namespace pstrain
