#include "worker/data/formats/buffered_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<BufferedReader>> BufferedReader::Open(const std::string& path,
                                                                     size_t chunk_size) {
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
  return std::unique_ptr<BufferedReader>(new BufferedReader(
      path, fd, fifo, fifo ? 0 : static_cast<uint64_t>(st.st_size), std::max<size_t>(chunk_size, 1)));
}

BufferedReader::BufferedReader(std::string path, int fd, bool is_fifo, uint64_t size, size_t chunk)
    : path_(std::move(path)), fd_(fd), is_fifo_(is_fifo), file_size_(size), chunk_(chunk) {}

BufferedReader::~BufferedReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status BufferedReader::ReadOnce(size_t want, bool* more) {
  *more = false;
  if (eof_) return absl::OkStatus();
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
  while (true) {
    const ssize_t n = ::read(fd_, buf_.get() + end_, room);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("read at offset ", window_offset_ + end_, " of"), path_);
    }
    if (n == 0) {
      eof_ = true;
      return absl::OkStatus();
    }
    end_ += static_cast<size_t>(n);
    *more = true;
    return absl::OkStatus();
  }
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
