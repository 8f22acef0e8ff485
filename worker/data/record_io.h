// The data layer's three seams: framing (RecordSource), parsing (RecordParser) and writing
// (RecordWriter). Each format in worker/data/formats/ implements them; the factories below pick one.
//
// Parsing is split from framing so that the pipeline can shard, shuffle and interleave raw
// records cheaply, then parse a whole batch at once on a reader thread ("batch first, then
// parse").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pstrain/config.pb.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"

namespace pstrain {

// One framed record and where it came from, for error messages.
struct RecordRef {
  absl::string_view data;             // the record body (a text line without its newline, or a
                                     // TFRecord / RecordIO payload)
  const std::string* file = nullptr;  // path of the file or FIFO it came from
  uint64_t number = 0;               // 1-based: the line number for text formats (counting any
                                     // header line), the record number for binary formats
};

// "file:line 12" / "file: record 12", for messages.
std::string DescribeRecord(const RecordRef& rec, DataFormat format);

// Reads framed records from one file or FIFO, sequentially. Not thread-safe.
class RecordSource {
 public:
  virtual ~RecordSource() = default;
  RecordSource() = default;
  RecordSource(const RecordSource&) = delete;
  RecordSource& operator=(const RecordSource&) = delete;

  // Reads the next record. At a clean end of input returns OK with *eof = true.
  // The view in *rec stays valid until the next call to Next or Seek.
  //   DATA_LOSS: this record is corrupt (e.g. its data CRC does not match) but its extent is
  //              known; the source has moved past it, so Next may be called again.
  //   any other error: the rest of the input cannot be read (truncated record, corrupt length,
  //              I/O error). The message names the file, the record number and byte offset, and
  //              what was expected.
  virtual absl::Status Next(RecordRef* rec, bool* eof) = 0;

  // Position of the next record: its byte offset, and how many records were returned or skipped
  // before it.
  virtual uint64_t offset() const = 0;
  virtual uint64_t records() const = 0;

  // Moves to a position previously read from offset()/records(). FIFOs cannot seek and return
  // FAILED_PRECONDITION.
  virtual absl::Status Seek(uint64_t offset, uint64_t records) = 0;

  // The CSV header line (without newline); empty for every other format.
  virtual absl::string_view header() const { return {}; }

  virtual const std::string& path() const = 0;
};

// Opens `path` (a regular file or a FIFO) for `format`. `compression`: Channel.compression (AUTO:
// gzip for names ending in ".gz" and streams starting with the gzip magic bytes). Offsets and
// positions of a gzip source are in the decompressed stream (formats/buffered_io.h).
absl::StatusOr<std::unique_ptr<RecordSource>> OpenRecordSource(
    DataFormat format, const std::string& path, Channel::Compression compression = Channel::AUTO);

// Turns raw records into RawRows. Create one per thread; Parse is not thread-safe.
class RecordParser {
 public:
  virtual ~RecordParser() = default;
  // Parses each record into one new row of *rows (rows->num_fields must equal the spec's).
  // A record that fails to parse adds no row; instead a DATA_LOSS / INVALID_ARGUMENT status
  // naming the file, the line or record, and what was expected is appended to *errors.
  virtual void Parse(absl::Span<const RecordRef> records, RawRows* rows,
                     std::vector<absl::Status>* errors) = 0;
};

// `csv_header` is the header line of CSV files (RecordSource::header()); ignored otherwise.
absl::StatusOr<std::unique_ptr<RecordParser>> CreateRecordParser(DataFormat format,
                                                                 const FeatureSpec& spec,
                                                                 absl::string_view csv_header);

// Writes RawRows in a format. Not thread-safe.
class RecordWriter {
 public:
  virtual ~RecordWriter() = default;
  // Appends rows [begin, end) of `rows`.
  virtual absl::Status Write(const RawRows& rows, int begin, int end) = 0;
  // Flushes and closes; the file is complete only after Close returns OK.
  virtual absl::Status Close() = 0;
  virtual uint64_t bytes_written() const = 0;
};

absl::StatusOr<std::unique_ptr<RecordWriter>> CreateRecordWriter(DataFormat format,
                                                                 const FeatureSpec& spec,
                                                                 const std::string& path);

// Parses "criteo_tsv", "csv", "libsvm", "tfrecord", "recordio" (as the --format flag spells them).
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
std::string DataFormatName(DataFormat format);
// Conventional file extension for written files: ".tsv", ".csv", ".libsvm", ".tfrecords", ".rec".
std::string DataFormatExtension(DataFormat format);

}  // namespace pstrain
