// libFuzzer target: TFRECORD files through their record source and parser
// (worker/data/formats/). Seed corpus: fuzz/corpus/tfrecord/.
#include "fuzz/record_reader_fuzzer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return pstrain::fuzz::ReadAndParse(pstrain::TFRECORD, data, size);
}
