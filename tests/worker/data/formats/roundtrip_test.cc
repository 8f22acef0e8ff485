// Properties every format shares: write -> read gives identical RawRows, records may straddle
// read chunks, Seek(offset(), records()) is exact, FIFOs read like files, empty files are empty.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using testing_util::Open;
using testing_util::ParseFile;
using testing_util::RandomRows;
using testing_util::ReadAll;
using testing_util::ReadSource;
using testing_util::SameRows;
using testing_util::ShapeFor;
using testing_util::TempDir;
using testing_util::WriteRows;

class AllFormats : public ::testing::TestWithParam<DataFormat> {
 protected:
  const FeatureSpec spec_ = testing_util::CriteoSpec();
  TempDir dir_;

  // Writes `n` random rows the format can represent; returns the path and the rows.
  std::string WriteRandom(int n, uint64_t seed, RawRows* rows) {
    *rows = RandomRows(spec_, ShapeFor(GetParam()), n, seed);
    const std::string path = dir_.File("data" + DataFormatExtension(GetParam()));
    WriteRows(GetParam(), spec_, path, *rows);
    return path;
  }
};

TEST_P(AllFormats, RoundTripIsExact) {
  RawRows written;
  const std::string path = WriteRandom(500, 7, &written);
  std::vector<absl::Status> errors;
  const RawRows read = ParseFile(GetParam(), spec_, path, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  EXPECT_TRUE(SameRows(written, read));
}

TEST_P(AllFormats, WriterReportsBytesAndIsDeterministic) {
  RawRows rows = RandomRows(spec_, ShapeFor(GetParam()), 50, 3);
  std::string bytes[2];
  for (int i = 0; i < 2; ++i) {
    const std::string path = dir_.File(absl::StrCat("det", i));
    auto w = CreateRecordWriter(GetParam(), spec_, path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Write(rows, 0, rows.size()).ok());
    ASSERT_TRUE((*w)->Close().ok());
    bytes[i] = ReadAll(path);
    EXPECT_EQ((*w)->bytes_written(), bytes[i].size());
    EXPECT_FALSE((*w)->Write(rows, 0, 1).ok()) << "Write after Close must fail";
  }
  EXPECT_EQ(bytes[0], bytes[1]);
}

TEST_P(AllFormats, RecordsStraddlingReadChunks) {
  RawRows written;
  const std::string path = WriteRandom(60, 11, &written);
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, size_t{1000}}) {
    std::vector<absl::Status> errors;
    const RawRows read = ParseFile(GetParam(), spec_, path, &errors, chunk);
    ASSERT_TRUE(errors.empty()) << "chunk " << chunk << ": " << errors[0];
    EXPECT_TRUE(SameRows(written, read)) << "chunk " << chunk;
  }
}

TEST_P(AllFormats, SeekToSavedPositionIsExact) {
  RawRows written;
  const std::string path = WriteRandom(40, 5, &written);
  auto whole = Open(GetParam(), path);
  const testing_util::ReadResult all = ReadSource(whole.get());
  ASSERT_TRUE(all.error.ok()) << all.error;
  ASSERT_EQ(all.data.size(), 40u);
  const uint64_t file_size = ReadAll(path).size();
  for (size_t k : {size_t{0}, size_t{1}, size_t{17}, size_t{39}, size_t{40}}) {
    // A small chunk makes `a` refill (and move its window) many times before offset() is read.
    auto a = Open(GetParam(), path, k % 2 ? 7 : kDefaultReadChunk);
    ASSERT_EQ(ReadSource(a.get(), k).data.size(), k);
    EXPECT_EQ(a->records(), k);
    auto b = Open(GetParam(), path, /*chunk=*/5);
    ASSERT_TRUE(b->Seek(a->offset(), a->records()).ok());
    EXPECT_EQ(b->offset(), a->offset());
    const testing_util::ReadResult rest_a = ReadSource(a.get());
    const testing_util::ReadResult rest_b = ReadSource(b.get());
    ASSERT_EQ(rest_b.data.size(), 40 - k);
    EXPECT_EQ(rest_a.data, rest_b.data);
    EXPECT_EQ(rest_a.numbers, rest_b.numbers);
    for (size_t j = 0; j < rest_b.data.size(); ++j) EXPECT_EQ(rest_b.data[j], all.data[k + j]);
    EXPECT_EQ(b->records(), 40u);
    EXPECT_EQ(a->offset(), file_size);
    EXPECT_EQ(b->offset(), file_size);
  }
  auto c = Open(GetParam(), path);
  EXPECT_FALSE(c->Seek(file_size + 1, 0).ok());
}

TEST_P(AllFormats, FifoReadsLikeAFileAndCannotSeek) {
  RawRows written;
  const std::string path = WriteRandom(200, 9, &written);
  const std::string fifo = dir_.File("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string contents = ReadAll(path);
  // If the reader stopped early, the feeder's write fails with EPIPE instead of killing the test.
  std::signal(SIGPIPE, SIG_IGN);
  std::thread feeder([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    // Small writes, so the reader sees short reads mid-record.
    for (size_t done = 0; done < contents.size();) {
      const ssize_t n = ::write(fd, contents.data() + done, std::min<size_t>(777, contents.size() - done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  std::vector<absl::Status> errors;
  absl::Status source_error;
  const RawRows read = ParseFile(GetParam(), spec_, fifo, &errors, 4096, &source_error);
  feeder.join();
  EXPECT_TRUE(source_error.ok()) << source_error;
  ASSERT_TRUE(errors.empty()) << errors[0];
  EXPECT_TRUE(SameRows(written, read));

  // Seeking a FIFO is refused, without blocking: a writer is attached first.
  std::thread opener([&] { ::close(::open(fifo.c_str(), O_WRONLY)); });
  auto src = Open(GetParam(), fifo);
  opener.join();
  EXPECT_EQ(src->Seek(0, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(AllFormats, EmptyFileHasNoRecords) {
  const std::string path = dir_.Write("empty", "");
  auto src = Open(GetParam(), path);
  RecordRef rec;
  bool eof = false;
  ASSERT_TRUE(src->Next(&rec, &eof).ok());
  EXPECT_TRUE(eof);
  EXPECT_EQ(src->records(), 0u);
  EXPECT_EQ(src->offset(), 0u);
}

TEST_P(AllFormats, OpenMissingFileNamesIt) {
  auto src = OpenRecordSource(GetParam(), dir_.File("nope"));
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(src.status().message().find("nope"), std::string::npos);
}

TEST_P(AllFormats, WriterRefusesBadLabelNamingTheRow) {
  RawRows rows = RandomRows(spec_, ShapeFor(GetParam()), 5, 1);
  rows.labels[3] = 2.0f;
  auto w = CreateRecordWriter(GetParam(), spec_, dir_.File("bad"));
  ASSERT_TRUE(w.ok());
  const absl::Status s = (*w)->Write(rows, 0, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 3"), std::string::npos) << s;
  // The three good rows before it were written, the bad one was not.
  ASSERT_TRUE((*w)->Close().ok());
  std::vector<absl::Status> errors;
  const RawRows read = ParseFile(GetParam(), spec_, dir_.File("bad"), &errors);
  EXPECT_EQ(read.size(), 3);
}

INSTANTIATE_TEST_SUITE_P(Formats, AllFormats,
                         ::testing::Values(CRITEO_TSV, CSV, LIBSVM, TFRECORD, RECORDIO),
                         [](const auto& info) { return DataFormatName(info.param); });

TEST(Factories, RejectUnsetFormat) {
  const FeatureSpec spec = testing_util::CriteoSpec();
  EXPECT_FALSE(OpenRecordSource(FORMAT_UNSPECIFIED, "/dev/null").ok());
  EXPECT_FALSE(CreateRecordParser(FORMAT_UNSPECIFIED, spec, "").ok());
  EXPECT_FALSE(CreateRecordWriter(FORMAT_UNSPECIFIED, spec, "/dev/null").ok());
}

}  // namespace
}  // namespace pstrain
