// The small-file reader refuses what would hang or exhaust it (issue 26): a FIFO (a reader would
// wait for a writer forever), a device (/dev/zero never ends), a directory, and a file longer than
// its limit, each with an error naming the path and what it is; a regular file, or a symlink to
// one, reads as before. The config loader and the checkpoint readers go through it. The writers
// of a job's own files are as careful: a temporary's predictable name, a log's name, never lead
// a write through a symlink planted there to a file outside the directory, nor wait on a FIFO
// (CreateFreshFile, OpenForAppend; WriteFileAtomic and the checkpoint BlockWriter use them).
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

// A file outside the job's directory, and a symlink to it planted at `name`.
std::string PlantLink(const std::string& name, const std::string& outside) {
  EXPECT_TRUE(WriteFileAtomic(outside, "precious\n").ok());
  ::unlink(name.c_str());
  EXPECT_EQ(::symlink(outside.c_str(), name.c_str()), 0);
  return outside;
}

std::string Slurp(const std::string& path) { return ReadFileToString(path).value_or("<error>"); }

TEST(CreateFreshFile, ReplacesWhatIsPlantedAtTheNameAndNeverWritesThroughIt) {
  const std::string name = Dir() + "/fresh.tmp.1";
  const std::string outside = PlantLink(name, Dir() + "/outside-fresh.txt");
  absl::StatusOr<int> fd = CreateFreshFile(name);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "new", 3), 3);
  ::close(*fd);
  EXPECT_EQ(Slurp(outside), "precious\n");
  struct stat st;
  ASSERT_EQ(::lstat(name.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Slurp(name), "new");
  // A FIFO at the name is replaced too, at once; a stale file's content is gone.
  ASSERT_EQ(::unlink(name.c_str()), 0);
  ASSERT_EQ(::mkfifo(name.c_str(), 0600), 0);
  auto unblock = [&] {
    const int r = ::open(name.c_str(), O_RDONLY | O_NONBLOCK);
    if (r >= 0) ::close(r);
  };
  absl::Status s = Bounded(
      [&]() -> absl::Status {
        absl::StatusOr<int> f = CreateFreshFile(name);
        if (f.ok()) ::close(*f);
        return f.status();
      },
      unblock);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(::lstat(name.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 0);
  // A directory cannot be replaced: an error naming the path.
  const std::string dir = Dir() + "/a-directory";
  ASSERT_TRUE(MakeDirs(dir).ok());
  fd = CreateFreshFile(dir);
  ASSERT_FALSE(fd.ok());
  EXPECT_THAT(std::string(fd.status().message()), HasSubstr("create " + dir));
}

TEST(OpenForAppend, AppendsToItsOwnFileAndRefusesSymlinksFifosAndDirectoriesAtOnce) {
  const std::string log = Dir() + "/append.log";
  ASSERT_TRUE(WriteFileAtomic(log, "first\n").ok());
  absl::StatusOr<int> fd = OpenForAppend(log);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(*fd, "second\n", 7), 7);
  ::close(*fd);
  EXPECT_EQ(Slurp(log), "first\nsecond\n");
  // Missing: created.
  const std::string created = Dir() + "/created.log";
  fd = OpenForAppend(created);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  EXPECT_TRUE(PathExists(created));
  // A symlink out: refused, the file outside untouched.
  const std::string link = Dir() + "/linked.log";
  const std::string outside = PlantLink(link, Dir() + "/outside-append.txt");
  fd = OpenForAppend(link);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
  EXPECT_THAT(std::string(fd.status().message()),
              HasSubstr(link + ": not a regular file (a symlink)"));
  EXPECT_EQ(Slurp(outside), "precious\n");
  // A FIFO with no reader, then one with a reader: refused at once, never written to.
  const std::string fifo = Dir() + "/append.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto unblock = [&] {
    const int r = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    if (r >= 0) ::close(r);
  };
  auto open_fifo = [&]() -> absl::Status {
    absl::StatusOr<int> f = OpenForAppend(fifo);
    if (f.ok()) ::close(*f);
    return f.status();
  };
  absl::Status s = Bounded(open_fifo, unblock);
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo + ": not a regular file (a FIFO)"));
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  s = Bounded(open_fifo, unblock);
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo + ": not a regular file (a FIFO)"));
  char byte;
  EXPECT_LE(::read(reader, &byte, 1), 0) << "something was written to the FIFO";
  ::close(reader);
  fd = OpenForAppend(Dir());
  ASSERT_FALSE(fd.ok());
  EXPECT_THAT(std::string(fd.status().message()), HasSubstr("not a regular file (a directory)"));
}

TEST(WriteFileAtomic, ASymlinkAtTheTemporarysNameDoesNotRedirectTheWrite) {
  const std::string path = Dir() + "/LATEST";
  const std::string outside =
      PlantLink(absl::StrCat(path, ".tmp.", ::getpid()), Dir() + "/outside-latest.txt");
  ASSERT_TRUE(WriteFileAtomic(path, "ckpt-7\n").ok());
  EXPECT_EQ(Slurp(path), "ckpt-7\n");
  EXPECT_EQ(Slurp(outside), "precious\n");
  EXPECT_FALSE(PathExists(absl::StrCat(path, ".tmp.", ::getpid())));
  // The same for a checkpoint file's writer.
  const std::string shard = Dir() + "/shard-0";
  const std::string outside_shard =
      PlantLink(absl::StrCat(shard, ".tmp.", ::getpid()), Dir() + "/outside-shard.txt");
  absl::StatusOr<std::unique_ptr<BlockWriter>> w = BlockWriter::Create(shard);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(Slurp(outside_shard), "precious\n");
  EXPECT_TRUE(BlockReader::Open(shard).ok());
}

}  // namespace
}  // namespace pstrain
