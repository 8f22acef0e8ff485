// Shared by the fuzz targets: the bytes of one input as a file the readers can open (a memfd:
// no disk), and the Criteo feature spec the parsers take.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/data/feature_spec.h"

namespace pstrain {
namespace fuzz {

// An anonymous in-memory file holding `data`, closed at destruction; path() opens it again.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz", MFD_CLOEXEC);
    size_t done = 0;
    while (fd_ >= 0 && done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() {
    if (fd_ >= 0) close(fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  int fd_ = -1;
};

// The Criteo preset (13 numeric, 26 categorical fields), made once.
inline const FeatureSpec& CriteoSpec() {
  static const FeatureSpec* spec = [] {
    auto s = FeatureSpec::Create(FeatureConfig());
    return s.ok() ? new FeatureSpec(*std::move(s)) : nullptr;
  }();
  return *spec;
}

}  // namespace fuzz
}  // namespace pstrain
