// Line framing for the text formats (CRITEO_TSV, CSV, LIBSVM).
//
// A record is one line without its '\n' and without a trailing '\r' (so \r\n files work). A last
// line without a newline is a record. Empty lines are skipped but still counted, so line numbers
// in messages stay the file's own. With a header (CSV), the first line is read at open time and
// returned by header(), and the first data line is line 2.
//
// Position: offset() is the byte offset of the next line; records() counts the lines consumed
// after the header (blank ones included), so the next line is line records() + 1 (+ 1 with a
// header). Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "worker/data/formats/buffered_io.h"
#include "worker/data/record_io.h"

namespace pstrain {

class LineSource : public RecordSource {
 public:
  // `compression`: buffered_io.h. A line longer than max_line_bytes (decompressed bytes for gzip
  // input) is INVALID_ARGUMENT naming the file, the line and its offset; the source then reads no
  // further (at most max_line_bytes + chunk_size buffered).
  static absl::StatusOr<std::unique_ptr<RecordSource>> Open(
      DataFormat format, const std::string& path, size_t chunk_size,
      Channel::Compression compression = Channel::AUTO,
      size_t max_line_bytes = kDefaultMaxRecordBytes);

  absl::Status Next(RecordRef* rec, bool* eof) override;
  uint64_t offset() const override { return reader_->offset(); }
  uint64_t records() const override { return lines_; }
  absl::Status Seek(uint64_t offset, uint64_t records) override;
  absl::string_view header() const override { return header_; }
  const std::string& path() const override { return reader_->path(); }

 private:
  LineSource(std::unique_ptr<BufferedReader> reader, bool has_header, size_t max_line_bytes)
      : reader_(std::move(reader)),
        header_lines_(has_header ? 1 : 0),
        max_line_bytes_(max_line_bytes) {}
  // The next line, whatever it holds; *eof at the end of input.
  absl::Status NextLine(absl::string_view* line, bool* eof);

  std::unique_ptr<BufferedReader> reader_;
  const uint64_t header_lines_;
  const size_t max_line_bytes_;
  absl::Status fatal_;  // a line too long: every later call returns it
  uint64_t header_end_ = 0;  // byte offset just past the header line
  uint64_t lines_ = 0;
  std::string header_;
};

}  // namespace pstrain
