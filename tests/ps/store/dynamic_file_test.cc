// A dynamic table's snapshot in a block file (ps/store/dynamic_file.h): full and delta
// round trips that restore a store exactly, hostile files (truncated, bad CRC, counts larger than
// the file, inconsistent blocks, a newer layout) refused with DATA_LOSS / FAILED_PRECONDITION
// before anything large is allocated, and the committed fixture
// tests/checkpoint/testdata/dynamic_v1.pstrn, which must keep loading.
#include "ps/store/dynamic_file.h"

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/record_frame.h"
#include "gtest/gtest.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using Store = DynamicEmbeddingStore;

const std::string kFixture =
    PSTRAIN_SOURCE_DIR "/tests/checkpoint/testdata/dynamic_v1.pstrn";

Store::Options Options() {
  Store::Options o;
  o.dim = 3;
  OptimizerConfig c;
  c.set_type(ADAGRAD);
  c.set_learning_rate(0.1f);
  o.optimizer = std::shared_ptr<const Optimizer>(Optimizer::Create(c).value());
  o.row_init = [](int64_t key, float* out) {
    for (int j = 0; j < 3; ++j) out[j] = static_cast<float>(key % 100) + 0.25f * j;
  };
  o.admission = Store::Admission::kCount;
  o.admit_count = 2;
  o.sketch_width = 1024;
  o.sketch_depth = 2;
  o.ttl_steps = 3;
  return o;
}

void Apply(Store* s, const std::vector<uint64_t>& keys, int64_t step) {
  std::vector<float> g(keys.size() * 3);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  s->Apply(keys, g.data(), step);
}

struct History {
  std::unique_ptr<Store> live;
  DynamicSnapshot full, delta;
};

// Rows 10..40 admitted at steps 1-2; a full checkpoint; 10 and 50 updated at steps 5-6, so the
// TTL of 3 steps evicts 20, 30 and 40; the delta holds 10 and 50 and those three tombstones.
History MakeHistory() {
  History h;
  h.live = Store::Create(Options()).value();
  h.live->SetPass(1);
  Apply(h.live.get(), {10, 20, 30, 40}, 1);
  Apply(h.live.get(), {10, 20, 30, 40}, 2);
  h.live->BeginGeneration(2, 2);
  h.full = h.live->Snapshot(0).value();
  h.live->SetPass(2);
  Apply(h.live.get(), {10, 50}, 5);
  Apply(h.live.get(), {10, 50}, 6);
  Apply(h.live.get(), {60}, 6);  // seen once: counted in the sketch, not admitted
  EXPECT_EQ(h.live->Evict().ttl, 3);
  h.live->BeginGeneration(3, 2);
  h.delta = h.live->Snapshot(2).value();
  return h;
}

void ExpectSame(const DynamicSnapshot& a, const DynamicSnapshot& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.state_floats, b.state_floats);
  EXPECT_EQ(a.last_step, b.last_step);
  EXPECT_EQ(a.pass, b.pass);
  EXPECT_EQ(a.changed_since, b.changed_since);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.last_pass, b.last_pass);
  EXPECT_EQ(a.last_step_of, b.last_step_of);
  EXPECT_EQ(a.deleted, b.deleted);
  EXPECT_EQ(a.sketch_width, b.sketch_width);
  EXPECT_EQ(a.sketch_depth, b.sketch_depth);
  EXPECT_EQ(a.sketch, b.sketch);
  EXPECT_EQ(a.admitted, b.admitted);
  EXPECT_EQ(a.rejected, b.rejected);
  EXPECT_EQ(a.evicted_ttl, b.evicted_ttl);
  EXPECT_EQ(a.evicted_capacity, b.evicted_capacity);
  EXPECT_EQ(a.seen, b.seen);
}

std::string Encode(const std::string& name, const DynamicSnapshot& s) {
  std::string data;
  auto w = BlockWriter::ToString(&data);
  EXPECT_TRUE(WriteDynamicSnapshot(name, s, w.get()).ok());
  EXPECT_TRUE(w->Finish().ok());
  return data;
}

absl::StatusOr<NamedDynamicSnapshot> Decode(std::string data) {
  auto r = BlockReader::FromString("test.pstrn", std::move(data));
  if (!r.ok()) return r.status();
  return ReadDynamicSnapshot(r->get());
}

TEST(DynamicFile, FullPlusDeltaFilesRestoreExactly) {
  History h = MakeHistory();
  ASSERT_EQ(h.delta.deleted, (std::vector<uint64_t>{20, 30, 40}));
  ASSERT_EQ(h.delta.keys, (std::vector<uint64_t>{10, 50}));
  const std::string dir = testing::FreshDir("dynamic_file");
  ASSERT_TRUE(WriteDynamicFile(dir + "/full", "user", h.full).ok());
  ASSERT_TRUE(WriteDynamicFile(dir + "/delta", "user", h.delta).ok());
  auto full = ReadDynamicFile(dir + "/full");
  auto delta = ReadDynamicFile(dir + "/delta");
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(full->name, "user");
  ExpectSame(full->snapshot, h.full);
  ExpectSame(delta->snapshot, h.delta);
  auto resumed = Store::Create(Options()).value();
  ASSERT_TRUE(resumed->Restore(full->snapshot).ok());
  ASSERT_TRUE(resumed->Restore(delta->snapshot).ok());
  ExpectSame(resumed->Snapshot(0).value(), h.live->Snapshot(0).value());
}

TEST(DynamicFile, ManyBlocksAndTwoGroupsInOneFile) {
  // More rows than one DYNR block holds, and two tables' groups back to back.
  DynamicSnapshot s;
  s.dim = 2;
  s.optimizer = SGD;
  const size_t n = kDynamicRowsPerBlock + 5;
  for (size_t i = 0; i < n; ++i) {
    s.keys.push_back(3 * i + 1);
    s.weights.push_back(static_cast<float>(i));
    s.weights.push_back(-static_cast<float>(i));
    s.counts.push_back(static_cast<uint32_t>(i));
    s.last_pass.push_back(1);
    s.last_step_of.push_back(static_cast<int64_t>(i));
  }
  DynamicSnapshot small;
  small.dim = 1;
  std::string data;
  auto w = BlockWriter::ToString(&data);
  ASSERT_TRUE(WriteDynamicSnapshot("a", s, w.get()).ok());
  ASSERT_TRUE(WriteDynamicSnapshot("b", small, w.get()).ok());
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_EQ(w->blocks(), 4);  // DYNM, 2 x DYNR, DYNM
  auto r = BlockReader::FromString("two", data).value();
  auto a = ReadDynamicSnapshot(r.get());
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectSame(a->snapshot, s);
  auto b = ReadDynamicSnapshot(r.get());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->name, "b");
  EXPECT_EQ(b->snapshot.rows(), 0);
}

void ExpectRefused(const std::string& data, absl::StatusCode code, const std::string& what) {
  auto got = Decode(data);
  ASSERT_FALSE(got.ok()) << what;
  EXPECT_EQ(got.status().code(), code) << got.status();
  EXPECT_NE(std::string(got.status().message()).find(what), std::string::npos) << got.status();
}

TEST(DynamicFile, HostileFilesAreRefused) {
  History h = MakeHistory();
  const std::string good = Encode("user", h.delta);
  ASSERT_TRUE(Decode(good).ok());
  // Truncated anywhere: the block reader's DATA_LOSS.
  for (size_t cut : {size_t{10}, size_t{40}, good.size() / 2, good.size() - 1}) {
    auto got = Decode(good.substr(0, cut));
    ASSERT_FALSE(got.ok()) << cut;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << cut << got.status();
  }
  // A flipped byte in a DYNR payload: its CRC.
  std::string flipped = good;
  flipped[kBlockFileHeaderSize + kBlockHeaderSize + 112 + 4 + 4 + kBlockHeaderSize + 12] ^= 1;
  ExpectRefused(flipped, absl::StatusCode::kDataLoss, "DYNR");
}

// A meta whose CRC is right but whose claims are not: written through BlockWriter.
std::string WithMeta(const DynamicSnapshot& s, const std::function<void(char*)>& edit,
                     bool rows_too = true) {
  std::string data;
  auto w = BlockWriter::ToString(&data);
  std::string meta_file = Encode("t", s);
  auto r = BlockReader::FromString("x", meta_file).value();
  Block b;
  std::vector<Block> blocks;
  while (r->Next(&b).value()) blocks.push_back(b);
  edit(blocks[0].payload.data());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i > 0 && !rows_too) break;
    EXPECT_TRUE(w->Add(blocks[i].tag, blocks[i].payload).ok());
  }
  EXPECT_TRUE(w->Finish().ok());
  return data;
}

TEST(DynamicFile, ClaimsAreCheckedBeforeAllocating) {
  History h = MakeHistory();
  // 2^40 rows, tombstones or sketch counters in a file of a few hundred bytes: refused from the
  // meta alone (a reserve of that would abort the process).
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed64(m + 32, uint64_t{1} << 40); }),
                absl::StatusCode::kDataLoss, "more than its");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed64(m + 40, uint64_t{1} << 40); }),
                absl::StatusCode::kDataLoss, "more than its");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed64(m + 48, uint64_t{1} << 32); }),
                absl::StatusCode::kDataLoss, "more than its");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 56, 17); }),
                absl::StatusCode::kDataLoss, "sketch of");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 4, 0); }),
                absl::StatusCode::kDataLoss, "dim 0");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 4, 100000); }),
                absl::StatusCode::kDataLoss, "dim 100000");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 8, 77); }),
                absl::StatusCode::kDataLoss, "unknown optimizer 77");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 104, 1000); }),
                absl::StatusCode::kDataLoss, "a name of 1000 bytes");
  // Fewer rows than the meta says (the DYNR blocks left out), or more.
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed64(m + 32, 3); }),
                absl::StatusCode::kDataLoss, "holds 2 rows");
  // Without its blocks the file is too small for the meta's claims.
  ExpectRefused(WithMeta(h.delta, [](char*) {}, /*rows_too=*/false), absl::StatusCode::kDataLoss,
                "more than its");
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed64(m + 32, 1); }),
                absl::StatusCode::kDataLoss, "more rows than the meta's 1");
  // A full snapshot cannot carry tombstones.
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m + 16, 0); }),
                absl::StatusCode::kDataLoss, "with tombstones");
  // A newer layout: not corruption, a newer pstrain.
  ExpectRefused(WithMeta(h.delta, [](char* m) { EncodeFixed32(m, 2); }),
                absl::StatusCode::kFailedPrecondition, "layout version 2");
  // Keys out of order.
  DynamicSnapshot unsorted = h.delta;
  std::swap(unsorted.keys[0], unsorted.keys[1]);
  ExpectRefused(Encode("t", unsorted), absl::StatusCode::kDataLoss, "not ascending");
  DynamicSnapshot dup = h.delta;
  dup.deleted[1] = dup.deleted[0];
  ExpectRefused(Encode("t", dup), absl::StatusCode::kDataLoss, "tombstones not ascending");
  // A snapshot whose arrays disagree is not written.
  DynamicSnapshot bad = h.delta;
  bad.counts.pop_back();
  std::string ignored;
  auto w = BlockWriter::ToString(&ignored);
  EXPECT_EQ(WriteDynamicSnapshot("t", bad, w.get()).code(), absl::StatusCode::kInvalidArgument);
}

// The committed fixture: a delta of table 'user' written by this layout's first version. It must
// keep loading (regenerate with PSTRAIN_REGENERATE_FIXTURES=1 only on a deliberate format change,
// with a new name and a reader for the old one).
TEST(DynamicFile, FixtureStillLoads) {
  History h = MakeHistory();
  if (std::getenv("PSTRAIN_REGENERATE_FIXTURES") != nullptr) {
    ASSERT_TRUE(WriteDynamicFile(kFixture, "user", h.delta).ok());
  }
  auto got = ReadDynamicFile(kFixture);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->name, "user");
  const DynamicSnapshot& s = got->snapshot;
  EXPECT_EQ(s.dim, 3);
  EXPECT_EQ(s.optimizer, ADAGRAD);
  EXPECT_EQ(s.state_floats, 3);
  EXPECT_EQ(s.changed_since, 2u);
  EXPECT_EQ(s.pass, 2);
  EXPECT_EQ(s.last_step, 6);
  EXPECT_EQ(s.keys, (std::vector<uint64_t>{10, 50}));
  // Counts start at the admitting update (each key's second): 10 has 3, 50 has 1.
  EXPECT_EQ(s.counts, (std::vector<uint32_t>{3, 1}));
  EXPECT_EQ(s.last_pass, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(s.last_step_of, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(s.deleted, (std::vector<uint64_t>{20, 30, 40}));
  EXPECT_EQ(s.sketch_width, 1024);
  EXPECT_EQ(s.sketch_depth, 2);
  EXPECT_EQ(s.evicted_ttl, 3);
  EXPECT_EQ(s.admitted, 5);
  ASSERT_EQ(s.weights.size(), 6u);
  // Key 10 started at its initializer (10, 10.25, 10.5) and moved by small steps.
  EXPECT_NEAR(s.weights[0], 10.0f, 0.5f);
  EXPECT_NEAR(s.weights[2], 10.5f, 0.5f);
  // Today's writer gives the same bytes for the same content (a change here is a format change).
  std::string rewritten;
  auto w = BlockWriter::ToString(&rewritten);
  ASSERT_TRUE(WriteDynamicSnapshot("user", s, w.get()).ok());
  ASSERT_TRUE(w->Finish().ok());
  EXPECT_TRUE(rewritten == testing::Slurp(kFixture));
  // And it restores on top of the full snapshot.
  auto store = Store::Create(Options()).value();
  ASSERT_TRUE(store->Restore(h.full).ok());
  ASSERT_TRUE(store->Restore(s).ok());
  EXPECT_EQ(store->metrics().rows_live, 2);
}

}  // namespace
}  // namespace pstrain
