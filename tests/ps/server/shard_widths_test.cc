// Compact table widths (docs/ARCHITECTURE.md "Tables"): a PS shard keeps each table's partition
// stores at the table's width 1 + dim, while its gather and apply stay stride-wide (the narrow
// rows expanded with zeros, the gradients cut); and a checkpoint group written at one width loads
// into a store of another (compact PS files into a stride-wide store, stride files of before
// compact widths into a compact store), with the optimizer slots resized alongside.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "gtest/gtest.h"
#include "cmd/served_shard.h"
#include "common/random.h"
#include "ps/server/shard.h"
#include "ps/server/shard_server.h"
#include "ps/store/embedding_store.h"
#include "ps/store/store_blocks.h"
#include "ps/store/table_rows.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"

namespace pstrain {
namespace {

constexpr int kStride = 17;  // 1 + max dim: a dim-16 table beside a dim-4 one (width 5)

// Every one of the stride's floats set, so that a width's cut shows.
void Init(int64_t row, float* out) {
  for (int j = 0; j < kStride; ++j) out[j] = 0.5f + 0.01f * static_cast<float>(row) + 0.001f * j;
}

Shard::Options Options(bool widths) {
  Shard::Options o;
  o.rows = 70;
  o.partitions = 3;
  o.table_splits = {{40, 2, widths ? 5 : 0}, {30, 1, widths ? kStride : 0}};
  o.row_dim = kStride;
  o.sparse_optimizer.set_type(SGD);
  o.sparse_optimizer.set_learning_rate(0.1f);
  o.dense_optimizer.set_type(SGD);
  o.dense_optimizer.set_learning_rate(0.1f);
  o.row_init = Init;
  return o;
}

TEST(ShardWidths, EachTablesStoresKeepItsWidthAndRowsTravelAtIt) {
  auto shard = Shard::Create(Options(true));
  ASSERT_TRUE(shard.ok()) << shard.status();
  const auto& stores = (*shard)->stores();
  ASSERT_EQ(stores.size(), 3u);
  EXPECT_EQ(stores[0]->dim(), 5);
  EXPECT_EQ(stores[1]->dim(), 5);
  EXPECT_EQ(stores[2]->dim(), kStride);

  // The rows' layout in and out of a shard: each row at its table's width, in ids' order.
  const std::vector<int64_t> ids = {3, 45, 39};
  const std::vector<int> widths = {5, kStride, 5};
  std::vector<float> rows(5 + kStride + 5, -1.f);
  ASSERT_TRUE((*shard)->GatherInto(ids, rows.data(), nullptr).ok());
  std::vector<float> want(kStride);
  size_t at = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    Init(ids[i], want.data());
    for (int j = 0; j < widths[i]; ++j) EXPECT_EQ(rows[at + j], want[j]) << ids[i] << " " << j;
    at += widths[i];
  }

  std::vector<float> grads(rows.size(), 1.f);
  ASSERT_TRUE((*shard)->Apply(ids, grads.data(), nullptr, /*step=*/1).ok());
  ASSERT_TRUE((*shard)->GatherInto(ids, rows.data(), nullptr).ok());
  at = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    Init(ids[i], want.data());
    for (int j = 0; j < widths[i]; ++j) EXPECT_FLOAT_EQ(rows[at + j], want[j] - 0.1f);
    at += widths[i];
  }

  // A narrow table's trained row costs its width, not the stride.
  auto wide = Shard::Create(Options(false));
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ((*wide)->stores()[0]->dim(), kStride);
  EXPECT_LT(stores[0]->stats().chunk_bytes, (*wide)->stores()[0]->stats().chunk_bytes);
}

// A push whose rows are not at their tables' widths (a hostile or mismatched peer: every row at
// the stride) is refused with the expected size, and nothing is applied.
TEST(ShardWidths, APushOfTheWrongLengthIsRefused) {
  auto shard = Shard::Create(Options(true));
  ASSERT_TRUE(shard.ok());
  const std::vector<int64_t> ids = {3, 45};
  for (size_t floats : {size_t{2 * kStride}, size_t{5 + kStride - 1}, size_t{5 + kStride + 1}}) {
    PushRequest req;
    req.set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
    const std::vector<float> g(floats, 1.f);
    req.set_row_grads(std::string(reinterpret_cast<const char*>(g.data()), floats * 4));
    Shard::Update u;
    const absl::Status s = (*shard)->Unpack(req, &u);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(absl::StrCat("carries ", floats, " gradient floats, expected ",
                                            5 + kStride)),
              std::string::npos)
        << s;
  }
  for (const auto& store : (*shard)->stores()) EXPECT_EQ(store->Snapshot().rows(), 0);
}

// A map without widths is the one-table map of before: every store at the stride.
TEST(ShardWidths, NoWidthsKeepTheStride) {
  Shard::Options o = Options(false);
  o.table_splits.clear();
  auto shard = Shard::Create(o);
  ASSERT_TRUE(shard.ok());
  for (const auto& s : (*shard)->stores()) EXPECT_EQ(s->dim(), kStride);
  // A width above the stride (a model whose rows are narrower than 1 + dim) keeps the stride.
  o = Options(true);
  o.table_splits[0].row_dim = kStride + 4;
  shard = Shard::Create(o);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ((*shard)->stores()[0]->dim(), kStride);
}

std::unique_ptr<EmbeddingStore> Store(int dim, OptimizerType type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(0.1f);
  c.set_initial_accumulator(0.25f);
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 100;
  o.dim = dim;
  o.optimizer = *Optimizer::Create(c);
  o.row_init = NarrowRowInit(Init, kStride, dim);
  return *EmbeddingStore::Create(std::move(o));
}

// Writes `from`'s rows to a block file and loads them into `to`.
void SaveAndLoad(const EmbeddingStore& from, EmbeddingStore* to, ParameterLoadMode mode = {}) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/widths_", getpid());
  auto w = BlockWriter::Create(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(SaveEmbeddingStore(from, w->get()).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto r = BlockReader::Open(path);
  ASSERT_TRUE(r.ok());
  int64_t loaded = 0;
  EmbeddingStore* stores[] = {to};
  const absl::Status s = LoadEmbeddingStores(r->get(), stores, &loaded, mode);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(loaded, from.Snapshot().rows());
  unlink(path.c_str());
}

TEST(ShardWidths, CheckpointRowsLoadAtAnotherWidth) {
  for (OptimizerType type : {SGD, ADAGRAD, ADAM, FTRL}) {
    SCOPED_TRACE(OptimizerType_Name(type));
    auto narrow = Store(5, type);
    const std::vector<int64_t> ids = {2, 7};
    std::vector<float> g(ids.size() * 5, 0.5f);
    ASSERT_TRUE(narrow->Apply(ids, g.data(), 1).ok());
    const EmbeddingSnapshot n = narrow->Snapshot();

    // Compact into the stride (predict, serve or `train` from a PS job's checkpoint).
    auto wide = Store(kStride, type);
    SaveAndLoad(*narrow, wide.get());
    const EmbeddingSnapshot w = wide->Snapshot();
    ASSERT_EQ(w.ids, n.ids);
    const Optimizer& opt = wide->optimizer();
    std::vector<float> init_state(opt.StateFloats(kStride));
    opt.InitState(init_state.data(), kStride);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < kStride; ++j) {
        EXPECT_EQ(w.weights[i * kStride + j], j < 5 ? n.weights[i * 5 + j] : 0.f);
      }
      for (int s = 0; s < opt.state_slots(); ++s) {
        for (int j = 0; j < kStride; ++j) {
          EXPECT_EQ(w.state[i * w.state_floats + s * kStride + j],
                    j < 5 ? n.state[i * n.state_floats + s * 5 + j] : init_state[s * kStride + j]);
        }
      }
      for (int e = 0; e < opt.state_extras(); ++e) {
        EXPECT_EQ(w.state[(i + 1) * w.state_floats - 1 - e],
                  n.state[(i + 1) * n.state_floats - 1 - e]);
      }
    }

    // And back (a stride file, as every checkpoint before compact widths, into a compact store):
    // the same rows as the narrow store had.
    auto again = Store(5, type);
    SaveAndLoad(*wide, again.get());
    const EmbeddingSnapshot a = again->Snapshot();
    EXPECT_EQ(a.ids, n.ids);
    EXPECT_EQ(a.weights, n.weights);
    EXPECT_EQ(a.state, n.state);

    // A warm start that resets the slots: InitState's at the store's width.
    auto reset = Store(kStride, type);
    SaveAndLoad(*narrow, reset.get(), ParameterLoadMode{false, false});
    const EmbeddingSnapshot r = reset->Snapshot();
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::vector<float>(r.state.begin() + i * r.state_floats,
                                   r.state.begin() + (i + 1) * r.state_floats),
                init_state);
    }
  }
}

// Through the real client and two shard servers (one of them also "in this process", its calls
// direct): tables of dims 4 and 16 (widths 5 and 17). The client's stride-wide rows match a
// stride-wide reference store whose gradients' tails are 0 (what the model produces), though the
// client is given non-zero tails (dropped at the client), and the rows cross the wire at their
// widths: the bytes a push and a pull carry, with and without widths, are printed (the figure in
// docs/PERFORMANCE.md "Compact table widths").
struct WireRun {
  int64_t bytes_in = 0, bytes_out = 0;
};

std::vector<PartitionMap::TableSplit> Splits(bool widths) {
  return {{3000, 4, widths ? 5 : 0}, {3000, 4, widths ? kStride : 0}};
}

OptimizerConfig Adagrad() {
  OptimizerConfig opt;
  opt.set_type(ADAGRAD);
  opt.set_learning_rate(0.05f);
  return opt;
}

// Two shard servers of rows [0, 3000) (dim 4) and [3000, 6000) (dim 16), with or without widths.
struct Shards : testing::LocalShards {
  explicit Shards(bool widths) {
    for (int s = 0; s < 2; ++s) {
      ShardServer::Options o;
      o.data.shard = s;
      o.data.num_shards = 2;
      o.data.rows = 6000;
      o.data.partitions = 8;
      o.data.table_splits = Splits(widths);
      o.data.row_dim = kStride;
      o.data.dense_size = 10;
      o.data.sparse_optimizer = Adagrad();
      o.data.dense_optimizer = Adagrad();
      o.data.row_init = [](int64_t row, float* out) {
        Init(row, out);
        if (row < 3000) std::fill(out + 5, out + kStride, 0.f);  // the narrow table's tail
      };
      Add(std::move(o));
    }
  }
  PsClient::Options ClientOptions(bool widths) const {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = 6000;
    o.partitions = 8;
    o.table_splits = Splits(widths);
    o.row_dim = kStride;
    o.dense_size = 10;
    o.rpc_deadline_ms = 5000;
    return o;
  }
};

WireRun RunCluster(bool widths, bool direct, int steps) {
  Shards shards(widths);
  PsClient::Options o = shards.ClientOptions(widths);
  ServedShard served(shards.servers[1].get());
  if (direct) {
    o.local_shard = 1;
    o.local_server = &served;
  }
  auto client = PsClient::Create(std::move(o));
  EXPECT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->WaitForShards(absl::Seconds(10)).ok());
  const OptimizerConfig opt = Adagrad();

  EmbeddingStore::Options eo;
  eo.begin = 0;
  eo.end = 6000;
  eo.dim = kStride;
  eo.optimizer = *Optimizer::Create(opt);
  eo.row_init = [](int64_t row, float* out) {
    Init(row, out);
    if (row < 3000) std::fill(out + 5, out + kStride, 0.f);
  };
  auto ref = *EmbeddingStore::Create(std::move(eo));

  Rng rng(7);
  std::vector<float> dense(10), dense_grad(10, 0.f);
  for (int step = 1; step <= steps; ++step) {
    std::vector<int64_t> ids;
    for (int64_t id = static_cast<int64_t>(rng.Uniform(4)); id < 6000;
         id += 1 + static_cast<int64_t>(rng.Uniform(40))) ids.push_back(id);
    std::vector<float> grads(ids.size() * kStride), ref_grads(ids.size() * kStride);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < kStride; ++j) {
        const float g = static_cast<float>(rng.UniformDouble() - 0.5);
        grads[i * kStride + j] = g;
        ref_grads[i * kStride + j] = ids[i] < 3000 && j >= 5 ? 0.f : g;
      }
    }
    // Without widths the stride's tail is stored and moved: it gets the model's zeros.
    EXPECT_TRUE(
        (*client)->Push(ids, (widths ? grads : ref_grads).data(), dense_grad.data(), step).ok());
    EXPECT_TRUE(ref->Apply(ids, ref_grads.data(), step).ok());
    std::vector<float> got(ids.size() * kStride, -1.f), want(ids.size() * kStride);
    EXPECT_TRUE((*client)->Pull(ids, got.data(), dense.data()).ok());
    EXPECT_TRUE(ref->Gather(ids, want.data()).ok());
    EXPECT_EQ(got, want) << "step " << step;
  }
  WireRun run;
  auto stats = (*client)->GetStats();
  EXPECT_TRUE(stats.ok());
  for (const ShardStats& st : *stats) {
    run.bytes_in += st.bytes_in();
    run.bytes_out += st.bytes_out();
  }
  return run;
}

TEST(ShardWidths, ClientAndShardsMoveRowsAtTheirWidths) {
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "remote");
    const int steps = 5;
    const WireRun narrow = RunCluster(true, direct, steps);
    const WireRun wide = RunCluster(false, direct, steps);
    if (direct) continue;  // the in-process shard counts no bytes
    std::printf("dims 4 and 16 (widths 5, 17), ~150 rows a step: bytes in (pushes and pulls' "
                "requests) per step %lld with widths, %lld at the stride; bytes out (pulls' "
                "answers) per step %lld, %lld\n",
                static_cast<long long>(narrow.bytes_in / steps),
                static_cast<long long>(wide.bytes_in / steps),
                static_cast<long long>(narrow.bytes_out / steps),
                static_cast<long long>(wide.bytes_out / steps));
    // Half the rows at 5 floats instead of 17 (plus 8 bytes of id each): about 0.66 of the bytes.
    EXPECT_LT(narrow.bytes_in, 0.75 * wide.bytes_in);
    EXPECT_LT(narrow.bytes_out, 0.75 * wide.bytes_out);
  }
}

// The memory of a shard holding a dim-4 and a dim-32 table (20,000 trained rows each, ADAGRAD),
// each table at its width against every row at the stride 33: printed for docs/PERFORMANCE.md
// "Compact table widths".
TEST(ShardWidths, MemoryOfAShardWithADim4AndADim32Table) {
  constexpr int64_t kRows = 20000;
  int64_t bytes[2] = {0, 0};
  for (bool widths : {true, false}) {
    Shard::Options o;
    o.rows = 2 * kRows;
    o.partitions = 2;
    o.table_splits = {{kRows, 1, widths ? 5 : 0}, {kRows, 1, widths ? 33 : 0}};
    o.row_dim = 33;
    o.sparse_optimizer.set_type(ADAGRAD);
    o.sparse_optimizer.set_learning_rate(0.1f);
    o.sparse_optimizer.set_initial_accumulator(0.1f);
    o.dense_optimizer = o.sparse_optimizer;
    auto shard = Shard::Create(o);
    ASSERT_TRUE(shard.ok()) << shard.status();
    std::vector<int64_t> ids(2 * kRows);
    for (int64_t i = 0; i < 2 * kRows; ++i) ids[i] = i;
    std::vector<float> grads(kRows * (widths ? 5 + 33 : 2 * 33), 0.01f);
    ASSERT_TRUE((*shard)->Apply(ids, grads.data(), nullptr, 1).ok());
    for (const auto& store : (*shard)->stores()) bytes[widths ? 0 : 1] += store->stats().bytes;
  }
  std::printf("a shard with a dim-4 and a dim-32 table, %lld trained rows each (ADAGRAD): %.2f MB "
              "with widths, %.2f MB at the stride (%.2f)\n",
              static_cast<long long>(kRows), bytes[0] / 1e6, bytes[1] / 1e6,
              static_cast<double>(bytes[0]) / bytes[1]);
  // Per row 1 + 5 + 5 floats instead of 1 + 33 + 33 for the dim-4 table: about 0.58 in all.
  EXPECT_LT(bytes[0], 0.65 * bytes[1]);
}

// A worker whose config disagrees with the shards on a table's width (here: every row at the
// stride) is refused at the handshake (ShardMap.partition_row_dims), naming both; and one that
// skips it is refused at its first pull and push, both sides naming the sizes; nothing applied.
TEST(ShardWidths, AWorkerWithOtherWidthsIsRefused) {
  Shards shards(/*widths=*/true);
  auto client = PsClient::Create(shards.ClientOptions(/*widths=*/false));
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Status handshake = (*client)->WaitForShards(absl::Seconds(10));
  EXPECT_EQ(handshake.code(), absl::StatusCode::kFailedPrecondition) << handshake;
  EXPECT_NE(handshake.message().find("with partition row widths ["), std::string::npos)
      << handshake;
  EXPECT_NE(handshake.message().find("this worker expects every row at the stride"),
            std::string::npos)
      << handshake;
  auto agreeing = PsClient::Create(shards.ClientOptions(/*widths=*/true));
  ASSERT_TRUE(agreeing.ok()) << agreeing.status();
  EXPECT_TRUE((*agreeing)->WaitForShards(absl::Seconds(10)).ok());
  const std::vector<int64_t> ids = {1, 3001};
  std::vector<float> rows(ids.size() * kStride), dense(10);
  absl::Status s = (*client)->Pull(ids, rows.data(), dense.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row bytes for"), std::string::npos) << s;
  EXPECT_NE(s.message().find("each row at its table's width"), std::string::npos) << s;
  const std::vector<float> grads(ids.size() * kStride, 0.1f), dense_grad(10, 0.f);
  s = (*client)->Push(ids, grads.data(), dense_grad.data(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("gradient floats, expected"), std::string::npos) << s;
  for (const auto& server : shards.servers) {
    for (const auto& store : server->data().stores()) EXPECT_EQ(store->Snapshot().rows(), 0);
  }
}

}  // namespace
}  // namespace pstrain
