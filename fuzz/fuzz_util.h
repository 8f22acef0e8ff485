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
