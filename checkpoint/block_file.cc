#include "checkpoint/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/record_frame.h"
#include "common/status.h"

namespace pstrain {
namespace {

std::string PrintableTag(absl::string_view tag) { return absl::CHexEscape(tag); }

template <typename T>
absl::string_view Bytes(const T* p, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), n * sizeof(T));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BlockWriter
// ---------------------------------------------------------------------------------------------

BlockWriter::BlockWriter(std::string path, int fd, std::string* out)
    : path_(std::move(path)), fd_(fd), out_(out) {}

absl::StatusOr<std::unique_ptr<BlockWriter>> BlockWriter::Create(const std::string& path) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  // Never through a symlink planted at the temporary's name (common/file.h CreateFreshFile).
  ASSIGN_OR_RETURN(const int fd, CreateFreshFile(tmp));
  std::unique_ptr<BlockWriter> w(new BlockWriter(path, fd, nullptr));
  w->tmp_path_ = tmp;
  char header[kBlockFileHeaderSize];
  std::memcpy(header, kBlockFileMagic, 8);
  EncodeFixed32(header + 8, kBlockFileVersion);
  EncodeFixed32(header + 12, crc32c::Mask(crc32c::Value(header, 12)));
  RETURN_IF_ERROR(w->Write(absl::string_view(header, sizeof(header))));
  return w;
}

std::unique_ptr<BlockWriter> BlockWriter::ToString(std::string* out) {
  out->clear();
  std::unique_ptr<BlockWriter> w(new BlockWriter("<memory>", -1, out));
  char header[kBlockFileHeaderSize];
  std::memcpy(header, kBlockFileMagic, 8);
  EncodeFixed32(header + 8, kBlockFileVersion);
  EncodeFixed32(header + 12, crc32c::Mask(crc32c::Value(header, 12)));
  w->Write(absl::string_view(header, sizeof(header))).IgnoreError();  // memory cannot fail
  return w;
}

BlockWriter::~BlockWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

absl::Status BlockWriter::Write(absl::string_view data) {
  if (!error_.ok()) return error_;
  if (out_ != nullptr) {
    out_->append(data.data(), data.size());
  } else {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = ErrnoError("write", tmp_path_);
        return error_;
      }
      done += static_cast<size_t>(n);
    }
  }
  bytes_ += data.size();
  return absl::OkStatus();
}

absl::Status BlockWriter::AddBlock(absl::string_view tag,
                                   absl::Span<const absl::string_view> pieces) {
  uint64_t length = 0;
  for (absl::string_view p : pieces) length += p.size();
  char header[kBlockHeaderSize];
  std::memcpy(header, tag.data(), 4);
  EncodeFixed32(header + 4, 0);  // flags: none are defined in version 1
  EncodeFixed64(header + 8, length);
  uint32_t crc = crc32c::Value(header, sizeof(header));
  RETURN_IF_ERROR(Write(absl::string_view(header, sizeof(header))));
  for (absl::string_view p : pieces) {
    crc = crc32c::Extend(crc, p.data(), p.size());
    RETURN_IF_ERROR(Write(p));
  }
  char footer[4];
  EncodeFixed32(footer, crc32c::Mask(crc));
  return Write(absl::string_view(footer, 4));
}

absl::Status BlockWriter::Add(absl::string_view tag, absl::Span<const absl::string_view> pieces) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Add after Finish"));
  if (tag.size() != 4 || tag == kEndTag) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": bad block tag '", PrintableTag(tag), "'"));
  }
  RETURN_IF_ERROR(AddBlock(tag, pieces));
  ++blocks_;
  return absl::OkStatus();
}

absl::Status BlockWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Finish twice"));
  char count[8];
  EncodeFixed64(count, static_cast<uint64_t>(blocks_));
  const absl::string_view piece(count, 8);
  RETURN_IF_ERROR(AddBlock(kEndTag, absl::Span<const absl::string_view>(&piece, 1)));
  if (out_ == nullptr) {
    if (::fsync(fd_) != 0) return error_ = ErrnoError("fsync", tmp_path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return error_ = ErrnoError("close", tmp_path_);
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
      return error_ = ErrnoError(absl::StrCat("rename ", tmp_path_, " to"), path_);
    }
    // The rename is durable only once the directory entry is.
    const int dfd = ::open(DirName(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  finished_ = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// BlockReader
// ---------------------------------------------------------------------------------------------

BlockReader::BlockReader(std::string name, int fd, std::string data, uint64_t size)
    : name_(std::move(name)), fd_(fd), data_(std::move(data)), size_(size) {}

BlockReader::~BlockReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<BlockReader>> BlockReader::Open(const std::string& path) {
  // A checkpoint shard or an export's MODEL: a regular file, never a FIFO to block on.
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("stat", path);
    ::close(fd);
    return s;
  }
  std::unique_ptr<BlockReader> r(new BlockReader(path, fd, "", static_cast<uint64_t>(st.st_size)));
  RETURN_IF_ERROR(r->ReadHeader());
  return r;
}

absl::StatusOr<std::unique_ptr<BlockReader>> BlockReader::FromString(std::string name,
                                                                     std::string data) {
  const uint64_t size = data.size();
  std::unique_ptr<BlockReader> r(new BlockReader(std::move(name), -1, std::move(data), size));
  RETURN_IF_ERROR(r->ReadHeader());
  return r;
}

absl::Status BlockReader::ReadAt(uint64_t offset, size_t n, char* dst) const {
  // Callers have checked offset + n <= size_.
  if (fd_ < 0) {
    std::memcpy(dst, data_.data() + offset, n);
    return absl::OkStatus();
  }
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoError("read", name_);
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(name_, ": file shrank while reading at offset ", offset + done));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status BlockReader::ReadHeader() {
  if (size_ < kBlockFileHeaderSize) {
    return absl::DataLossError(absl::StrCat(name_, ": truncated: ", size_,
                                            " bytes, shorter than the ", kBlockFileHeaderSize,
                                            "-byte header of a pstrain block file"));
  }
  char header[kBlockFileHeaderSize];
  RETURN_IF_ERROR(ReadAt(0, sizeof(header), header));
  if (std::memcmp(header, kBlockFileMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat(
        name_, ": not a pstrain block file (magic at offset 0 is \"",
        PrintableTag(absl::string_view(header, 8)), "\", expected \"", kBlockFileMagic, "\")"));
  }
  if (crc32c::Unmask(DecodeFixed32(header + 12)) != crc32c::Value(header, 12)) {
    return absl::DataLossError(absl::StrCat(name_, ": header checksum mismatch at offset 12"));
  }
  version_ = DecodeFixed32(header + 8);
  if (version_ == 0) {
    return absl::DataLossError(absl::StrCat(name_, ": format version 0 at offset 8 is invalid"));
  }
  if (version_ > kBlockFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": written in block file format version ", version_, ", newer than the version ",
        kBlockFileVersion, " this build reads; use a newer pstrain to read it"));
  }
  offset_ = kBlockFileHeaderSize;
  return absl::OkStatus();
}

absl::Status BlockReader::Corrupt(const Block& block, absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(name_, ": block ", block.index, " ('",
                                          PrintableTag(block.tag), "') at offset ", block.offset,
                                          ": ", what));
}

absl::StatusOr<bool> BlockReader::ReadBlock(Block* block) {
  if (at_end_) return false;
  block->index = index_;
  block->offset = offset_;
  block->tag.clear();
  block->payload.clear();
  const uint64_t remaining = size_ - offset_;
  if (remaining < kBlockHeaderSize + 4) {
    return Corrupt(*block, absl::StrCat("truncated: only ", remaining,
                                        " bytes left where a block or the end block should be"));
  }
  char header[kBlockHeaderSize];
  RETURN_IF_ERROR(ReadAt(offset_, sizeof(header), header));
  block->tag.assign(header, 4);
  block->flags = DecodeFixed32(header + 4);
  const uint64_t length = DecodeFixed64(header + 8);
  if (length > remaining - kBlockHeaderSize - 4) {
    return Corrupt(*block,
                   absl::StrCat("truncated or corrupt: length ", length, " but only ",
                                remaining - kBlockHeaderSize - 4, " bytes left for the payload"));
  }
  block->payload.resize(length);
  RETURN_IF_ERROR(ReadAt(offset_ + kBlockHeaderSize, length, block->payload.data()));
  char footer[4];
  RETURN_IF_ERROR(ReadAt(offset_ + kBlockHeaderSize + length, 4, footer));
  const uint32_t crc =
      crc32c::Extend(crc32c::Value(header, sizeof(header)), block->payload.data(), length);
  if (crc32c::Unmask(DecodeFixed32(footer)) != crc) {
    return Corrupt(*block, "checksum mismatch");
  }
  if (block->flags != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": block ", block->index, " ('", PrintableTag(block->tag), "') at offset ",
        block->offset, " has flags ", block->flags, " unknown to format version ",
        kBlockFileVersion, "; use a newer pstrain to read it"));
  }
  offset_ += kBlockHeaderSize + length + 4;
  ++index_;
  if (block->tag != kEndTag) return true;

  if (length != 8 || DecodeFixed64(block->payload.data()) != static_cast<uint64_t>(block->index)) {
    return Corrupt(*block, absl::StrCat("end block does not match the ", block->index,
                                        " blocks read before it"));
  }
  if (offset_ != size_) {
    return Corrupt(*block, absl::StrCat(size_ - offset_, " unexpected bytes after the end block"));
  }
  at_end_ = true;
  return false;
}

absl::StatusOr<bool> BlockReader::Next(Block* block) {
  if (has_peeked_) {
    has_peeked_ = false;
    *block = std::move(peeked_);
    return true;
  }
  return ReadBlock(block);
}

absl::StatusOr<std::string> BlockReader::PeekTag() {
  if (!has_peeked_) {
    ASSIGN_OR_RETURN(const bool more, ReadBlock(&peeked_));
    if (!more) return std::string();
    has_peeked_ = true;
  }
  return peeked_.tag;
}

}  // namespace pstrain
