// Large-block buffered file I/O for the record sources and writers of worker/data/formats/.
//
// BufferedReader keeps one growable buffer per open file. Records are handed out as views into
// it, so text and binary framing need no per-record allocation; a record larger than the chunk
// size grows the buffer. Regular files and FIFOs (SageMaker pipe mode) are both read with
// read(2) until EOF; only regular files can Seek.
//
// Gzip (zlib's inflate; Channel.compression in proto/pstrain/config.proto): the reader hands out
// the decompressed bytes, and every offset (offset(), Seek) is an offset in the decompressed
// stream, so the record sources above and their exact positions work unchanged. Seek in a gzip
// file moves forward by decompressing, and backward by decompressing again from the start: the
// same bytes, so a restored position is exact (it costs a re-read of the file up to it).
// Concatenated gzip members (`cat a.gz b.gz`) are one stream, as gzip(1) reads them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"

struct z_stream_s;

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
  // `compression`: AUTO is gzip for a name ending in ".gz" or a stream starting with the gzip
  // magic bytes 1f 8b 08, else uncompressed.
  static absl::StatusOr<std::unique_ptr<BufferedReader>> Open(
      const std::string& path, size_t chunk_size,
      Channel::Compression compression = Channel::AUTO);
  ~BufferedReader();
  BufferedReader(const BufferedReader&) = delete;
  BufferedReader& operator=(const BufferedReader&) = delete;

  const char* data() const { return buf_.get() + begin_; }
  size_t available() const { return end_ - begin_; }
  // File offset of data()[0].
  uint64_t offset() const { return window_offset_ + begin_; }
  void Consume(size_t n) { begin_ += n; }

  // Reads until at least n bytes are available or the input ends. Sets *complete to whether
  // n bytes are available. Errors are I/O errors (UNAVAILABLE) naming the file, and for gzip
  // input corrupt or truncated compressed data (DATA_LOSS is not used: the rest of the file is
  // unreadable) naming the file and the compressed byte offset.
  absl::Status Ensure(size_t n, bool* complete);
  // Reads at least one more byte unless the input has ended; sets *more = false at EOF.
  absl::Status ReadMore(bool* more);

  // Regular files only: moves the cursor to `offset` (<= file size). FIFOs: FAILED_PRECONDITION.
  absl::Status Seek(uint64_t offset);

  bool is_fifo() const { return is_fifo_; }
  // Whether the input is gzip (known after the first read under AUTO).
  bool gzip() const { return gzip_; }
  // Whether file_size() bounds offsets: a regular, uncompressed file.
  bool size_known() const { return !is_fifo_ && !gzip_ && decided_; }
  // Size at open time for regular files (compressed bytes for gzip), 0 for FIFOs.
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  BufferedReader(std::string path, int fd, bool is_fifo, uint64_t size, size_t chunk);
  // One read(2) (or one round of inflate) into the free tail of the buffer, first compacting
  // and, if the window already fills the buffer, growing it to at least `want` bytes.
  absl::Status ReadOnce(size_t want, bool* more);
  // Up to `room` bytes into `out`: from the raw bytes kept by the AUTO sniff, then read(2).
  absl::Status ReadRaw(char* out, size_t room, size_t* got);
  // Up to `room` decompressed bytes into `out` (at least one unless the stream ended).
  absl::Status Inflate(char* out, size_t room, size_t* got);
  // AUTO: reads the first bytes and decides whether the stream is gzip.
  absl::Status Decide();
  absl::Status InitInflate();
  absl::Status GzipError(const std::string& what) const;

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
  // Compression. Raw (compressed, or sniffed) bytes wait in raw_[raw_begin_, raw_end_).
  bool decided_ = true;  // false until AUTO has looked at the first bytes
  bool gzip_ = false;
  bool member_done_ = false;  // inflate reached the end of a gzip member
  std::unique_ptr<z_stream_s> zs_;
  std::unique_ptr<char[]> raw_;
  size_t raw_begin_ = 0, raw_end_ = 0;
  uint64_t raw_offset_ = 0;  // compressed bytes read from the file so far
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
