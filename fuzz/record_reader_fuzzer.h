// One fuzz input through a record source and its parser: the file framing (with small reads, so
// records straddle them, and a small record limit) and the parse of every record. Nothing may
// crash, hang or allocate beyond the limit; errors are fine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "worker/data/batch.h"
#include "worker/data/formats/registry.h"

namespace pstrain {
namespace fuzz {

// Every record through `spec`'s parser, and the rows through its encoder.
inline void ReadAndParseWith(DataFormat format, const FeatureSpec& spec, const std::string& path) {
  RecordSourceOptions o;
  o.read_chunk = 61;
  o.max_record_bytes = 1 << 16;
  auto src = OpenRecordSource(format, path, o);
  if (!src.ok()) return;
  auto parser = CreateRecordParser(format, spec, (*src)->header());
  if (!parser.ok()) return;
  RawRows rows;
  rows.Clear(spec.num_fields());
  std::vector<absl::Status> errors;
  for (int i = 0; i < 10000; ++i) {
    RecordRef rec;
    bool eof = false;
    if (!(*src)->Next(&rec, &eof).ok() || eof) break;
    // RecordRef points into the source's buffer: parse before the next read.
    (*parser)->Parse({&rec, 1}, &rows, &errors);
  }
  Batch batch;
  batch.Clear(spec.num_fields());
  spec.Encode(rows, &batch);
}

// With the CRITEO preset's spec, then (for the formats that read lists) a spec with list fields.
inline int ReadAndParse(DataFormat format, const uint8_t* data, size_t size) {
  MemFile file(data, size);
  if (!file.ok()) return 0;
  ReadAndParseWith(format, CriteoSpec(), file.path());
  if (format != CRITEO_TSV) ReadAndParseWith(format, ListSpec(), file.path());
  return 0;
}

}  // namespace fuzz
}  // namespace pstrain
