// ShardServer + PsClient over real gRPC on loopback, in one process: results are bit-identical
// to the same updates applied to one local EmbeddingStore / DenseStore, shards are balanced,
// foreign ids are refused naming their owner, pushes are idempotent, failures are bounded.
#include "ps/server/shard_server.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cmd/served_shard.h"
#include "common/random.h"
#include "common/rpc/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/store/store_blocks.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/ps/server/local_shards.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/ps_client/shard_rpc.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

struct Table {
  int64_t rows = 10007;  // prime: partitions of unequal sizes
  int partitions = 7;    // not a multiple of the shard counts tested
  int row_dim = 5;
  int64_t dense_size = 103;
};

// Pure, recognizable initial values.
void RowInit(int64_t row, float* out, int dim) {
  for (int j = 0; j < dim; ++j) out[j] = 0.001f * static_cast<float>(row % 1000) - 0.01f * j;
}
void DenseInit(float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 0.01f * static_cast<float>(i % 17 - 8);
}

// S shard servers on 127.0.0.1:<free port>.
struct Cluster : testing::LocalShards {
  Cluster(int shards, const Table& t, OptimizerType type, const std::string& checkpoint_dir = "",
          int num_workers = 1, StalenessCompensation compensation = NO_COMPENSATION)
      : table(t) {
    for (int s = 0; s < shards; ++s) {
      ShardServer::Options o;
      o.data.scale_dense_lr_by_staleness =
          compensation == SCALE_DENSE_LR || compensation == SCALE_LR;
      o.data.scale_row_lr_by_staleness = compensation == SCALE_ROW_LR || compensation == SCALE_LR;
      o.data.checkpoint_dir = checkpoint_dir;
      o.num_workers = num_workers;
      o.data.shard = s;
      o.data.num_shards = shards;
      o.data.rows = t.rows;
      o.data.partitions = t.partitions;
      o.data.row_dim = t.row_dim;
      o.data.dense_size = t.dense_size;
      o.data.sparse_optimizer = testing::TestOptimizer(type);
      o.data.dense_optimizer = testing::TestOptimizer(type);
      const int dim = t.row_dim;
      const int64_t dense_size = t.dense_size;
      o.data.row_init = [dim](int64_t row, float* out) { RowInit(row, out, dim); };
      o.data.dense_init = [dense_size](float* out) { DenseInit(out, dense_size); };
      Add(std::move(o));
    }
  }

  PsClient::Options ClientOptions() const {
    PsClient::Options o;
    o.shards = addresses;
    o.rows = table.rows;
    o.partitions = table.partitions;
    o.row_dim = table.row_dim;
    o.dense_size = table.dense_size;
    o.rpc_deadline_ms = 5000;
    return o;
  }

  std::unique_ptr<PsClient> Client(PsClient::Options o) const {
    auto c = PsClient::Create(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->WaitForShards(absl::Seconds(10)).ok());
    return std::move(c).value();
  }
  std::unique_ptr<PsClient> Client() const { return Client(ClientOptions()); }
  // A client of worker `id` (of num_workers).
  std::unique_ptr<PsClient> Worker(int id) const {
    PsClient::Options o = ClientOptions();
    o.worker_id = id;
    return Client(std::move(o));
  }

  Table table;
};

// The single-process twin: one store for [0, V) and one dense store for the whole vector.
struct Reference {
  Reference(const Table& t, OptimizerType type) : dim(t.row_dim) {
    std::shared_ptr<const Optimizer> opt = Optimizer::Create(testing::TestOptimizer(type)).value();
    EmbeddingStore::Options eo;
    eo.begin = 0;
    eo.end = t.rows;
    eo.dim = t.row_dim;
    eo.optimizer = opt;
    const int d = t.row_dim;
    eo.row_init = [d](int64_t row, float* out) { RowInit(row, out, d); };
    rows = EmbeddingStore::Create(std::move(eo)).value();
    DenseStore::Options dopt;
    dopt.size = t.dense_size;
    dopt.optimizer = opt;
    dense = DenseStore::Create(std::move(dopt)).value();
    std::vector<float> init(t.dense_size);
    DenseInit(init.data(), t.dense_size);
    dense->Set(init.data());
  }
  int dim;
  std::unique_ptr<EmbeddingStore> rows;
  std::unique_ptr<DenseStore> dense;
};

std::vector<int64_t> UniqueIds(Rng* rng, int64_t rows, int n) {
  std::set<int64_t> s;
  while (static_cast<int>(s.size()) < n) s.insert(static_cast<int64_t>(rng->Uniform(rows)));
  std::vector<int64_t> ids(s.begin(), s.end());
  // Shuffle so that the client has to regroup and scatter.
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng->Uniform(i)]);
  return ids;
}

std::vector<float> RandomValues(Rng* rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->UniformDouble() * 2 - 1);
  return v;
}

// Pulls `ids` and the dense vector through the client and from the reference; expects the
// same bits.
void ExpectSameAsReference(PsClient* client, Reference* ref, const std::vector<int64_t>& ids,
                           const Table& t) {
  std::vector<float> got(ids.size() * t.row_dim), want(ids.size() * t.row_dim);
  std::vector<float> got_dense(t.dense_size), want_dense(t.dense_size);
  ASSERT_TRUE(client->Pull(ids, got.data(), got_dense.data()).ok());
  ASSERT_TRUE(ref->rows->Gather(ids, want.data()).ok());
  ref->dense->Get(want_dense.data());
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  ASSERT_EQ(0, std::memcmp(got_dense.data(), want_dense.data(), got_dense.size() * sizeof(float)));
}

// Shards, optimizer, and whether shard 1 is "in this process" (PsClient::Options::local_server,
// as in `pstrain host`): its pulls and pushes are then direct calls.
class Equivalence
    : public ::testing::TestWithParam<std::tuple<int, OptimizerType, bool>> {};

TEST_P(Equivalence, PullPushMatchesLocalStores) {
  const auto [shards, type, direct] = GetParam();
  const Table t;
  Cluster cluster(shards, t, type);
  Reference ref(t, type);
  PsClient::Options o = cluster.ClientOptions();
  ServedShard served(cluster.servers[1].get());
  if (direct) {
    o.local_shard = 1;
    o.local_server = &served;
  }
  auto client = cluster.Client(std::move(o));
  Rng rng(1234 + shards);
  std::vector<int64_t> probe = UniqueIds(&rng, t.rows, 2000);  // trained and untrained rows
  ExpectSameAsReference(client.get(), &ref, probe, t);
  for (int step = 1; step <= 12; ++step) {
    const std::vector<int64_t> ids = UniqueIds(&rng, t.rows, 700);
    const std::vector<float> grads = RandomValues(&rng, ids.size() * t.row_dim);
    const std::vector<float> dense_grad = RandomValues(&rng, t.dense_size);
    ASSERT_TRUE(client->Push(ids, grads.data(), dense_grad.data(), step).ok());
    ASSERT_TRUE(ref.rows->Apply(ids, grads.data(), step).ok());
    ref.dense->Apply(dense_grad.data(), step);
    if (step % 4 == 0) {
      ExpectSameAsReference(client.get(), &ref, ids, t);
      ExpectSameAsReference(client.get(), &ref, probe, t);
    }
  }
  // Every shard took part, and its Stats say so.
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(static_cast<int>(stats->size()), shards);
  for (int s = 0; s < shards; ++s) {
    SCOPED_TRACE(s);
    EXPECT_EQ((*stats)[s].push_requests(), 12);
    EXPECT_GT((*stats)[s].rows_initialized(), 0);
    EXPECT_EQ((*stats)[s].last_step(), 12);
    // Direct calls carry no message: the in-process shard counts no bytes.
    if (direct && s == 1) {
      EXPECT_EQ((*stats)[s].bytes_in(), 0);
      EXPECT_GT((*stats)[s].pull_requests(), 0);
    } else {
      EXPECT_GT((*stats)[s].bytes_in(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ShardsAndOptimizers, Equivalence,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(ADAGRAD, SGD, ADAM, FTRL),
                                            ::testing::Bool()));

TEST(PsClient, PipelinedPullsAndPushesMatchLocalStoresAfterFlush) {
  const Table t;
  Cluster cluster(3, t, ADAGRAD);
  Reference ref(t, ADAGRAD);
  PsClient::Options o = cluster.ClientOptions();
  o.max_pushes_in_flight = 2;
  auto client = cluster.Client(o);
  Rng rng(77);
  std::vector<float> rows(800 * t.row_dim), dense(t.dense_size);
  std::shared_ptr<PsFuture> pull =
      client->PullAsync(UniqueIds(&rng, t.rows, 800), rows.data(), dense.data());
  std::vector<std::shared_ptr<PsFuture>> pushes;
  for (int step = 1; step <= 20; ++step) {
    // The next batch's pull runs while this step "computes" and pushes.
    ASSERT_TRUE(pull->Wait().ok());
    const std::vector<int64_t> ids = UniqueIds(&rng, t.rows, 800);
    pull = client->PullAsync(ids, rows.data(), dense.data());
    const std::vector<float> grads = RandomValues(&rng, ids.size() * t.row_dim);
    const std::vector<float> dense_grad = RandomValues(&rng, t.dense_size);
    ASSERT_TRUE(pull->Wait().ok());  // rows[] is reused by the next PullAsync
    pushes.push_back(client->PushAsync(ids, grads.data(), dense_grad.data(), step));
    ASSERT_TRUE(ref.rows->Apply(ids, grads.data(), step).ok());
    ref.dense->Apply(dense_grad.data(), step);
  }
  ASSERT_TRUE(client->Flush().ok());
  for (const auto& p : pushes) {
    EXPECT_TRUE(p->done());
    EXPECT_TRUE(p->Wait().ok());
  }
  // Pushes reach each shard in order, so once flushed the state is exactly the reference's.
  ExpectSameAsReference(client.get(), &ref, UniqueIds(&rng, t.rows, 5000), t);
}

// Staleness compensation (cluster.staleness_compensation: SCALE_DENSE_LR): worker A computes a
// dense gradient from the slice it pulled; worker B applies 3 dense updates meanwhile; A's push is
// 3 updates stale on every shard, counted in the stats, and applied with lr / 3.
TEST(PsClient, StaleDensePushesAreCountedAndTheirLearningRateScaled) {
  const Table t;
  Cluster cluster(2, t, SGD, "", /*num_workers=*/2, SCALE_DENSE_LR);
  auto a = cluster.Worker(0);
  auto b = cluster.Worker(1);
  Rng rng(5);
  const std::vector<int64_t> ids = UniqueIds(&rng, t.rows, 100);
  std::vector<float> rows(ids.size() * t.row_dim), dense(t.dense_size);
  ASSERT_TRUE(a->PullAtStepAsync(ids, rows.data(), dense.data(), 1)->Wait().ok());
  for (int step = 1; step <= 3; ++step) {  // each from the slice it has just pulled: tau 0
    ASSERT_TRUE(b->PullAtStepAsync(ids, rows.data(), dense.data(), step)->Wait().ok());
    const std::vector<float> g = RandomValues(&rng, t.dense_size);
    ASSERT_TRUE(b->PushAsync({}, nullptr, g.data(), step)->Wait().ok());
  }
  std::vector<float> before(t.dense_size), after(t.dense_size);
  ASSERT_TRUE(b->Pull({}, nullptr, before.data()).ok());  // not a training pull: no version kept
  const std::vector<float> g = RandomValues(&rng, t.dense_size);
  ASSERT_TRUE(a->PushAsync({}, nullptr, g.data(), 1)->Wait().ok());
  ASSERT_TRUE(b->Pull({}, nullptr, after.data()).ok());
  const float lr = testing::TestOptimizer(SGD).learning_rate();
  for (int64_t i = 0; i < t.dense_size; ++i) {
    ASSERT_NEAR(after[i], before[i] - lr / 3 * g[i], 1e-6) << i;
  }
  absl::StatusOr<std::vector<ShardStats>> stats = a->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->size(), 2u);
  for (const ShardStats& s : *stats) {
    EXPECT_EQ(s.dense_versioned_pushes(), 4) << s.shard();
    EXPECT_EQ(s.dense_staleness_max(), 3) << s.shard();
    EXPECT_DOUBLE_EQ(s.dense_staleness_mean(), 0.75) << s.shard();
  }
  EXPECT_THAT(FormatShardBalance(*stats), HasSubstr("0.75 (max 3)"));
}

// The same per row (SCALE_ROW_LR): B updates rows A pulled 3 times before A pushes them; A's
// update of each is 3 updates stale and applied with lr / 3. A row only A pushes is not stale.
TEST(PsClient, StaleRowPushesAreCountedAndTheirLearningRateScaledPerRow) {
  const Table t;
  Cluster cluster(2, t, SGD, "", /*num_workers=*/2, SCALE_ROW_LR);
  auto a = cluster.Worker(0);
  auto b = cluster.Worker(1);
  Rng rng(6);
  const std::vector<int64_t> all = UniqueIds(&rng, t.rows, 200);
  const std::vector<int64_t> shared(all.begin(), all.begin() + 100);  // B pushes these too
  const size_t dim = t.row_dim;
  std::vector<float> rows(all.size() * dim), dense(t.dense_size);
  ASSERT_TRUE(a->PullAtStepAsync(all, rows.data(), dense.data(), 1)->Wait().ok());
  for (int step = 1; step <= 3; ++step) {  // each from the rows it has just pulled: tau 0
    ASSERT_TRUE(b->PullAtStepAsync(shared, rows.data(), dense.data(), step)->Wait().ok());
    const std::vector<float> g = RandomValues(&rng, shared.size() * dim);
    ASSERT_TRUE(b->PushAsync(shared, g.data(), nullptr, step)->Wait().ok());
  }
  std::vector<float> before(all.size() * dim), after(all.size() * dim);
  ASSERT_TRUE(b->Pull(all, before.data(), nullptr).ok());
  const std::vector<float> g = RandomValues(&rng, all.size() * dim);
  ASSERT_TRUE(a->PushAsync(all, g.data(), nullptr, 1)->Wait().ok());
  ASSERT_TRUE(b->Pull(all, after.data(), nullptr).ok());
  const float lr = testing::TestOptimizer(SGD).learning_rate();
  for (size_t i = 0; i < all.size(); ++i) {
    const float scale = i < shared.size() ? 1.0f / 3 : 1.0f;  // stale 3, or not stale
    for (size_t j = 0; j < dim; ++j) {
      ASSERT_NEAR(after[i * dim + j], before[i * dim + j] - lr * scale * g[i * dim + j], 1e-6)
          << "row " << all[i] << " float " << j;
    }
  }
  absl::StatusOr<std::vector<ShardStats>> stats = a->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t updates = 0, max = 0;
  double sum = 0;
  for (const ShardStats& s : *stats) {
    updates += s.row_versioned_updates();
    sum += s.row_staleness_mean() * s.row_versioned_updates();
    max = std::max(max, s.row_staleness_max());
  }
  EXPECT_EQ(updates, 3 * 100 + 200);  // B's 3 pushes of 100 rows, A's push of 200
  EXPECT_NEAR(sum, 3 * 100, 1e-6);    // only A's pushes of the shared rows were stale (3 each)
  EXPECT_EQ(max, 3);
}

TEST(ShardServer, FixedSizePartitionedTableIsBalancedAcrossShards) {
  Table t;
  t.rows = 1000003;
  t.partitions = 12;
  t.row_dim = 17;
  t.dense_size = 1000;
  Cluster cluster(3, t, ADAGRAD);
  auto client = cluster.Client();
  // Zipf-like popularity over raw keys, hashed into the table as the FeatureSpec does.
  Rng rng(5);
  for (int step = 1; step <= 10; ++step) {
    std::set<int64_t> unique;
    for (int i = 0; i < 8000; ++i) {
      const uint64_t key = static_cast<uint64_t>(std::exp(rng.UniformDouble() * std::log(5e6)));
      unique.insert(static_cast<int64_t>(SplitMix64(key) % t.rows));
    }
    std::vector<int64_t> ids(unique.begin(), unique.end());
    std::vector<float> grads(ids.size() * t.row_dim, 0.5f);
    ASSERT_TRUE(client->Push(ids, grads.data(), nullptr, step).ok());
  }
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok());
  int64_t owned = 0, trained = 0, max_owned = 0, max_trained = 0;
  for (const ShardStats& s : *stats) {
    owned += s.rows_owned();
    trained += s.rows_initialized();
    max_owned = std::max(max_owned, s.rows_owned());
    max_trained = std::max(max_trained, s.rows_initialized());
    EXPECT_EQ(s.dense_floats(), s.shard() == 0 ? 334 : 333);
  }
  EXPECT_EQ(owned, t.rows);
  EXPECT_LT(max_owned * 3.0 / owned, 1.01);
  EXPECT_GT(trained, 30000);
  EXPECT_LT(max_trained * 3.0 / trained, 1.02);
  const std::string table = FormatShardBalance(*stats);
  EXPECT_THAT(table, HasSubstr("max/mean imbalance: rows_owned 1.000"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);  // header, 3 shards, summary
}

std::unique_ptr<ParameterServer::Stub> RawStub(const std::string& address) {
  return ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

TEST(ShardServer, RefusesForeignIdNamingItsOwner) {
  const Table t;  // 10007 rows in 7 partitions of 1430/1429 rows
  Cluster cluster(2, t, ADAGRAD);
  const PartitionMap map(t.rows, t.partitions, 2);
  const int64_t foreign = map.PartitionBegin(3) + 5;  // partition 3 lives on shard 1
  ASSERT_EQ(map.ShardOf(foreign), 1);
  auto stub = RawStub(cluster.addresses[0]);
  PullRequest req;
  const int64_t ids[2] = {map.PartitionBegin(2), foreign};  // an owned id, then a foreign one
  PackArray(ids, 2, req.mutable_ids());
  PullResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status s = stub->Pull(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("row ", foreign, " is owned by shard 1")));
  EXPECT_THAT(s.error_message(), HasSubstr("partition 3"));

  // A foreign push applies nothing, not even the owned row before it.
  PushRequest push;
  PackArray(ids, 2, push.mutable_ids());
  std::vector<float> grads(2 * t.row_dim, 1.0f);
  PackArray(grads.data(), grads.size(), push.mutable_row_grads());
  push.set_sequence(1);
  PushResponse push_resp;
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  EXPECT_EQ(stub->Push(&ctx2, push, &push_resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(cluster.servers[0]->Stats().rows_initialized(), 0);

  // Out of the table altogether.
  const int64_t bad = t.rows;
  PackArray(&bad, 1, req.mutable_ids());
  grpc::ClientContext ctx3;
  SetDeadline(&ctx3);
  const grpc::Status s3 = stub->Pull(&ctx3, req, &resp);
  EXPECT_EQ(s3.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s3.error_message(), HasSubstr("outside the table"));
}

TEST(ShardServer, DuplicatedPushIdIsAppliedOnce) {
  Table t;
  t.dense_size = 8;
  Cluster cluster(1, t, ADAGRAD, "", /*num_workers=*/9);  // pushes of workers 7 and 8
  Reference ref(t, ADAGRAD);
  auto stub = RawStub(cluster.addresses[0]);
  const int64_t id = 42;
  const std::vector<float> grad = {0.5f, -1.0f, 0.25f, 2.0f, -0.75f};
  const std::vector<float> dense_grad(t.dense_size, 0.3f);
  auto push = [&](int worker, uint64_t incarnation, uint64_t sequence) {
    PushRequest req;
    req.set_worker_id(worker);
    req.set_incarnation(incarnation);
    req.set_sequence(sequence);
    req.set_step(static_cast<int64_t>(sequence));
    PackArray(&id, 1, req.mutable_ids());
    PackArray(grad.data(), grad.size(), req.mutable_row_grads());
    PackArray(dense_grad.data(), dense_grad.size(), req.mutable_dense_grad());
    PushResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    EXPECT_TRUE(stub->Push(&ctx, req, &resp).ok());
    return resp.duplicate();
  };
  auto expect_applied_times = [&](int times) {
    Reference want(t, ADAGRAD);
    for (int i = 0; i < times; ++i) {
      ASSERT_TRUE(want.rows->Apply({id}, grad.data(), 1).ok());
      want.dense->Apply(dense_grad.data(), 1);
    }
    std::vector<float> got(t.row_dim), expected(t.row_dim);
    std::vector<float> got_dense(t.dense_size), expected_dense(t.dense_size);
    ASSERT_TRUE(cluster.servers[0]->data().stores()[0]->Gather({id}, got.data()).ok());
    ASSERT_TRUE(want.rows->Gather({id}, expected.data()).ok());
    cluster.servers[0]->data().dense()->Get(got_dense.data());
    want.dense->Get(expected_dense.data());
    EXPECT_EQ(got, expected) << "expected " << times << " applications";
    EXPECT_EQ(got_dense, expected_dense) << "expected " << times << " applications";
  };
  EXPECT_FALSE(push(7, 99, 1));
  expect_applied_times(1);
  EXPECT_TRUE(push(7, 99, 1));  // the retry of a push whose response was lost
  expect_applied_times(1);
  EXPECT_FALSE(push(7, 99, 2));
  expect_applied_times(2);
  EXPECT_TRUE(push(7, 99, 1));  // a stale straggler
  expect_applied_times(2);
  EXPECT_FALSE(push(7, 100, 1));  // the same worker restarted: a new incarnation
  expect_applied_times(3);
  EXPECT_FALSE(push(8, 99, 1));  // another worker
  expect_applied_times(4);
  EXPECT_FALSE(push(7, 99, 0));  // sequence 0 opts out of deduplication
  EXPECT_FALSE(push(7, 99, 0));
  expect_applied_times(6);
  EXPECT_EQ(cluster.servers[0]->Stats().duplicate_pushes(), 2);
}

TEST(ShardServer, CreateAndStartRejectBadInput) {
  ShardServer::Options o;
  o.data.rows = 100;
  o.data.partitions = 4;
  o.data.row_dim = 4;
  o.data.num_shards = 2;
  o.data.shard = 2;
  EXPECT_EQ(ShardServer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.data.shard = 1;
  o.data.row_dim = 0;
  EXPECT_EQ(ShardServer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.data.row_dim = 4;
  o.data.sparse_optimizer.set_type(ADAM);
  o.data.sparse_optimizer.set_epsilon(0);
  EXPECT_EQ(ShardServer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.data.sparse_optimizer.set_epsilon(1e-8f);
  auto a = ShardServer::Create(o);
  auto b = ShardServer::Create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Start("127.0.0.1:0").ok());
  // SO_REUSEPORT is off: a second shard cannot take the same port.
  const absl::Status taken = (*b)->Start(absl::StrCat("127.0.0.1:", (*a)->port()));
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(taken.message()), HasSubstr("cannot listen"));
}

TEST(PsClient, RejectsOutOfRangeIdsAndMismatchedShards) {
  const Table t;
  Cluster cluster(2, t, ADAGRAD);
  auto client = cluster.Client();
  std::vector<float> rows(2 * t.row_dim);
  const absl::Status s = client->Pull({1, t.rows}, rows.data(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("outside the table"));

  PsClient::Options o = cluster.ClientOptions();
  o.rows = t.rows + 1;
  auto wrong = PsClient::Create(o);
  ASSERT_TRUE(wrong.ok());
  const absl::Status m = (*wrong)->WaitForShards(absl::Seconds(10));
  EXPECT_EQ(m.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(m.message()), HasSubstr("serves shard 0 of 2 with rows=10007"));

  o = cluster.ClientOptions();
  std::swap(o.shards[0], o.shards[1]);  // shards listed in the wrong order
  auto swapped = PsClient::Create(o);
  ASSERT_TRUE(swapped.ok());
  EXPECT_EQ((*swapped)->WaitForShards(absl::Seconds(10)).code(),
            absl::StatusCode::kFailedPrecondition);

  o.shards.clear();
  EXPECT_EQ(PsClient::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PsClient, UnreachableShardFailsWithinItsBudgetNamingTheShard) {
  const Table t;
  Cluster cluster(2, t, ADAGRAD);
  const std::string dead = cluster.addresses[1];
  cluster.servers[1]->Shutdown(absl::ZeroDuration());
  cluster.servers[1].reset();  // nothing listens on shard 1's port any more

  PsClient::Options o = cluster.ClientOptions();
  o.rpc_deadline_ms = 200;
  o.rpc_retries = 3;
  o.initial_backoff_ms = 20;
  o.max_backoff_ms = 100;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  std::vector<int64_t> ids(t.rows);
  for (int64_t i = 0; i < t.rows; ++i) ids[i] = i;
  std::vector<float> rows(ids.size() * t.row_dim);
  const absl::Time start = absl::Now();
  const absl::Status s = (*client)->Pull(ids, rows.data(), nullptr);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("shard 1 (", dead, "): Pull failed after 4 attempts")));
  EXPECT_LT(took, absl::Seconds(3));  // budget: 4 attempts x 200 ms, plus backoff

  // Pushes fail the same way and Flush reports it; the live shard is unaffected.
  std::vector<float> grads(ids.size() * t.row_dim, 0.1f);
  EXPECT_FALSE((*client)->PushAsync(ids, grads.data(), nullptr, 1)->Wait().ok());
  EXPECT_FALSE((*client)->Flush().ok());
  EXPECT_TRUE((*client)->Flush().ok());  // the error was reported once
  const PartitionMap map(t.rows, t.partitions, 2);
  const int64_t live = map.PartitionBegin(0);
  EXPECT_TRUE((*client)->Pull({live}, rows.data(), nullptr).ok());
}

TEST(PsClient, DestructionCancelsCallsStillRetrying) {
  const Table t;
  Cluster cluster(2, t, ADAGRAD);
  cluster.servers[1].reset();  // shard 1 is gone: its calls retry for up to a minute
  PsClient::Options o = cluster.ClientOptions();
  o.rpc_deadline_ms = 200;
  o.rpc_retries = 100000;
  o.call_deadline_ms = 60000;
  o.initial_backoff_ms = 10;
  o.max_backoff_ms = 50;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  const std::vector<int64_t> ids = {0, t.rows - 1, t.rows / 2};
  std::vector<float> rows(ids.size() * t.row_dim), grads(ids.size() * t.row_dim, 0.1f);
  std::vector<float> dense(t.dense_size), dense_grad(t.dense_size, 0.1f);
  auto pull = (*client)->PullAsync(ids, rows.data(), dense.data());
  auto push1 = (*client)->PushAsync(ids, grads.data(), dense_grad.data(), 1);
  auto push2 = (*client)->PushAsync(ids, grads.data(), dense_grad.data(), 2);  // queued behind 1
  EXPECT_FALSE(pull->done());
  const absl::Time start = absl::Now();
  client->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const auto& f : {pull, push1, push2}) {
    ASSERT_TRUE(f->done());
    EXPECT_EQ(f->Wait().code(), absl::StatusCode::kCancelled) << f->Wait();
  }
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// The end-of-job protocol (docs/PS.md): reports over gRPC, a bounded wait (polls of Coordinate
// REPORTS), job_finished in Info after Coordinate FINISH_JOB.
TEST(ShardServer, ReportsWaitAndJobFinished) {
  const Table t;
  Cluster cluster(1, t, ADAGRAD, "", /*num_workers=*/2);
  ShardServer& shard = *cluster.servers[0];
  auto stub = RawStub(cluster.addresses[0]);
  ShardRpc rpc(cluster.addresses[0]);
  // Nobody reported yet: the wait times out naming the missing workers.
  auto none = rpc.WaitForReports(TRAINING_DONE, 2, absl::Milliseconds(50));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(none.status().message(), HasSubstr("workers [0, 1]"));
  for (int worker : {1, 1, 0}) {  // a repeated report replaces the earlier one
    ReportRequest r;
    r.set_worker_id(worker);
    r.set_phase(TRAINING_DONE);
    r.set_examples(100 * worker + 7);
    ReportResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ASSERT_TRUE(stub->Report(&ctx, r, &resp).ok());
  }
  auto all = rpc.WaitForReports(TRAINING_DONE, 2, absl::Seconds(10));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].examples(), 7);
  EXPECT_EQ((*all)[1].examples(), 107);
  EXPECT_FALSE(rpc.WaitForReports(FINISH_SEEN, 1, absl::Milliseconds(10)).ok());

  EXPECT_FALSE(shard.Info().job_finished());
  CoordinateRequest finish;
  finish.set_kind(CoordinateRequest::FINISH_JOB);
  ASSERT_TRUE(rpc.Coordinate(finish, absl::Seconds(10)).ok());
  InfoResponse info;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ASSERT_TRUE(stub->Info(&ctx, InfoRequest(), &info).ok());
  EXPECT_TRUE(info.job_finished());
}

// ---- Checkpoints (ps/server/shard_checkpoint.cc) ----

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/shard_ckpt_", getpid(), "_", name);
  std::system(("rm -rf " + dir).c_str());
  return dir;
}

// Writes a checkpoint of `cluster` under dir the way the chief does: COPY every shard, WRITE
// every shard, then the MANIFEST and LATEST. With `deltas`, a delta when the chain says so.
// `between` runs after the COPYs and before the WRITEs (training goes on then); the rows the
// shards wrote are added to *rows_written when it is not null.
void SaveCluster(Cluster* cluster, const std::string& dir, int64_t step, int64_t round,
                 DeltaChain* deltas = nullptr, const std::function<void()>& between = nullptr,
                 int64_t* rows_written = nullptr) {
  auto ckpt = PrepareCheckpointDir(dir, step);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  CheckpointManifest manifest;
  const std::optional<CheckpointDelta> delta =
      deltas != nullptr ? deltas->Next() : std::nullopt;
  if (delta) *manifest.mutable_delta() = *delta;
  manifest.set_step(step);
  manifest.set_num_shards(static_cast<int>(cluster->servers.size()));
  manifest.set_table_rows(cluster->table.rows);
  manifest.set_partitions(cluster->table.partitions);
  manifest.set_row_dim(cluster->table.row_dim);
  manifest.set_dense_size(cluster->table.dense_size);
  for (auto& server : cluster->servers) {
    ASSERT_TRUE(server
                    ->CopyForCheckpoint(round, delta ? std::optional<int64_t>(delta->parent_step())
                                                     : std::nullopt)
                    .ok());
  }
  if (between) between();
  for (auto& server : cluster->servers) {
    auto written = server->WriteCheckpoint(round, CheckpointName(step));
    ASSERT_TRUE(written.ok()) << written.status();
    if (rows_written != nullptr) *rows_written += written->rows();
    auto* f = manifest.add_file();
    f->set_name(written->file());
    f->set_bytes(written->bytes());
  }
  WorkerState state;
  state.set_step(step);
  ASSERT_TRUE(CommitCheckpoint(dir, manifest, {{0, state}}, /*keep=*/3).ok());
  if (deltas != nullptr) deltas->Committed(manifest);
}

// One step of `n` random rows (and the dense vector) pushed to a cluster through `client` and
// applied to its single-store twin `ref`; the rows are added to *touched.
void PushStep(PsClient* client, Reference* ref, Rng* rng, const Table& t, int step, int n,
              std::vector<int64_t>* touched) {
  const std::vector<int64_t> ids = UniqueIds(rng, t.rows, n);
  touched->insert(touched->end(), ids.begin(), ids.end());
  const std::vector<float> grads = RandomValues(rng, ids.size() * t.row_dim);
  const std::vector<float> dense_grad = RandomValues(rng, t.dense_size);
  ASSERT_TRUE(client->Push(ids, grads.data(), dense_grad.data(), step).ok());
  ASSERT_TRUE(ref->rows->Apply(ids, grads.data(), step).ok());
  ref->dense->Apply(dense_grad.data(), step);
}

// Restores the chosen checkpoint onto new clusters of 2, 3 and 4 shards and expects every row and
// optimizer slot to match the twin bit for bit; then one more update of 500 `touched` rows at
// `next_step` (the optimizer state came along: it matches too). `touched` must be sorted and
// unique. Returns the restored clusters (2, 3, 4 shards, writing checkpoints under
// checkpoint_dir) and the 500 rows updated.
std::vector<std::unique_ptr<Cluster>> ExpectRestoresOntoAnyShardCount(
    const CheckpointChoice& choice, const Table& t, OptimizerType type, Reference* ref, Rng* rng,
    const std::vector<int64_t>& touched, int64_t next_step,
    const std::string& checkpoint_dir = "") {
  std::vector<std::unique_ptr<Cluster>> restored;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int shards : {2, 3, 4}) {
    restored.push_back(std::make_unique<Cluster>(shards, t, type, checkpoint_dir));
    for (auto& server : restored.back()->servers) {
      EXPECT_TRUE(server->RestoreCheckpoint(choice.chain).ok());
      EXPECT_EQ(server->Info().restored_from(), choice.dir);
    }
    clients.push_back(restored.back()->Client());
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    ExpectSameAsReference(clients.back().get(), ref, touched, t);
  }
  const std::vector<int64_t> ids(touched.begin(), touched.begin() + 500);
  const std::vector<float> grads = RandomValues(rng, ids.size() * t.row_dim);
  const std::vector<float> dense_grad = RandomValues(rng, t.dense_size);
  EXPECT_TRUE(ref->rows->Apply(ids, grads.data(), next_step).ok());
  ref->dense->Apply(dense_grad.data(), next_step);
  for (auto& c : clients) {
    EXPECT_TRUE(c->Push(ids, grads.data(), dense_grad.data(), next_step).ok());
    ExpectSameAsReference(c.get(), ref, touched, t);
  }
  return restored;
}

void SortUnique(std::vector<int64_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

// Every row and optimizer slot (Adam: m, v and the per-row step) survives a checkpoint written by
// 3 shards and restored onto 2, 3 or 4: pulls match the single-store twin bit for bit, and so
// do the updates after the restore.
TEST(ShardCheckpoint, RestoresOntoAnyShardCount) {
  const Table t;
  Cluster three(3, t, ADAM, TestDir("repartition"));
  Reference ref(t, ADAM);
  auto client = three.Client();
  Rng rng(99);
  std::vector<int64_t> touched;
  for (int step = 1; step <= 6; ++step) PushStep(client.get(), &ref, &rng, t, step, 900, &touched);
  SortUnique(&touched);
  const std::string dir = TestDir("repartition");
  SaveCluster(&three, dir, 6, 1);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->manifest.num_shards(), 3);
  ExpectRestoresOntoAnyShardCount(**choice, t, ADAM, &ref, &rng, touched, 7);
  std::system(("rm -rf " + dir).c_str());
}

// A checkpoint is the instant of its COPY, not of its WRITE: pushes that land between them (the
// workers train while the shards write) stay out of the files, full and delta alike (the shards
// keep those rows' values of the instant: copy-on-write), and a restore matches the twin as of
// the COPY.
TEST(ShardCheckpoint, PushesBetweenCopyAndWriteStayOutOfTheCheckpoint) {
  const Table t;
  const std::string dir = TestDir("instant");
  Cluster three(3, t, ADAGRAD, dir);
  Reference ref(t, ADAGRAD);
  auto client = three.Client();
  Rng rng(97);
  std::vector<int64_t> touched;
  for (int step = 1; step <= 3; ++step) PushStep(client.get(), &ref, &rng, t, step, 800, &touched);
  SortUnique(&touched);
  // Pushed to the cluster only, between a COPY and its WRITE; the twin gets them afterwards, in
  // the same order relative to the other steps.
  std::vector<int64_t> late_ids;
  std::vector<float> late_grads, late_dense;
  auto push_late = [&](int step) {
    late_ids = UniqueIds(&rng, t.rows, 600);  // rows of the instant and rows new to it
    late_grads = RandomValues(&rng, late_ids.size() * t.row_dim);
    late_dense = RandomValues(&rng, t.dense_size);
    EXPECT_TRUE(client->Push(late_ids, late_grads.data(), late_dense.data(), step).ok());
  };
  auto expect_restores = [&](const std::vector<int64_t>& rows) {
    auto choice = ChooseCheckpoint(dir);
    ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
    Cluster two(2, t, ADAGRAD);
    for (auto& server : two.servers) ASSERT_TRUE(server->RestoreCheckpoint((*choice)->chain).ok());
    ExpectSameAsReference(two.Client().get(), &ref, rows, t);
  };
  DeltaChain deltas(11);
  int64_t full_rows = 0;
  SaveCluster(&three, dir, 3, 1, &deltas, [&] { push_late(4); }, &full_rows);
  EXPECT_EQ(full_rows, static_cast<int64_t>(touched.size()));  // not the late pushes' new rows
  expect_restores(touched);

  // The twin catches up; then a delta whose WRITE also races with pushes.
  ASSERT_TRUE(ref.rows->Apply(late_ids, late_grads.data(), 4).ok());
  ref.dense->Apply(late_dense.data(), 4);
  std::vector<int64_t> since_full = late_ids;
  for (int step = 5; step <= 6; ++step) {
    PushStep(client.get(), &ref, &rng, t, step, 300, &since_full);
  }
  SortUnique(&since_full);
  touched.insert(touched.end(), since_full.begin(), since_full.end());
  SortUnique(&touched);
  int64_t delta_rows = 0;
  SaveCluster(&three, dir, 6, 2, &deltas, [&] { push_late(7); }, &delta_rows);
  EXPECT_EQ(delta_rows, static_cast<int64_t>(since_full.size()));
  expect_restores(touched);
  std::system(("rm -rf " + dir).c_str());
}

// Incremental checkpoints of a 3-shard cluster: a full checkpoint and 10 deltas (each shard's
// file holds only the rows updated since the round before), restored as a chain onto 2, 3 or 4
// shards: every row and optimizer slot and the dense vector match the single-store twin bit for
// bit, and so does the next update.
TEST(ShardCheckpoint, FullPlusTenDeltasRestoreOntoAnyShardCount) {
  const Table t;
  Cluster three(3, t, ADAGRAD, TestDir("deltas"));
  Reference ref(t, ADAGRAD);
  auto client = three.Client();
  Rng rng(98);
  std::vector<int64_t> touched;
  const std::string dir = TestDir("deltas");
  DeltaChain deltas(11);
  for (int step = 1; step <= 11; ++step) {
    PushStep(client.get(), &ref, &rng, t, step, step == 1 ? 3000 : 100, &touched);
    SaveCluster(&three, dir, step, step, &deltas);
  }
  SortUnique(&touched);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  ASSERT_EQ((*choice)->chain.size(), 11u);
  EXPECT_EQ((*choice)->manifest.delta().depth(), 10);
  const CheckpointManifest& full = (*choice)->chain.front().manifest;
  EXPECT_FALSE(full.has_delta());
  for (int s = 0; s < 3; ++s) {  // 100 rows of 3000
    EXPECT_LT((*choice)->manifest.file(s).bytes() * 5, full.file(s).bytes()) << s;
  }
  const std::string after = TestDir("deltas_after");
  std::vector<std::unique_ptr<Cluster>> restored =
      ExpectRestoresOntoAnyShardCount(**choice, t, ADAGRAD, &ref, &rng, touched, 12, after);

  // A restored shard's delta after the restored checkpoint (ckpt-11) holds the rows updated
  // since the restore (the 500 of step 12); a parent it has no record of gets every row (a
  // superset is still a correct delta).
  auto rows_written = [&](int64_t round, int64_t parent) {
    EXPECT_TRUE(PrepareCheckpointDir(after, round).ok());
    int64_t rows = 0;
    for (auto& server : restored.front()->servers) {
      EXPECT_TRUE(server->CopyForCheckpoint(round, parent).ok());
      auto written = server->WriteCheckpoint(round, CheckpointName(round));
      EXPECT_TRUE(written.ok()) << written.status();
      if (written.ok()) rows += written->rows();
    }
    return rows;
  };
  EXPECT_EQ(rows_written(100, 11), 500);
  EXPECT_EQ(rows_written(101, 5), static_cast<int64_t>(touched.size()));
  std::system(("rm -rf " + dir + " " + after).c_str());
}

// Writes `ref` as `pstrain train` does: ckpt-<step>/shard-0-of-1 (store blocks only, no SHRD),
// the MANIFEST and LATEST. Returns the checkpoint chosen from dir.
CheckpointChoice SaveSingleStore(Reference* ref, const Table& t, const std::string& dir,
                                 int64_t step) {
  auto ckpt = PrepareCheckpointDir(dir, step);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_num_shards(1);
  manifest.set_table_rows(t.rows);
  manifest.set_partitions(1);
  manifest.set_row_dim(t.row_dim);
  manifest.set_dense_size(t.dense_size);
  auto w = BlockWriter::Create(*ckpt + "/" + ShardFileName(0, 1)).value();
  EXPECT_TRUE(SaveEmbeddingStore(*ref->rows, w.get()).ok());
  EXPECT_TRUE(SaveDenseStore(ref->dense->Snapshot(), w.get()).ok());
  EXPECT_TRUE(w->Finish().ok());
  auto* f = manifest.add_file();
  f->set_name(ShardFileName(0, 1));
  f->set_bytes(w->bytes());
  WorkerState state;
  state.set_step(step);
  EXPECT_TRUE(CommitCheckpoint(dir, manifest, {{0, state}}, /*keep=*/3).ok());
  auto choice = ChooseCheckpoint(dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  return **choice;
}

// Trains `ref` for `steps` steps of random rows; returns the rows touched, sorted.
std::vector<int64_t> TrainReference(Reference* ref, const Table& t, Rng* rng, int steps) {
  std::vector<int64_t> touched;
  for (int step = 1; step <= steps; ++step) {
    const std::vector<int64_t> ids = UniqueIds(rng, t.rows, 900);
    touched.insert(touched.end(), ids.begin(), ids.end());
    const std::vector<float> grads = RandomValues(rng, ids.size() * t.row_dim);
    const std::vector<float> dense_grad = RandomValues(rng, t.dense_size);
    EXPECT_TRUE(ref->rows->Apply(ids, grads.data(), step).ok());
    ref->dense->Apply(dense_grad.data(), step);
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  return touched;
}

// A 2-shard job warm-started from a single-store reference trained for 6 steps, saved under its
// own directory as `pstrain train` saves.
struct WarmStarted {
  WarmStarted(OptimizerType type, bool reset_optimizer, const std::string& name)
      : ref(t, type), dir(TestDir(name)), two(2, t, type) {
    touched = TrainReference(&ref, t, &rng, 6);
    const CheckpointChoice source = SaveSingleStore(&ref, t, dir, 6);
    for (auto& server : two.servers) {
      EXPECT_TRUE(server->WarmStart(source.chain, reset_optimizer).ok());
    }
  }
  ~WarmStarted() { std::system(("rm -rf " + dir).c_str()); }

  const Table t;
  Reference ref;
  Rng rng{7};
  std::vector<int64_t> touched;
  const std::string dir;
  Cluster two;
};

// A warm start (docs/CHECKPOINT.md "Warm start") of a 2-shard job from a single-store checkpoint:
// every row and slot bit for bit, the next update too, but the job's step is a fresh job's (0)
// and nothing counts as restored from the job's own checkpoints.
TEST(ShardCheckpoint, WarmStartFromASingleStoreCheckpoint) {
  WarmStarted w(ADAM, /*reset_optimizer=*/false, "warm_single");
  const Table& t = w.t;
  Reference& ref = w.ref;
  Rng& rng = w.rng;
  const std::vector<int64_t>& touched = w.touched;
  Cluster& two = w.two;
  for (auto& server : two.servers) {
    EXPECT_EQ(server->Info().step(), 0);
    EXPECT_EQ(server->Info().restored_from(), "");
  }
  auto client = two.Client();
  ExpectSameAsReference(client.get(), &ref, touched, t);
  // Adam's m, v and per-row t came along: the job's first update equals the source's 7th.
  const std::vector<int64_t> ids(touched.begin(), touched.begin() + 500);
  const std::vector<float> grads = RandomValues(&rng, ids.size() * t.row_dim);
  const std::vector<float> dense_grad = RandomValues(&rng, t.dense_size);
  ASSERT_TRUE(ref.rows->Apply(ids, grads.data(), 7).ok());
  ref.dense->Apply(dense_grad.data(), 7);
  ASSERT_TRUE(client->Push(ids, grads.data(), dense_grad.data(), 1).ok());
  ExpectSameAsReference(client.get(), &ref, touched, t);
}

// --reset_optimizer: the weights are the source's, every optimizer slot is the optimizer's
// initial state (Adagrad's initial accumulator), not the source's trained accumulators.
TEST(ShardCheckpoint, WarmStartResetOptimizerStartsTheSlotsFresh) {
  WarmStarted w(ADAGRAD, /*reset_optimizer=*/true, "warm_reset");
  const Table& t = w.t;
  Reference& ref = w.ref;
  const std::vector<int64_t>& touched = w.touched;
  Cluster& two = w.two;
  auto client = two.Client();
  ExpectSameAsReference(client.get(), &ref, touched, t);  // the weights
  const EmbeddingSnapshot trained = ref.rows->Snapshot();
  int64_t rows = 0;
  for (auto& server : two.servers) {
    for (const auto& store : server->data().stores()) {
      const EmbeddingSnapshot snap = store->Snapshot();
      std::vector<float> fresh(snap.state_floats);
      store->optimizer().InitState(fresh.data(), snap.dim);
      for (int64_t i = 0; i < snap.rows(); ++i, ++rows) {
        ASSERT_TRUE(std::equal(fresh.begin(), fresh.end(),
                               snap.state.begin() + i * snap.state_floats))
            << "row " << snap.ids[i];
      }
    }
    const DenseStore* dense = server->data().dense();
    if (dense == nullptr) continue;
    const DenseSnapshot d = dense->Snapshot();
    std::vector<float> fresh(d.state_floats);
    dense->optimizer().InitState(fresh.data(), d.size);
    EXPECT_EQ(d.state, fresh);
    EXPECT_EQ(d.last_step, 0);
  }
  EXPECT_EQ(rows, static_cast<int64_t>(touched.size()));
  // The source's slots were not the initial ones (else the check above proves nothing).
  std::vector<float> fresh(trained.state_floats);
  ref.rows->optimizer().InitState(fresh.data(), trained.dim);
  EXPECT_FALSE(std::equal(fresh.begin(), fresh.end(), trained.state.begin()));
}

TEST(ShardCheckpoint, RestoreRefusesAnotherShape) {
  const Table t;
  Cluster two(2, t, ADAGRAD, TestDir("shape"));
  const std::string dir = TestDir("shape");
  SaveCluster(&two, dir, 1, 1);
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  Table other = t;
  other.row_dim = t.row_dim + 1;
  Cluster wrong(2, other, ADAGRAD);
  const absl::Status s = wrong.servers[0]->RestoreCheckpoint((*choice)->chain);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another model"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(ShardCheckpoint, WriteNeedsTheRoundsCopy) {
  const Table t;
  Cluster one(1, t, SGD, TestDir("nocopy"));
  auto w = one.servers[0]->WriteCheckpoint(5, "ckpt-5");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("without its COPY"));
}

// The coordinator: one open round at a time, joined by later requests; a finished worker stands
// in with its final state; the wait names the missing workers.
TEST(ShardCheckpoint, CoordinatorRounds) {
  const Table t;
  Cluster one(1, t, SGD, "", /*num_workers=*/3);
  ShardServer& s0 = *one.servers[0];
  EXPECT_EQ(s0.coordinator().RequestCheckpoint(false), 1);
  EXPECT_EQ(s0.coordinator().RequestCheckpoint(true), 1);  // joins the open round and marks it stopping
  EXPECT_TRUE(s0.Info().checkpoint_stop());
  ASSERT_TRUE(s0.coordinator().ArriveCheckpoint(1, 0, "state-0").ok());
  ReportRequest done;
  done.set_worker_id(1);
  done.set_phase(TRAINING_DONE);
  done.set_worker_state("final-1");
  ASSERT_TRUE(s0.Report(done).ok());
  CoordinateResponse got;
  ASSERT_TRUE(s0.coordinator().CollectArrivals(1, 2, &got).ok());
  EXPECT_EQ(got.missing_size(), 0);
  EXPECT_EQ(got.worker_states().at(0), "state-0");
  EXPECT_EQ(got.worker_states().at(1), "final-1");
  ASSERT_TRUE(s0.coordinator().ReleaseCheckpoint(1).ok());
  EXPECT_EQ(s0.coordinator().ArriveCheckpoint(1, 0, "late").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s0.coordinator().CompleteCheckpoint(1, "/ckpt/dir", "").ok());
  InfoResponse info = s0.Info();
  EXPECT_EQ(info.checkpoint_done_round(), 1);
  EXPECT_EQ(info.checkpoint_done_dir(), "/ckpt/dir");

  EXPECT_EQ(s0.coordinator().RequestCheckpoint(false), 2);  // a new round, not stopping
  EXPECT_FALSE(s0.Info().checkpoint_stop());
  // Over gRPC, as the chief waits: a bounded poll naming the missing workers (worker 1 stands in
  // with its final state).
  ShardRpc rpc(one.addresses[0]);
  auto missing = rpc.WaitForArrivals(2, 3, absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("workers [0, 2]"));
  CoordinateResponse closed;
  EXPECT_EQ(s0.coordinator().CollectArrivals(1, 2, &closed).code(), absl::StatusCode::kFailedPrecondition);

  // Worker states hold the pipeline's buffered records: megabytes go through in both directions.
  const std::string big(6 << 20, 'x');
  CoordinateRequest arrive;
  arrive.set_kind(CoordinateRequest::ARRIVE);
  arrive.set_round(2);
  arrive.set_worker_id(0);
  arrive.set_worker_state(big);
  ASSERT_TRUE(rpc.Coordinate(arrive, absl::Seconds(10)).ok());
  auto states = rpc.WaitForArrivals(2, 1, absl::Seconds(10));
  ASSERT_TRUE(states.ok()) << states.status();
  EXPECT_EQ(states->at(0).size(), big.size());
  ASSERT_TRUE(s0.coordinator().CompleteCheckpoint(2, "", "disk full").ok());
  EXPECT_EQ(s0.Info().checkpoint_error(), "disk full");
}

}  // namespace
}  // namespace pstrain
