#include "ps/store/store_blocks.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/file.h"
#include "common/random.h"
#include "common/record_frame.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

const char kFixturePath[] = PSTRAIN_SOURCE_DIR "/tests/checkpoint/testdata/checkpoint_v1.pstrn";

// ---------------------------------------------------------------------------------------------
// The version-1 fixture: fixed, hand-chosen contents (no optimizer math), so that the bytes
// depend on the format only.
// ---------------------------------------------------------------------------------------------

EmbeddingSnapshot FixtureEmbedding() {
  EmbeddingSnapshot s;
  s.begin = 10;
  s.end = 20;
  s.dim = 3;
  s.optimizer = ADAM;
  s.state_floats = 7;  // m[3], v[3], t
  s.last_step = 42;
  s.ids = {11, 15, 19};
  for (int64_t id : s.ids) {
    for (int j = 0; j < 3; ++j) s.weights.push_back(id + j * 0.25f);
    for (int k = 0; k < 6; ++k) s.state.push_back(-0.5f * id + k * 0.125f);
    s.state.push_back(static_cast<float>(id % 4));  // t
  }
  return s;
}

DenseSnapshot FixtureDense() {
  DenseSnapshot s;
  s.begin = 4;
  s.size = 5;
  s.optimizer = ADAGRAD;
  s.state_floats = 5;
  s.last_step = 42;
  for (int j = 0; j < 5; ++j) {
    s.weights.push_back(j * 0.5f - 1.0f);
    s.state.push_back(0.1f + j);
  }
  return s;
}

constexpr char kNoteTag[] = "NOTE";
constexpr char kNote[] = "pstrain block file fixture, format version 1";

// EMBM, EMBR, DNSE, NOTE, ENDB.
std::string WriteFixtureV1() {
  std::string out;
  auto w = BlockWriter::ToString(&out);
  EXPECT_TRUE(SaveEmbeddingStore(FixtureEmbedding(), w.get()).ok());
  EXPECT_TRUE(SaveDenseStore(FixtureDense(), w.get()).ok());
  EXPECT_TRUE(w->Add(kNoteTag, kNote).ok());
  EXPECT_TRUE(w->Finish().ok());
  return out;
}

// Reads every block of a file; the container checks only.
absl::Status ReadAllBlocks(std::string name, std::string data) {
  auto r = BlockReader::FromString(std::move(name), std::move(data));
  if (!r.ok()) return r.status();
  Block b;
  while (true) {
    auto more = (*r)->Next(&b);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
  }
}

TEST(CheckpointFixture, RegenerateWhenAsked) {
  if (std::getenv("PSTRAIN_REGENERATE_FIXTURES") == nullptr) {
    GTEST_SKIP() << "set PSTRAIN_REGENERATE_FIXTURES=1 to rewrite " << kFixturePath;
  }
  ASSERT_TRUE(WriteFileAtomic(kFixturePath, WriteFixtureV1()).ok());
}

// Backward compatibility: the committed version-1 file still reads, with the expected contents.
TEST(CheckpointFixture, Version1FileReads) {
  auto r = BlockReader::Open(kFixturePath);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->version(), 1u);
  const EmbeddingSnapshot want = FixtureEmbedding();
  EmbeddingSnapshot got;
  auto meta = LoadEmbeddingRows(r->get(), [&](const EmbeddingMeta&, absl::Span<const int64_t> ids,
                                              const float* w, const float* s) {
    got.ids.insert(got.ids.end(), ids.begin(), ids.end());
    got.weights.insert(got.weights.end(), w, w + ids.size() * 3);
    got.state.insert(got.state.end(), s, s + ids.size() * 7);
    return absl::OkStatus();
  });
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->begin, 10);
  EXPECT_EQ(meta->end, 20);
  EXPECT_EQ(meta->dim, 3);
  EXPECT_EQ(meta->optimizer, ADAM);
  EXPECT_EQ(meta->state_floats, 7);
  EXPECT_EQ(meta->last_step, 42);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.weights, want.weights);
  EXPECT_EQ(got.state, want.state);

  auto dense = LoadDenseSnapshot(r->get());
  ASSERT_TRUE(dense.ok()) << dense.status();
  const DenseSnapshot d = FixtureDense();
  EXPECT_EQ(dense->begin, d.begin);
  EXPECT_EQ(dense->size, d.size);
  EXPECT_EQ(dense->optimizer, d.optimizer);
  EXPECT_EQ(dense->last_step, d.last_step);
  EXPECT_EQ(dense->weights, d.weights);
  EXPECT_EQ(dense->state, d.state);

  Block b;
  auto more = (*r)->Next(&b);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_EQ(b.tag, kNoteTag);
  EXPECT_EQ(b.payload, kNote);
  more = (*r)->Next(&b);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(*more);
}

// The writer still produces the committed bytes: a change here is a format change, which needs
// a new version number (and a new fixture next to the old one).
TEST(CheckpointFixture, WriterStillProducesVersion1Bytes) {
  auto committed = ReadFileToString(kFixturePath);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, WriteFixtureV1());
}

// ---------------------------------------------------------------------------------------------
// Container
// ---------------------------------------------------------------------------------------------

TEST(BlockFile, RoundTripInMemory) {
  std::string data;
  auto w = BlockWriter::ToString(&data);
  ASSERT_TRUE(w->Add("AAAA", "hello").ok());
  ASSERT_TRUE(w->Add("BBBB", "").ok());
  const absl::string_view pieces[] = {"con", "", "cat"};
  ASSERT_TRUE(w->Add("CCCC", pieces).ok());
  EXPECT_EQ(w->Add("toolong", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Add(kEndTag, "x").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(w->blocks(), 3);
  EXPECT_EQ(w->bytes(), data.size());
  EXPECT_EQ(data.size(), kBlockFileHeaderSize + 4 * (kBlockHeaderSize + 4) + 5 + 6 + 8);
  EXPECT_EQ(data.substr(0, 8), "PSTRNCKP");

  auto r = BlockReader::FromString("mem", data);
  ASSERT_TRUE(r.ok()) << r.status();
  auto tag = (*r)->PeekTag();
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(*tag, "AAAA");
  Block b;
  std::vector<std::string> seen;
  while (true) {
    auto more = (*r)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    seen.push_back(b.tag + "=" + b.payload + "@" + std::to_string(b.index));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"AAAA=hello@0", "BBBB=@1", "CCCC=concat@2"}));
  tag = (*r)->PeekTag();
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(*tag, "");
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.push_back(e->d_name);
    }
  }
  closedir(d);
  return out;
}

TEST(BlockFile, FileAppearsOnlyWhenFinished) {
  const std::string dir = testing::TempDir() + "/block_file_atomic." + std::to_string(getpid());
  // A process id is reused over a long run: never trust a leftover directory.
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = dir + "/shard-0-of-1";
  {
    auto w = BlockWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Add("AAAA", std::string(100000, 'x')).ok());
    EXPECT_FALSE(PathExists(path));
    // Abandoned without Finish: nothing is left behind.
  }
  EXPECT_TRUE(ListDir(dir).empty());
  {
    auto w = BlockWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Add("AAAA", "payload").ok());
    EXPECT_FALSE(PathExists(path));
    ASSERT_TRUE((*w)->Finish().ok());
    EXPECT_EQ((*w)->Add("BBBB", "late").code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"shard-0-of-1"});
  auto r = BlockReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  Block b;
  ASSERT_TRUE(*(*r)->Next(&b));
  EXPECT_EQ(b.payload, "payload");
  EXPECT_FALSE(*(*r)->Next(&b));
  EXPECT_EQ(BlockReader::Open(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

// Every single-byte corruption anywhere in the file is refused with DATA_LOSS, never a crash.
TEST(BlockFile, EveryFlippedByteIsDataLoss) {
  const std::string good = WriteFixtureV1();
  ASSERT_TRUE(ReadAllBlocks("good", good).ok());
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (unsigned char flip : {0x01, 0x80, 0xff}) {
      std::string bad = good;
      bad[pos] = static_cast<char>(bad[pos] ^ flip);
      const absl::Status s = ReadAllBlocks("bad", bad);
      ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss)
          << "byte " << pos << " ^ " << int{flip} << ": " << s;
    }
  }
}

TEST(BlockFile, EveryTruncationIsDataLoss) {
  const std::string good = WriteFixtureV1();
  for (size_t len = 0; len < good.size(); ++len) {
    const absl::Status s = ReadAllBlocks("cut", good.substr(0, len));
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
  }
  EXPECT_EQ(ReadAllBlocks("long", good + "x").code(), absl::StatusCode::kDataLoss);
}

TEST(BlockFile, ErrorsNameFileBlockTagAndOffset) {
  std::string bad = WriteFixtureV1();
  // Block 0 (EMBM, 48-byte payload) spans [16, 84); block 1 (EMBR) starts at 84.
  bad[84 + kBlockHeaderSize + 10] ^= 0x40;
  const absl::Status s = ReadAllBlocks("ckpt-7/shard-1-of-2", bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  for (const char* part : {"ckpt-7/shard-1-of-2", "block 1", "'EMBR'", "offset 84", "checksum"}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos) << part << " in " << s;
  }
  const absl::Status cut = ReadAllBlocks("f", WriteFixtureV1().substr(0, 100));
  EXPECT_NE(cut.message().find("truncated"), absl::string_view::npos) << cut;
}

std::string Header(uint32_t version) {
  char h[kBlockFileHeaderSize];
  std::memcpy(h, kBlockFileMagic, 8);
  EncodeFixed32(h + 8, version);
  EncodeFixed32(h + 12, crc32c::Mask(crc32c::Value(h, 12)));
  return std::string(h, sizeof(h));
}

TEST(BlockFile, NewerVersionIsRefusedClearly) {
  std::string file = WriteFixtureV1();
  file.replace(0, kBlockFileHeaderSize, Header(2));
  const absl::Status s = ReadAllBlocks("future", file);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("version 2"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("newer"), absl::string_view::npos) << s;
}

TEST(BlockFile, UnknownFlagsAreRefused) {
  // A block with flags = 1 and a valid checksum, as a future writer might produce.
  char h[kBlockHeaderSize];
  std::memcpy(h, "AAAA", 4);
  EncodeFixed32(h + 4, 1);
  EncodeFixed64(h + 8, 0);
  char crc[4];
  EncodeFixed32(crc, crc32c::Mask(crc32c::Value(h, sizeof(h))));
  const std::string file = Header(1) + std::string(h, sizeof(h)) + std::string(crc, 4);
  const absl::Status s = ReadAllBlocks("flags", file);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("flags 1"), absl::string_view::npos) << s;
}

// A well-framed block whose contents make no sense (a writer bug) is DATA_LOSS too.
TEST(BlockFile, InconsistentRowsAreDataLoss) {
  EmbeddingSnapshot s = FixtureEmbedding();
  std::swap(s.ids[0], s.ids[1]);  // not ascending
  std::string data;
  auto w = BlockWriter::ToString(&data);
  ASSERT_TRUE(SaveEmbeddingStore(s, w.get()).ok());
  ASSERT_TRUE(w->Finish().ok());
  auto r = BlockReader::FromString("unsorted", data);
  ASSERT_TRUE(r.ok());
  auto meta =
      LoadEmbeddingRows(r->get(), [](const EmbeddingMeta&, absl::Span<const int64_t>, const float*,
                                     const float*) { return absl::OkStatus(); });
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(meta.status().message().find("ascending"), absl::string_view::npos) << meta.status();
  // Asking for the wrong block kind names what was expected.
  r = BlockReader::FromString("dense?", data);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(LoadDenseSnapshot(r->get()).status().code(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------------------------
// Stores through files
// ---------------------------------------------------------------------------------------------

std::shared_ptr<const Optimizer> Adam() {
  OptimizerConfig c;
  c.set_type(ADAM);
  c.set_learning_rate(0.01f);
  return std::shared_ptr<const Optimizer>(std::move(Optimizer::Create(c)).value());
}

constexpr int kDim = 5;
constexpr int64_t kTableRows = 3000000;  // spans several of the saver's snapshot ranges

std::unique_ptr<EmbeddingStore> Store(int64_t begin, int64_t end) {
  EmbeddingStore::Options o;
  o.begin = begin;
  o.end = end;
  o.dim = kDim;
  o.optimizer = Adam();
  o.threads = 2;
  o.row_init = [](int64_t row, float* out) {
    Rng rng(static_cast<uint64_t>(row));
    for (int j = 0; j < kDim; ++j) out[j] = static_cast<float>(rng.Normal() * 0.01);
  };
  return std::move(EmbeddingStore::Create(std::move(o))).value();
}

std::unique_ptr<DenseStore> Dense(int64_t begin, int64_t size) {
  DenseStore::Options o;
  o.begin = begin;
  o.size = size;
  o.optimizer = Adam();
  return std::move(DenseStore::Create(std::move(o))).value();
}

struct Push {
  std::vector<int64_t> ids;  // unique, ascending
  std::vector<float> grads;
  std::vector<float> dense_grad;
};

Push RandomPush(Rng* rng, int rows) {
  std::set<int64_t> u;
  // Zipf-like: half the rows from a small hot range.
  while (static_cast<int>(u.size()) < rows) {
    u.insert(static_cast<int64_t>(rng->Uniform(2) ? rng->Uniform(1000) : rng->Uniform(kTableRows)));
  }
  Push p;
  p.ids.assign(u.begin(), u.end());
  for (size_t i = 0; i < p.ids.size() * kDim; ++i) {
    p.grads.push_back(static_cast<float>(rng->Normal()));
  }
  for (int i = 0; i < 64; ++i) p.dense_grad.push_back(static_cast<float>(rng->Normal()));
  return p;
}

// Save a trained Adam store (over 65536 rows: several EMBR blocks) and a dense slice to a file,
// restore into a fresh store and into two stores splitting the range, keep training all three:
// the results are bit-identical.
TEST(CheckpointStores, RoundTripThenContinuedTrainingIsBitIdentical) {
  auto original = Store(0, kTableRows);
  auto dense = Dense(0, 64);
  Rng rng(99);
  for (int step = 1; step <= 3; ++step) {
    const Push p = RandomPush(&rng, 30000);
    ASSERT_TRUE(original->Apply(p.ids, p.grads.data(), step).ok());
    dense->Apply(p.dense_grad.data(), step);
  }
  ASSERT_GT(original->stats().rows_initialized, kRowsPerBlock);

  const std::string dir = testing::TempDir() + "/ckpt_roundtrip." + std::to_string(getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = dir + "/shard-0-of-1";
  {
    auto w = BlockWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(SaveEmbeddingStore(*original, w->get()).ok());
    ASSERT_TRUE(SaveDenseStore(dense->Snapshot(), w->get()).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }

  auto whole = Store(0, kTableRows);
  const int64_t cut = 1234567;
  auto left = Store(0, cut), right = Store(cut, kTableRows);
  auto dense2 = Dense(0, 64);
  {
    auto r = BlockReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    int64_t rows = 0;
    ASSERT_TRUE(LoadEmbeddingStores(r->get(), {whole.get()}, &rows).ok());
    EXPECT_EQ(rows, original->stats().rows_initialized);
    auto d = LoadDenseSnapshot(r->get());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(dense2->Restore(*d).ok());
    auto tag = (*r)->PeekTag();
    ASSERT_TRUE(tag.ok() && tag->empty());
  }
  {
    // The two stores as two shards would: each reads the file and keeps its own rows.
    for (EmbeddingStore* s : {left.get(), right.get()}) {
      auto r = BlockReader::Open(path);
      ASSERT_TRUE(r.ok());
      int64_t rows = 0;
      ASSERT_TRUE(LoadEmbeddingStores(r->get(), {s}, &rows).ok());
      EXPECT_EQ(rows, s->stats().rows_initialized);
    }
    EXPECT_EQ(left->stats().rows_initialized + right->stats().rows_initialized,
              original->stats().rows_initialized);
  }
  EXPECT_EQ(whole->last_step(), 3);
  EXPECT_EQ(dense2->last_step(), 3);

  for (int step = 4; step <= 6; ++step) {
    const Push p = RandomPush(&rng, 30000);
    ASSERT_TRUE(original->Apply(p.ids, p.grads.data(), step).ok());
    ASSERT_TRUE(whole->Apply(p.ids, p.grads.data(), step).ok());
    const size_t k = std::lower_bound(p.ids.begin(), p.ids.end(), cut) - p.ids.begin();
    ASSERT_TRUE(left->Apply(absl::MakeConstSpan(p.ids.data(), k), p.grads.data(), step).ok());
    ASSERT_TRUE(right
                    ->Apply(absl::MakeConstSpan(p.ids.data() + k, p.ids.size() - k),
                            p.grads.data() + k * kDim, step)
                    .ok());
    dense->Apply(p.dense_grad.data(), step);
    dense2->Apply(p.dense_grad.data(), step);
  }
  const EmbeddingSnapshot a = original->Snapshot(), b = whole->Snapshot();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  const EmbeddingSnapshot l = left->Snapshot(), r = right->Snapshot();
  std::vector<int64_t> ids = l.ids;
  ids.insert(ids.end(), r.ids.begin(), r.ids.end());
  std::vector<float> weights = l.weights, state = l.state;
  weights.insert(weights.end(), r.weights.begin(), r.weights.end());
  state.insert(state.end(), r.state.begin(), r.state.end());
  EXPECT_EQ(ids, a.ids);
  EXPECT_EQ(weights, a.weights);
  EXPECT_EQ(state, a.state);
  const DenseSnapshot da = dense->Snapshot(), db = dense2->Snapshot();
  EXPECT_EQ(da.weights, db.weights);
  EXPECT_EQ(da.state, db.state);
}

TEST(CheckpointStores, LoadIntoAnotherOptimizerIsRefusedNamingTheFile) {
  std::string data;
  auto w = BlockWriter::ToString(&data);
  ASSERT_TRUE(SaveEmbeddingStore(FixtureEmbedding(), w.get()).ok());
  ASSERT_TRUE(w->Finish().ok());
  EmbeddingStore::Options o;
  o.begin = 10;
  o.end = 20;
  o.dim = 3;
  OptimizerConfig c;  // ADAGRAD
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(Optimizer::Create(c)).value());
  auto store = std::move(EmbeddingStore::Create(o)).value();
  auto r = BlockReader::FromString("ckpt-3/shard-0-of-1", data);
  ASSERT_TRUE(r.ok());
  const absl::Status s = LoadEmbeddingStores(r->get(), {store.get()}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("ckpt-3/shard-0-of-1"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace pstrain
