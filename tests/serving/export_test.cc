// serving/export.h: the serving export's format (docs/SERVING.md), its row encodings, its
// versions, and what a reader refuses. testdata/export_v1/ is the fixture of format version 1:
// one test reads it against values computed here, one writes the same model with today's code
// and compares the bytes (the header's wall_time aside). PSTRAIN_REGENERATE_FIXTURES=1 rewrites it.
#include "serving/export.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "common/file.h"
#include "ps/store/table_rows.h"
#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "tests/serving/serving_test_util.h"

namespace pstrain {
namespace {

using testing_serving::AllRows;
using testing_serving::FreshDir;
using testing_serving::SmallDescription;
using testing_serving::SmallModel;
using testing_serving::TablesDescription;

const std::string kFixture = PSTRAIN_SOURCE_DIR "/tests/serving/testdata/export_v1";

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

std::string Frame(const std::vector<Block>& blocks) {
  std::string out;
  auto w = BlockWriter::ToString(&out);
  for (const Block& b : blocks) EXPECT_TRUE(w->Add(b.tag, b.payload).ok());
  EXPECT_TRUE(w->Finish().ok());
  return out;
}

// Writes `blocks` as <dir>/MODEL.
void WriteModelFile(const std::string& dir, const std::vector<Block>& blocks) {
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/MODEL", Frame(blocks)).ok());
}

TEST(Export, RoundTripIsExact) {
  const std::string base = FreshDir("export_f32");
  auto model = SmallModel(SmallDescription(), 1);
  ASSERT_NE(model, nullptr);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version, 7);  // the step
  EXPECT_EQ(info->dir, base + "/7");
  EXPECT_EQ(info->rows, model->stored_rows());
  struct stat st;
  ASSERT_EQ(::stat((info->dir + "/MODEL").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), info->bytes);

  auto read = ReadExport(info->dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->stored_rows(), model->stored_rows());
  EXPECT_EQ((*read)->origin().version, 7);
  EXPECT_EQ((*read)->description().SerializeAsString(),
            model->description().SerializeAsString());
  EXPECT_EQ((*read)->dense(), model->dense());
  // Stored rows come back bit for bit; the others read as the same initial values.
  EXPECT_EQ(AllRows(**read), AllRows(*model));
  std::system(("rm -rf " + base).c_str());
}

// The staging directory's name is predictable (<base>/.tmp-<version>.<pid>): a symlink planted
// there is replaced by a real directory, so the export is not written into its target, and the
// version that appears is a real directory (common/file.h MakeOwnDir; until 2026-11-29 the MODEL
// went into the target and the version became the symlink).
TEST(Export, ASymlinkAtTheStagingNameIsReplaced) {
  const std::string base = FreshDir("export_staging_symlink");
  const std::string elsewhere = FreshDir("export_staging_elsewhere");
  ASSERT_TRUE(MakeDirs(base).ok());
  ASSERT_EQ(::symlink(elsewhere.c_str(), absl::StrCat(base, "/.tmp-7.", getpid()).c_str()), 0);
  auto model = SmallModel(SmallDescription(), 1);
  ASSERT_NE(model, nullptr);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  struct stat st;
  ASSERT_EQ(::lstat(info->dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << info->dir << " is not a real directory";
  EXPECT_FALSE(PathExists(elsewhere + "/MODEL")) << "the export was written outside its base";
  EXPECT_TRUE(ReadExport(info->dir).ok());
  std::system(("rm -rf " + base + " " + elsewhere).c_str());
}

TEST(Export, QuantizedRowsAreCloseAndSmaller) {
  auto model = SmallModel(SmallDescription(), 2);
  ASSERT_NE(model, nullptr);
  const int dim = model->row_dim();
  const int64_t n = model->stored_rows();
  const std::vector<float> exact = AllRows(*model);
  uint64_t bytes[3];
  for (RowEncoding enc : {RowEncoding::kFloat32, RowEncoding::kBfloat16, RowEncoding::kInt8}) {
    SCOPED_TRACE(RowEncodingName(enc));
    const std::string base = FreshDir("export_q");
    ExportOptions o;
    o.encoding = enc;
    auto info = WriteExport(*model, base, o);
    ASSERT_TRUE(info.ok()) << info.status();
    bytes[static_cast<int>(enc)] = info->bytes;
    auto read = ReadExport(info->dir);
    ASSERT_TRUE(read.ok()) << read.status();
    const std::vector<float> got = AllRows(**read);
    for (int64_t r = 0; r < model->table_rows(); ++r) {
      float max_abs = 0;
      for (int j = 1; j < dim; ++j) max_abs = std::max(max_abs, std::fabs(exact[r * dim + j]));
      for (int j = 0; j < dim; ++j) {
        const float want = exact[r * dim + j], have = got[r * dim + j];
        if (r % 3 != 0 || enc == RowEncoding::kFloat32 || (enc == RowEncoding::kInt8 && j == 0)) {
          // Unstored rows, f32, and int8's first-order weight are exact.
          ASSERT_EQ(have, want) << "row " << r << " [" << j << "]";
        } else if (enc == RowEncoding::kBfloat16) {
          ASSERT_LE(std::fabs(have - want), std::fabs(want) * 0x1p-8f) << "row " << r;
        } else {
          ASSERT_LE(std::fabs(have - want), max_abs / 127.f * 0.5001f) << "row " << r;
        }
      }
    }
    std::system(("rm -rf " + base).c_str());
  }
  // The row blocks shrink by the encoding: 8 bytes of id plus 4 dim, 2 dim, or 8 + (dim - 1).
  EXPECT_EQ(bytes[0] - bytes[1], static_cast<uint64_t>(n * 2 * dim));
  EXPECT_EQ(bytes[0] - bytes[2], static_cast<uint64_t>(n * (4 * dim - 8 - (dim - 1))));
}

// The encodings' bytes, pinned to hand-computed values.
TEST(Export, EncodingsGolden) {
  // bfloat16: the upper half, rounded to nearest, ties to even.
  const uint32_t above_tie_bits = 0x3F808001u;  // 1 + 2^-8 + 2^-23: just above a tie
  float above_tie;
  std::memcpy(&above_tie, &above_tie_bits, 4);
  const float bf[] = {1.0f, -2.5f, 1.00390625f /* a tie, to even: down */,
                      1.01171875f /* a tie, to even: up */, above_tie /* up */};
  std::string out;
  EncodeRows(RowEncoding::kBfloat16, 5, 1, bf, &out);
  const uint16_t want_bf[] = {0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81};
  ASSERT_EQ(out.size(), sizeof(want_bf));
  EXPECT_EQ(std::memcmp(out.data(), want_bf, sizeof(want_bf)), 0);
  // int8: w as float32, scale = max |v| / 127, q = round-to-nearest-even(v / scale).
  const float row[] = {0.5f, 1.0f, -0.5f, 0.25f};
  out.clear();
  EncodeRows(RowEncoding::kInt8, 4, 1, row, &out);
  ASSERT_EQ(out.size(), 8u + 3u);
  float w, scale;
  std::memcpy(&w, out.data(), 4);
  std::memcpy(&scale, out.data() + 4, 4);
  EXPECT_EQ(w, 0.5f);
  EXPECT_EQ(scale, 1.0f / 127.f);
  EXPECT_EQ(static_cast<int8_t>(out[8]), 127);
  EXPECT_EQ(static_cast<int8_t>(out[9]), -64);  // -63.5 -> -64 (ties to even)
  EXPECT_EQ(static_cast<int8_t>(out[10]), 32);  // 31.75
  float back[4];
  DecodeRows(RowEncoding::kInt8, 4, 1, out.data(), back);
  EXPECT_EQ(back[0], 0.5f);
  EXPECT_EQ(back[1], 127 * scale);
  EXPECT_EQ(back[2], -64 * scale);
  // An all-zero embedding has scale 0 and decodes to zeros.
  const float zero[] = {-3.0f, 0.f, 0.f};
  out.clear();
  EncodeRows(RowEncoding::kInt8, 3, 1, zero, &out);
  float z[3];
  DecodeRows(RowEncoding::kInt8, 3, 1, out.data(), z);
  EXPECT_EQ(std::vector<float>(z, z + 3), std::vector<float>(zero, zero + 3));
}

TEST(Export, VersionsAreListedAndNeverOverwritten) {
  const std::string base = FreshDir("export_versions");
  auto model = SmallModel(SmallDescription(), 3);
  ExportOptions o;
  o.version = 5;
  ASSERT_TRUE(WriteExport(*model, base, o).ok());
  o.version = 12;
  ASSERT_TRUE(WriteExport(*model, base, o).ok());
  auto again = WriteExport(*model, base, o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  // Names that are not versions, and a version without its MODEL (a staging leftover), are not.
  for (const char* junk : {".tmp-40.123", "007", "abc", "40"}) {
    ASSERT_TRUE(MakeDirs(base + "/" + junk).ok());
  }
  EXPECT_EQ(ListExportVersions(base), (std::vector<int64_t>{12, 5}));
  auto dir = ResolveExportDir(base);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, base + "/12");
  auto self = ResolveExportDir(base + "/5");
  ASSERT_TRUE(self.ok());
  EXPECT_EQ(*self, base + "/5");
  auto none = ResolveExportDir(base + "/abc");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(base + "/abc"), absl::string_view::npos);
  EXPECT_EQ(ListExportVersions(base + "/missing"), std::vector<int64_t>{});
  std::system(("rm -rf " + base).c_str());
}

// A MODEL that is a FIFO (or a device) is refused without a byte read: a reader that opened it
// would block for ever. Readers of a base directory skip such a version, and a damaged one, for
// the newest version that reads (predict's ReadExportAt, serve's ReadNewestExport), naming each.
TEST(Export, AVersionThatDoesNotReadIsSkippedForTheNewestThatDoes) {
  const std::string base = FreshDir("export_skip");
  auto model = SmallModel(SmallDescription(), 3);
  ExportOptions o;
  o.version = 4;
  ASSERT_TRUE(WriteExport(*model, base, o).ok());
  ASSERT_TRUE(MakeDirs(base + "/9").ok());
  ASSERT_EQ(::mkfifo((base + "/9/MODEL").c_str(), 0600), 0);
  ASSERT_TRUE(MakeDirs(base + "/6").ok());
  ASSERT_TRUE(WriteFileAtomic(base + "/6/MODEL", "PSTRNCKP not a model").ok());
  ASSERT_TRUE(MakeDirs(base + "/8").ok());
  ASSERT_EQ(::symlink("/dev/zero", (base + "/8/MODEL").c_str()), 0);
  EXPECT_EQ(ListExportVersions(base), (std::vector<int64_t>{9, 8, 6, 4}));

  auto fifo = ReadExport(base + "/9");
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fifo.status().message().find("open " + base + "/9/MODEL: not a regular file (a FIFO)"),
            absl::string_view::npos)
      << fifo.status();
  auto device = ReadExport(base + "/8");
  EXPECT_NE(device.status().message().find("not a regular file (a character device)"),
            absl::string_view::npos)
      << device.status();

  auto newest = ReadExportAt(base);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)->origin().path, base + "/4");
  auto newer = ReadNewestExport(base, 4);
  ASSERT_FALSE(newer.ok());
  for (const char* v : {"/9/MODEL", "/8/MODEL", "/6/MODEL"}) {
    EXPECT_NE(newer.status().message().find(base + v), absl::string_view::npos) << v;
  }
  EXPECT_NE(newer.status().message().find("newer than 4 reads (3 tried)"), absl::string_view::npos)
      << newer.status();
  auto none = ReadNewestExport(base, 9);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  absl::Notification stop;
  stop.Notify();
  ReadExportOptions cancelled;
  cancelled.cancel = &stop;
  EXPECT_EQ(ReadExport(base + "/4", cancelled).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ReadExportAt(base, cancelled).status().code(), absl::StatusCode::kCancelled);
  std::system(("rm -rf " + base).c_str());
}

// Every damaged or inconsistent file is refused with the file (and block) named, never a crash.
TEST(Export, DamagedOrInconsistentFilesAreRefused) {
  const std::string base = FreshDir("export_bad");
  auto model = SmallModel(SmallDescription(), 4);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok());
  const std::string good = Slurp(info->dir + "/MODEL");
  const std::vector<Block> blocks = Blocks(good);
  ASSERT_GE(blocks.size(), 3u);
  ASSERT_EQ(blocks[0].tag, "MODL");
  ASSERT_EQ(blocks[1].tag, "XDNS");
  ASSERT_EQ(blocks[2].tag, "XROW");
  ExportHeader header;
  ASSERT_TRUE(header.ParseFromString(blocks[0].payload));

  auto expect_refused = [&](const std::string& name, const std::vector<Block>* as_blocks,
                            const std::string* as_bytes, absl::StatusCode code,
                            const std::string& says) {
    SCOPED_TRACE(name);
    const std::string dir = base + "/" + name;
    if (as_blocks != nullptr) WriteModelFile(dir, *as_blocks);
    if (as_bytes != nullptr) {
      ASSERT_TRUE(MakeDirs(dir).ok());
      ASSERT_TRUE(WriteFileAtomic(dir + "/MODEL", *as_bytes).ok());
    }
    auto r = ReadExport(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(dir + "/MODEL"), absl::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find(says), absl::string_view::npos) << r.status();
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  expect_refused("flipped", nullptr, &flipped, absl::StatusCode::kDataLoss, "checksum");
  const std::string truncated = good.substr(0, good.size() - 30);
  expect_refused("truncated", nullptr, &truncated, absl::StatusCode::kDataLoss, "");

  std::vector<Block> b = blocks;
  ExportHeader h = header;
  h.set_rows(header.rows() + 1);
  b[0].payload = h.SerializeAsString();
  expect_refused("rows", &b, nullptr, absl::StatusCode::kDataLoss, "the header says");

  b = blocks;
  h = header;
  h.set_format_version(kExportFormatVersion + 1);
  b[0].payload = h.SerializeAsString();
  expect_refused("newer", &b, nullptr, absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("export format version ", kExportFormatVersion + 1));

  b = blocks;
  h = header;
  h.set_row_dim(header.row_dim() + 1);
  b[0].payload = h.SerializeAsString();
  expect_refused("shape", &b, nullptr, absl::StatusCode::kDataLoss, "its model description makes");

  b = blocks;
  b[1].payload.pop_back();
  expect_refused("dense", &b, nullptr, absl::StatusCode::kDataLoss, "float32");

  b = blocks;
  b[2].payload[15] = 0x7f;  // the first id's high byte: far past the table
  expect_refused("id", &b, nullptr, absl::StatusCode::kDataLoss, "expected ascending ids");

  b = blocks;
  b.push_back(blocks[2]);  // the same ids again: not ascending
  h = header;
  h.set_rows(header.rows() * 2);
  b[0].payload = h.SerializeAsString();
  expect_refused("repeat", &b, nullptr, absl::StatusCode::kDataLoss, "expected ascending ids");

  b = blocks;
  b[2].payload[4] = 1;  // a block in another encoding than the header's
  expect_refused("encoding", &b, nullptr, absl::StatusCode::kDataLoss, "row encoding 1");

  b = blocks;
  b[2].payload.resize(b[2].payload.size() - 3);
  expect_refused("short", &b, nullptr, absl::StatusCode::kDataLoss, "bytes for");

  b = {blocks[1], blocks[0]};
  expect_refused("order", &b, nullptr, absl::StatusCode::kDataLoss, "not a pstrain export");

  // A description that makes no model.
  b = blocks;
  h = header;
  h.mutable_model()->mutable_model()->set_embedding_dim(-3);
  b[0].payload = h.SerializeAsString();
  expect_refused("description", &b, nullptr, absl::StatusCode::kInvalidArgument,
                 "the model description");
  std::system(("rm -rf " + base).c_str());
}

// This process's address space now (VmSize), in bytes; 0 if unknown.
uint64_t AddressSpaceBytes() {
  auto status = ReadFileToString("/proc/self/status");
  if (!status.ok()) return 0;
  const size_t at = status->find("VmSize:");
  if (at == std::string::npos) return 0;
  return std::strtoull(status->c_str() + at + 7, nullptr, 10) * 1024;  // "VmSize:  123 kB"
}

// Caps this process's address space at its size now plus `headroom` while alive (RLIMIT_AS): an
// allocation beyond it fails (std::bad_alloc ends the test) instead of taking the memory.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(uint64_t headroom) {
    const uint64_t now = AddressSpaceBytes();
    ok_ = now > 0 && getrlimit(RLIMIT_AS, &old_) == 0;
    if (!ok_) return;
    rlimit cap = old_;
    cap.rlim_cur = std::min<rlim_t>(old_.rlim_max, now + headroom);
    ok_ = setrlimit(RLIMIT_AS, &cap) == 0;
  }
  ~AddressSpaceCap() {
    if (ok_) setrlimit(RLIMIT_AS, &old_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// A crafted header whose model claims a dense vector of 2.56e8 floats (1 GiB, within the model's
// own bound) in a file of a few kB: refused naming the file and the field, before anything is
// allocated for it (the vector was allocated first, then the dense block's size was checked).
// The read runs under an address-space cap of 512 MiB more than the process has, so an
// allocation for the claim would fail the test (std::bad_alloc).
TEST(Export, AHeaderClaimingHugeSizesIsRefusedBeforeAllocating) {
  const std::string base = FreshDir("export_huge");
  auto model = SmallModel(SmallDescription(), 4);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok());
  const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
  ASSERT_GE(blocks.size(), 3u);
  ExportHeader header;
  ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
  // The header's sizes made consistent with its (crafted) description, as an attacker would.
  auto craft = [&](const ModelDescription& d) {
    ExportHeader h = header;
    *h.mutable_model() = d;
    auto spec = FeatureSpec::Create(d.features());
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto m = Model::Create(d.model(), spec.ok() ? spec->num_fields() : 1);
    EXPECT_TRUE(m.ok()) << m.status();
    if (spec.ok()) h.set_table_rows(static_cast<int64_t>(spec->total_rows()));
    if (m.ok()) {
      h.set_row_dim((*m)->row_dim());
      h.set_dense_size((*m)->dense_size());
    }
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    return b;
  };
  ModelDescription wide = SmallDescription();
  wide.mutable_model()->clear_hidden();
  wide.mutable_model()->add_hidden(16000);
  wide.mutable_model()->add_hidden(16000);  // 2.56e8 floats between them
  const std::string dir = base + "/wide";
  WriteModelFile(dir, craft(wide));
  {
    absl::StatusOr<std::unique_ptr<ServingModel>> r;
    {
      AddressSpaceCap cap(uint64_t{512} << 20);
      if (!cap.ok()) GTEST_SKIP() << "cannot cap the address space (RLIMIT_AS) here";
      r = ReadExport(dir);
    }
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(dir + "/MODEL"), absl::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find("header field dense_size"), absl::string_view::npos)
        << r.status();
  }
  // A header whose own rows field claims more rows than the file holds (its description being
  // the real one): refused before the rows are read, naming the field.
  std::vector<Block> b = blocks;
  ExportHeader h = header;
  h.set_rows(int64_t{1} << 40);
  b[0].payload = h.SerializeAsString();
  WriteModelFile(base + "/rows", b);
  auto r = ReadExport(base + "/rows");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("header field rows 1099511627776"),
            absl::string_view::npos)
      << r.status();
  std::system(("rm -rf " + base).c_str());
}

// ---- Tables (FeatureConfig.table): rows at their table's width ----

// The XROW blocks of an export: (first id, ids, payload bytes) per block.
struct RowBlock {
  std::vector<int64_t> ids;
  size_t bytes = 0;
};
std::vector<RowBlock> RowBlocks(const std::vector<Block>& blocks) {
  std::vector<RowBlock> out;
  for (const Block& b : blocks) {
    if (b.tag != kExportRowsTag) continue;
    uint32_t n = 0;
    std::memcpy(&n, b.payload.data(), 4);
    RowBlock r;
    r.ids.resize(n);
    std::memcpy(r.ids.data(), b.payload.data() + 8, 8 * n);
    r.bytes = b.payload.size();
    out.push_back(std::move(r));
  }
  return out;
}

// Two named tables of different widths and a table two fields share: every encoding writes a
// block per table at the table's width (a `small` row costs 3 floats, not the stride's 5), reads
// back to the same rows, and rows never trained read as their table's initializer.
TEST(ExportTables, RoundTripStoresEachTableAtItsWidth) {
  const ModelDescription d = TablesDescription();
  auto model = SmallModel(d, 3);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->row_dim(), 5);
  ASSERT_EQ(model->row_tables().size(), 3u);
  const auto& tables = model->row_tables();
  EXPECT_EQ(tables[0].name, "");
  EXPECT_EQ(tables[0].width, 5);
  EXPECT_EQ(tables[1].name, "item");
  EXPECT_EQ(tables[1].width, 5);
  EXPECT_EQ(tables[2].name, "small");
  EXPECT_EQ(tables[2].width, 3);
  EXPECT_EQ(tables[2].end, model->table_rows());
  const std::vector<float> want = AllRows(*model);
  // A row of `small` is [w, v0, v1] and zeros to the stride, whatever was stored after them.
  for (int64_t r = tables[2].begin; r < tables[2].end; ++r) {
    EXPECT_EQ(want[r * 5 + 3], 0.f) << r;
    EXPECT_EQ(want[r * 5 + 4], 0.f) << r;
  }
  // Ids of every table in any order (and repeated) gather as the rows in order do.
  {
    const std::vector<int64_t> ids = {155, 3, 60, 159, 0, 60, 151, 99, 49, 150};
    std::vector<float> got(ids.size() * 5);
    ASSERT_TRUE(model->Gather(ids, got.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::vector<float>(got.begin() + i * 5, got.begin() + i * 5 + 5),
                std::vector<float>(want.begin() + ids[i] * 5, want.begin() + ids[i] * 5 + 5))
          << ids[i];
    }
    const std::vector<int64_t> bad = {3, 160};
    EXPECT_EQ(model->Gather(bad, got.data()).code(), absl::StatusCode::kInvalidArgument);
  }
  // Untrained rows (SmallModel stores rows 0, 3, 6, ...) read as their table's initializer.
  const FeatureSpec& spec = model->spec();
  for (int t = 1; t <= 2; ++t) {
    const int64_t row = (tables[t].begin + 1) % 3 != 0 ? tables[t].begin + 1 : tables[t].begin + 2;
    std::vector<float> init(5, -1.f);
    InitTableRow(spec.tables()[t].initializer, spec.tables()[t].dim, 5, row, d.init_seed(),
                 init.data());
    EXPECT_EQ(std::vector<float>(want.begin() + row * 5, want.begin() + row * 5 + 5), init)
        << tables[t].name;
    EXPECT_NE(init[1], 0.f);
  }
  const int64_t row = 1;  // the default table's: Model::InitRow
  std::vector<float> init(5);
  model->model().InitRow(row, d.init_seed(), init.data());
  EXPECT_EQ(std::vector<float>(want.begin() + 5, want.begin() + 10), init);

  for (RowEncoding e : {RowEncoding::kFloat32, RowEncoding::kBfloat16, RowEncoding::kInt8}) {
    SCOPED_TRACE(RowEncodingName(e));
    const std::string base = FreshDir("export_tables");
    ExportOptions o;
    o.encoding = e;
    auto info = WriteExport(*model, base, o);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->rows, model->stored_rows());
    const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
    ExportHeader header;
    ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
    EXPECT_EQ(header.format_version(), 2);
    EXPECT_EQ(header.row_dim(), 5);
    const std::vector<RowBlock> row_blocks = RowBlocks(blocks);
    ASSERT_EQ(row_blocks.size(), 3u);  // one a table (each has stored rows)
    for (size_t t = 0; t < 3; ++t) {
      const RowBlock& rb = row_blocks[t];
      for (int64_t id : rb.ids) EXPECT_EQ(model->RowTableOf(id), static_cast<int>(t)) << id;
      EXPECT_EQ(rb.bytes, 8 + rb.ids.size() * (8 + EncodedRowBytes(e, tables[t].width)));
    }
    auto read = ReadExport(info->dir);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ((*read)->stored_rows(), model->stored_rows());
    ASSERT_EQ((*read)->row_tables().size(), 3u);
    EXPECT_EQ((*read)->row_tables()[2].width, 3);
    const std::vector<float> got = AllRows(**read);
    ASSERT_EQ(got.size(), want.size());
    const float tolerance = e == RowEncoding::kFloat32 ? 0.f : 0.02f;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tolerance + std::fabs(want[i]) * 0.01f * (tolerance > 0))
          << "float " << i;
    }
    if (e == RowEncoding::kFloat32) {
      EXPECT_EQ(got, want);
    }
    std::system(("rm -rf " + base).c_str());
  }
}

// What a reader refuses of an export with tables: a header claiming a table of 2^40 rows (a
// description consistent with itself, as an attacker would craft it) before anything is
// allocated for it, naming the table; a block mixing two tables' rows; a version-1 header whose
// description has tables.
TEST(ExportTables, CraftedOrInconsistentFilesAreRefused) {
  const std::string base = FreshDir("export_tables_bad");
  auto model = SmallModel(TablesDescription(), 4);
  ASSERT_NE(model, nullptr);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
  ASSERT_EQ(blocks.size(), 5u);  // MODL, XDNS, an XROW per table
  ExportHeader header;
  ASSERT_TRUE(header.ParseFromString(blocks[0].payload));

  {
    ExportHeader h = header;
    h.mutable_model()->mutable_features()->mutable_table(0)->set_rows(uint64_t{1} << 40);
    h.set_table_rows(header.table_rows() - 100 + (int64_t{1} << 40));
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    const std::string dir = base + "/huge";
    WriteModelFile(dir, b);
    absl::StatusOr<std::unique_ptr<ServingModel>> r;
    {
      AddressSpaceCap cap(uint64_t{512} << 20);
      if (!cap.ok()) GTEST_SKIP() << "cannot cap the address space (RLIMIT_AS) here";
      r = ReadExport(dir);
    }
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(dir + "/MODEL"), absl::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find("table 'item': 1099511627776 rows"),
              absl::string_view::npos)
        << r.status();
  }
  {
    // Tables each within a store's bound, together past what a served model holds.
    ExportHeader h = header;
    h.mutable_model()->mutable_features()->mutable_table(0)->set_rows((uint64_t{1} << 32) - 2);
    h.mutable_model()->mutable_features()->mutable_table(1)->set_rows((uint64_t{1} << 32) - 2);
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    const std::string dir = base + "/many";
    WriteModelFile(dir, b);
    auto r = ReadExport(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("the tables hold 8589934638 rows"),
              absl::string_view::npos)
        << r.status();
  }
  {
    // The `small` block's rows appended to the `item` block: one block, two tables.
    std::vector<Block> b = {blocks[0], blocks[1], blocks[2], blocks[3]};
    const RowBlock item = RowBlocks({blocks[3]})[0];
    const RowBlock small = RowBlocks({blocks[4]})[0];
    std::vector<int64_t> ids = item.ids;
    ids.insert(ids.end(), small.ids.begin(), small.ids.end());
    std::string p;
    const uint32_t n = static_cast<uint32_t>(ids.size()), enc = 0;
    p.append(reinterpret_cast<const char*>(&n), 4);
    p.append(reinterpret_cast<const char*>(&enc), 4);
    p.append(reinterpret_cast<const char*>(ids.data()), 8 * ids.size());
    p.append(blocks[3].payload.substr(8 + 8 * item.ids.size()));
    p.append(blocks[4].payload.substr(8 + 8 * small.ids.size()));
    p.resize(8 + ids.size() * (8 + 20));  // as wide as `item` rows would be
    b[3].payload = p;
    const std::string dir = base + "/mixed";
    WriteModelFile(dir, b);
    auto r = ReadExport(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("a block holds one table's rows"),
              absl::string_view::npos)
        << r.status();
  }
  {
    ExportHeader h = header;
    h.set_format_version(1);
    std::vector<Block> b = blocks;
    b[0].payload = h.SerializeAsString();
    const std::string dir = base + "/v1";
    WriteModelFile(dir, b);
    auto r = ReadExport(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("cannot hold tables"), absl::string_view::npos)
        << r.status();
  }
  std::system(("rm -rf " + base).c_str());
}

// An export without tables is still format version 1 (ExportFixture.V1StillWrites pins its
// bytes).
TEST(ExportTables, AnExportWithoutTablesIsVersion1) {
  const std::string base = FreshDir("export_no_tables");
  auto model = SmallModel(SmallDescription(), 1);
  ASSERT_NE(model, nullptr);
  auto info = WriteExport(*model, base, ExportOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  const std::vector<Block> blocks = Blocks(Slurp(info->dir + "/MODEL"));
  ExportHeader header;
  ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
  EXPECT_EQ(header.format_version(), 1);
  std::system(("rm -rf " + base).c_str());
}

// ---- The fixture of format version 1 ----

ExportOptions FixtureOptions() {
  ExportOptions o;
  o.encoding = RowEncoding::kInt8;  // pins the most involved encoding
  o.created_by = "pstrain export (fixture)";
  return o;
}

TEST(ExportFixture, V1Reads) {
  const std::string dir = kFixture + "/7";
  auto read = ReadExport(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  auto model = SmallModel(SmallDescription(), 11);
  // What the fixture holds: the model quantized to int8, as the encoder does it today.
  EXPECT_EQ((*read)->stored_rows(), 57);
  EXPECT_EQ((*read)->dense(), model->dense());
  const std::vector<float> got = AllRows(**read), want = AllRows(*model);
  const int dim = model->row_dim();
  for (int64_t r = 0; r < model->table_rows(); ++r) {
    std::vector<float> quantized(want.begin() + r * dim, want.begin() + (r + 1) * dim);
    if (r % 3 == 0) {
      std::string bytes;
      EncodeRows(RowEncoding::kInt8, dim, 1, quantized.data(), &bytes);
      DecodeRows(RowEncoding::kInt8, dim, 1, bytes.data(), quantized.data());
    }
    EXPECT_EQ(std::vector<float>(got.begin() + r * dim, got.begin() + (r + 1) * dim), quantized)
        << "row " << r;
  }
  const std::vector<Block> blocks = Blocks(Slurp(dir + "/MODEL"));
  ASSERT_EQ(blocks.size(), 3u);
  ExportHeader h;
  ASSERT_TRUE(h.ParseFromString(blocks[0].payload));
  EXPECT_EQ(h.format_version(), 1);
  EXPECT_EQ(h.row_encoding(), 2);
  EXPECT_EQ(h.table_rows(), 170);
  EXPECT_EQ(h.row_dim(), 5);
  EXPECT_EQ(h.rows(), 57);
  EXPECT_EQ(h.dense_size(), 1 + 16 * 8 + 8 + 8 * 4 + 4 + 4 + 1);
  ASSERT_EQ(h.dense_tensor_size(), 7);
  EXPECT_EQ(h.dense_tensor(1).name(), "mlp0/w");
  EXPECT_EQ(h.dense_tensor(1).offset(), 1);
  EXPECT_EQ(h.dense_tensor(1).shape_size(), 2);
  EXPECT_EQ(h.step(), 7);
  EXPECT_EQ(h.version(), 7);
  EXPECT_EQ(h.created_by(), "pstrain export (fixture)");
  EXPECT_GT(h.wall_time(), 1.7e9);
}

TEST(ExportFixture, V1StillWrites) {
  const std::string base = FreshDir("export_fixture");
  auto model = SmallModel(SmallDescription(), 11);
  auto info = WriteExport(*model, base, FixtureOptions());
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string fixture = Slurp(kFixture + "/7/MODEL");
  std::vector<Block> fresh = Blocks(Slurp(info->dir + "/MODEL"));
  const std::vector<Block> committed = Blocks(fixture);
  ASSERT_FALSE(fresh.empty());
  ASSERT_FALSE(committed.empty());
  ExportHeader a, b;
  ASSERT_TRUE(a.ParseFromString(fresh[0].payload));
  ASSERT_TRUE(b.ParseFromString(committed[0].payload));
  a.set_wall_time(b.wall_time());  // the one fact of the writing process
  fresh[0].payload = a.SerializeAsString();
  EXPECT_EQ(Frame(fresh), fixture);
  std::system(("rm -rf " + base).c_str());
}

TEST(ExportFixture, RegenerateWhenAsked) {
  if (std::getenv("PSTRAIN_REGENERATE_FIXTURES") == nullptr) {
    GTEST_SKIP() << "set PSTRAIN_REGENERATE_FIXTURES=1 to rewrite " << kFixture;
  }
  ASSERT_EQ(std::system(("rm -rf " + kFixture).c_str()), 0);
  auto model = SmallModel(SmallDescription(), 11);
  auto info = WriteExport(*model, kFixture, FixtureOptions());
  ASSERT_TRUE(info.ok()) << info.status();
}

}  // namespace
}  // namespace pstrain
