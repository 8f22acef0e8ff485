// Dynamic tables in the serving export (format version 3, docs/SERVING.md "Dynamic tables") and
// the ServingModel: the live rows round-trip in every encoding, a key not exported reads what
// training reads for a key without a row (the initializer with ALWAYS admission, zeros with
// COUNT), and a crafted file (a huge row count, a wrong width, an unknown table, keys out of
// order, an older format version claiming dynamic tables) is refused before allocating, naming
// what is wrong.
#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/block_file.h"
#include "common/dynamic_rows.h"
#include "common/file.h"
#include "common/random.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "ps/store/table_rows.h"
#include "serving/export.h"
#include "tests/serving/serving_test_util.h"

namespace pstrain {
namespace {

using testing_serving::FreshDir;

// A default-table field, a fixed table, and two dynamic tables: `user` (ALWAYS admission, an
// initializer) and `tag` (COUNT admission, dim 2, out of the FM term).
ModelDescription DynamicDescription() {
  ModelDescription d;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features {
      preset: NO_PRESET
      field { name: "c1" vocab_size: 50 }
      field { name: "user" table: "user" }
      field { name: "item" table: "item" }
      field { name: "tag" table: "tag" }
      table { name: "user" dynamic {} initializer { type: UNIFORM limit: 0.2 } }
      table { name: "item" dim: 4 rows: 100 }
      table { name: "tag" dim: 2 fm_join: EXCLUDE dynamic { admission: COUNT admit_count: 3 } }
      hash_seed: 3
    }
    model { type: DEEPFM embedding_dim: 4 hidden: [ 8, 4 ] embedding_init_stddev: 0.05 }
    init_seed: 9
    init_rule: 1
  )pb", &d));
  return d;
}

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

std::vector<Block> Blocks(const std::string& data) {
  std::vector<Block> out;
  auto r = BlockReader::FromString("MODEL", data);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  Block b;
  while (true) {
    auto more = (*r)->Next(&b);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) return out;
    out.push_back(b);
  }
}

void WriteModelFile(const std::string& dir, const std::vector<Block>& blocks) {
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string data;
  auto w = BlockWriter::ToString(&data);
  for (const Block& b : blocks) ASSERT_TRUE(w->Add(b.tag, b.payload).ok());
  ASSERT_TRUE(w->Finish().ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/MODEL", data).ok());
}

// A model with 40 live `user` rows and 7 live `tag` rows (keys 1000 + 3i, random weights), some
// fixed rows and a dense vector.
std::unique_ptr<ServingModel> DynamicModel() {
  auto m = ServingModel::Create(DynamicDescription(), ServingModel::Origin{"test", 7, 7});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  Rng rng(4);
  for (int d : {0, 1}) {
    const int n = d == 0 ? 40 : 7;
    const int width = (*m)->dynamic_stores()[d]->dim();
    std::vector<uint64_t> keys;
    for (int i = 0; i < n; ++i) keys.push_back(1000 + 3 * i);
    std::vector<float> w(n * width);
    for (float& x : w) x = static_cast<float>(rng.Normal() * 0.5);
    EXPECT_TRUE((*m)->StoreDynamicRows(d, keys, w.data()).ok());
  }
  std::vector<int64_t> ids = {0, 5, 60, 70};
  std::vector<float> rows(ids.size() * (*m)->row_dim(), 0.3f);
  EXPECT_TRUE((*m)->StoreRows(ids, rows.data()).ok());
  (*m)->model().InitDense(1, (*m)->mutable_dense()->data());
  return *std::move(m);
}

// The rows of `ids` gathered from `m`.
std::vector<float> GatherAll(const ServingModel& m, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * m.row_dim(), -9.f);
  const absl::Status s = m.Gather(ids, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(ExportDynamic, LiveRowsRoundTripAndMissingKeysReadAsInTraining) {
  auto model = DynamicModel();
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->row_dim(), 5);
  ASSERT_EQ(model->dynamic_stores().size(), 2u);
  EXPECT_EQ(model->dynamic_rows(), 47);
  // Mixed ids: fixed, stored dynamic rows of both tables, keys never stored, the missing row.
  const std::vector<int64_t> ids = {DynamicRow(0, 1003), 5, DynamicRow(1, 1006), 1,
                                    DynamicRow(0, 77), DynamicRow(1, 77), DynamicMissingRow(0),
                                    DynamicRow(0, 1003)};
  const std::vector<float> want = GatherAll(*model, ids);
  {
    // A `user` key without a row reads its initializer (ALWAYS: what training's store reads),
    // a `tag` key zeros (COUNT); both zeros after their 1 + dim floats.
    const FeatureSpec::Table& user = model->spec().dynamic_table(0);
    std::vector<float> init(5, 0.f);
    InitTableRow(user.initializer, 4, 5, DynamicRow(0, 77), 9, init.data());
    EXPECT_EQ(std::vector<float>(want.begin() + 4 * 5, want.begin() + 5 * 5), init);
    EXPECT_NE(init[1], 0.f);
    EXPECT_EQ(std::vector<float>(want.begin() + 5 * 5, want.begin() + 6 * 5),
              std::vector<float>(5, 0.f));
    EXPECT_EQ(want[2 * 5 + 3], 0.f);  // a stored `tag` row: 3 floats, then zeros
    EXPECT_EQ(want[2 * 5 + 4], 0.f);
    EXPECT_NE(want[2 * 5 + 1], 0.f);
    std::vector<float> out(5);
    EXPECT_EQ(model->Gather({DynamicRow(2, 1)}, out.data()).code(),
              absl::StatusCode::kInvalidArgument);  // no third dynamic table
  }
  for (RowEncoding e : {RowEncoding::kFloat32, RowEncoding::kBfloat16, RowEncoding::kInt8}) {
    SCOPED_TRACE(RowEncodingName(e));
    const std::string base = FreshDir("export_dynamic");
    ExportOptions o;
    o.encoding = e;
    auto info = WriteExport(*model, base, o);
    ASSERT_TRUE(info.ok()) << info.status();
    const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
    ExportHeader header;
    ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
    EXPECT_EQ(header.format_version(), 3);
    EXPECT_EQ(header.dynamic_rows(), 47);
    int dynamic_blocks = 0;
    for (const Block& b : blocks) dynamic_blocks += b.tag == kExportDynamicTag;
    EXPECT_EQ(dynamic_blocks, 2);  // one a table
    auto read = ReadExport(info->dir);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ((*read)->dynamic_rows(), 47);
    EXPECT_EQ((*read)->stored_rows(), model->stored_rows());
    const std::vector<float> got = GatherAll(**read, ids);
    if (e == RowEncoding::kFloat32) {
      EXPECT_EQ(got, want);
    } else {
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 0.02f + std::fabs(want[i]) * 0.01f) << "float " << i;
      }
    }
    std::system(("rm -rf " + base).c_str());
  }
}

struct AddressSpaceCap {
  explicit AddressSpaceCap(uint64_t bytes) {
    ok_ = getrlimit(RLIMIT_AS, &old_) == 0;
    if (!ok_) return;
    rlimit cap = old_;
    cap.rlim_cur = std::min<rlim_t>(old_.rlim_max, bytes);
    ok_ = setrlimit(RLIMIT_AS, &cap) == 0;
  }
  ~AddressSpaceCap() {
    if (ok_) setrlimit(RLIMIT_AS, &old_);
  }
  bool ok() const { return ok_; }
  rlimit old_{};
  bool ok_ = false;
};

TEST(ExportDynamic, CraftedFilesAreRefused) {
  auto model = DynamicModel();
  ASSERT_NE(model, nullptr);
  const std::string base = FreshDir("export_dynamic_bad");
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
  ASSERT_EQ(blocks.size(), 6u);  // MODL, XDNS, XROW of the default table and `item`, XDYN x 2
  ExportHeader header;
  ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
  int user = -1;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].tag == kExportDynamicTag && user < 0) user = static_cast<int>(i);
  }
  ASSERT_GT(user, 0);
  auto refused = [&](const std::vector<Block>& b, const std::string& name,
                     const std::string& what) {
    const std::string dir = base + "/" + name;
    WriteModelFile(dir, b);
    absl::StatusOr<std::unique_ptr<ServingModel>> r;
    {
      AddressSpaceCap cap(uint64_t{1} << 30);
      r = ReadExport(dir);
    }
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(what), absl::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find(dir + "/MODEL"), absl::string_view::npos) << r.status();
  };
  {
    ExportHeader h = header;
    h.set_dynamic_rows(int64_t{1} << 50);
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    refused(b, "huge", "header field dynamic_rows 1125899906842624 does not fit");
  }
  {
    // A block claiming 2^16 rows with the bytes of its 40: its size does not match.
    std::vector<Block> b = blocks;
    const uint32_t n = 65536;
    std::memcpy(&b[user].payload[0], &n, 4);
    refused(b, "count", "bytes for 65536 dynamic rows");
  }
  {
    // The `user` rows cut to 4 floats: the width of another table.
    std::vector<Block> b = blocks;
    b[user].payload.resize(b[user].payload.size() - 40 * 4);
    refused(b, "width", "bytes for 40 dynamic rows of 20 bytes");
  }
  {
    std::vector<Block> b = blocks;
    const uint32_t table = 2;
    std::memcpy(&b[user].payload[8], &table, 4);
    refused(b, "table", "dynamic table 2, the model has 2");
  }
  {
    std::vector<Block> b = blocks;
    std::swap(b[user], b[user + 1]);  // `tag` before `user`
    refused(b, "order", "expected (table, key) ascending");
  }
  {
    ExportHeader h = header;
    h.set_format_version(2);
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    refused(b, "v2", "cannot hold dynamic tables, version 3 does");
  }
  std::system(("rm -rf " + base).c_str());
}

}  // namespace
}  // namespace pstrain
