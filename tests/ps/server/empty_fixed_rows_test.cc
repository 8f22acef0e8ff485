// A PS job whose every table is dynamic (issue 28): the shards' fixed row space is empty (rows 0,
// cmd/ps_setup.cc ShardOptionsForJob), so a shard makes no fixed store and owns no row, and a
// client routes only dynamic ids (and the dense slices). Over real gRPC on loopback: the
// handshake, pulls and pushes equal one store per table, a fixed id is refused naming the empty
// table, a checkpoint's shard files hold no fixed row group, and it restores onto another shard
// count with the same rows. Options with no fixed row and no dynamic table are refused.
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/delta_chain.h"
#include "checkpoint/layout.h"
#include "common/dynamic_rows.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/store_blocks.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

constexpr int kPartitions = 4;
constexpr int kRowDim = 5;
constexpr int64_t kDense = 13;
const std::vector<int> kDynamicDims = {5, 3};

OptimizerConfig Adagrad() {
  OptimizerConfig c;
  c.set_type(ADAGRAD);
  c.set_learning_rate(0.05f);
  return c;
}

DynamicEmbeddingStore::Options DynamicOptions(int dim) {
  DynamicEmbeddingStore::Options d;
  d.dim = dim;
  d.row_init = [dim](int64_t key, float* out) {
    for (int j = 0; j < dim; ++j) out[j] = 0.001f * static_cast<float>(key % 101) + 0.01f * j;
  };
  return d;
}

ShardServer::Options ShardOptions(int shard, int shards, const std::string& dir = "") {
  ShardServer::Options o;
  o.data.checkpoint_dir = dir;
  o.num_workers = 1;
  o.data.shard = shard;
  o.data.num_shards = shards;
  o.data.rows = 0;  // every table dynamic
  o.data.partitions = kPartitions;
  o.data.row_dim = kRowDim;
  o.data.dense_size = kDense;
  o.data.sparse_optimizer = Adagrad();
  o.data.dense_optimizer = Adagrad();
  o.data.row_init = [](int64_t, float* out) { std::fill(out, out + kRowDim, 0.f); };
  for (int dim : kDynamicDims) {
    o.data.dynamic_tables.push_back(DynamicOptions(dim));
    o.data.dynamic_names.push_back(absl::StrCat("table", dim));
  }
  return o;
}

struct Cluster : testing::LocalShards {
  Cluster(int shards, const std::string& dir = "") {
    for (int s = 0; s < shards; ++s) {
      Add(ShardOptions(s, shards, dir));
    }
  }
  PsClient::Options ClientOptions() const {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = 0;
    o.partitions = kPartitions;
    o.row_dim = kRowDim;
    o.dense_size = kDense;
    o.dynamic_row_dims = kDynamicDims;
    o.rpc_deadline_ms = 5000;
    return o;
  }
  std::unique_ptr<PsClient> Connect() const {
    auto c = PsClient::Create(ClientOptions());
    EXPECT_TRUE(c.ok()) << c.status();
    const absl::Status ready = (*c)->WaitForShards(absl::Seconds(10));
    EXPECT_TRUE(ready.ok()) << ready;
    return std::move(c).value();
  }
};

// n distinct dynamic ids of both tables from a pool of `keys` keys, shuffled.
std::vector<int64_t> DynamicIds(Rng* rng, int n, uint64_t keys) {
  std::vector<int64_t> ids;
  while (static_cast<int>(ids.size()) < n) {
    const int64_t id = DynamicRow(static_cast<int>(rng->Uniform(2)),
                                  (1 + rng->Uniform(keys)) * 0x9e3779b97f4a7c15ull);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::vector<float> RandomValues(Rng* rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return v;
}

// Every live row of table t over the cluster's shards, keyed, with its weights.
std::map<uint64_t, std::vector<float>> Rows(const Cluster& c, int t) {
  std::map<uint64_t, std::vector<float>> rows;
  for (const auto& server : c.servers) {
    const DynamicSnapshot s = server->data().dynamic_stores()[t]->Snapshot().value();
    for (int64_t r = 0; r < s.rows(); ++r) {
      rows[s.keys[r]].assign(s.weights.begin() + r * s.dim, s.weights.begin() + (r + 1) * s.dim);
    }
  }
  return rows;
}

TEST(EmptyFixedRows, OptionsWithNoRowAndNoDynamicTableAreRefused) {
  ShardServer::Options o = ShardOptions(0, 1);
  o.data.dynamic_tables.clear();
  o.data.dynamic_names.clear();
  auto refused = ShardServer::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("rows must be > 0 (or 0 with dynamic"));
  o = ShardOptions(0, 1);
  o.data.rows = -1;
  EXPECT_FALSE(ShardServer::Create(o).ok());

  Cluster c(1);
  PsClient::Options co = c.ClientOptions();
  co.dynamic_row_dims.clear();
  auto client = PsClient::Create(co);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("rows must be > 0 (or 0 with dynamic"));
}

// Two shards with no fixed row: the handshake agrees, the shards own no row, pushes of dynamic
// ids (and the dense vector) land on the shards by key hash and pull back as one store per table
// has them; a fixed id is refused by the client naming the empty table, nothing applied.
TEST(EmptyFixedRows, DynamicIdsOnlyPullAndPushAsOneStorePerTable) {
  Cluster c(2);
  auto client = c.Connect();
  std::vector<std::unique_ptr<DynamicEmbeddingStore>> twin;
  for (int dim : kDynamicDims) {
    DynamicEmbeddingStore::Options d = DynamicOptions(dim);
    d.optimizer = Optimizer::Create(Adagrad()).value();
    twin.push_back(DynamicEmbeddingStore::Create(std::move(d)).value());
  }
  for (const auto& server : c.servers) {
    EXPECT_TRUE(server->data().stores().empty());
    EXPECT_EQ(server->data().Stats().rows_owned(), 0);
  }
  Rng rng(3);
  std::vector<float> dense_grad = RandomValues(&rng, kDense);
  for (int step = 1; step <= 4; ++step) {
    const std::vector<int64_t> ids = DynamicIds(&rng, 40, 60);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), dense_grad.data(), step).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t key = DynamicKeyOf(ids[i]);
      twin[DynamicTableOf(ids[i])]->Apply({&key, 1}, grads.data() + i * kRowDim, step);
    }
  }
  const std::vector<int64_t> ids = DynamicIds(&rng, 50, 60);
  std::vector<float> got(ids.size() * kRowDim), dense(kDense);
  ASSERT_TRUE(client->Pull(ids, got.data(), dense.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t key = DynamicKeyOf(ids[i]);
    std::vector<float> want(kRowDim, 0.f);
    twin[DynamicTableOf(ids[i])]->Gather({&key, 1}, want.data());
    EXPECT_EQ(std::vector<float>(got.begin() + i * kRowDim, got.begin() + (i + 1) * kRowDim),
              want)
        << i;
  }
  // The dense vector moved from its initial zeros (both shards' slices pulled back).
  EXPECT_GT(std::count_if(dense.begin(), dense.end(), [](float x) { return x != 0.f; }),
            kDense / 2);
  for (const auto& server : c.servers) {  // the keys spread over both shards
    EXPECT_GT(server->data().dynamic_stores()[0]->Snapshot().value().rows(), 0);
  }

  const std::vector<int64_t> fixed = {0};
  std::vector<float> row(kRowDim);
  const absl::Status pull = client->Pull(fixed, row.data(), nullptr);
  EXPECT_FALSE(pull.ok());
  EXPECT_THAT(pull.message(), HasSubstr("outside the table [0, 0)"));
  const auto before = Rows(c, 0);
  std::vector<int64_t> mixed = {ids[0], 0};
  std::vector<float> grads(2 * kRowDim, 1.f);
  EXPECT_FALSE(client->Push(mixed, grads.data(), nullptr, 5).ok());
  EXPECT_EQ(Rows(c, 0), before);
}

// A checkpoint of 2 such shards: manifest rows 0, no fixed row group (EMBM / EMBR) in any shard
// file, and a restore onto 1 and 3 shards (each keeps the keys it owns) has every row.
TEST(EmptyFixedRows, CheckpointHasNoFixedGroupAndRestoresOntoAnyShardCount) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/empty_fixed_rows_", getpid());
  std::system(("rm -rf " + dir).c_str());
  Cluster two(2, dir);
  auto client = two.Connect();
  Rng rng(7);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<int64_t> ids = DynamicIds(&rng, 40, 80);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
  }
  const int64_t step = 3;
  ASSERT_TRUE(PrepareCheckpointDir(dir, step).ok());
  CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_num_shards(2);
  manifest.set_table_rows(0);
  manifest.set_partitions(kPartitions);
  manifest.set_row_dim(kRowDim);
  manifest.set_dense_size(kDense);
  for (auto& server : two.servers) ASSERT_TRUE(server->CopyForCheckpoint(step).ok());
  std::map<std::string, int> tags;
  for (auto& server : two.servers) {
    auto written = server->WriteCheckpoint(step, CheckpointName(step));
    ASSERT_TRUE(written.ok()) << written.status();
    auto* f = manifest.add_file();
    f->set_name(written->file());
    f->set_bytes(written->bytes());
    auto reader = BlockReader::Open(dir + "/" + CheckpointName(step) + "/" + written->file());
    ASSERT_TRUE(reader.ok()) << reader.status();
    Block b;
    for (auto more = (*reader)->Next(&b); more.ok() && *more; more = (*reader)->Next(&b)) {
      ++tags[b.tag];
    }
  }
  EXPECT_EQ(tags[kEmbeddingMetaTag], 0);
  EXPECT_EQ(tags[kEmbeddingRowsTag], 0);
  EXPECT_EQ(tags[kDenseTag], 2);
  EXPECT_EQ(tags[kDynamicMetaTag], 4);  // 2 tables on 2 shards
  WorkerState state;
  state.set_step(step);
  ASSERT_TRUE(CommitCheckpoint(dir, manifest, {{0, state}}, /*keep=*/3).ok());
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  for (int shards : {1, 3}) {
    SCOPED_TRACE(shards);
    Cluster restored(shards);
    for (auto& server : restored.servers) {
      const absl::Status s = server->RestoreCheckpoint((*choice)->chain);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(server->data().stores().empty());
    }
    for (int t = 0; t < 2; ++t) {
      EXPECT_FALSE(Rows(two, t).empty());
      EXPECT_EQ(Rows(restored, t), Rows(two, t)) << "table " << t;
    }
    // The restored dense slices pull back as the original ones.
    std::vector<float> a(kDense), b(kDense);
    ASSERT_TRUE(client->Pull({}, nullptr, a.data()).ok());
    ASSERT_TRUE(restored.Connect()->Pull({}, nullptr, b.data()).ok());
    EXPECT_EQ(a, b);
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
