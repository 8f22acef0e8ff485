// Gzip input (formats/buffered_io.h, Channel.compression): every format reads its .gz file as it
// reads the plain file (the same records, the same decompressed offsets), positions resume
// exactly, FIFOs (pipe mode) decompress too, and bad gzip data is an error naming the file.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/buffered_io.h"
#include "worker/data/formats/registry.h"
#include "worker/data/pipeline.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::RunShell;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/gzip_", getpid()); }

void Sh(const std::string& cmd) {
  std::string out;
  ASSERT_EQ(RunShell(cmd, 120, &out), 0) << cmd << "\n" << out;
}

struct Record {
  std::string data;
  uint64_t number, offset_after, records_after;
  bool operator==(const Record& o) const {
    return data == o.data && number == o.number && offset_after == o.offset_after &&
           records_after == o.records_after;
  }
};

// Every record of a source, with the position after it.
std::vector<Record> ReadAll(RecordSource* src) {
  std::vector<Record> out;
  while (true) {
    RecordRef rec;
    bool eof = false;
    absl::Status s = src->Next(&rec, &eof);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok() || eof) break;
    out.push_back({std::string(rec.data), rec.number, src->offset(), src->records()});
  }
  return out;
}

class GzipTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Sh("rm -rf " + Dir() + " && mkdir -p " + Dir());
    for (const char* f : {"criteo_tsv", "csv", "libsvm", "tfrecord", "recordio"}) {
      Sh(absl::StrCat(PSTRAIN_BINARY, " datagen --rows 300 --seed 3 --format ", f, " --out ",
                      Dir(), "/", f, " > /dev/null"));
      // part-00000<ext> and part-00000<ext>.gz side by side.
      Sh(absl::StrCat("cd ", Dir(), "/", f, " && gzip -k part-00000.*"));
    }
  }
  static void TearDownTestSuite() {
    std::string out;
    RunShell("rm -rf " + Dir(), 30, &out);
  }
  static std::string Plain(const std::string& format) {
    std::string out;
    RunShell("ls " + Dir() + "/" + format + "/part-00000.* | grep -v '\\.gz$'", 10, &out);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }
};

TEST_F(GzipTest, EveryFormatReadsItsGzipFileLikeThePlainOne) {
  for (const char* name : {"criteo_tsv", "csv", "libsvm", "tfrecord", "recordio"}) {
    SCOPED_TRACE(name);
    const DataFormat format = *ParseDataFormat(name);
    const std::string plain = Plain(name);
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, kDefaultReadChunk}) {
      RecordSourceOptions o;
      o.read_chunk = chunk;
      auto a = OpenRecordSource(format, plain, o);
      auto b = OpenRecordSource(format, plain + ".gz", o);  // AUTO: by the name
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      const std::vector<Record> ra = ReadAll(a->get()), rb = ReadAll(b->get());
      EXPECT_EQ(ra.size(), 300u);
      EXPECT_TRUE(ra == rb) << "chunk " << chunk;
      EXPECT_EQ((*a)->header(), (*b)->header());
    }
  }
}

// AUTO also knows gzip by its magic bytes (a .gz renamed, a FIFO); NONE reads the bytes as is;
// GZIP forces it.
TEST_F(GzipTest, MagicBytesAndTheExplicitSettings) {
  const std::string plain = Plain("criteo_tsv");
  Sh("cp " + plain + ".gz " + Dir() + "/renamed.tsv");
  auto a = OpenRecordSource(CRITEO_TSV, plain);
  auto b = OpenRecordSource(CRITEO_TSV, Dir() + "/renamed.tsv");
  auto c = OpenRecordSource(CRITEO_TSV, Dir() + "/renamed.tsv", Channel::GZIP);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto ra = ReadAll(a->get());
  EXPECT_TRUE(ra == ReadAll(b->get()));
  EXPECT_TRUE(ra == ReadAll(c->get()));
  // NONE: the compressed bytes are the "lines".
  auto n = OpenRecordSource(CRITEO_TSV, Dir() + "/renamed.tsv", Channel::NONE);
  ASSERT_TRUE(n.ok());
  RecordRef rec;
  bool eof = false;
  ASSERT_TRUE((*n)->Next(&rec, &eof).ok());
  EXPECT_EQ(static_cast<unsigned char>(rec.data[0]), 0x1f);
  // GZIP on a plain file: an error naming the file and what was expected.
  auto g = OpenRecordSource(CRITEO_TSV, plain, Channel::GZIP);
  ASSERT_TRUE(g.ok());
  absl::Status s = (*g)->Next(&rec, &eof);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(plain));
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected gzip data"));
}

TEST_F(GzipTest, ConcatenatedMembersAreOneStream) {
  const std::string plain = Plain("criteo_tsv");
  Sh("cat " + plain + ".gz " + plain + ".gz > " + Dir() + "/twice.tsv.gz");
  auto src = OpenRecordSource(CRITEO_TSV, Dir() + "/twice.tsv.gz");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(ReadAll(src->get()).size(), 600u);
}

TEST_F(GzipTest, TruncatedAndCorruptFilesAreErrorsNamingTheFile) {
  const std::string plain = Plain("tfrecord");
  struct stat st;
  ASSERT_EQ(stat((plain + ".gz").c_str(), &st), 0);
  Sh(absl::StrCat("head -c ", st.st_size / 2, " ", plain, ".gz > ", Dir(), "/cut.tfrecords.gz"));
  Sh(absl::StrCat("cp ", plain, ".gz ", Dir(), "/bad.tfrecords.gz && printf 'XXXXXXXX' | dd of=",
                  Dir(), "/bad.tfrecords.gz bs=1 seek=", st.st_size / 2, " conv=notrunc 2>/dev/null"));
  for (const char* name : {"cut", "bad"}) {
    const std::string path = absl::StrCat(Dir(), "/", name, ".tfrecords.gz");
    auto src = OpenRecordSource(TFRECORD, path);
    ASSERT_TRUE(src.ok());
    absl::Status s;
    for (int i = 0; i < 1000 && s.ok(); ++i) {
      RecordRef rec;
      bool eof = false;
      s = (*src)->Next(&rec, &eof);
      if (s.ok() && eof) break;
    }
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
    EXPECT_THAT(std::string(s.message()), ::testing::AnyOf(HasSubstr("truncated"),
                                                           HasSubstr("corrupt gzip data"),
                                                           HasSubstr("CRC")));
  }
}

// A position inside a gzip file is a decompressed offset: Seek forward and backward lands exactly.
TEST_F(GzipTest, SeekToAnySavedPositionIsExact) {
  const std::string gz = Plain("recordio") + ".gz";
  for (size_t chunk : {size_t{5}, kDefaultReadChunk}) {
    RecordSourceOptions o;
    o.read_chunk = chunk;
    auto src = OpenRecordSource(RECORDIO, gz, o);
    ASSERT_TRUE(src.ok());
    const std::vector<Record> all = ReadAll(src->get());
    ASSERT_EQ(all.size(), 300u);
    for (size_t k : {size_t{250}, size_t{0}, size_t{120}, size_t{299}, size_t{17}}) {
      const uint64_t offset = k == 0 ? 0 : all[k - 1].offset_after;
      const uint64_t records = k == 0 ? 0 : all[k - 1].records_after;
      ASSERT_TRUE((*src)->Seek(offset, records).ok()) << k;
      std::vector<Record> rest = ReadAll(src->get());
      ASSERT_EQ(rest.size(), all.size() - k);
      EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + k)) << k;
    }
    EXPECT_FALSE((*src)->Seek(all.back().offset_after + 10, 301).ok());
  }
}

// Pipe mode: SageMaker streams a channel's (gzip) objects into a FIFO; the magic bytes say gzip.
TEST_F(GzipTest, FifoOfGzipData) {
  const std::string plain = Plain("criteo_tsv");
  const std::string fifo = Dir() + "/train_0";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::string out;
    RunShell("cat " + plain + ".gz > " + fifo, 60, &out);
  });
  auto src = OpenRecordSource(CRITEO_TSV, fifo);
  ASSERT_TRUE(src.ok()) << src.status();
  auto ref = OpenRecordSource(CRITEO_TSV, plain);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(ReadAll(src->get()) == ReadAll(ref->get()));
  writer.join();
}

// The pipeline over gzip files: a run resumed from a saved position delivers exactly the batches
// an uninterrupted run delivers after it (records are neither lost nor repeated).
TEST_F(GzipTest, PipelineResumesExactlyInAGzipFile) {
  auto spec = FeatureSpec::Create(FeatureConfig());
  ASSERT_TRUE(spec.ok());
  Channel ch;
  ch.set_name("train");
  ch.set_format(TFRECORD);
  ch.add_path(Plain("tfrecord") + ".gz");
  ch.set_shard_policy(SHARD_BY_RECORD);
  auto options = [&] {
    PipelineOptions o;
    o.channels = {ch};
    o.batch_size = 32;
    o.shuffle_buffer = 50;
    o.reader_threads = 2;
    o.num_shards = 2;
    o.shard_index = 1;
    o.formats = RegisteredFormats();
    return o;
  };
  auto whole = Pipeline::Create(options(), *spec);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<std::vector<float>> labels;
  std::vector<std::vector<int64_t>> ids;
  PipelinePosition at3;
  Batch b;
  int64_t epoch;
  while (true) {
    auto got = (*whole)->Next(&b, &epoch);
    ASSERT_TRUE(got.ok()) << got.status();
    if (!*got) break;
    labels.push_back(b.labels);
    ids.push_back(b.ids);
    if (labels.size() == 3) at3 = (*whole)->position();
  }
  ASSERT_EQ(labels.size(), 5u);  // 150 of the 300 records, 32 a batch
  PipelineOptions o = options();
  o.start = at3;
  auto resumed = Pipeline::Create(o, *spec);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  for (size_t i = 3; i < labels.size(); ++i) {
    auto got = (*resumed)->Next(&b, &epoch);
    ASSERT_TRUE(got.ok() && *got);
    EXPECT_EQ(b.labels, labels[i]) << i;
    EXPECT_EQ(b.ids, ids[i]) << i;
  }
  auto end = (*resumed)->Next(&b, &epoch);
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(*end);
}

}  // namespace
}  // namespace pstrain
