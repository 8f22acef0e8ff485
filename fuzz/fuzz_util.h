// Shared by the fuzz targets: the bytes of one input as a file the readers can open (a memfd:
// no disk), a scratch directory per process (on tmpfs when there is one: targets that need real
// directories write there), a reader that splits an input into the pieces a target needs, and
// the Criteo feature spec the parsers take.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file.h"
#include "common/logging.h"
#include "worker/data/feature_spec.h"

namespace pstrain {
namespace fuzz {

// Every refused input makes the code log a line or two: hundreds of MB a minute in a run's log,
// and time. Only FATAL (a failed check, which aborts, and is a finding) is printed, unless
// PSTRAIN_FUZZ_LOG is set (to see why a target's inputs are refused).
inline const bool kQuietLogs = [] {
  if (std::getenv("PSTRAIN_FUZZ_LOG") == nullptr) SetMinLogLevel(3);
  return true;
}();

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

// A directory of this process for the target `name`, made once: /dev/shm/pstrain_fuzz_<name>_<pid>
// (tmpfs: no disk writes, no fsync cost) or $TMPDIR / /tmp when there is no /dev/shm. Removed
// when the process exits normally (libFuzzer's end of a timed run, the replay's end); a run that
// crashes leaves it, beside its finding.
inline std::string ScratchDir(const std::string& name) {
  struct stat st;
  const char* tmp = std::getenv("TMPDIR");
  const std::string root = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)
                               ? "/dev/shm"
                               : (tmp != nullptr ? tmp : "/tmp");
  static std::vector<std::string>* made = [] {
    auto* dirs = new std::vector<std::string>;
    std::atexit([] {
      std::error_code ec;
      for (const std::string& d : *made) std::filesystem::remove_all(d, ec);
    });
    return dirs;
  }();
  std::string dir = absl::StrCat(root, "/pstrain_fuzz_", name, "_", getpid());
  (void)MakeDirs(dir);
  made->push_back(dir);
  return dir;
}

// A target that cannot set up what it fuzzes (a server that does not start, a model that does not
// build) would pass every input untested: it says why and aborts, failing the run.
[[noreturn]] inline void SetupFailed(const char* target, const std::string& why) {
  std::fprintf(stderr, "%s: the fuzz target's setup failed: %s\n", target, why.c_str());
  std::abort();
}

// Writes `bytes` to `path` (plain, not atomic: fuzz inputs need no crash safety). False on error.
inline bool WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

// Splits a fuzz input into the pieces a target needs, libFuzzer's FuzzedDataProvider in small:
// bytes and integers from the front, length-prefixed pieces, the rest. Reading past the end gives
// zeros and empty pieces (never an error), so that every input means something.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  size_t left() const { return size_ - at_; }
  uint8_t Byte() { return at_ < size_ ? static_cast<uint8_t>(data_[at_++]) : 0; }
  uint16_t U16() {
    const uint8_t low = Byte();
    return static_cast<uint16_t>(low | Byte() << 8);
  }
  // A piece of at most `max` bytes whose length is the next 2 bytes.
  std::string Piece(size_t max = 1 << 16) {
    const size_t n = std::min<size_t>({U16(), max, left()});
    std::string s(data_ + at_, n);
    at_ += n;
    return s;
  }
  // The piece up to the next `sep` (excluded; the separator is consumed), or the rest.
  std::string Until(char sep) {
    const absl::string_view rest(data_ + at_, left());
    const size_t end = rest.find(sep);
    const std::string s(rest.substr(0, end));
    at_ += end == absl::string_view::npos ? rest.size() : end + 1;
    return s;
  }
  std::string Rest() {
    std::string s(data_ + at_, left());
    at_ = size_;
    return s;
  }

 private:
  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

// The Criteo preset (13 numeric, 26 categorical fields), made once.
// A spec with list fields (docs/FORMATS.md "Lists") over names of the CRITEO preset, so that the
// Criteo-shaped seeds also parse with it: I1 numeric, C1 a MEAN list (separator '|', at most 8,
// REFUSE), C2 a SQRTN list (';', weights under "C2w") sharing C3's rows, C3 single-valued.
inline const FeatureSpec& ListSpec() {
  static const FeatureSpec* spec = [] {
    FeatureConfig c;
    c.set_preset(NO_PRESET);
    FieldSpec* i1 = c.add_field();
    i1->set_name("I1");
    i1->set_kind(NUMERIC);
    FieldSpec* c1 = c.add_field();
    c1->set_name("C1");
    c1->set_vocab_size(1000);
    c1->mutable_list()->set_max_length(8);
    c1->mutable_list()->set_overflow(REFUSE);
    FieldSpec* c2 = c.add_field();
    c2->set_name("C2");
    c2->set_share_rows_with("C3");
    c2->mutable_list()->set_combiner(SQRTN);
    c2->mutable_list()->set_separator(";");
    c2->mutable_list()->set_weights_key("C2w");
    c.add_field()->set_name("C3");
    auto s = FeatureSpec::Create(c);
    return s.ok() ? new FeatureSpec(*std::move(s)) : nullptr;
  }();
  return *spec;
}

inline const FeatureSpec& CriteoSpec() {
  static const FeatureSpec* spec = [] {
    auto s = FeatureSpec::Create(FeatureConfig());
    return s.ok() ? new FeatureSpec(*std::move(s)) : nullptr;
  }();
  return *spec;
}

}  // namespace fuzz
}  // namespace pstrain
