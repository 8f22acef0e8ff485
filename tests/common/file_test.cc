// The small-file reader refuses what would hang or exhaust it (issue 26): a FIFO (a reader would
// wait for a writer forever), a device (/dev/zero never ends), a directory, and a file longer than
// its limit, each with an error naming the path and what it is; a regular file, or a symlink to
// one, reads as before. The config loader and the checkpoint readers go through it.
#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() {
  static const std::string dir = [] {
    const std::string d = absl::StrCat(::testing::TempDir(), "/file_test_", getpid());
    EXPECT_TRUE(MakeDirs(d).ok());
    return d;
  }();
  return dir;
}

// Runs `read` on another thread and fails (instead of hanging the suite) if it has not returned
// within 10 s; `unblock` then releases it.
template <typename Fn>
absl::Status Bounded(Fn read, const std::function<void()>& unblock) {
  auto f = std::async(std::launch::async, read);
  if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "the read blocked";
    unblock();
  }
  return f.get();
}

TEST(ReadFileToString, RefusesAFifoWithoutBlocking) {
  const std::string fifo = Dir() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // What unblocks a reader that did block: a writer that opens and closes.
  auto unblock = [&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  };
  absl::Status s = Bounded([&] { return ReadFileToString(fifo).status(); }, unblock);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo + ": not a regular file (a FIFO)"));
  // The config loader and the checkpoint block reader (MANIFEST, shards, an export's MODEL).
  s = Bounded([&] { return LoadConfigFile(fifo).status(); }, unblock);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config file " + fifo));
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file (a FIFO)"));
  s = Bounded([&] { return BlockReader::Open(fifo).status(); }, unblock);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file (a FIFO)"));
}

TEST(ReadFileToString, RefusesDevicesAndDirectories) {
  absl::Status s = ReadFileToString("/dev/zero").status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("/dev/zero: not a regular file (a character device)"));
  s = LoadConfigFile("/dev/zero").status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file (a character device)"));
  s = ReadFileToString(Dir()).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a regular file (a directory)"));
  EXPECT_EQ(ReadFileToString(Dir() + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(ReadFileToString, BoundsTheLengthAndReadsRegularFilesAndTheirSymlinks) {
  const std::string file = Dir() + "/small.txt";
  ASSERT_TRUE(WriteFileAtomic(file, "model { embedding_dim: 8 }\n").ok());
  auto text = ReadFileToString(file);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "model { embedding_dim: 8 }\n");
  const std::string link = Dir() + "/link.txt";
  ASSERT_EQ(::symlink(file.c_str(), link.c_str()), 0);
  EXPECT_EQ(ReadFileToString(link).value_or(""), *text);
  auto config = LoadConfigFile(link);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model().embedding_dim(), 8);
  // Longer than the limit: refused by name, nothing returned.
  absl::Status s = ReadFileToString(file, 10).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("longer than 10 bytes"));
  EXPECT_TRUE(ReadFileToString(file, text->size()).ok());
}

}  // namespace
}  // namespace pstrain
