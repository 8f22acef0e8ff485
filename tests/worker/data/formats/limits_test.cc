// Readers have memory limits (data.max_record_bytes): a line, a TFRecord record or a reassembled
// RecordIO record beyond the limit is an error naming the file, the record and its offset, found
// without buffering the record (a 32 MB line without a newline does not take 32 MB); records
// within the limit still read; gzip input is limited by its decompressed bytes; the limit
// reaches the readers from the config.
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/record_frame.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"
#include "worker/data/formats/line_source.h"
#include "worker/data/formats/recordio.h"
#include "worker/data/formats/registry.h"
#include "worker/data/formats/tfrecord.h"
#include "worker/data/pipeline.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::CriteoSpec;
using testing_util::TempDir;

// Peak resident memory of this process (VmHWM), in bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

absl::Status ReadAllRecords(RecordSource* src, int* records) {
  *records = 0;
  while (true) {
    RecordRef rec;
    bool eof = false;
    absl::Status s = src->Next(&rec, &eof);
    if (!s.ok()) return s;
    if (eof) return absl::OkStatus();
    ++*records;
  }
}

// Opens `path` as `format` with the record limit `max_record_bytes` and reads every record.
absl::Status ReadWithLimit(DataFormat format, const std::string& path, size_t max_record_bytes,
                           int* records) {
  RecordSourceOptions o;
  o.max_record_bytes = max_record_bytes;
  auto src = OpenRecordSource(format, path, o);
  if (!src.ok()) return src.status();
  return ReadAllRecords(src->get(), records);
}

// First in this binary, so that the peak memory before it is the test's start.
TEST(ReaderLimits, ALongLineWithoutNewlineIsRefusedWithoutBufferingIt) {
  TempDir dir;
  const std::string path = dir.File("noline.tsv");
  {
    std::ofstream out(path, std::ios::binary);
    const std::string block(1 << 20, 'x');
    for (int i = 0; i < 32; ++i) out << block;
  }
  const int64_t before = PeakRss();
  RecordSourceOptions o;
  o.read_chunk = 64 << 10;
  o.max_record_bytes = 1 << 20;
  auto src = OpenRecordSource(CRITEO_TSV, path, o);
  ASSERT_TRUE(src.ok());
  int records = 0;
  const absl::Status s = ReadAllRecords(src->get(), &records);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path + ": line 1 at offset 0 is longer than 1048576 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("data.max_record_bytes"));
  // Every later call says the same, reading nothing more.
  RecordRef rec;
  bool eof = false;
  EXPECT_EQ((*src)->Next(&rec, &eof).message(), s.message());
  const int64_t grown = PeakRss() - before;
  EXPECT_LT(grown, 8 << 20) << "the reader buffered the line";
}

// Second, while the peak memory is still near the start. gzip input: the limit counts
// decompressed bytes, so a small file that inflates to a 64 MB line without a newline (a
// "gzip bomb") is refused the same way, without buffering what it inflates to.
TEST(ReaderLimits, AGzipBombLineIsRefusedWithoutInflatingItIntoMemory) {
  TempDir dir;
  const std::string path = dir.File("bomb.tsv.gz");
  {
    gzFile gz = gzopen(path.c_str(), "wb9");
    ASSERT_NE(gz, nullptr);
    const std::string block(1 << 20, 'x');
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(gzwrite(gz, block.data(), static_cast<unsigned>(block.size())),
                static_cast<int>(block.size()));
    }
    ASSERT_EQ(gzclose(gz), Z_OK);
  }
  std::ifstream compressed(path, std::ios::binary | std::ios::ate);
  ASSERT_LT(static_cast<int64_t>(compressed.tellg()), 1 << 20);  // small on disk
  const int64_t before = PeakRss();
  RecordSourceOptions o;
  o.read_chunk = 64 << 10;
  o.max_record_bytes = 1 << 20;
  auto src = OpenRecordSource(CRITEO_TSV, path, o);
  ASSERT_TRUE(src.ok()) << src.status();
  int records = 0;
  const absl::Status s = ReadAllRecords(src->get(), &records);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(path + ": line 1 at offset 0 is longer than 1048576 bytes"));
  EXPECT_EQ(records, 0);
  const int64_t grown = PeakRss() - before;
  EXPECT_LT(grown, 8 << 20) << "the reader inflated the line into memory";
}

TEST(ReaderLimits, LinesWithinTheLimitReadAndALongOneStopsTheFile) {
  TempDir dir;
  const std::string ok_line(900, 'a');
  const std::string path = dir.Write(
      "mixed.tsv", ok_line + "\n" + ok_line + "\r\n" + std::string(3000, 'b') + "\n" + "c\n");
  for (size_t chunk : {size_t{7}, size_t{64}, size_t{1} << 20}) {
    RecordSourceOptions o;
    o.read_chunk = chunk;
    o.max_record_bytes = 1024;
    auto src = OpenRecordSource(CRITEO_TSV, path, o);
    ASSERT_TRUE(src.ok());
    int records = 0;
    const absl::Status s = ReadAllRecords(src->get(), &records);
    EXPECT_EQ(records, 2) << chunk;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << chunk;
    EXPECT_THAT(s.message(), HasSubstr(path + ": line 3")) << chunk;
  }
  // The default limit (16 MiB) takes them all.
  auto src = OpenRecordSource(CRITEO_TSV, path, RecordSourceOptions{});
  ASSERT_TRUE(src.ok());
  int records = 0;
  EXPECT_TRUE(ReadAllRecords(src->get(), &records).ok());
  EXPECT_EQ(records, 4);
}

TEST(ReaderLimits, ATFRecordLongerThanTheLimitIsRefusedByItsHeader) {
  TempDir dir;
  std::string file;
  AppendTFRecordFrame(std::string(100, 'a'), &file);
  AppendTFRecordFrame(std::string(5000, 'b'), &file);
  const std::string path = dir.Write("big.tfrecord", file);
  int records = 0;
  const absl::Status s = ReadWithLimit(TFRECORD, path, 1024, &records);
  EXPECT_EQ(records, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path + ": record 2 at offset 116"));
  EXPECT_THAT(s.message(), HasSubstr("record length 5000 exceeds the limit of 1024"));
}

TEST(ReaderLimits, RecordIOReassemblyIsBounded) {
  TempDir dir;
  // A payload with the magic at 4-aligned places is split into parts by the writer.
  std::string payload;
  char magic[4];
  const uint32_t m = kRecordIOMagic;
  std::memcpy(magic, &m, 4);
  for (int i = 0; i < 10; ++i) {
    payload += std::string(400, static_cast<char>('a' + i));
    payload.append(magic, 4);
  }
  std::string file;
  AppendRecordIOFrame("small", &file);
  AppendRecordIOFrame(payload, &file);  // ~4 kB in 11 parts
  const std::string path = dir.Write("split.rec", file);
  int records = 0;
  const absl::Status s = ReadWithLimit(RECORDIO, path, 2000, &records);
  EXPECT_EQ(records, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path + ": record 2"));
  EXPECT_THAT(s.message(), HasSubstr("reassembled from its parts exceeds the limit of 2000"));
  // With room for it, the same record reads whole.
  EXPECT_TRUE(ReadWithLimit(RECORDIO, path, 1 << 20, &records).ok());
  EXPECT_EQ(records, 2);
}

// The config's data.max_record_bytes reaches the pipeline's readers.
TEST(ReaderLimits, TheConfigsLimitReachesThePipeline) {
  TempDir dir;
  const std::string path = dir.Write("long.tsv", std::string(5000, '1') + "\n");
  DataConfig data;
  Channel* c = data.add_train();
  c->set_name("train");
  c->set_format(CRITEO_TSV);
  c->add_path(path);
  data.set_max_record_bytes(1024);
  const FeatureSpec spec = CriteoSpec();
  PipelineOptions o = OptionsFromConfig(data, /*train=*/true, 4, 0, 1, 1);
  auto pipeline = Pipeline::Create(o, spec);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::Status error;
  for (int i = 0; i < 10 && error.ok(); ++i) {
    Batch b;
    int64_t epoch = 0;
    absl::StatusOr<bool> got = (*pipeline)->Next(&b, &epoch);
    error = got.status();
    if (got.ok() && !*got) break;
  }
  EXPECT_THAT(error.message(), HasSubstr("data.max_record_bytes"));
}

}  // namespace
}  // namespace pstrain
