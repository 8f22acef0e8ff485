// serving/serving_model.h: a model read from the checkpoints of every mode (the single-process
// trainer's, a PS job's of any shard count, the committed version-1 PS fixture) gives exactly the
// rows and dense vector the trainer's parameters hold, trained or not; and the choice of the
// checkpoint to read (LATEST, a named one, a version-1 one that needs a config, one for another
// model).
#include "serving/serving_model.h"

#include <google/protobuf/text_format.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "cmd/ps_setup.h"
#include "common/file.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "tests/serving/serving_test_util.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

using testing_serving::AllRows;
using testing_serving::FreshDir;

Config SmallConfig() {
  Config c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features {
      preset: NO_PRESET
      field { name: "a" vocab_size: 40 }
      field { name: "b" kind: NUMERIC vocab_size: 16 }
      field { name: "c" vocab_size: 40 }
      hash_seed: 5
    }
    model { type: DEEPFM embedding_dim: 4 hidden: [ 6 ] }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.5 }
    dense_optimizer { type: ADAM learning_rate: 0.01 }
    train { seed: 17 }
  )pb", &c));
  return c;
}

// Random gradients for ids.
std::vector<float> Grads(size_t n, Rng* rng) {
  std::vector<float> g(n);
  for (float& x : g) x = static_cast<float>(rng->Normal());
  return g;
}

TEST(ServingModel, ReadsTheSingleProcessCheckpointExactly) {
  const std::string dir = FreshDir("sm_train");
  const Config config = SmallConfig();
  auto spec = FeatureSpec::Create(config.features());
  ASSERT_TRUE(spec.ok());
  auto model = Model::Create(config.model(), spec->num_fields());
  ASSERT_TRUE(model.ok());
  auto params = LocalParams::Create(**model, spec->total_rows(), config, 1);
  ASSERT_TRUE(params.ok());
  Rng rng(3);
  const std::vector<int64_t> ids = {0, 5, 41, 50, 95};
  for (int step = 1; step <= 3; ++step) {
    const auto rg = Grads(ids.size() * (*params)->row_dim(), &rng);
    const auto dg = Grads((*params)->dense_size(), &rng);
    ASSERT_TRUE((*params)->Push(ids, rg.data(), dg.data(), step).ok());
  }
  WorkerState state;
  state.set_step(3);
  auto description = DescribeModel(config);
  ASSERT_TRUE(description.ok());
  ASSERT_TRUE(SaveCheckpoint(dir, state, **params, 3, *description).ok());

  auto chosen = ChooseCheckpointToRead(dir, "", nullptr);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->dir, dir + "/ckpt-3");
  auto m = ServingModel::FromCheckpoint(chosen->chain, chosen->description);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->stored_rows(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ((*m)->origin().step, 3);
  // Every row, trained or not, and the dense vector, as the trainer's parameters hold them.
  std::vector<int64_t> all((*m)->table_rows());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::vector<float> want(all.size() * (*m)->row_dim()), dense((*m)->dense_size());
  ASSERT_TRUE((*params)->Pull(all, want.data(), dense.data()).ok());
  EXPECT_EQ(AllRows(**m), want);
  EXPECT_EQ((*m)->dense(), dense);
  // Ids outside the table are refused, not read.
  std::vector<float> row((*m)->row_dim());
  const std::vector<int64_t> bad = {(*m)->table_rows()};
  EXPECT_EQ((*m)->Gather(bad, row.data()).code(), absl::StatusCode::kInvalidArgument);
  std::system(("rm -rf " + dir).c_str());
}

// A checkpoint of a config with tables (rows at the stride, as every mode writes them) reads into
// a store per table at the table's width: `small` (dim 2) keeps 3 floats a row, and Gather gives
// the checkpoint's rows with zeros after a row's width (the trainer's rows of a narrower table
// hold zeros there; this test's random gradients put values there, which are cut).
TEST(ServingModel, ReadsACheckpointWithTablesAtEachTablesWidth) {
  const std::string dir = FreshDir("sm_tables");
  const ModelDescription d = testing_serving::TablesDescription();
  Config config = SmallConfig();
  *config.mutable_features() = d.features();
  *config.mutable_model() = d.model();
  auto spec = FeatureSpec::Create(config.features(), config.model());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(config.model(), ModelInputsOf(*spec));
  ASSERT_TRUE(model.ok());
  auto params = LocalParams::Create(**model, spec->total_rows(), config, 1);
  ASSERT_TRUE(params.ok());
  const int stride = (*params)->row_dim();
  ASSERT_EQ(stride, 5);
  Rng rng(3);
  // Rows of the default table, of `item` and of `small` (offsets 0, 50, 150).
  const std::vector<int64_t> ids = {0, 7, 50, 99, 149, 150, 155, 159};
  for (int step = 1; step <= 3; ++step) {
    const auto rg = Grads(ids.size() * stride, &rng);
    const auto dg = Grads((*params)->dense_size(), &rng);
    ASSERT_TRUE((*params)->Push(ids, rg.data(), dg.data(), step).ok());
  }
  WorkerState state;
  state.set_step(3);
  auto description = DescribeModel(config);
  ASSERT_TRUE(description.ok());
  ASSERT_EQ(description->features().table_size(), 2);
  ASSERT_TRUE(SaveCheckpoint(dir, state, **params, 3, *description).ok());

  auto chosen = ChooseCheckpointToRead(dir, "", nullptr);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  auto m = ServingModel::FromCheckpoint(chosen->chain, chosen->description);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->stored_rows(), static_cast<int64_t>(ids.size()));
  ASSERT_EQ((*m)->row_tables().size(), 3u);
  const int widths[] = {5, 5, 3};
  const int64_t stored[] = {2, 3, 3};
  for (int t = 0; t < 3; ++t) {
    const auto& rt = (*m)->row_tables()[t];
    const EmbeddingSnapshot snap = (*m)->StoredTableRows(t, rt.begin, rt.end);
    EXPECT_EQ(rt.width, widths[t]);
    EXPECT_EQ(snap.dim, widths[t]);
    EXPECT_EQ(snap.rows(), stored[t]) << t;
  }
  std::vector<float> want(ids.size() * stride), dense((*m)->dense_size());
  ASSERT_TRUE((*params)->Pull(ids, want.data(), dense.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 150) std::fill(&want[i * stride + 3], &want[(i + 1) * stride], 0.f);
  }
  std::vector<float> got(ids.size() * stride);
  ASSERT_TRUE((*m)->Gather(ids, got.data()).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ((*m)->dense(), dense);
  const EmbeddingSnapshot all = (*m)->StoredRows(0, (*m)->table_rows());
  EXPECT_EQ(all.ids, ids);
  EXPECT_EQ(all.weights, want);
  std::system(("rm -rf " + dir).c_str());
}

// A PS checkpoint of 3 shards (each shard file holds its partitions' rows and its dense slice)
// reads as the parameters the shards hold.
TEST(ServingModel, ReadsAPsCheckpointOfAnyShardCount) {
  const Config config = SmallConfig();
  auto description = DescribeModel(config);
  ASSERT_TRUE(description.ok());
  for (int shards : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    const std::string dir = FreshDir("sm_ps");
    std::vector<std::unique_ptr<ShardServer>> servers;
    for (int s = 0; s < shards; ++s) {
      auto o = ShardOptionsForJob(config, s, shards);
      ASSERT_TRUE(o.ok()) << o.status();
      o->data.checkpoint_dir = dir;  // a shard writes only under its job's checkpoint dir
      auto server = ShardServer::Create(*std::move(o));
      ASSERT_TRUE(server.ok()) << server.status();
      servers.push_back(*std::move(server));
    }
    const PartitionMap& map = servers[0]->map();
    const int dim = 5;
    Rng rng(4);
    for (int64_t id : {1, 7, 30, 44, 60, 95}) {
      ShardServer& s = *servers[map.ShardOf(id)];
      const std::vector<int64_t> one = {id};
      const auto g = Grads(dim, &rng);
      ASSERT_TRUE(s.PushDirect(0, 1, one, g.data(), nullptr).ok());
    }
    CheckpointManifest manifest;
    manifest.set_step(6);
    manifest.set_num_shards(shards);
    manifest.set_table_rows(map.rows());
    manifest.set_partitions(map.partitions());
    manifest.set_row_dim(dim);
    manifest.set_dense_size(servers[0]->Info().map().dense_size());
    *manifest.mutable_model() = *description;
    ASSERT_TRUE(PrepareCheckpointDir(dir, 6).ok());
    for (auto& s : servers) ASSERT_TRUE(s->CopyForCheckpoint(1).ok());
    for (auto& s : servers) {
      auto written = s->WriteCheckpoint(1, CheckpointName(6));
      ASSERT_TRUE(written.ok()) << written.status();
      auto* f = manifest.add_file();
      f->set_name(written->file());
      f->set_bytes(written->bytes());
    }
    ASSERT_TRUE(CommitCheckpoint(dir, manifest, {{0, WorkerState()}}, 3).ok());

    auto chosen = ChooseCheckpointToRead(dir, "ckpt-6", nullptr);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    auto m = ServingModel::FromCheckpoint(chosen->chain, chosen->description);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->stored_rows(), 6);
    // Every row, from the shard that owns it; the dense vector, slice by slice.
    const std::vector<float> got = AllRows(**m);
    std::vector<float> dense;
    for (int s = 0; s < shards; ++s) {
      std::vector<int64_t> ids;
      for (int64_t r = 0; r < map.rows(); ++r) {
        if (map.ShardOf(r) == s) ids.push_back(r);
      }
      std::vector<float> rows(ids.size() * dim), slice(servers[s]->dense_slice_size());
      int64_t staleness;
      ASSERT_TRUE(servers[s]->PullDirect(ids, 0, rows.data(), slice.data(), &staleness).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(std::vector<float>(rows.begin() + i * dim, rows.begin() + (i + 1) * dim),
                  std::vector<float>(got.begin() + ids[i] * dim, got.begin() + (ids[i] + 1) * dim))
            << "row " << ids[i];
      }
      dense.insert(dense.end(), slice.begin(), slice.end());
    }
    EXPECT_EQ((*m)->dense(), dense);

    if (shards == 3) {
      // A MANIFEST that leaves out a shard file leaves a dense slice uncovered: refused.
      CheckpointManifest partial = chosen->manifest;
      partial.mutable_file()->DeleteSubrange(1, 1);
      const CheckpointLink link{chosen->dir, partial};
      auto refused = ServingModel::FromCheckpoint({link}, chosen->description);
      ASSERT_FALSE(refused.ok());
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_NE(refused.status().message().find("in none of its shard files"),
                absl::string_view::npos)
          << refused.status();
    }
    std::system(("rm -rf " + dir).c_str());
  }
}

// The committed PS fixture of version 1 (2 shards, no model description): readable with the
// description of the model that matches its shapes; its trained rows and dense slices come back.
TEST(ServingModel, ReadsTheVersion1PsFixtureGivenItsModel) {
  const std::string fixture = PSTRAIN_SOURCE_DIR "/tests/checkpoint/testdata/ps_v1";
  ModelDescription d;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features { preset: NO_PRESET field { name: "x" vocab_size: 12 } }
    model { type: DEEPFM embedding_dim: 1 hidden: 1 }
  )pb", &d));
  auto needs_config = ChooseCheckpointToRead(fixture, "", nullptr);
  ASSERT_FALSE(needs_config.ok());
  EXPECT_EQ(needs_config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(needs_config.status().message().find("--config"), absl::string_view::npos);
  auto chosen = ChooseCheckpointToRead(fixture, "", &d);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  auto m = ServingModel::FromCheckpoint(chosen->chain, chosen->description);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->stored_rows(), 3);
  // The fixture's values (tests/checkpoint/fixtures_test.cc): rows 1, 5, 9 trained by one
  // Adagrad step of [0.5, -0.5] from row + 0.25 j; the dense vector after one SGD step.
  const std::vector<int64_t> ids = {1, 5, 9};
  std::vector<float> rows(6);
  ASSERT_TRUE((*m)->Gather(ids, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<float>{0.875f, 1.375f, 4.875f, 5.375f, 8.875f, 9.375f}));
  EXPECT_EQ((*m)->dense(), (std::vector<float>{-1.25f, -0.8125f, -0.375f, 0.0625f, 0.5f}));
}

// Rows never trained are stored nowhere: they read as Model::InitRow(row, init_seed), the rule
// docs/CHECKPOINT.md documents and python/pstrain_checkpoint.py reimplements. Golden values (the
// Python twin's; tests/python/pstrain_checkpoint_test.py checks it against the same numbers).
// A narrow table's rows cost its width in memory, not the stride: 100k stored rows of a dim-4
// table in a model of k = 16 (stride 17) hold about 5 floats each (20 bytes; 68 at the stride).
TEST(ServingModel, ANarrowTablesRowsCostItsWidthInMemory) {
  ModelDescription d;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    features {
      preset: NO_PRESET
      field { name: "a" vocab_size: 10 }
      field { name: "s" table: "small" }
      table { name: "small" dim: 4 rows: 200000 fm_join: EXCLUDE }
    }
    model { type: DEEPFM embedding_dim: 16 hidden: [ 4 ] }
    init_seed: 1
    init_rule: 1
  )pb", &d));
  auto m = ServingModel::Create(d, ServingModel::Origin{"test", 1, 1});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->row_dim(), 17);
  ASSERT_EQ((*m)->row_tables().size(), 2u);
  const auto& small = (*m)->row_tables()[1];
  ASSERT_EQ(small.width, 5);
  const int64_t before = (*m)->memory_bytes();
  constexpr int64_t kRows = 100000;
  std::vector<int64_t> ids(kRows);
  std::vector<float> rows(kRows * 5, 0.5f);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = small.begin + 1 + 2 * i;
  ASSERT_TRUE((*m)->StoreTableRows(1, ids, rows.data()).ok());
  const int64_t grew = (*m)->memory_bytes() - before;
  EXPECT_GE(grew, kRows * 5 * 4);
  EXPECT_LT(grew, kRows * 17 * 4 / 2) << "rows kept at the stride?";
  std::vector<float> got(17);
  ASSERT_TRUE((*m)->Gather({ids[7]}, got.data()).ok());
  EXPECT_EQ(got, std::vector<float>({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                     0, 0}));
}

TEST(ServingModel, RowsNeverTrainedReadAsTheDocumentedInitRule) {
  auto m = ServingModel::Create(testing_serving::SmallDescription(), ServingModel::Origin{});
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<int64_t> ids = {0, 1, 169};
  std::vector<float> rows(ids.size() * 5);
  ASSERT_TRUE((*m)->Gather(ids, rows.data()).ok());
  const std::vector<float> want = {
      0.f, -0.0954230055f, -0.0210496709f, 0.0176667515f, -0.00829756539f,  // row 0
      0.f, 0.0442207977f,  0.0220386144f,  0.0666234121f, -0.0896068513f,   // row 1
      0.f, 0.00583246443f, -0.0327057838f, -0.0704622939f, 0.035526827f,    // row 169
  };
  EXPECT_EQ(rows, want);
}

TEST(ServingModel, ChoosingRefusesWhatDoesNotFit) {
  const std::string dir = FreshDir("sm_choose");
  auto missing = ChooseCheckpointToRead(dir, "", nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto no_such = ChooseCheckpointToRead(dir, "ckpt-9", nullptr);
  EXPECT_EQ(no_such.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_such.status().message().find("ckpt-9"), absl::string_view::npos);

  const Config config = SmallConfig();
  auto description = DescribeModel(config);
  auto model = Model::Create(config.model(), 3);
  auto params = LocalParams::Create(**model, 96, config, 1);
  ASSERT_TRUE(params.ok());
  WorkerState state;
  state.set_step(1);
  ASSERT_TRUE(SaveCheckpoint(dir, state, **params, 3, *description).ok());
  // A config for another model is refused naming the field.
  Config other = config;
  other.mutable_features()->mutable_field(2)->set_vocab_size(41);
  auto other_description = DescribeModel(other);
  auto refused = ChooseCheckpointToRead(dir, "", &*other_description);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "features.field[2] 'c'.vocab_size: 40 in the checkpoint, 41 in the config"),
            absl::string_view::npos)
      << refused.status();
  // The same config is accepted; so is a path to the checkpoint directory.
  EXPECT_TRUE(ChooseCheckpointToRead(dir, "", &*description).ok());
  auto by_path = ChooseCheckpointToRead("", dir + "/ckpt-1", nullptr);
  ASSERT_TRUE(by_path.ok()) << by_path.status();
  EXPECT_EQ(by_path->manifest.step(), 1);
  // A damaged checkpoint named explicitly is refused (no fallback for an explicit choice).
  std::string shard = *ReadFileToString(dir + "/ckpt-1/shard-0-of-1");
  shard[shard.size() / 2] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(dir + "/ckpt-1/shard-0-of-1", shard).ok());
  auto damaged = ChooseCheckpointToRead(dir, "ckpt-1", nullptr);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(damaged.status().message().find("shard-0-of-1"), absl::string_view::npos);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
