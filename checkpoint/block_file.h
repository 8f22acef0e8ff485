// The block file: the one on-disk container of every pstrain checkpoint file (PS shard files,
// the single-process trainer's checkpoint, worker state). docs/CHECKPOINT.md has the byte
// layout; in short (all integers little-endian):
//
//   header: magic "PSTRNCKP" (8) | uint32 version | uint32 masked_crc32c(magic, version)
//   blocks: char tag[4] | uint32 flags | uint64 length | payload[length]
//           | uint32 masked_crc32c(tag, flags, length, payload)
//   end:    a block with tag "ENDB" whose payload is the uint64 number of blocks before it,
//           followed by nothing.
//
// The writer streams to a temporary file and renames it over the target only when complete, so
// a crash never leaves a torn file under the final name. The reader verifies the magic, the
// version, every CRC, the end block and the exact file length; every failure is DATA_LOSS naming
// the file, the block index and tag and the byte offset, except a file from a NEWER format
// version (or with flags this version does not know), which is FAILED_PRECONDITION.
//
// The stores' serialization on top of it (block tags EMBM, EMBR, DNSE) is ps/store/store_blocks.h;
// the checkpoint directories and their commit rules are checkpoint/layout.h.
//
// Thread-safety: BlockWriter and BlockReader are not thread-safe; the free functions are as
// safe as the objects they are given (the stores are thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pstrain {

constexpr char kBlockFileMagic[] = "PSTRNCKP";  // 8 bytes on disk, without the NUL
constexpr uint32_t kBlockFileVersion = 1;       // the version this build writes and reads up to
constexpr size_t kBlockFileHeaderSize = 16;
constexpr size_t kBlockHeaderSize = 16;  // tag, flags, length
constexpr char kEndTag[] = "ENDB";

struct Block {
  std::string tag;  // 4 bytes
  uint32_t flags = 0;
  std::string payload;
  int64_t index = 0;    // position in the file, from 0
  uint64_t offset = 0;  // byte offset of the block's tag
};

class BlockWriter {
 public:
  // Writes to "<path>.tmp.<pid>"; Finish() renames it to `path`. Errors name the path.
  static absl::StatusOr<std::unique_ptr<BlockWriter>> Create(const std::string& path);
  // Builds the file in memory: *out holds the complete file after Finish(). For small files
  // (worker state, then written with WriteFileAtomic) and tests.
  static std::unique_ptr<BlockWriter> ToString(std::string* out);
  // Without a successful Finish(), removes the temporary file: nothing appears under `path`.
  ~BlockWriter();
  BlockWriter(const BlockWriter&) = delete;
  BlockWriter& operator=(const BlockWriter&) = delete;

  // Appends one block whose payload is the concatenation of `pieces` (no copy is made).
  // tag must be 4 bytes and must not be kEndTag; flags must be 0 in format version 1.
  absl::Status Add(absl::string_view tag, absl::Span<const absl::string_view> pieces);
  absl::Status Add(absl::string_view tag, absl::string_view payload) {
    return Add(tag, absl::Span<const absl::string_view>(&payload, 1));
  }
  // Writes the end block, then (files) fsyncs, renames onto the path and fsyncs the directory.
  absl::Status Finish();

  int64_t blocks() const { return blocks_; }  // added so far, not counting the end block
  uint64_t bytes() const { return bytes_; }   // written so far, headers included

 private:
  BlockWriter(std::string path, int fd, std::string* out);
  absl::Status Write(absl::string_view data);
  absl::Status AddBlock(absl::string_view tag, absl::Span<const absl::string_view> pieces);

  std::string path_, tmp_path_;
  int fd_ = -1;                 // file mode
  std::string* out_ = nullptr;  // in-memory mode
  int64_t blocks_ = 0;
  uint64_t bytes_ = 0;
  bool finished_ = false;
  absl::Status error_;  // the first write error; later calls return it
};

class BlockReader {
 public:
  // Opens and verifies the file header. NOT_FOUND etc. from open(2); DATA_LOSS for a bad magic,
  // header CRC or a truncated header; FAILED_PRECONDITION for a newer format version.
  static absl::StatusOr<std::unique_ptr<BlockReader>> Open(const std::string& path);
  // The same over an in-memory file; `name` is used in error messages.
  static absl::StatusOr<std::unique_ptr<BlockReader>> FromString(std::string name,
                                                                 std::string data);
  ~BlockReader();
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  // The file's size in bytes (fixed at Open): what its blocks can hold at most, for a reader
  // that bounds a header's claims before it allocates for them.
  uint64_t size() const { return size_; }

  // Reads and verifies the next block into *block and returns true; at the end block returns
  // false after checking its block count and that the file ends right after it. Errors are
  // DATA_LOSS (corruption, truncation) naming the file, block index, tag and offset.
  absl::StatusOr<bool> Next(Block* block);
  // The tag of the next block without consuming it ("" at the end), verified like Next().
  absl::StatusOr<std::string> PeekTag();
  // Error helper: DATA_LOSS "<file>: block <i> ('<tag>') at offset <o>: <what>".
  absl::Status Corrupt(const Block& block, absl::string_view what) const;

 private:
  BlockReader(std::string name, int fd, std::string data, uint64_t size);
  absl::Status ReadAt(uint64_t offset, size_t n, char* dst) const;
  absl::Status ReadHeader();
  absl::StatusOr<bool> ReadBlock(Block* block);

  std::string name_;
  int fd_ = -1;       // file mode
  std::string data_;  // in-memory mode
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t offset_ = 0;  // of the next unread block
  int64_t index_ = 0;    // of the next unread block
  bool at_end_ = false;
  bool has_peeked_ = false;
  Block peeked_;
};

}  // namespace pstrain
