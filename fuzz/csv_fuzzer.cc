// libFuzzer target: CSV files through their record source and parser
// (worker/data/formats/). Seed corpus: fuzz/corpus/csv/.
#include "fuzz/record_reader_fuzzer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return pstrain::fuzz::ReadAndParse(pstrain::CSV, data, size);
}
