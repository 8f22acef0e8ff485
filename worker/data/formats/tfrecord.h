// TFRECORD: TFRecord framing (common/record_frame.h) of tf.train.Example (docs/FORMATS.md).
//
// Source: both CRCs are checked. A bad header CRC or a truncated record ends the file with an
// error (INVALID_ARGUMENT); a bad data CRC is a DATA_LOSS for that record only, and the source
// moves past it. records() counts records returned or skipped; offset() is the next header's.
//
// Parser: each Example feature key is looked up with FeatureSpec::FieldIndex (unknown keys are
// ignored); the label is feature label_name() (float_list or int64_list). Categorical fields:
// int64_list -> key = the value as uint64; bytes_list -> hex value if 1..16 hex digits, else
// HashBytes. Numeric fields: float_list or int64_list. An absent feature or an empty list is a
// missing value; lists of more than one value are bad records.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {

// A record longer than max_record_bytes (decompressed bytes for gzip input) is INVALID_ARGUMENT
// naming the file, the record and its offset, before any of it is buffered; the source then reads
// no further.
absl::StatusOr<std::unique_ptr<RecordSource>> OpenTFRecordSource(
    const std::string& path, size_t chunk_size, Channel::Compression compression = Channel::AUTO,
    size_t max_record_bytes = kDefaultMaxRecordBytes);

std::unique_ptr<RecordParser> NewTFRecordParser(const FeatureSpec& spec);

// One Example per row: numeric fields as float_list (rounded to float32, as TensorFlow stores
// them), categorical fields as int64_list, the label as float_list; missing fields are omitted.
// Serialization is deterministic (map keys sorted). Categorical values other than 1 are refused.
absl::StatusOr<std::unique_ptr<RecordWriter>> NewTFRecordWriter(const FeatureSpec& spec,
                                                                const std::string& path);

}  // namespace pstrain
