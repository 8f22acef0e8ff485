// Options-taking variant of OpenRecordSource (worker/data/record_io.h), for tests and tuning.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {

struct RecordSourceOptions {
  // Bytes per read(2). Records may straddle reads; tests use tiny values to prove it.
  size_t read_chunk = kDefaultReadChunk;
  // The longest record accepted (data.max_record_bytes, in decompressed bytes); a longer one is
  // INVALID_ARGUMENT naming the file, the record and its offset, and the source reads no further.
  size_t max_record_bytes = kDefaultMaxRecordBytes;
  // gzip or not (buffered_io.h); AUTO decides by the name and the first bytes.
  Channel::Compression compression = Channel::AUTO;
};

absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordSource(DataFormat format,
                                                               const std::string& path,
                                                               const RecordSourceOptions& options);

}  // namespace pstrain
