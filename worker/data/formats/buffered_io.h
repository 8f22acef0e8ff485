// Large-block buffered file I/O for the record sources and writers of worker/data/formats/.
//
// BufferedReader keeps one growable buffer per open file. Records are handed out as views into
// it, so text and binary framing need no per-record allocation; a record larger than the chunk
// size grows the buffer. Regular files and FIFOs (SageMaker pipe mode) are both read with
// read(2) until EOF; only regular files can Seek.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pstrain {

// Default read size of a source: large reads, few syscalls.
constexpr size_t kDefaultReadChunk = size_t{2} << 20;
// Default longest record a source accepts (DataConfig.max_record_bytes): a line, a TFRecord
// record, a reassembled RecordIO record. A source buffers at most this plus one read chunk.
constexpr size_t kDefaultMaxRecordBytes = size_t{16} << 20;

// Sequential reader over a file or FIFO. Not thread-safe.
//
// The window [data(), data() + available()) holds bytes starting at file offset offset().
// Consume(n) moves the cursor forward; Ensure/ReadMore read more and may move the window in
// memory, which invalidates earlier views.
class BufferedReader {
 public:
  // Opens `path` (regular file or FIFO) for reading. `chunk_size` (>= 1) is the read size; tests
  // use tiny sizes so records straddle reads.
  static absl::StatusOr<std::unique_ptr<BufferedReader>> Open(const std::string& path,
                                                             size_t chunk_size);
  ~BufferedReader();
  BufferedReader(const BufferedReader&) = delete;
  BufferedReader& operator=(const BufferedReader&) = delete;

  const char* data() const { return buf_.get() + begin_; }
  size_t available() const { return end_ - begin_; }
  // File offset of data()[0].
  uint64_t offset() const { return window_offset_ + begin_; }
  void Consume(size_t n) { begin_ += n; }

  // Reads until at least n bytes are available or the input ends. Sets *complete to whether
  // n bytes are available. Errors are I/O errors (UNAVAILABLE) naming the file.
  absl::Status Ensure(size_t n, bool* complete);
  // Reads at least one more byte unless the input has ended; sets *more = false at EOF.
  absl::Status ReadMore(bool* more);

  // Regular files only: moves the cursor to `offset` (<= file size). FIFOs: FAILED_PRECONDITION.
  absl::Status Seek(uint64_t offset);

  bool is_fifo() const { return is_fifo_; }
  // Size at open time for regular files, 0 for FIFOs.
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  BufferedReader(std::string path, int fd, bool is_fifo, uint64_t size, size_t chunk);
  // One read(2) into the free tail of the buffer, first compacting and, if the window already
  // fills the buffer, growing it to at least `want` bytes.
  absl::Status ReadOnce(size_t want, bool* more);

  std::string path_;
  int fd_ = -1;
  bool is_fifo_ = false;
  uint64_t file_size_ = 0;
  size_t chunk_ = kDefaultReadChunk;
  std::unique_ptr<char[]> buf_;
  size_t capacity_ = 0;
  size_t begin_ = 0;  // cursor within buf_
  size_t end_ = 0;    // end of valid bytes within buf_
  uint64_t window_offset_ = 0;  // file offset of buf_[0]
  bool eof_ = false;
};

// Buffered writer to a file (created or truncated) or a FIFO. Callers append to buffer() and
// call MaybeFlush(); Close() flushes, fsyncs regular files and closes. Not thread-safe.
class BufferedWriter {
 public:
  static absl::StatusOr<std::unique_ptr<BufferedWriter>> Create(const std::string& path);
  // Closes without reporting errors if Close() was not called.
  ~BufferedWriter();
  BufferedWriter(const BufferedWriter&) = delete;
  BufferedWriter& operator=(const BufferedWriter&) = delete;

  // Bytes not yet written; append to it freely.
  std::string* buffer() { return &buf_; }
  // Writes the buffer out once it holds at least the flush threshold (1 MiB).
  absl::Status MaybeFlush() { return buf_.size() >= kFlushBytes ? Flush() : absl::OkStatus(); }
  absl::Status Flush();
  absl::Status Close();
  bool closed() const { return fd_ < 0; }
  // Bytes written so far, including those still buffered.
  uint64_t bytes_written() const { return flushed_ + buf_.size(); }
  const std::string& path() const { return path_; }

 private:
  static constexpr size_t kFlushBytes = size_t{1} << 20;
  BufferedWriter(std::string path, int fd, bool regular);

  std::string path_;
  int fd_ = -1;
  bool regular_ = true;
  std::string buf_;
  uint64_t flushed_ = 0;
};

}  // namespace pstrain
