#include "worker/data/formats/buffered_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <zlib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status.h"

namespace pstrain {
namespace {

// Raw (compressed) bytes read per read(2): the chunk size, at least 64 KiB unless a test asks
// for tiny chunks (then tiny too, so that gzip members straddle reads as well).
size_t RawCapacity(size_t chunk) {
  return chunk < 4096 ? std::max<size_t>(chunk, 16) : std::max<size_t>(chunk, 64 << 10);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BufferedReader>> BufferedReader::Open(
    const std::string& path, size_t chunk_size, Channel::Compression compression) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("stat", path);
    ::close(fd);
    return s;
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, expected a data file"));
  }
  const bool fifo = S_ISFIFO(st.st_mode);
  if (!fifo) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<BufferedReader> r(new BufferedReader(
      path, fd, fifo, fifo ? 0 : static_cast<uint64_t>(st.st_size), std::max<size_t>(chunk_size, 1)));
  if (compression == Channel::GZIP || (compression == Channel::AUTO && absl::EndsWith(path, ".gz"))) {
    r->gzip_ = true;
    RETURN_IF_ERROR(r->InitInflate());
  } else if (compression == Channel::AUTO) {
    r->decided_ = false;  // the first read looks for the gzip magic bytes
  }
  return r;
}

absl::Status BufferedReader::InitInflate() {
  if (raw_ == nullptr) raw_.reset(new char[RawCapacity(chunk_)]);
  zs_ = std::make_unique<z_stream>();
  // 16 + MAX_WBITS: a gzip header and trailer (with its CRC-32 and length check).
  if (inflateInit2(zs_.get(), 16 + MAX_WBITS) != Z_OK) {
    zs_.reset();
    return absl::ResourceExhaustedError(absl::StrCat(path_, ": cannot initialize zlib"));
  }
  return absl::OkStatus();
}

absl::Status BufferedReader::GzipError(const std::string& what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ": ", what, " (at compressed byte ", raw_offset_ - (zs_ ? zs_->avail_in : 0),
                   "); expected gzip data: the file is read as gzip because ",
                   absl::EndsWith(path_, ".gz") ? "its name ends in .gz"
                                                : "of compression: GZIP or its first bytes",
                   " (compression: NONE reads it as is)"));
}

absl::Status BufferedReader::Decide() {
  if (raw_ == nullptr) raw_.reset(new char[RawCapacity(chunk_)]);
  // A FIFO may deliver fewer than 3 bytes per read: read until 3 or the end.
  while (raw_end_ < 3) {
    const ssize_t n = ::read(fd_, raw_.get() + raw_end_, RawCapacity(chunk_) - raw_end_);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read at offset 0 of", path_);
    }
    if (n == 0) break;
    raw_end_ += static_cast<size_t>(n);
  }
  raw_offset_ = raw_end_;
  decided_ = true;
  const auto* b = reinterpret_cast<const unsigned char*>(raw_.get());
  if (raw_end_ >= 3 && b[0] == 0x1f && b[1] == 0x8b && b[2] == 8) {
    gzip_ = true;
    return InitInflate();
  }
  return absl::OkStatus();
}

absl::Status BufferedReader::ReadRaw(char* out, size_t room, size_t* got) {
  *got = 0;
  if (raw_begin_ < raw_end_) {
    *got = std::min(room, raw_end_ - raw_begin_);
    std::memcpy(out, raw_.get() + raw_begin_, *got);
    raw_begin_ += *got;
    return absl::OkStatus();
  }
  while (true) {
    const ssize_t n = ::read(fd_, out, room);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("read at offset ", window_offset_ + end_, " of"), path_);
    }
    *got = static_cast<size_t>(n);
    raw_offset_ += *got;
    return absl::OkStatus();
  }
}

absl::Status BufferedReader::Inflate(char* out, size_t room, size_t* got) {
  *got = 0;
  while (*got == 0) {
    if (zs_->avail_in == 0) {
      if (raw_begin_ >= raw_end_) {
        ssize_t n;
        do {
          n = ::read(fd_, raw_.get(), RawCapacity(chunk_));
        } while (n < 0 && errno == EINTR);
        if (n < 0) {
          return ErrnoError(absl::StrCat("read at compressed offset ", raw_offset_, " of"), path_);
        }
        if (n == 0) {
          // The end of the compressed input: clean after a whole member (or an empty file).
          if (member_done_ || raw_offset_ == 0) return absl::OkStatus();
          return GzipError("the gzip stream ends in the middle of a member (truncated)");
        }
        raw_begin_ = 0;
        raw_end_ = static_cast<size_t>(n);
        raw_offset_ += raw_end_;
      }
      zs_->next_in = reinterpret_cast<unsigned char*>(raw_.get() + raw_begin_);
      zs_->avail_in = static_cast<unsigned>(raw_end_ - raw_begin_);
      raw_begin_ = raw_end_;
    }
    if (member_done_) {
      // More input after the end of a member: the next member of a concatenation.
      inflateReset(zs_.get());
      member_done_ = false;
    }
    zs_->next_out = reinterpret_cast<unsigned char*>(out);
    zs_->avail_out = static_cast<unsigned>(std::min<size_t>(room, 1u << 30));
    const int rc = inflate(zs_.get(), Z_NO_FLUSH);
    *got = std::min<size_t>(room, 1u << 30) - zs_->avail_out;
    if (rc == Z_STREAM_END) {
      member_done_ = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return GzipError(absl::StrCat("corrupt gzip data: ", zs_->msg != nullptr ? zs_->msg : "zlib error"));
    }
  }
  return absl::OkStatus();
}

BufferedReader::BufferedReader(std::string path, int fd, bool is_fifo, uint64_t size, size_t chunk)
    : path_(std::move(path)), fd_(fd), is_fifo_(is_fifo), file_size_(size), chunk_(chunk) {}

BufferedReader::~BufferedReader() {
  if (zs_ != nullptr) inflateEnd(zs_.get());
  if (fd_ >= 0) ::close(fd_);
}

absl::Status BufferedReader::ReadOnce(size_t want, bool* more) {
  *more = false;
  if (eof_) return absl::OkStatus();
  if (!decided_) RETURN_IF_ERROR(Decide());
  // The unconsumed tail is at most one partial record, so moving it to the front is cheap.
  if (begin_ > 0) {
    std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
    window_offset_ += begin_;
    end_ -= begin_;
    begin_ = 0;
  }
  const size_t need = std::max({want, end_ + 1, std::min(chunk_, size_t{1} << 30)});
  if (need > capacity_) {
    const size_t cap = std::max(need, capacity_ * 2);
    std::unique_ptr<char[]> grown(new char[cap]);
    if (end_ > 0) std::memcpy(grown.get(), buf_.get(), end_);
    buf_ = std::move(grown);
    capacity_ = cap;
  }
  // Reads are capped at the chunk size even when the buffer has grown, so tiny test chunks
  // really do split records across reads.
  const size_t room = std::min(capacity_ - end_, chunk_);
  size_t got = 0;
  RETURN_IF_ERROR(gzip_ ? Inflate(buf_.get() + end_, room, &got)
                        : ReadRaw(buf_.get() + end_, room, &got));
  if (got == 0) {
    eof_ = true;
    return absl::OkStatus();
  }
  end_ += got;
  *more = true;
  return absl::OkStatus();
}

absl::Status BufferedReader::Ensure(size_t n, bool* complete) {
  bool more = true;
  while (available() < n && more) {
    // Ask for room for the whole request (the window moves to the buffer's start first), so a
    // large record costs one allocation.
    absl::Status s = ReadOnce(n, &more);
    if (!s.ok()) return s;
  }
  *complete = available() >= n;
  return absl::OkStatus();
}

absl::Status BufferedReader::ReadMore(bool* more) { return ReadOnce(0, more); }

absl::Status BufferedReader::Seek(uint64_t offset) {
  if (is_fifo_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " is a FIFO (pipe mode): cannot seek to offset ", offset));
  }
  if (!decided_) RETURN_IF_ERROR(Decide());
  if (gzip_) {
    // Offsets are in the decompressed stream: within the window, move the cursor; before it,
    // decompress again from the start; then decompress forward to the offset.
    if (offset < window_offset_) {
      if (::lseek(fd_, 0, SEEK_SET) < 0) return ErrnoError("seek", path_);
      inflateReset(zs_.get());
      zs_->avail_in = 0;
      raw_begin_ = raw_end_ = 0;
      raw_offset_ = 0;
      member_done_ = false;
      window_offset_ = 0;
      begin_ = end_ = 0;
      eof_ = false;
    }
    while (window_offset_ + end_ < offset) {
      window_offset_ += end_;
      begin_ = end_ = 0;
      bool more = false;
      RETURN_IF_ERROR(ReadOnce(0, &more));
      if (!more) {
        return absl::OutOfRangeError(absl::StrCat(path_, ": cannot seek to offset ", offset,
                                                  ": the decompressed stream has ",
                                                  window_offset_, " bytes"));
      }
    }
    begin_ = static_cast<size_t>(offset - window_offset_);
    return absl::OkStatus();
  }
  raw_begin_ = raw_end_ = 0;  // bytes kept by the AUTO sniff: the seek replaces them
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError("stat", path_);
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (offset > file_size_) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": cannot seek to offset ", offset,
                                              ": the file has ", file_size_, " bytes"));
  }
  if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) return ErrnoError("seek", path_);
  begin_ = end_ = 0;
  window_offset_ = offset;
  eof_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BufferedWriter>> BufferedWriter::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", path);
  struct stat st;
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  return std::unique_ptr<BufferedWriter>(new BufferedWriter(path, fd, regular));
}

BufferedWriter::BufferedWriter(std::string path, int fd, bool regular)
    : path_(std::move(path)), fd_(fd), regular_(regular) {
  buf_.reserve(kFlushBytes + (kFlushBytes >> 2));
}

BufferedWriter::~BufferedWriter() {
  if (fd_ >= 0) Close().IgnoreError();
}

absl::Status BufferedWriter::Flush() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("write", path_);
      buf_.erase(0, done);
      flushed_ += done;
      return s;
    }
    done += static_cast<size_t>(n);
  }
  flushed_ += done;
  buf_.clear();
  return absl::OkStatus();
}

absl::Status BufferedWriter::Close() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s = Flush();
  // fsync is meaningless (EINVAL) on pipes; only regular files are made durable.
  if (s.ok() && regular_ && ::fsync(fd_) != 0) s = ErrnoError("fsync", path_);
  if (::close(fd_) != 0 && s.ok()) s = ErrnoError("close", path_);
  fd_ = -1;
  return s;
}

}  // namespace pstrain
