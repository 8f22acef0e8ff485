#include "worker/data/formats/line_source.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<RecordSource>> LineSource::Open(DataFormat format,
                                                               const std::string& path,
                                                               size_t chunk_size,
                                                               Channel::Compression compression) {
  ASSIGN_OR_RETURN(auto reader, BufferedReader::Open(path, chunk_size, compression));
  std::unique_ptr<LineSource> src(new LineSource(std::move(reader), format == CSV));
  if (src->header_lines_ > 0) {
    absl::string_view line;
    bool eof = false;
    RETURN_IF_ERROR(src->NextLine(&line, &eof));
    // Spreadsheet exports often start with a UTF-8 byte order mark.
    if (absl::StartsWith(line, "\xEF\xBB\xBF")) line.remove_prefix(3);
    src->header_ = std::string(line);
    src->header_end_ = src->reader_->offset();
  }
  return std::unique_ptr<RecordSource>(std::move(src));
}

absl::Status LineSource::NextLine(absl::string_view* line, bool* eof) {
  *eof = false;
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
  return absl::OkStatus();
}

}  // namespace pstrain
