// A test-only record format for the pipeline's tests and bench: one record per line,
// "label,value" (label 0 or 1, value a non-negative integer below 2^24 so that it survives the
// float of a DENSE field exactly). It implements RecordSource / RecordParser the way the real
// formats do (positions, seeking, FIFOs, corrupt records) without their parsing cost.
//   - A line starting with '!' is a corrupt record whose extent is known: Next returns DATA_LOSS
//     and moves past it (like a TFRecord whose data CRC does not match).
//   - A line "#TRUNCATED" is a non-skippable error: Next returns OUT_OF_RANGE and the rest of
//     the file cannot be read (like a truncated record).
//   - Any other line that is not "label,value" is rejected by the parser.
//   - With format CSV the first line is a header; the parser requires it to be "label,value".
// FakeLineSpec() is the matching FeatureSpec: one NUMERIC DENSE field "v", so each encoded row
// has ids[b] == 1 and values[b] == value.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace testing_fake {

class LineSource : public RecordSource {
 public:
  static absl::StatusOr<std::unique_ptr<RecordSource>> Open(DataFormat format,
                                                            const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a FIFO blocks for a writer
    if (fd < 0) {
      return absl::NotFoundError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
    }
    std::unique_ptr<LineSource> s(new LineSource(fd, path));
    if (format == CSV) {
      absl::string_view line;
      bool eof = false;
      absl::Status st = s->ReadLine(&line, &eof);
      if (!st.ok()) return st;
      if (!eof) s->header_ = std::string(line);
      s->header_lines_ = 1;
    }
    return std::unique_ptr<RecordSource>(std::move(s));
  }

  ~LineSource() override { ::close(fd_); }

  absl::Status Next(RecordRef* rec, bool* eof) override {
    absl::string_view line;
    RETURN_IF_ERROR(ReadLine(&line, eof));
    if (*eof) return absl::OkStatus();
    ++records_;
    const uint64_t number = records_ + header_lines_;
    if (line == "#TRUNCATED") {
      done_ = true;
      return absl::OutOfRangeError(
          absl::StrCat(path_, ": record ", number, ": truncated; expected a complete line"));
    }
    if (!line.empty() && line[0] == '!') {
      return absl::DataLossError(
          absl::StrCat(path_, ":line ", number, ": corrupt record (checksum mismatch)"));
    }
    rec->data = line;
    rec->file = &path_;
    rec->number = number;
    return absl::OkStatus();
  }

  uint64_t offset() const override { return offset_; }
  uint64_t records() const override { return records_; }

  absl::Status Seek(uint64_t offset, uint64_t records) override {
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("seek ", path_, ": ", std::strerror(errno)));
    }
    offset_ = offset;
    records_ = records;
    begin_ = end_ = 0;
    at_eof_ = done_ = false;
    return absl::OkStatus();
  }

  absl::string_view header() const override { return header_; }
  const std::string& path() const override { return path_; }

 private:
  LineSource(int fd, std::string path) : fd_(fd), path_(std::move(path)), buf_(1 << 16, '\0') {}

  // The next line without its newline; a last line without a newline counts.
  absl::Status ReadLine(absl::string_view* line, bool* eof) {
    *eof = false;
    while (true) {
      if (done_) {
        *eof = true;
        return absl::OkStatus();
      }
      const char* nl = static_cast<const char*>(std::memchr(&buf_[begin_], '\n', end_ - begin_));
      if (nl != nullptr || (at_eof_ && end_ > begin_)) {
        const size_t len = nl ? nl - &buf_[begin_] : end_ - begin_;
        *line = absl::string_view(&buf_[begin_], len);
        const size_t used = len + (nl ? 1 : 0);
        begin_ += used;
        offset_ += used;
        return absl::OkStatus();
      }
      if (at_eof_) {
        done_ = true;
        continue;
      }
      if (begin_ > 0) {  // compact, then read more
        std::memmove(&buf_[0], &buf_[begin_], end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
      const ssize_t n = ::read(fd_, &buf_[end_], buf_.size() - end_);
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("read ", path_, ": ", std::strerror(errno)));
      }
      if (n == 0) at_eof_ = true;
      end_ += static_cast<size_t>(n);
    }
  }

  int fd_;
  std::string path_;
  std::string header_;
  uint64_t header_lines_ = 0;
  std::string buf_;
  size_t begin_ = 0, end_ = 0;
  bool at_eof_ = false;
  bool done_ = false;
  uint64_t offset_ = 0;
  uint64_t records_ = 0;
};

class LineParser : public RecordParser {
 public:
  void Parse(absl::Span<const RecordRef> records, RawRows* rows,
             std::vector<absl::Status>* errors) override {
    for (const RecordRef& rec : records) {
      const size_t comma = rec.data.find(',');
      uint32_t value = 0;
      if (comma == absl::string_view::npos || comma != 1 ||
          (rec.data[0] != '0' && rec.data[0] != '1') ||
          !absl::SimpleAtoi(rec.data.substr(comma + 1), &value) || value >= (1u << 24)) {
        errors->push_back(absl::InvalidArgumentError(
            absl::StrCat(DescribeRecord(rec, CRITEO_TSV), ": expected 'label,value' with label 0 ",
                         "or 1 and an integer value below 2^24, got '", rec.data, "'")));
        continue;
      }
      const int row = rows->AddRow(rec.data[0] == '1' ? 1.0f : 0.0f);
      rows->SetNumeric(row, 0, static_cast<double>(value));
    }
  }
};

inline RecordFormats Formats() {
  RecordFormats f;
  f.open_source = [](DataFormat format, const std::string& path, Channel::Compression) {
    return LineSource::Open(format, path);
  };
  f.make_parser = [](DataFormat format, const FeatureSpec&,
                     absl::string_view header) -> absl::StatusOr<std::unique_ptr<RecordParser>> {
    if (format == CSV && header != "label,value") {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV header '", header, "': expected 'label,value'"));
    }
    return std::unique_ptr<RecordParser>(new LineParser());
  };
  return f;
}

inline FeatureSpec FakeLineSpec() {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  FieldSpec* f = config.add_field();
  f->set_name("v");
  f->set_kind(NUMERIC);
  f->set_numeric_mode(DENSE);
  f->set_numeric_transform(NO_TRANSFORM);  // values pass through exactly
  return *FeatureSpec::Create(config);
}

// One line per value: "<value % 2>,<value>".
inline std::string Lines(const std::vector<int>& values) {
  std::string out;
  for (int v : values) absl::StrAppend(&out, v % 2, ",", v, "\n");
  return out;
}

}  // namespace testing_fake
}  // namespace pstrain
