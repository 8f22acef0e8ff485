// One fuzz input through a record source and its parser: the file framing (with small reads, so
// records straddle them, and a small record limit) and the parse of every record. Nothing may
// crash, hang or allocate beyond the limit; errors are fine.
#pragma once

#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "worker/data/batch.h"
#include "worker/data/formats/registry.h"

namespace pstrain {
namespace fuzz {

inline int ReadAndParse(DataFormat format, const uint8_t* data, size_t size) {
  MemFile file(data, size);
  if (!file.ok()) return 0;
  RecordSourceOptions o;
  o.read_chunk = 61;
  o.max_record_bytes = 1 << 16;
  auto src = OpenRecordSource(format, file.path(), o);
  if (!src.ok()) return 0;
  auto parser = CreateRecordParser(format, CriteoSpec(), (*src)->header());
  if (!parser.ok()) return 0;
  RawRows rows;
  rows.Clear(CriteoSpec().num_fields());
  std::vector<absl::Status> errors;
  for (int i = 0; i < 10000; ++i) {
    RecordRef rec;
    bool eof = false;
    if (!(*src)->Next(&rec, &eof).ok() || eof) break;
    // RecordRef points into the source's buffer: parse before the next read.
    (*parser)->Parse({&rec, 1}, &rows, &errors);
  }
  return 0;
}

}  // namespace fuzz
}  // namespace pstrain
