// RECORDIO: SageMaker RecordIO-protobuf, i.e. dmlc-core RecordIO framing of aialgs.data.Record
// payloads (docs/FORMATS.md).
//
// Framing, per part: uint32 magic 0xCED7230A | uint32 lrecord | data | zero pad to 4 bytes, with
// lrecord = cflag << 29 | length. cflag 0 is a whole record; a payload holding the magic at a
// 4-aligned offset is cut there into parts 1 (start), 2 (middle)..., 3 (end), the magic itself
// being dropped; the reader joins the parts with the magic in between (dmlc-core recordio.cc).
// A bad magic, a bad flag sequence or a truncated part ends the file with an error. There is no
// checksum, so the source never reports DATA_LOSS. records() counts logical records.
//
// Parser: the Record's features map holds either
//   "values": one tensor for the whole row; dense (no keys, F values: value i is field i, NaN =
//             missing) or sparse (keys = field indices, shape [F]; absent keys are missing), or
//   one 1-element tensor per field name (absent or empty = missing).
// Categorical fields take the value as the key (it must be a non-negative integer). The label
// is the 1-element tensor label["values"] (or label[label_name]). Float32Tensor, Float64Tensor
// and Int32Tensor are accepted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {

constexpr uint32_t kRecordIOMagic = 0xCED7230Au;
// Largest part length lrecord can hold (29 bits).
constexpr uint32_t kRecordIOMaxPart = (1u << 29) - 1;

// Appends `payload` framed exactly as dmlc-core's RecordIOWriter::WriteRecord does, split at
// every 4-aligned occurrence of the magic. The payload must be shorter than 2^29 bytes.
void AppendRecordIOFrame(absl::string_view payload, std::string* out);

// A record longer than max_record_bytes (a part, or the parts of a split record reassembled so
// far; decompressed bytes for gzip input) is INVALID_ARGUMENT naming the file, the record and its
// offset; the source then reads no further.
absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordIOSource(
    const std::string& path, size_t chunk_size, Channel::Compression compression = Channel::AUTO,
    size_t max_record_bytes = kDefaultMaxRecordBytes);

std::unique_ptr<RecordParser> NewRecordIOParser(const FeatureSpec& spec);

// Writes the sparse form: features["values"] = Float64Tensor{keys = present field indices,
// values, shape = [F]}, label["values"] = Float32Tensor{label}. A categorical key >= 2^53 cannot
// be a double exactly, and a categorical value other than 1 cannot be stored: Write fails naming
// the row.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewRecordIOWriter(const FeatureSpec& spec,
                                                                const std::string& path);

}  // namespace pstrain
