// Dynamic tables on the PS (issue 28): shards own dynamic rows (negative ids) by key hash, over
// real gRPC on loopback. Pulls and pushes of mixed fixed and dynamic ids through PsClient give
// the bits of one EmbeddingStore and one DynamicEmbeddingStore per table holding every key; the
// keys spread over the shards; a dynamic row is stored at 1 + dim floats and pulled at row_dim
// (zeros after); an unknown dynamic table, a foreign key and a shard of another config are
// refused by name, nothing applied.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "checkpoint/delta_chain.h"
#include "checkpoint/layout.h"
#include "cmd/served_shard.h"
#include "common/dynamic_rows.h"
#include "common/metrics/metrics.h"
#include "common/random.h"
#include "common/rpc/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "ps/store/dynamic_routing.h"
#include "ps/store/dynamic_store.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 1009;
constexpr int kPartitions = 5;
constexpr int kRowDim = 6;  // the stride: 1 + the fixed table's dim 5
constexpr int64_t kDense = 31;
// Two dynamic tables, narrower than the stride: 1 + 3 and 1 + 1 floats a row.
const std::vector<int> kDynamicDims = {4, 2};

void FixedInit(int64_t row, float* out, int dim) {
  for (int j = 0; j < dim; ++j) out[j] = 0.001f * static_cast<float>(row % 997) - 0.01f * j;
}
// A dynamic row's initial value: a function of its key (ALWAYS admission reads it before the
// first update), so that a pull that misplaced floats would show.
void DynamicInit(int64_t key_bits, float* out, int dim) {
  for (int j = 0; j < dim; ++j) {
    out[j] = 0.0001f * static_cast<float>(static_cast<uint64_t>(key_bits) % 1013) + 0.02f * j;
  }
}

DynamicEmbeddingStore::Options DynamicOptions(int dim, OptimizerType type) {
  DynamicEmbeddingStore::Options d;
  d.dim = dim;
  d.optimizer = Optimizer::Create(testing::TestOptimizer(type)).value();
  d.row_init = [dim](int64_t key, float* out) { DynamicInit(key, out, dim); };
  return d;
}

// Dynamic tables' options beyond the dim (eviction), the same for the shards and the twin.
std::function<void(DynamicEmbeddingStore::Options*)> g_dynamic_extra;

ShardServer::Options ShardOptions(int shard, int shards, OptimizerType type,
                                  const std::vector<int>& dynamic_dims,
                                  const std::string& checkpoint_dir = "") {
  ShardServer::Options o;
  o.data.checkpoint_dir = checkpoint_dir;
  o.num_workers = 1;
  o.data.shard = shard;
  o.data.num_shards = shards;
  o.data.rows = kRows;
  o.data.partitions = kPartitions;
  o.data.row_dim = kRowDim;
  o.data.dense_size = kDense;
  o.data.sparse_optimizer = testing::TestOptimizer(type);
  o.data.dense_optimizer = testing::TestOptimizer(type);
  o.data.row_init = [](int64_t row, float* out) { FixedInit(row, out, kRowDim); };
  for (int dim : dynamic_dims) {
    DynamicEmbeddingStore::Options d = DynamicOptions(dim, type);
    d.optimizer = nullptr;  // the shard's sparse optimizer
    if (g_dynamic_extra) g_dynamic_extra(&d);
    o.data.dynamic_tables.push_back(std::move(d));
    o.data.dynamic_names.push_back(absl::StrCat("table", dim));
  }
  return o;
}

// `shards` shard servers on local ports; `tweak`, when set, changes each one's options first.
struct Cluster : testing::LocalShards {
  Cluster(int shards, OptimizerType type, const std::vector<int>& dynamic_dims = kDynamicDims,
          const std::string& checkpoint_dir = "",
          const std::function<void(ShardServer::Options*)>& tweak = nullptr) {
    for (int s = 0; s < shards; ++s) {
      ShardServer::Options so = ShardOptions(s, shards, type, dynamic_dims, checkpoint_dir);
      if (tweak) tweak(&so);
      Add(std::move(so));
    }
  }
  PsClient::Options ClientOptions() const {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = kRows;
    o.partitions = kPartitions;
    o.row_dim = kRowDim;
    o.dense_size = kDense;
    o.dynamic_row_dims = kDynamicDims;
    o.rpc_deadline_ms = 5000;
    return o;
  }
};

// The single-process twin: one fixed store of [0, V) and one dynamic store per table with
// every key.
struct Reference {
  explicit Reference(OptimizerType type) {
    EmbeddingStore::Options eo;
    eo.begin = 0;
    eo.end = kRows;
    eo.dim = kRowDim;
    eo.optimizer = Optimizer::Create(testing::TestOptimizer(type)).value();
    eo.row_init = [](int64_t row, float* out) { FixedInit(row, out, kRowDim); };
    fixed = EmbeddingStore::Create(std::move(eo)).value();
    for (int dim : kDynamicDims) {
      DynamicEmbeddingStore::Options d = DynamicOptions(dim, type);
      if (g_dynamic_extra) g_dynamic_extra(&d);
      dynamic.push_back(DynamicEmbeddingStore::Create(std::move(d)).value());
    }
  }
  // rows[ids.size() x kRowDim], a dynamic row's tail zeros.
  std::vector<float> Gather(const std::vector<int64_t>& ids) const {
    std::vector<float> out(ids.size() * kRowDim, 0.f);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (IsDynamicRow(ids[i])) {
        const uint64_t key = DynamicKeyOf(ids[i]);
        dynamic[DynamicTableOf(ids[i])]->Gather({&key, 1}, out.data() + i * kRowDim);
      } else {
        EXPECT_TRUE(fixed->Gather({&ids[i], 1}, out.data() + i * kRowDim).ok());
      }
    }
    return out;
  }
  void Apply(const std::vector<int64_t>& ids, const std::vector<float>& grads, int64_t step) {
    std::vector<int64_t> fixed_ids;
    std::vector<float> fixed_grads;
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* g = grads.data() + i * kRowDim;
      if (IsDynamicRow(ids[i])) {
        const uint64_t key = DynamicKeyOf(ids[i]);
        dynamic[DynamicTableOf(ids[i])]->Apply({&key, 1}, g, step);
      } else {
        fixed_ids.push_back(ids[i]);
        fixed_grads.insert(fixed_grads.end(), g, g + kRowDim);
      }
    }
    ASSERT_TRUE(fixed->Apply(fixed_ids, fixed_grads.data(), step).ok());
  }
  std::unique_ptr<EmbeddingStore> fixed;
  std::vector<std::unique_ptr<DynamicEmbeddingStore>> dynamic;
};

// n distinct ids, about a third fixed and a third of each dynamic table (keys from a pool of
// `keys`, so that steps revisit rows), shuffled.
std::vector<int64_t> MixedIds(Rng* rng, int n, uint64_t keys) {
  std::set<int64_t> s;
  while (static_cast<int>(s.size()) < n) {
    const uint64_t kind = rng->Uniform(3);
    if (kind == 0) {
      s.insert(static_cast<int64_t>(rng->Uniform(kRows)));
    } else {
      // Spread keys over the 55 bits (key 0 is the missing row: in the pool too).
      const uint64_t key = rng->Uniform(keys) * 0x9e3779b97f4a7c15ull;
      s.insert(DynamicRow(static_cast<int>(kind - 1), key));
    }
  }
  std::vector<int64_t> ids(s.begin(), s.end());
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng->Uniform(i)]);
  return ids;
}

std::vector<float> RandomValues(Rng* rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return v;
}

std::unique_ptr<PsClient> Connect(PsClient::Options o) {
  auto c = PsClient::Create(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status();
  const absl::Status ready = (*c)->WaitForShards(absl::Seconds(10));
  EXPECT_TRUE(ready.ok()) << ready;
  return std::move(c).value();
}

class DynamicEquivalence
    : public ::testing::TestWithParam<std::tuple<int, OptimizerType, bool>> {};

TEST_P(DynamicEquivalence, MixedPullPushMatchesOneStorePerTable) {
  const auto [shards, type, direct] = GetParam();
  Cluster cluster(shards, type);
  Reference ref(type);
  PsClient::Options o = cluster.ClientOptions();
  ServedShard served(cluster.servers[1].get());
  if (direct) {  // shard 1 in this process: GatherInto / Apply without messages
    o.local_shard = 1;
    o.local_server = &served;
  }
  auto client = Connect(std::move(o));
  Rng rng(77 + shards);
  const std::vector<int64_t> probe = MixedIds(&rng, 300, 400);
  auto expect_same = [&](const std::vector<int64_t>& ids) {
    std::vector<float> got(ids.size() * kRowDim, -1.f);
    ASSERT_TRUE(client->Pull(ids, got.data(), nullptr).ok());
    const std::vector<float> want = ref.Gather(ids);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  };
  expect_same(probe);  // before any update: row_init's values (ALWAYS admission)
  for (int step = 1; step <= 6; ++step) {
    const std::vector<int64_t> ids = MixedIds(&rng, 200, 400);
    // Gradients over the whole stride: the floats beyond a dynamic table's 1 + dim are ignored.
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
    ref.Apply(ids, grads, step);
    if (step % 3 == 0) {
      expect_same(ids);
      expect_same(probe);
    }
  }
  // Every shard holds some of each table's keys, exactly those it owns, and no key twice.
  std::vector<int64_t> live(kDynamicDims.size(), 0);
  for (int s = 0; s < shards; ++s) {
    SCOPED_TRACE(s);
    const Shard& shard = cluster.servers[s]->data();
    ASSERT_EQ(shard.dynamic_stores().size(), kDynamicDims.size());
    for (size_t t = 0; t < kDynamicDims.size(); ++t) {
      const DynamicSnapshot snap = shard.dynamic_stores()[t]->Snapshot().value();
      EXPECT_GT(snap.rows(), 0);
      EXPECT_EQ(snap.dim, kDynamicDims[t]);
      for (uint64_t key : snap.keys) {
        EXPECT_EQ(DynamicShardOf(DynamicRow(static_cast<int>(t), key), shards), s);
      }
      live[t] += snap.rows();
    }
    EXPECT_EQ(shard.LastStep(), 6);
  }
  for (size_t t = 0; t < kDynamicDims.size(); ++t) {
    EXPECT_EQ(live[t], ref.dynamic[t]->metrics().rows_live);
  }
}

INSTANTIATE_TEST_SUITE_P(ShardsAndOptimizers, DynamicEquivalence,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(ADAGRAD, FTRL),
                                            ::testing::Bool()));

std::unique_ptr<ParameterServer::Stub> RawStub(const std::string& address) {
  return ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

// A key of dynamic table `table` owned by `shard` of `shards`.
int64_t KeyOwnedBy(int table, int shard, int shards, uint64_t from = 1) {
  for (uint64_t key = from;; ++key) {
    const int64_t id = DynamicRow(table, key);
    if (DynamicShardOf(id, shards) == shard) return id;
  }
}

TEST(DynamicShard, RefusesUnknownTableAndForeignKeyNothingApplied) {
  Cluster cluster(2, ADAGRAD);
  auto stub = RawStub(cluster.addresses[0]);
  const int64_t owned_fixed = 0;  // partition 0 lives on shard 0
  const int64_t owned = KeyOwnedBy(0, 0, 2);
  const int64_t unknown = DynamicRow(2, 5);  // the shards have dynamic tables 0 and 1
  const int64_t foreign = KeyOwnedBy(1, 1, 2);

  auto push = [&](std::vector<int64_t> ids) {
    PushRequest req;
    PackArray(ids.data(), ids.size(), req.mutable_ids());
    // Each row at its width (the wire's layout): a dynamic row at 1 + its table's dim.
    int64_t floats = 0;
    for (const int64_t id : ids) {
      const bool known = IsDynamicRow(id) && DynamicTableOf(id) < 2;
      floats += known ? kDynamicDims[DynamicTableOf(id)] : kRowDim;
    }
    const std::vector<float> grads(floats, 1.0f);
    PackArray(grads.data(), grads.size(), req.mutable_row_grads());
    req.set_sequence(0);
    PushResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub->Push(&ctx, req, &resp);
  };
  // The owned rows come first: a refused push applies none of them.
  grpc::Status s = push({owned_fixed, owned, unknown});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("is of dynamic table 2, but this shard has 2"));
  s = push({owned_fixed, owned, foreign});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("dynamic row ", foreign, " (table 1, key ",
                                     DynamicKeyOf(foreign), ") is owned by shard 1")));
  EXPECT_EQ(cluster.servers[0]->Stats().rows_initialized(), 0);
  EXPECT_EQ(cluster.servers[0]->data().dynamic_stores()[0]->metrics().seen, 0);

  PullRequest pull;
  PackArray(&unknown, 1, pull.mutable_ids());
  PullResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  EXPECT_EQ(stub->Pull(&ctx, pull, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The owned ones alone are applied: one fixed row and one dynamic row.
  ASSERT_TRUE(push({owned_fixed, owned}).ok());
  EXPECT_EQ(cluster.servers[0]->Stats().rows_initialized(), 2);

  // The client refuses an id of a table it does not know before sending anything.
  auto client = Connect(cluster.ClientOptions());
  std::vector<float> rows(kRowDim);
  const absl::Status c = client->Pull({unknown}, rows.data(), nullptr);
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.message()), HasSubstr("of dynamic table 2, but the job has 2"));
}

TEST(DynamicShard, HandshakeRefusesShardsOfAnotherDynamicConfig) {
  Cluster without(2, ADAGRAD, {});  // shards that know no dynamic table
  PsClient::Options o = without.ClientOptions();
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->WaitForShards(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("with 0 dynamic tables of row dims [], but this worker expects 2 of row "
                        "dims [4, 2]"));

  Cluster with(2, ADAGRAD);
  o = with.ClientOptions();
  o.dynamic_row_dims = {4, 3};  // another dim for table 1
  client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  s = (*client)->WaitForShards(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("row dims [4, 2]"));

  o.dynamic_row_dims = {4, kRowDim + 1};
  EXPECT_THAT(std::string(PsClient::Create(o).status().message()),
              HasSubstr("dynamic_row_dims[1] must be in [1, 6]"));
}

TEST(DynamicShard, GatherIntoWritesEachRowAtItsWidth) {
  // The in-process path's calls take the wire's layout (Shard::RowFloats): each row at its width,
  // a dynamic row at its store's 1 + dim floats, one after the other, whatever the buffer held.
  ShardServer::Options o = ShardOptions(0, 1, SGD, kDynamicDims);
  auto shard = Shard::Create(o.data);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<int64_t> ids = {DynamicRow(1, 42), 3, DynamicRow(0, 42)};
  std::vector<int> width, offset;
  int total = 0;
  for (const int64_t id : ids) {
    offset.push_back(total);
    width.push_back(IsDynamicRow(id) ? kDynamicDims[DynamicTableOf(id)] : kRowDim);
    total += width.back();
  }
  std::vector<float> grads(total, 0.5f);
  ASSERT_TRUE((*shard)->Apply(ids, grads.data(), nullptr, 1).ok());
  std::vector<float> rows(total + 1, -7.f);
  ASSERT_TRUE((*shard)->GatherInto(ids, rows.data(), nullptr).ok());
  for (size_t i : {size_t{0}, size_t{2}}) {
    const int dim = kDynamicDims[DynamicTableOf(ids[i])];
    ASSERT_EQ(width[i], dim);
    std::vector<float> want(dim, 0.f);
    DynamicInit(static_cast<int64_t>(DynamicKeyOf(ids[i])), want.data(), dim);
    for (int j = 0; j < dim; ++j) want[j] -= 0.1f * 0.5f;  // one SGD step, lr 0.1
    for (int j = 0; j < dim; ++j) {
      EXPECT_FLOAT_EQ(rows[offset[i] + j], want[j]) << "row " << i << " float " << j;
    }
  }
  EXPECT_EQ(rows[total], -7.f);  // nothing written past the layout's floats
}

TEST(DynamicShard, CreateRefusesADynamicTableWiderThanTheStride) {
  ShardServer::Options o = ShardOptions(0, 1, SGD, {kRowDim + 1});
  const absl::Status s = Shard::Create(o.data).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dynamic_tables[0].dim must be in [1, 6]"));
}

// ---- Checkpoints (ps/server/shard_checkpoint.cc) ----

std::string TestDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/dynamic_ckpt_", getpid(), "_", name);
  std::system(("rm -rf " + dir).c_str());
  return dir;
}

// Writes a checkpoint of `cluster` under dir as the chief does: COPY every shard, WRITE every
// shard, then the MANIFEST and LATEST; a delta when `deltas` says so; `end_pass`: the COPY ends
// the pass (SaveShardRequest.end_pass, with the checkpoint's step).
void SaveCluster(Cluster* cluster, const std::string& dir, int64_t step, DeltaChain* deltas,
                 bool end_pass = false) {
  ASSERT_TRUE(PrepareCheckpointDir(dir, step).ok());
  CheckpointManifest manifest;
  const std::optional<CheckpointDelta> delta = deltas->Next();
  if (delta) *manifest.mutable_delta() = *delta;
  manifest.set_step(step);
  manifest.set_num_shards(static_cast<int>(cluster->servers.size()));
  manifest.set_table_rows(kRows);
  manifest.set_partitions(kPartitions);
  manifest.set_row_dim(kRowDim);
  manifest.set_dense_size(kDense);
  for (auto& server : cluster->servers) {
    ASSERT_TRUE(server
                    ->CopyForCheckpoint(step,
                                        delta ? std::optional<int64_t>(delta->parent_step())
                                              : std::nullopt,
                                        end_pass, step)
                    .ok());
  }
  for (auto& server : cluster->servers) {
    auto written = server->WriteCheckpoint(step, CheckpointName(step));
    ASSERT_TRUE(written.ok()) << written.status();
    auto* f = manifest.add_file();
    f->set_name(written->file());
    f->set_bytes(written->bytes());
  }
  WorkerState state;
  state.set_step(step);
  ASSERT_TRUE(CommitCheckpoint(dir, manifest, {{0, state}}, /*keep=*/3).ok());
  deltas->Committed(manifest);
}

// Every live row of each dynamic table of the cluster, with its metadata, as one snapshot per
// table (the shards' snapshots merged in key order).
struct LiveRows {
  std::vector<uint64_t> keys;
  std::vector<float> weights, state;
  std::vector<uint32_t> counts;
  std::vector<int64_t> last_step;
  bool operator==(const LiveRows& o) const {
    return keys == o.keys && weights == o.weights && state == o.state && counts == o.counts &&
           last_step == o.last_step;
  }
};
LiveRows Live(const std::vector<const DynamicEmbeddingStore*>& stores) {
  std::vector<std::pair<uint64_t, std::pair<size_t, int64_t>>> order;
  std::vector<DynamicSnapshot> snaps;
  for (const DynamicEmbeddingStore* s : stores) snaps.push_back(s->Snapshot().value());
  for (size_t i = 0; i < snaps.size(); ++i) {
    for (int64_t r = 0; r < snaps[i].rows(); ++r) order.push_back({snaps[i].keys[r], {i, r}});
  }
  std::sort(order.begin(), order.end());
  LiveRows l;
  for (const auto& [key, at] : order) {
    const DynamicSnapshot& s = snaps[at.first];
    const int64_t r = at.second;
    l.keys.push_back(key);
    l.weights.insert(l.weights.end(), s.weights.begin() + r * s.dim,
                     s.weights.begin() + (r + 1) * s.dim);
    l.state.insert(l.state.end(), s.state.begin() + r * s.state_floats,
                   s.state.begin() + (r + 1) * s.state_floats);
    l.counts.push_back(s.counts[r]);
    l.last_step.push_back(s.last_step_of[r]);
  }
  return l;
}
LiveRows ClusterLive(const Cluster& c, int table) {
  std::vector<const DynamicEmbeddingStore*> stores;
  for (const auto& server : c.servers) {
    stores.push_back(server->data().dynamic_stores()[table].get());
  }
  return Live(stores);
}

// Full + delta checkpoints with TTL evictions at each COPY (tombstones in the delta) restore onto
// 2 and 3 shards (re-sharding from 3: each shard reads every old file and keeps its keys) with
// exactly the live rows, their optimizer slots and metadata of a single store per table that saw
// the same pushes and evictions; training on from the restore matches too.
TEST(DynamicCheckpoint, FullPlusDeltasWithEvictionsRestoreOntoAnyShardCount) {
  g_dynamic_extra = [](DynamicEmbeddingStore::Options* d) { d->ttl_steps = 3; };
  const std::string dir = TestDir("chain");
  Cluster three(3, ADAGRAD, kDynamicDims, dir);
  Reference ref(ADAGRAD);
  auto client = Connect(three.ClientOptions());
  Rng rng(5);
  DeltaChain deltas(4);
  int64_t evicted = 0;
  for (int step = 1; step <= 9; ++step) {
    // A pool that drifts: keys of early steps stop, so the TTL evicts them.
    const std::vector<int64_t> ids = MixedIds(&rng, 150, 100 + 40 * step);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
    ref.Apply(ids, grads, step);
    if (step % 3 == 0) {  // ckpt-3 full, ckpt-6 and ckpt-9 deltas
      for (auto& d : ref.dynamic) {
        const DynamicEmbeddingStore::EvictionResult e = d->Evict();
        evicted += e.ttl;
      }
      SaveCluster(&three, dir, step, &deltas);
    }
  }
  ASSERT_GT(evicted, 0);  // the test exercises tombstones
  for (size_t t = 0; t < kDynamicDims.size(); ++t) {
    ASSERT_TRUE(ClusterLive(three, static_cast<int>(t)) ==
                Live({ref.dynamic[t].get()}))
        << "the cluster's evictions differ from the twin's, table " << t;
  }
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  ASSERT_EQ((*choice)->chain.size(), 3u);  // full + 2 deltas
  g_dynamic_extra = nullptr;
  for (int shards : {3, 2}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    Cluster restored(shards, ADAGRAD, kDynamicDims);
    for (auto& server : restored.servers) {
      ASSERT_TRUE(server->RestoreCheckpoint((*choice)->chain).ok());
    }
    for (size_t t = 0; t < kDynamicDims.size(); ++t) {
      EXPECT_TRUE(ClusterLive(restored, static_cast<int>(t)) == Live({ref.dynamic[t].get()}))
          << "table " << t;
      // The cumulative counters sum to the old shards' (re-sharded: shard 0 carries them).
      auto counters = [t](const Cluster& cluster) {
        std::vector<int64_t> sum(5, 0);
        for (const auto& server : cluster.servers) {
          const DynamicEmbeddingStore::Metrics m = server->data().dynamic_stores()[t]->metrics();
          const int64_t v[5] = {m.admitted, m.rejected, m.evicted_ttl, m.evicted_capacity, m.seen};
          for (int i = 0; i < 5; ++i) sum[i] += v[i];
        }
        return sum;
      };
      EXPECT_EQ(counters(restored), counters(three)) << "table " << t;
      EXPECT_GT(counters(three)[2], 0);
      for (const auto& server : restored.servers) {  // every shard holds only its own keys
        const DynamicSnapshot snap = server->data().dynamic_stores()[t]->Snapshot().value();
        for (uint64_t key : snap.keys) {
          EXPECT_EQ(DynamicShardOf(DynamicRow(static_cast<int>(t), key), shards),
                    server->shard());
        }
      }
    }
    // Training goes on from the restore as from the twin (optimizer slots came along).
    PsClient::Options o = restored.ClientOptions();
    auto c = Connect(o);
    Rng more(shards);
    const std::vector<int64_t> ids = MixedIds(&more, 150, 500);
    const std::vector<float> grads = RandomValues(&more, ids.size() * kRowDim);
    ASSERT_TRUE(c->Push(ids, grads.data(), nullptr, 10).ok());
    std::vector<float> got(ids.size() * kRowDim);
    ASSERT_TRUE(c->Pull(ids, got.data(), nullptr).ok());
    Reference twin(ADAGRAD);  // the twin as restored, then the same push
    for (size_t t = 0; t < kDynamicDims.size(); ++t) {
      ASSERT_TRUE(twin.dynamic[t]->Restore(ref.dynamic[t]->Snapshot().value()).ok());
    }
    twin.Apply(ids, grads, 10);
    const std::vector<float> want = twin.Gather(ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!IsDynamicRow(ids[i])) continue;  // the fixed rows: shard_server_test's
      ASSERT_EQ(0, std::memcmp(got.data() + i * kRowDim, want.data() + i * kRowDim,
                               kRowDim * sizeof(float)))
          << "row " << ids[i];
    }
    if (shards == 3) {  // the same layout: each shard's own sketch and counters come back
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(restored.servers[s]->data().dynamic_stores()[0]->metrics().evicted_ttl,
                  three.servers[s]->data().dynamic_stores()[0]->metrics().evicted_ttl);
      }
    }
  }
  std::system(("rm -rf " + dir).c_str());
}

// With a step schedule (Shard::Options::dynamic_evict_every_steps, the chief's checkpoint.
// every_steps), a shard evicts right after applying a step that is a multiple of it, and never at
// a COPY: a stop's checkpoint at another step changes nothing a resumed job would see.
TEST(DynamicCheckpoint, StepScheduleEvictsAfterItsStepsAndNotAtCopy) {
  const std::string dir = TestDir("schedule");
  g_dynamic_extra = [](DynamicEmbeddingStore::Options* d) { d->ttl_steps = 2; };
  Reference ref(ADAGRAD);
  g_dynamic_extra = nullptr;
  Cluster cluster(2, ADAGRAD, kDynamicDims, dir, [](ShardServer::Options* so) {
    EXPECT_EQ(so->data.dynamic_evict_every_steps, 0);  // the default: at every COPY
    for (auto& d : so->data.dynamic_tables) d.ttl_steps = 2;
    so->data.dynamic_evict_every_steps = 3;
  });
  const std::vector<std::unique_ptr<ShardServer>>& servers = cluster.servers;
  auto client = Connect(cluster.ClientOptions());
  Rng rng(11);
  int64_t twin_evicted = 0;
  for (int step = 1; step <= 7; ++step) {
    const std::vector<int64_t> ids = MixedIds(&rng, 120, 60 + 40 * step);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
    ref.Apply(ids, grads, step);
    if (step % 3 == 0) {
      for (auto& d : ref.dynamic) twin_evicted += d->Evict().ttl;
    }
    if (step == 4) {  // a checkpoint off the schedule: its COPY evicts nothing
      for (auto& server : servers) ASSERT_TRUE(server->CopyForCheckpoint(1, std::nullopt).ok());
    }
  }
  ASSERT_GT(twin_evicted, 0);
  int64_t evicted = 0;
  for (size_t t = 0; t < kDynamicDims.size(); ++t) {
    std::vector<const DynamicEmbeddingStore*> stores;
    for (const auto& server : servers) {
      stores.push_back(server->data().dynamic_stores()[t].get());
      evicted += server->data().dynamic_stores()[t]->metrics().evicted_ttl;
    }
    EXPECT_TRUE(Live(stores) == Live({ref.dynamic[t].get()})) << "table " << t;
  }
  EXPECT_EQ(evicted, twin_evicted);
  std::system(("rm -rf " + dir).c_str());
}

// Passes on the PS: a COPY of a pass's end (SaveShardRequest.end_pass) evicts with the TTL in
// passes counting that pass as finished, ages the sketch and counts the next pass; a COPY before
// a pass's end (every_steps 0) compares with the last finished pass, so it does not evict the
// previous pass's rows while the current pass may still see them.
TEST(DynamicCheckpoint, PassEndCopyEvictsByPassesAndCountsTheNextPass) {
  const std::string dir = TestDir("passes");
  Cluster cluster(1, ADAGRAD, kDynamicDims, dir, [](ShardServer::Options* so) {
    for (auto& d : so->data.dynamic_tables) d.ttl_passes = 1;
  });
  ShardServer* server = cluster.servers[0].get();
  auto client = Connect(cluster.ClientOptions());
  const auto& stores = server->data().dynamic_stores();
  auto live = [&] { return stores[0]->metrics().rows_live + stores[1]->metrics().rows_live; };
  auto evicted = [&] {
    return stores[0]->metrics().evicted_ttl + stores[1]->metrics().evicted_ttl;
  };
  Rng rng(17);
  auto push = [&](int step, uint64_t keys) {
    const std::vector<int64_t> ids = MixedIds(&rng, 60, keys);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
  };
  push(1, 1000);  // pass 0: ~40 rows
  ASSERT_TRUE(server->CopyForCheckpoint(1, std::nullopt, /*end_pass=*/false).ok());
  EXPECT_EQ(stores[0]->pass(), 0);
  ASSERT_TRUE(server->CopyForCheckpoint(2, std::nullopt, /*end_pass=*/true).ok());
  EXPECT_EQ(evicted(), 0);  // every row is of the pass that just ended
  EXPECT_EQ(stores[0]->pass(), 1);
  EXPECT_EQ(stores[1]->pass(), 1);
  const int64_t pass0_rows = live();
  ASSERT_GT(pass0_rows, 20);
  push(2, 3);  // pass 1 sees at most 3 keys a table: pass 0's others are a pass old at its end
  ASSERT_TRUE(server->CopyForCheckpoint(3, std::nullopt, /*end_pass=*/false).ok());
  EXPECT_EQ(evicted(), 0);  // before the pass's end: the last finished pass is 0
  ASSERT_TRUE(server->CopyForCheckpoint(4, std::nullopt, /*end_pass=*/true).ok());
  EXPECT_GT(evicted(), pass0_rows / 2);  // pass 0's rows not seen in pass 1
  EXPECT_EQ(stores[0]->pass(), 2);
  EXPECT_EQ(live(), stores[0]->metrics().admitted + stores[1]->metrics().admitted - evicted());
  EXPECT_LE(live(), 6);
  std::system(("rm -rf " + dir).c_str());
}

// The pass's end happens once per checkpoint step (SaveShardRequest.step): a retried COPY of the
// round that ended it, and that round redone by a shard restored from the checkpoint that holds
// the pass end, neither count another pass nor age the admission sketch again; a shard restored
// from a checkpoint before the pass end ends it, and a later step ends the next pass.
TEST(DynamicCheckpoint, PassEndOncePerStepRetriedCopyAndRestoredRedo) {
  const std::string dir = TestDir("pass_once");
  g_dynamic_extra = [](DynamicEmbeddingStore::Options* d) {
    d->admission = DynamicEmbeddingStore::Admission::kCount;
    d->admit_count = 3;
    d->sketch_width = 1024;
    d->sketch_depth = 2;
  };
  Cluster two(2, ADAGRAD, kDynamicDims, dir);
  auto client = Connect(two.ClientOptions());
  const Cluster& c = two;
  // Every store's pass, and its sketch's counters, of a cluster.
  auto passes = [](const Cluster& cluster) {
    std::vector<int32_t> p;
    for (const auto& server : cluster.servers) {
      for (const auto& store : server->data().dynamic_stores()) p.push_back(store->pass());
    }
    return p;
  };
  auto sketches = [](const Cluster& cluster) {
    std::vector<uint32_t> all;
    for (const auto& server : cluster.servers) {
      for (const auto& store : server->data().dynamic_stores()) {
        const std::vector<uint32_t> sketch = store->Snapshot().value().sketch;
        all.insert(all.end(), sketch.begin(), sketch.end());
      }
    }
    return all;
  };
  auto halved = [](std::vector<uint32_t> v) {
    for (uint32_t& x : v) x /= 2;
    return v;
  };
  const std::vector<int32_t> pass0(4, 0), pass1(4, 1), pass2(4, 2);
  Rng rng(23);
  const std::vector<int64_t> ids = MixedIds(&rng, 80, 200);
  for (int step = 1; step <= 3; ++step) {  // the same ids thrice: counts of 3 to halve
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
  }
  DeltaChain deltas(0);
  SaveCluster(&two, dir, 3, &deltas);  // before the pass end
  const std::vector<uint32_t> sketch0 = sketches(c);
  ASSERT_GT(*std::max_element(sketch0.begin(), sketch0.end()), 2u);
  EXPECT_EQ(passes(c), pass0);

  for (auto& server : two.servers) {  // the pass's end at step 5, round 5
    ASSERT_TRUE(server->CopyForCheckpoint(5, std::nullopt, /*end_pass=*/true, 5).ok());
  }
  EXPECT_EQ(passes(c), pass1);
  EXPECT_TRUE(sketches(c) == halved(sketch0));
  for (auto& server : two.servers) {  // its COPY retried (the answer was lost)
    ASSERT_TRUE(server->CopyForCheckpoint(5, std::nullopt, /*end_pass=*/true, 5).ok());
    EXPECT_EQ(server->data().pass_end_step(), 5);
  }
  EXPECT_EQ(passes(c), pass1) << "a retried COPY ended the pass again";
  EXPECT_TRUE(sketches(c) == halved(sketch0)) << "a retried COPY aged the sketch again";
  SaveCluster(&two, dir, 5, &deltas, /*end_pass=*/true);  // ckpt-5 holds the pass end
  EXPECT_EQ(passes(c), pass1);
  EXPECT_TRUE(sketches(c) == halved(sketch0));
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  ASSERT_EQ((*choice)->manifest.step(), 5);
  const std::vector<CheckpointLink> chain5 = (*choice)->chain;

  // A restart restored from ckpt-5 (onto 2 shards, then re-sharded onto 1) redoes its round.
  for (int shards : {2, 1}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    Cluster restored(shards, ADAGRAD, kDynamicDims);
    for (auto& server : restored.servers) {
      ASSERT_TRUE(server->RestoreCheckpoint(chain5).ok());
      EXPECT_EQ(server->data().pass_end_step(), 5);
    }
    const std::vector<int32_t> want1(2 * shards, 1), want2(2 * shards, 2);
    EXPECT_EQ(passes(restored), want1);
    const std::vector<uint32_t> restored_sketch = sketches(restored);
    for (auto& server : restored.servers) {
      ASSERT_TRUE(server->CopyForCheckpoint(1, std::nullopt, /*end_pass=*/true, 5).ok());
    }
    EXPECT_EQ(passes(restored), want1) << "the redone round ended the restored pass again";
    EXPECT_TRUE(sketches(restored) == restored_sketch);
    // The next pass ends at a later step.
    for (auto& server : restored.servers) {
      ASSERT_TRUE(server->CopyForCheckpoint(2, std::nullopt, /*end_pass=*/true, 9).ok());
      EXPECT_EQ(server->data().pass_end_step(), 9);
    }
    EXPECT_EQ(passes(restored), want2);
    EXPECT_TRUE(sketches(restored) == halved(restored_sketch));
  }

  // A restart restored from ckpt-3 (before the pass end) ends the pass at step 5 once.
  auto chain3 = VerifyCheckpointChain(CheckpointPath(dir, 3));
  ASSERT_TRUE(chain3.ok()) << chain3.status();
  Cluster before(2, ADAGRAD, kDynamicDims);
  for (auto& server : before.servers) {
    ASSERT_TRUE(server->RestoreCheckpoint(*chain3).ok());
    EXPECT_EQ(server->data().pass_end_step(), 0);
  }
  EXPECT_TRUE(sketches(before) == sketch0);
  for (int copy = 0; copy < 2; ++copy) {
    for (auto& server : before.servers) {
      ASSERT_TRUE(server->CopyForCheckpoint(1, std::nullopt, /*end_pass=*/true, 5).ok());
    }
    EXPECT_EQ(passes(before), pass1);
    EXPECT_TRUE(sketches(before) == halved(sketch0));
  }
  g_dynamic_extra = nullptr;
  std::system(("rm -rf " + dir).c_str());
}

// Issue 28's per-table metrics on the PS: each shard's Stats carry its share of every dynamic
// table, which sum over the shards to one store's metrics (what the chief writes to summary.json),
// and its /metrics scrape has them as pstrain_shard_dynamic_*{shard, table}; they move with
// training and with an eviction.
TEST(DynamicShard, StatsAndScrapeCountEachTableOnEachShard) {
  const std::string dir = TestDir("stats");
  g_dynamic_extra = [](DynamicEmbeddingStore::Options* d) { d->ttl_steps = 1; };
  Reference ref(ADAGRAD);
  g_dynamic_extra = nullptr;
  Cluster cluster(2, ADAGRAD, kDynamicDims, dir, [](ShardServer::Options* so) {
    for (auto& d : so->data.dynamic_tables) d.ttl_steps = 1;
    so->data.dynamic_evict_every_steps = 3;
  });
  const std::vector<std::unique_ptr<ShardServer>>& servers = cluster.servers;
  auto client = Connect(cluster.ClientOptions());
  auto stats_of = [&] {
    std::vector<ShardStats> stats;
    for (const auto& server : servers) stats.push_back(server->data().Stats());
    return stats;
  };
  Rng rng(13);
  std::vector<DynamicTableMetrics> before;
  for (int step = 1; step <= 3; ++step) {
    // Step 3 draws from keys far from the first steps', so that TTL 1 evicts rows of steps 1, 2.
    const std::vector<int64_t> ids = MixedIds(&rng, 100, step < 3 ? 50 : 1000);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * kRowDim);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
    ref.Apply(ids, grads, step);
    if (step == 3) {
      for (auto& d : ref.dynamic) d->Evict();
    }
    if (step == 1) before = SumDynamicTables(stats_of());
  }
  const std::vector<ShardStats> stats = stats_of();
  for (const ShardStats& s : stats) ASSERT_EQ(s.dynamic_tables_size(), 2) << s.shard();
  const std::vector<DynamicTableMetrics> sum = SumDynamicTables(stats);
  ASSERT_EQ(sum.size(), kDynamicDims.size());
  ASSERT_EQ(before.size(), kDynamicDims.size());
  for (size_t t = 0; t < kDynamicDims.size(); ++t) {
    const DynamicEmbeddingStore::Metrics m = ref.dynamic[t]->metrics();
    EXPECT_EQ(sum[t].table, absl::StrCat("table", kDynamicDims[t]));
    EXPECT_EQ(sum[t].rows_live, m.rows_live) << t;
    EXPECT_EQ(sum[t].admitted, m.admitted) << t;
    EXPECT_EQ(sum[t].evicted_ttl, m.evicted_ttl) << t;
    EXPECT_GT(sum[t].evicted_ttl, 0) << t;
    EXPECT_EQ(before[t].evicted_ttl, 0) << t;
    EXPECT_GT(sum[t].admitted, before[t].admitted) << t;
    EXPECT_GT(sum[t].bytes, 0) << t;
    EXPECT_GT(stats[0].dynamic_tables(t).rows_live(), 0) << t;  // both shards hold some
    EXPECT_GT(stats[1].dynamic_tables(t).rows_live(), 0) << t;
  }
  const std::string text = ScrapeText();
  for (int s = 0; s < 2; ++s) {
    for (int dim : kDynamicDims) {
      const std::string labels = absl::StrCat("{shard=\"", s, "\",table=\"table", dim, "\"}");
      for (const char* name : {"pstrain_shard_dynamic_rows_live", "pstrain_shard_dynamic_bytes",
                               "pstrain_shard_dynamic_admitted_total",
                               "pstrain_shard_dynamic_evicted_ttl_total"}) {
        EXPECT_NE(text.find(absl::StrCat(name, labels)), std::string::npos) << name << labels;
      }
    }
  }
  const std::string live =
      absl::StrCat("pstrain_shard_dynamic_rows_live{shard=\"0\",table=\"table4\"} ",
                   stats[0].dynamic_tables(0).rows_live());
  EXPECT_NE(text.find(live), std::string::npos) << live << " in\n" << text;
  std::system(("rm -rf " + dir).c_str());
}

TEST(DynamicCheckpoint, RestoreRefusesATableOfAnotherWidth) {
  const std::string dir = TestDir("width");
  Cluster one(1, SGD, {4}, dir);
  auto client = Connect([&] {
    PsClient::Options o = one.ClientOptions();
    o.dynamic_row_dims = {4};
    return o;
  }());
  const int64_t id = DynamicRow(0, 9);
  const std::vector<float> grads(kRowDim, 1.f);
  ASSERT_TRUE(client->Push({id}, grads.data(), nullptr, 1).ok());
  DeltaChain deltas(1);
  SaveCluster(&one, dir, 1, &deltas);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  // The group is named "table4" (ShardOptions): a shard whose table4 has rows of 3 floats.
  ShardServer::Options o = ShardOptions(0, 1, SGD, {3});
  o.data.dynamic_names = {"table4"};
  auto shard = Shard::Create(o.data);
  ASSERT_TRUE(shard.ok());
  const absl::Status s = (*shard)->RestoreCheckpoint((*choice)->chain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dynamic table 'table4' has rows of 4 floats, "
                                                  "this job's have 3"));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
