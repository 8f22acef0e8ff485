#include "worker/data/formats/line_source.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/formats/csv.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<RecordSource>> LineSource::Open(DataFormat format,
                                                               const std::string& path,
                                                               size_t chunk_size,
                                                               Channel::Compression compression,
                                                               size_t max_line_bytes) {
  ASSIGN_OR_RETURN(auto reader, BufferedReader::Open(path, chunk_size, compression));
  std::unique_ptr<LineSource> src(
      new LineSource(std::move(reader), format == CSV, std::max<size_t>(1, max_line_bytes)));
  if (src->header_lines_ > 0) {
    absl::string_view line;
    bool eof = false;
    RETURN_IF_ERROR(src->NextLine(&line, &eof));
    // Spreadsheet exports often start with a UTF-8 byte order mark.
    if (absl::StartsWith(line, "\xEF\xBB\xBF")) line.remove_prefix(3);
    // Every column costs each parser memory: refuse a header of too many before anyone keeps it.
    if (CountCsvColumns(line) > kMaxCsvColumns) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": line 1 (the CSV header, ", line.size(), " bytes) has more than ",
          kMaxCsvColumns, " columns, the most a CSV file may have (docs/FORMATS.md)"));
    }
    src->header_ = std::string(line);
    src->header_end_ = src->reader_->offset();
  }
  return std::unique_ptr<RecordSource>(std::move(src));
}

absl::Status LineSource::NextLine(absl::string_view* line, bool* eof) {
  *eof = false;
  if (!fatal_.ok()) return fatal_;
  size_t scanned = 0;  // bytes after the cursor already known to hold no newline
  while (true) {
    const char* d = reader_->data();
    const size_t avail = reader_->available();
    const void* nl = std::memchr(d + scanned, '\n', avail - scanned);
    size_t len;
    if (nl != nullptr) {
      len = static_cast<size_t>(static_cast<const char*>(nl) - d);
      reader_->Consume(len + 1);
    } else {
      scanned = avail;
      // Stop buffering at the limit: a file with no newline (or a binary file read as text)
      // must not take memory without bound.
      if (avail > max_line_bytes_) {
        fatal_ = absl::InvalidArgumentError(absl::StrCat(
            reader_->path(), ": line ", lines_ + header_lines_ + 1, " at offset ",
            reader_->offset(), " is longer than ", max_line_bytes_,
            " bytes (data.max_record_bytes) without a newline: not a text file of records, "
            "or raise the limit"));
        return fatal_;
      }
      bool more = false;
      RETURN_IF_ERROR(reader_->ReadMore(&more));
      if (more) continue;
      len = reader_->available();
      if (len == 0) {
        *eof = true;
        return absl::OkStatus();
      }
      d = reader_->data();
      reader_->Consume(len);
    }
    if (len > max_line_bytes_) {  // the newline came within the last read
      fatal_ = absl::InvalidArgumentError(absl::StrCat(
          reader_->path(), ": line ", lines_ + header_lines_ + 1, " ending at offset ",
          reader_->offset(), " has ", len, " bytes, more than ", max_line_bytes_,
          " (data.max_record_bytes)"));
      return fatal_;
    }
    if (len > 0 && d[len - 1] == '\r') --len;
    *line = absl::string_view(d, len);
    return absl::OkStatus();
  }
}

absl::Status LineSource::Next(RecordRef* rec, bool* eof) {
  absl::string_view line;
  do {
    RETURN_IF_ERROR(NextLine(&line, eof));
    if (*eof) return absl::OkStatus();
    ++lines_;
  } while (line.empty());
  rec->data = line;
  rec->file = &reader_->path();
  rec->number = lines_ + header_lines_;
  return absl::OkStatus();
}

absl::Status LineSource::Seek(uint64_t offset, uint64_t records) {
  if (offset < header_end_) {
    return absl::InvalidArgumentError(absl::StrCat(
        path(), ": cannot seek to offset ", offset, ": it is inside the header line (data starts at ",
        header_end_, ")"));
  }
  RETURN_IF_ERROR(reader_->Seek(offset));
  lines_ = records;
  fatal_ = absl::OkStatus();
  return absl::OkStatus();
}

}  // namespace pstrain
