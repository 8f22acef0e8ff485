// libFuzzer target: the config loader (common/config.h): a text-format Config, validated and
// given its defaults; the input's first line is also applied as a `--set` override. Seed corpus:
// fuzz/corpus/config/ (the shipped configs/ and overrides).
#include <cstdint>
#include <string>

#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfigText(text, "fuzz");
  if (config.ok()) {
    ApplyConfigDefaults(&*config);
    (void)ValidateConfig(*config);
  }
  Config base;
  const std::string first = text.substr(0, text.find('\n'));
  if (ApplyOverride(first, &base).ok()) (void)ValidateConfig(base);
  return 0;
}
