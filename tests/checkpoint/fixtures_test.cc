// Golden fixtures of every checkpoint file that is not a bare block-file example
// (tests/checkpoint/block_file_test.cc pins the container and the EMBM / EMBR / DNSE blocks):
//
//   testdata/train_v1/   a `pstrain train` checkpoint (SaveCheckpoint): LATEST, and in ckpt-3/
//                        the single-process checkpoint file shard-0-of-1 (FTRL rows, Adam dense),
//                        worker-0.state (a WorkerState with a full pipeline position) and the
//                        MANIFEST of version 1 (no model description); today's code reads it
//                        (and restores it for any config: it has nothing to compare);
//   testdata/train_v2/   the same checkpoint as written since the MANIFEST records the model
//                        (version 2: a ModelDescription of 2 fields of 5 rows, DeepFM k = 2);
//                        the same shard-0-of-1 and worker-0.state bytes;
//   testdata/train_v3_delta/  incremental checkpoints (MANIFEST version 3): ckpt-3, the train_v2
//                        checkpoint (full), and ckpt-5, a delta of it holding row 7 after one
//                        FTRL update, the whole dense vector and the worker state;
//   testdata/ps_v1/      a PS checkpoint of 2 SYNC shards and 2 workers, written by
//                        ShardServer::WriteCheckpoint and CommitCheckpoint: LATEST, and in ckpt-3/
//                        shard-0-of-2 and shard-1-of-2 (SHRD, CONS with a kept push, one EMBM+EMBR
//                        group per partition, DNSE; Adagrad rows, SGD dense), worker-0.state,
//                        worker-1.state and the MANIFEST.
//
// For each, one test reads the committed files and checks what they decode to against values
// written here, and one writes the same content with today's code and checks that the files are
// byte-identical. Two fields hold a fact of the writing process rather than content: the
// MANIFEST's wall_time and the SHRD header's incarnation (random per server process). The write
// tests check those fields for plausibility, set them to the fixture's values and re-frame the
// file, and compare every byte of the result. A failure of a "StillWrites" test is a format
// change: bump the version, keep these files as the old version's fixtures and add new ones.
//
// PSTRAIN_REGENERATE_FIXTURES=1 rewrites the fixtures (then review the diff: it must be one).
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/rpc/wire.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "ps/store/partition.h"
#include "ps/store/store_blocks.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using pstrain::testing::FreshDir;
using pstrain::testing::Slurp;

const std::string kTestdata = PSTRAIN_SOURCE_DIR "/tests/checkpoint/testdata";
const std::string kTrainFixture = kTestdata + "/train_v1";
const std::string kTrainV2Fixture = kTestdata + "/train_v2";
const std::string kTrainV3DeltaFixture = kTestdata + "/train_v3_delta";
const std::string kPsFixture = kTestdata + "/ps_v1";

bool Regenerating() { return std::getenv("PSTRAIN_REGENERATE_FIXTURES") != nullptr; }

template <typename M>
M ParseText(const std::string& text) {
  M m;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &m)) << text;
  return m;
}

template <typename M>
void ExpectProtoEq(const M& got, const M& want) {
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
      << "got:\n" << got.DebugString() << "want:\n" << want.DebugString();
}

// Every block of a block file, the end block excluded.
std::vector<Block> Blocks(const std::string& name, const std::string& data) {
  std::vector<Block> out;
  auto r = BlockReader::FromString(name, data);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  while (true) {
    Block b;
    auto more = (*r)->Next(&b);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) return out;
    out.push_back(std::move(b));
  }
}

std::string Frame(const std::vector<Block>& blocks) {
  std::string out;
  auto w = BlockWriter::ToString(&out);
  for (const Block& b : blocks) EXPECT_TRUE(w->Add(b.tag, b.payload).ok());
  EXPECT_TRUE(w->Finish().ok());
  return out;
}

// The single-block file `data` (tag `tag`) parsed into *msg.
template <typename M>
void ParseSingleBlockFile(const std::string& name, const std::string& data, const char* tag,
                          M* msg) {
  const std::vector<Block> blocks = Blocks(name, data);
  ASSERT_EQ(blocks.size(), 1u) << name;
  EXPECT_EQ(blocks[0].tag, tag) << name;
  ASSERT_TRUE(msg->ParseFromString(blocks[0].payload)) << name;
}

// A MANIFEST's bytes with its wall_time replaced: the fixture's bytes when everything else is the
// same. Checks first that re-framing the file as it is gives back the same bytes.
std::string ManifestWithWallTime(const std::string& data, double wall_time) {
  std::vector<Block> blocks = Blocks("MANIFEST", data);
  EXPECT_EQ(Frame(blocks), data);
  if (blocks.size() != 1) return "";
  CheckpointManifest m;
  EXPECT_TRUE(m.ParseFromString(blocks[0].payload));
  m.set_wall_time(wall_time);
  blocks[0].payload = m.SerializeAsString();
  return Frame(blocks);
}

// The same for a shard file's SHRD incarnation.
std::string ShardFileWithIncarnation(const std::string& data, uint64_t incarnation) {
  std::vector<Block> blocks = Blocks("shard file", data);
  EXPECT_EQ(Frame(blocks), data);
  if (blocks.empty()) return "";
  InfoResponse header;
  EXPECT_EQ(blocks[0].tag, "SHRD");
  EXPECT_TRUE(header.ParseFromString(blocks[0].payload));
  header.set_incarnation(incarnation);
  blocks[0].payload = header.SerializeAsString();
  return Frame(blocks);
}

double WallTimeNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------
// `pstrain train`: testdata/train_v1
// ---------------------------------------------------------------------------------------------

// Hand-chosen contents (no optimizer math), so that the files depend on the format only.
constexpr int64_t kTrainStep = 3;
constexpr int64_t kTrainRows = 10;  // the table: 2 fields of 5 rows
constexpr int kTrainRowDim = 3;     // DeepFM with k = 2: [w, v0, v1]
constexpr int64_t kTrainDenseSize = 14;  // bias + MLP 4 -> 2 -> 1: 1 + (8 + 2) + (2 + 1)

Config TrainConfig() {
  return ParseText<Config>(R"pb(
    features {
      preset: NO_PRESET
      field { name: "a" vocab_size: 5 }
      field { name: "b" kind: NUMERIC vocab_size: 5 }
      hash_seed: 11
    }
    model { type: DEEPFM embedding_dim: 2 hidden: 2 }
    sparse_optimizer { type: FTRL learning_rate: 0.5 }
    dense_optimizer { type: ADAM learning_rate: 0.25 }
    train { seed: 7 }
  )pb");
}

// Rows 2 and 7 of the FTRL store: weights [w, v0, v1], state accum[3] then linear[3].
EmbeddingSnapshot TrainRows() {
  EmbeddingSnapshot s;
  s.begin = 0;
  s.end = kTrainRows;
  s.dim = kTrainRowDim;
  s.optimizer = FTRL;
  s.state_floats = 2 * kTrainRowDim;
  s.last_step = kTrainStep;
  s.ids = {2, 7};
  for (int64_t id : s.ids) {
    for (int j = 0; j < kTrainRowDim; ++j) s.weights.push_back(id + 0.5f * j);
    for (int j = 0; j < kTrainRowDim; ++j) s.state.push_back(0.25f * (id + j));  // accum
    for (int j = 0; j < kTrainRowDim; ++j) s.state.push_back(-0.125f * id - j);   // linear
  }
  return s;
}

// The Adam dense vector: weights, then m[14], v[14], t.
DenseSnapshot TrainDense() {
  DenseSnapshot s;
  s.begin = 0;
  s.size = kTrainDenseSize;
  s.optimizer = ADAM;
  s.state_floats = 2 * kTrainDenseSize + 1;
  s.last_step = kTrainStep;
  for (int i = 0; i < kTrainDenseSize; ++i) s.weights.push_back(0.125f * i - 1.0f);
  for (int i = 0; i < kTrainDenseSize; ++i) s.state.push_back(0.0625f * i);  // m
  for (int i = 0; i < kTrainDenseSize; ++i) s.state.push_back(0.5f + i);     // v
  s.state.push_back(3.0f);                                                    // t
  return s;
}

WorkerState TrainWorkerState() {
  return ParseText<WorkerState>(R"pb(
    step: 3
    examples: 96
    position {
      version: 1
      epoch: 1
      channel {
        channel: "train"
        files: [ "day_0.tsv", "day_1.tsv" ]
        file_cursor: 1
        offset: 1234
        source_records: 17
        epoch_records: 40
        input_done: false
        exhausted: false
        shuffle_rng: [ 1, 2, 3, 18446744073709551615 ]
        shuffle_buffer { data: "1\t5\tab12\n" file: 0 number: 16 }
        records_read: 57
        bad_records: 1
        epoch_started: true
      }
      interleave_rng: [ 5, 6, 7, 8 ]
      batches_delivered: 3
      file { path: "day_1.tsv" header: "" channel: 0 }
      pending {
        epoch: 1
        record { data: "0\t\t9f\n" file: 0 number: 17 }
        bad_records: [ 0 ]
        error_code: 0
      }
      shard_index: 0
      num_shards: 1
      producer_done: false
      last_bad_record: "day_1.tsv:9: 2 fields, expected 3"
    }
  )pb");
}

std::unique_ptr<LocalParams> TrainParams(const Config& config) {
  auto model = Model::Create(config.model(), 2);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EXPECT_EQ((*model)->row_dim(), kTrainRowDim);
  EXPECT_EQ((*model)->dense_size(), kTrainDenseSize);
  auto params = LocalParams::Create(**model, kTrainRows, config, 1);
  EXPECT_TRUE(params.ok()) << params.status();
  // The parameters initialize new rows through the model (Model::InitRow): it must outlive them.
  static std::vector<std::unique_ptr<Model>>* const models =
      new std::vector<std::unique_ptr<Model>>();
  models->push_back(std::move(*model));
  return params.ok() ? std::move(params).value() : nullptr;
}

ModelDescription TrainDescription() {
  auto d = DescribeModel(TrainConfig());
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : ModelDescription();
}

// Writes the train_v2 contents under `dir` with SaveCheckpoint, as `pstrain train` does.
void WriteTrainCheckpoint(const std::string& dir) {
  const Config config = TrainConfig();
  auto params = TrainParams(config);
  ASSERT_NE(params, nullptr);
  ASSERT_TRUE(params->embedding()->Restore(TrainRows()).ok());
  ASSERT_TRUE(params->dense()->Restore(TrainDense()).ok());
  auto ckpt = SaveCheckpoint(dir, TrainWorkerState(), *params, /*keep=*/3, TrainDescription());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(*ckpt, dir + "/ckpt-3");
}

// The fixture's MANIFEST, as SaveCheckpoint writes it; wall_time is when the fixture was made.
CheckpointManifest TrainManifest() {
  return ParseText<CheckpointManifest>(R"pb(
    step: 3
    num_shards: 1
    num_workers: 1
    table_rows: 10
    partitions: 1
    row_dim: 3
    dense_size: 14
    file { name: "shard-0-of-1" bytes: 460 }
    file { name: "worker-0.state" bytes: 246 }
    created_by: "pstrain train"
    wall_time: 0
  )pb");
}

TEST(CheckpointFixtures, TrainV1Reads) {
  const std::string ckpt = kTrainFixture + "/ckpt-3";
  EXPECT_EQ(Slurp(kTrainFixture + "/LATEST"), "ckpt-3\n");

  // The MANIFEST: every field (wall_time: whenever the fixture was made).
  CheckpointManifest manifest;
  ParseSingleBlockFile(ckpt + "/MANIFEST", Slurp(ckpt + "/MANIFEST"), "MANI", &manifest);
  CheckpointManifest want = TrainManifest();
  EXPECT_GT(manifest.wall_time(), 1.7e9);  // written after 2023
  want.set_wall_time(manifest.wall_time());
  ExpectProtoEq(manifest, want);

  // worker-0.state: one WSTA block.
  WorkerState state;
  ParseSingleBlockFile(ckpt + "/worker-0.state", Slurp(ckpt + "/worker-0.state"), "WSTA", &state);
  ExpectProtoEq(state, TrainWorkerState());

  // shard-0-of-1: EMBM, EMBR, DNSE.
  const std::vector<Block> blocks = Blocks("shard-0-of-1", Slurp(ckpt + "/shard-0-of-1"));
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].tag, "EMBM");
  EXPECT_EQ(blocks[1].tag, "EMBR");
  EXPECT_EQ(blocks[2].tag, "DNSE");
  auto r = BlockReader::Open(ckpt + "/shard-0-of-1");
  ASSERT_TRUE(r.ok()) << r.status();
  const EmbeddingSnapshot rows = TrainRows();
  std::vector<int64_t> ids;
  std::vector<float> weights, slots;
  auto meta = LoadEmbeddingRows(r->get(), [&](const EmbeddingMeta&, absl::Span<const int64_t> i,
                                              const float* w, const float* s) {
    ids.insert(ids.end(), i.begin(), i.end());
    weights.insert(weights.end(), w, w + i.size() * kTrainRowDim);
    slots.insert(slots.end(), s, s + i.size() * 2 * kTrainRowDim);
    return absl::OkStatus();
  });
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->begin, 0);
  EXPECT_EQ(meta->end, 10);
  EXPECT_EQ(meta->dim, 3);
  EXPECT_EQ(meta->optimizer, FTRL);
  EXPECT_EQ(meta->state_floats, 6);
  EXPECT_EQ(meta->last_step, 3);
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(weights, (std::vector<float>{2, 2.5, 3, 7, 7.5, 8}));
  EXPECT_EQ(slots, (std::vector<float>{0.5, 0.75, 1, -0.25, -1.25, -2.25,  //
                                       1.75, 2, 2.25, -0.875, -1.875, -2.875}));
  auto dense = LoadDenseSnapshot(r->get());
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->begin, 0);
  EXPECT_EQ(dense->size, 14);
  EXPECT_EQ(dense->optimizer, ADAM);
  EXPECT_EQ(dense->state_floats, 29);
  EXPECT_EQ(dense->last_step, 3);
  EXPECT_EQ(dense->weights, TrainDense().weights);
  ASSERT_EQ(dense->state.size(), 29u);
  EXPECT_EQ(dense->state[1], 0.0625f);   // m[1]
  EXPECT_EQ(dense->state[14], 0.5f);     // v[0]
  EXPECT_EQ(dense->state[27], 13.5f);    // v[13]
  EXPECT_EQ(dense->state[28], 3.0f);     // t
  EXPECT_EQ(dense->state, TrainDense().state);

  // And through the restore path of `pstrain train`.
  const Config config = TrainConfig();
  auto params = TrainParams(config);
  ASSERT_NE(params, nullptr);
  WorkerState restored_state;
  // Version 1 has no model description: it restores for any config (here one with another hash
  // seed, which a version 2 checkpoint refuses: TrainV2Reads).
  Config other = TrainConfig();
  other.mutable_features()->set_hash_seed(12);
  auto restored =
      RestoreLatestCheckpoint(kTrainFixture, params.get(), &restored_state, *DescribeModel(other));
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ(**restored, ckpt);
  ExpectProtoEq(restored_state, TrainWorkerState());
  const EmbeddingSnapshot got = params->embedding()->Snapshot();
  EXPECT_EQ(got.ids, rows.ids);
  EXPECT_EQ(got.weights, rows.weights);
  EXPECT_EQ(got.state, rows.state);
  EXPECT_EQ(params->embedding()->last_step(), 3);
  const DenseSnapshot got_dense = params->dense()->Snapshot();
  EXPECT_EQ(got_dense.weights, TrainDense().weights);
  EXPECT_EQ(got_dense.state, TrainDense().state);
}

// The MANIFEST of version 2: version 1's fields plus the version and the model description.
CheckpointManifest TrainV2Manifest() {
  CheckpointManifest m = TrainManifest();
  m.set_version(2);
  *m.mutable_model() = ParseText<ModelDescription>(R"pb(
    features {
      preset: NO_PRESET
      field { name: "a" kind: CATEGORICAL numeric_mode: LOG_SQUARED_BUCKET numeric_transform: LOG1P vocab_size: 5 }
      field { name: "b" kind: NUMERIC numeric_mode: LOG_SQUARED_BUCKET numeric_transform: LOG1P vocab_size: 5 }
      label_name: "label"
      hash_seed: 11
    }
    model {
      type: DEEPFM
      embedding_dim: 2
      hidden: 2
      precision: F32
      embedding_init_stddev: 0.01
      embedding_l2: 0
    }
    init_seed: 7
    init_rule: 1
    sparse_optimizer { type: FTRL learning_rate: 0.5 }
    dense_optimizer { type: ADAM learning_rate: 0.25 }
  )pb");
  return m;
}

TEST(CheckpointFixtures, TrainV2Reads) {
  const std::string ckpt = kTrainV2Fixture + "/ckpt-3";
  EXPECT_EQ(Slurp(kTrainV2Fixture + "/LATEST"), "ckpt-3\n");
  CheckpointManifest manifest;
  ParseSingleBlockFile(ckpt + "/MANIFEST", Slurp(ckpt + "/MANIFEST"), "MANI", &manifest);
  CheckpointManifest want = TrainV2Manifest();
  EXPECT_GT(manifest.wall_time(), 1.7e9);
  want.set_wall_time(manifest.wall_time());
  ExpectProtoEq(manifest, want);
  // The parameter and state files did not change with the MANIFEST's version.
  for (const char* file : {"shard-0-of-1", "worker-0.state"}) {
    EXPECT_EQ(Slurp(ckpt + "/" + file), Slurp(kTrainFixture + "/ckpt-3/" + file)) << file;
  }
  // The description rebuilds the model it was written for.
  auto spec = FeatureSpec::Create(manifest.model().features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->total_rows(), static_cast<uint64_t>(manifest.table_rows()));
  auto model = Model::Create(manifest.model().model(), spec->num_fields());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->row_dim(), manifest.row_dim());
  EXPECT_EQ((*model)->dense_size(), manifest.dense_size());

  // Restored for its own config; refused for another hash seed, naming the field.
  const Config config = TrainConfig();
  auto params = TrainParams(config);
  ASSERT_NE(params, nullptr);
  WorkerState state;
  auto restored = RestoreLatestCheckpoint(kTrainV2Fixture, params.get(), &state, TrainDescription());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  ExpectProtoEq(state, TrainWorkerState());
  EXPECT_EQ(params->embedding()->Snapshot().weights, TrainRows().weights);
  Config other = config;
  other.mutable_features()->set_hash_seed(12);
  auto fresh = TrainParams(other);
  auto refused =
      RestoreLatestCheckpoint(kTrainV2Fixture, fresh.get(), &state, *DescribeModel(other));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("features.hash_seed: 11 in the checkpoint, 12 in the "
                                            "config"),
            absl::string_view::npos)
      << refused.status();
}

TEST(CheckpointFixtures, TrainV2StillWrites) {
  const std::string dir = FreshDir("train_v2");
  const double before = WallTimeNow();
  WriteTrainCheckpoint(dir);
  const double after = WallTimeNow();
  const std::string fresh = dir + "/ckpt-3", fixture = kTrainV2Fixture + "/ckpt-3";
  EXPECT_EQ(Slurp(dir + "/LATEST"), Slurp(kTrainV2Fixture + "/LATEST"));
  for (const char* file : {"shard-0-of-1", "worker-0.state"}) {
    EXPECT_EQ(Slurp(fresh + "/" + file), Slurp(fixture + "/" + file)) << file;
  }
  CheckpointManifest written, committed;
  const std::string written_bytes = Slurp(fresh + "/MANIFEST");
  const std::string committed_bytes = Slurp(fixture + "/MANIFEST");
  ParseSingleBlockFile("fresh MANIFEST", written_bytes, "MANI", &written);
  ParseSingleBlockFile("fixture MANIFEST", committed_bytes, "MANI", &committed);
  EXPECT_GE(written.wall_time(), before - 1);
  EXPECT_LE(written.wall_time(), after + 1);
  EXPECT_EQ(ManifestWithWallTime(written_bytes, committed.wall_time()), committed_bytes);
  std::system(("rm -rf " + dir).c_str());
}

// ---------------------------------------------------------------------------------------------
// Incremental checkpoints: testdata/train_v3_delta
// ---------------------------------------------------------------------------------------------

// ckpt-3: the train_v2 checkpoint, full (checkpoint.incremental_every 2); then one update of row 7
// and the dense vector at step 5, and ckpt-5: the delta.
void WriteTrainDeltaCheckpoints(const std::string& dir) {
  auto params = TrainParams(TrainConfig());
  ASSERT_NE(params, nullptr);
  ASSERT_TRUE(params->embedding()->Restore(TrainRows()).ok());
  ASSERT_TRUE(params->dense()->Restore(TrainDense()).ok());
  ReplicaDeltas deltas(2);
  auto full = SaveCheckpoint(dir, TrainWorkerState(), *params, 3, TrainDescription(), &deltas);
  ASSERT_TRUE(full.ok()) << full.status();
  const std::vector<int64_t> ids = {7};
  const std::vector<float> grads = {0.5f, -0.25f, 0.125f};
  const std::vector<float> dense(kTrainDenseSize, 0.0625f);
  ASSERT_TRUE(params->Push(ids, grads.data(), dense.data(), 5).ok());
  WorkerState state = TrainWorkerState();
  state.set_step(5);
  auto delta = SaveCheckpoint(dir, state, *params, 3, TrainDescription(), &deltas);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(*delta, dir + "/ckpt-5");
}

TEST(CheckpointFixtures, TrainV3DeltaReads) {
  const std::string& dir = kTrainV3DeltaFixture;
  EXPECT_EQ(Slurp(dir + "/LATEST"), "ckpt-5\n");
  // The base is an ordinary full checkpoint: train_v2's files.
  for (const char* file : {"shard-0-of-1", "worker-0.state"}) {
    EXPECT_EQ(Slurp(dir + "/ckpt-3/" + file), Slurp(kTrainV2Fixture + "/ckpt-3/" + file)) << file;
  }
  CheckpointManifest base, manifest;
  ParseSingleBlockFile("base MANIFEST", Slurp(dir + "/ckpt-3/MANIFEST"), "MANI", &base);
  EXPECT_EQ(base.version(), 2);
  EXPECT_FALSE(base.has_delta());
  ParseSingleBlockFile("delta MANIFEST", Slurp(dir + "/ckpt-5/MANIFEST"), "MANI", &manifest);
  EXPECT_EQ(manifest.version(), 3);
  ExpectProtoEq(manifest.delta(),
                ParseText<CheckpointDelta>("base_step: 3 parent_step: 3 depth: 1"));
  // The delta's file holds row 7 only (the row updated since ckpt-3), then the dense vector.
  auto reader = BlockReader::Open(dir + "/ckpt-5/shard-0-of-1");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> ids;
  std::vector<float> row7, state7;
  auto meta = LoadEmbeddingRows(reader->get(), [&](const EmbeddingMeta& m,
                                                   absl::Span<const int64_t> block_ids,
                                                   const float* w, const float* st) {
    ids.insert(ids.end(), block_ids.begin(), block_ids.end());
    row7.assign(w, w + m.dim);
    state7.assign(st, st + m.state_floats);
    return absl::OkStatus();
  });
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(ids, std::vector<int64_t>{7});
  EXPECT_EQ(meta->last_step, 5);
  auto dense = LoadDenseSnapshot(reader->get());
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->last_step, 5);

  // The restore reads the chain: row 2 from ckpt-3, row 7 and the dense vector from ckpt-5.
  auto params = TrainParams(TrainConfig());
  ASSERT_NE(params, nullptr);
  WorkerState state;
  auto restored = RestoreLatestCheckpoint(dir, params.get(), &state, TrainDescription());
  ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
  EXPECT_EQ(**restored, dir + "/ckpt-5");
  EXPECT_EQ(state.step(), 5);
  const EmbeddingSnapshot rows = params->embedding()->Snapshot();
  const EmbeddingSnapshot saved = TrainRows();
  ASSERT_EQ(rows.ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(std::vector<float>(rows.weights.begin(), rows.weights.begin() + kTrainRowDim),
            std::vector<float>(saved.weights.begin(), saved.weights.begin() + kTrainRowDim));
  EXPECT_EQ(std::vector<float>(rows.weights.begin() + kTrainRowDim, rows.weights.end()), row7);
  EXPECT_EQ(std::vector<float>(rows.state.begin() + 2 * kTrainRowDim, rows.state.end()), state7);
  EXPECT_NE(row7, std::vector<float>(saved.weights.begin() + kTrainRowDim, saved.weights.end()));
  EXPECT_EQ(params->dense()->Snapshot().weights, dense->weights);
}

TEST(CheckpointFixtures, TrainV3DeltaStillWrites) {
  const std::string dir = FreshDir("train_v3_delta");
  WriteTrainDeltaCheckpoints(dir);
  EXPECT_EQ(Slurp(dir + "/LATEST"), Slurp(kTrainV3DeltaFixture + "/LATEST"));
  for (const char* ckpt : {"/ckpt-3", "/ckpt-5"}) {
    const std::string fresh = dir + ckpt, fixture = kTrainV3DeltaFixture + ckpt;
    for (const char* file : {"shard-0-of-1", "worker-0.state"}) {
      EXPECT_EQ(Slurp(fresh + "/" + file), Slurp(fixture + "/" + file)) << ckpt << " " << file;
    }
    CheckpointManifest committed;
    const std::string committed_bytes = Slurp(fixture + "/MANIFEST");
    ParseSingleBlockFile("fixture MANIFEST", committed_bytes, "MANI", &committed);
    EXPECT_EQ(ManifestWithWallTime(Slurp(fresh + "/MANIFEST"), committed.wall_time()),
              committed_bytes)
        << ckpt;
  }
  std::system(("rm -rf " + dir).c_str());
}

// ---------------------------------------------------------------------------------------------
// PS mode: testdata/ps_v1
// ---------------------------------------------------------------------------------------------

// V = 12 rows in P = 3 partitions of 4 rows on S = 2 shards: shard 0 holds partitions 0 and 2
// (rows [0, 4) and [8, 12)) and the dense slice [0, 3); shard 1 partition 1 (rows [4, 8)) and
// the dense slice [3, 5). SYNC with 2 workers; Adagrad rows (learning rate 0.25, initial
// accumulator 0.75), SGD dense (learning rate 0.5). Every value below is exact in float32.
constexpr int kPsShards = 2;
constexpr int kPsWorkers = 2;
constexpr int64_t kPsRows = 12;
constexpr int kPsPartitions = 3;
constexpr int kPsRowDim = 2;
constexpr int64_t kPsDenseSize = 5;

float PsRowInit(int64_t row, int j) { return static_cast<float>(row) + 0.25f * j; }
float PsDenseInit(int64_t i) { return 0.5f * static_cast<float>(i) - 1.0f; }

ShardServer::Options PsShardOptions(int shard, int shards) {
  ShardServer::Options o;
  o.data.shard = shard;
  o.data.num_shards = shards;
  o.data.rows = kPsRows;
  o.data.partitions = kPsPartitions;
  o.data.row_dim = kPsRowDim;
  o.data.dense_size = kPsDenseSize;
  o.data.sparse_optimizer = ParseText<OptimizerConfig>(
      "type: ADAGRAD learning_rate: 0.25 initial_accumulator: 0.75");
  o.data.dense_optimizer = ParseText<OptimizerConfig>("type: SGD learning_rate: 0.5");
  o.data.row_init = [](int64_t row, float* out) {
    for (int j = 0; j < kPsRowDim; ++j) out[j] = PsRowInit(row, j);
  };
  o.data.dense_init = [](float* out) {
    for (int64_t i = 0; i < kPsDenseSize; ++i) out[i] = PsDenseInit(i);
  };
  o.consistency = SYNC;
  o.num_workers = kPsWorkers;
  return o;
}

std::vector<std::unique_ptr<ShardServer>> PsShards(int shards,
                                                   const std::string& checkpoint_dir = "") {
  std::vector<std::unique_ptr<ShardServer>> out;
  for (int s = 0; s < shards; ++s) {
    ShardServer::Options o = PsShardOptions(s, shards);
    o.data.checkpoint_dir = checkpoint_dir;
    auto server = ShardServer::Create(std::move(o));
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) out.push_back(std::move(server).value());
  }
  return out;
}

void PsPush(ShardServer* shard, int worker, int64_t step, std::vector<int64_t> ids,
            std::vector<float> row_grads, std::vector<float> dense_grad) {
  PushRequest req;
  req.set_worker_id(worker);
  req.set_step(step);
  PackArray(ids.data(), static_cast<int64_t>(ids.size()), req.mutable_ids());
  PackArray(row_grads.data(), static_cast<int64_t>(row_grads.size()), req.mutable_row_grads());
  PackArray(dense_grad.data(), static_cast<int64_t>(dense_grad.size()), req.mutable_dense_grad());
  PushResponse resp;
  const absl::Status s = shard->Push(req, &resp);
  EXPECT_TRUE(s.ok()) << s;
}

// Step 1 of both workers (applied: the mean of the two pushes), then worker 0's step 2 (kept:
// worker 1 has not pushed step 2), as the shards see them.
void PsTrain(std::vector<std::unique_ptr<ShardServer>>& shards) {
  ShardServer* s0 = shards[0].get();
  ShardServer* s1 = shards[1].get();
  // Step 1, worker 0: row 1 (shard 0) with [1, -1], row 5 (shard 1) with [0.5, -0.5].
  PsPush(s0, 0, 1, {1}, {1, -1}, {0.25, 0.5, 0.75});
  PsPush(s1, 0, 1, {5}, {0.5, -0.5}, {1.0, 1.25});
  // Step 1, worker 1: row 5 with [0.5, -0.5], row 9 (shard 0) with [1, -1].
  PsPush(s0, 1, 1, {9}, {1, -1}, {0.75, 0.75, 0.75});
  PsPush(s1, 1, 1, {5}, {0.5, -0.5}, {0.75, 0.75});
  // Step 2, worker 0 only.
  PsPush(s0, 0, 2, {2, 10}, {0.25, 0.5, 0.25, 0.5}, {0.125, 0.125, 0.125});
  PsPush(s1, 0, 2, {6}, {0.25, 0.5}, {0.125, 0.125});
}

std::map<int, WorkerState> PsWorkerStates() {
  return {{0, ParseText<WorkerState>("step: 2 examples: 64")},
          {1, ParseText<WorkerState>("step: 1 examples: 32")}};
}

// Writes the ps_v1 contents under `dir` as the chief's round does: COPY and WRITE on every
// shard, then the worker states, the MANIFEST and LATEST.
void WritePsCheckpoint(const std::string& dir) {
  auto shards = PsShards(kPsShards, dir);
  ASSERT_EQ(shards.size(), 2u);
  PsTrain(shards);
  auto ckpt = PrepareCheckpointDir(dir, 3);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  CheckpointManifest manifest;
  manifest.set_step(3);
  manifest.set_num_shards(kPsShards);
  manifest.set_table_rows(kPsRows);
  manifest.set_partitions(kPsPartitions);
  manifest.set_row_dim(kPsRowDim);
  manifest.set_dense_size(kPsDenseSize);
  manifest.set_created_by("pstrain PS job (2 shards, 2 workers, round 1)");
  for (auto& s : shards) ASSERT_TRUE(s->CopyForCheckpoint(1).ok());
  for (auto& s : shards) {
    auto written = s->WriteCheckpoint(1, CheckpointName(3));
    ASSERT_TRUE(written.ok()) << written.status();
    auto* f = manifest.add_file();
    f->set_name(written->file());
    f->set_bytes(written->bytes());
  }
  auto committed = CommitCheckpoint(dir, manifest, PsWorkerStates(), /*keep=*/3);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, dir + "/ckpt-3");
}

CheckpointManifest PsManifest() {
  return ParseText<CheckpointManifest>(R"pb(
    step: 3
    num_shards: 2
    num_workers: 2
    table_rows: 12
    partitions: 3
    row_dim: 2
    dense_size: 5
    file { name: "shard-0-of-2" bytes: 493 }
    file { name: "shard-1-of-2" bytes: 354 }
    file { name: "worker-0.state" bytes: 68 }
    file { name: "worker-1.state" bytes: 68 }
    created_by: "pstrain PS job (2 shards, 2 workers, round 1)"
    wall_time: 0
  )pb");
}

// Each shard's SHRD header (its InfoResponse at the copy) without the incarnation.
InfoResponse PsHeader(int shard) {
  return ParseText<InfoResponse>(shard == 0 ? R"pb(
    shard: 0
    map { rows: 12 partitions: 3 shards: 2 row_dim: 2 dense_size: 5 }
    ready: true
    last_step: 1
    dense_begin: 0
    dense_slice_size: 3
    sparse_optimizer: 0
    dense_optimizer: 1
    step: 1
  )pb"
                                            : R"pb(
    shard: 1
    map { rows: 12 partitions: 3 shards: 2 row_dim: 2 dense_size: 5 }
    ready: true
    last_step: 1
    dense_begin: 3
    dense_slice_size: 2
    sparse_optimizer: 0
    dense_optimizer: 1
    step: 1
  )pb");
}

template <typename T>
std::string Packed(std::vector<T> v) {
  std::string out;
  PackArray(v.data(), static_cast<int64_t>(v.size()), &out);
  return out;
}

// Each shard's CONS block: step 1 applied, worker 0 pushed step 2 (kept), worker 1 step 1.
ConsistencyState PsConsistency(int shard) {
  ConsistencyState c;
  c.set_applied(1);
  c.add_pushed(2);
  c.add_pushed(1);
  c.add_done(false);
  c.add_done(false);
  ConsistencyState::Pending* p = c.add_pending();
  p->set_step(2);
  p->set_worker(0);
  if (shard == 0) {
    p->set_ids(Packed<int64_t>({2, 10}));
    p->set_row_grads(Packed<float>({0.25, 0.5, 0.25, 0.5}));
    p->set_dense_grad(Packed<float>({0.125, 0.125, 0.125}));
  } else {
    p->set_ids(Packed<int64_t>({6}));
    p->set_row_grads(Packed<float>({0.25, 0.5}));
    p->set_dense_grad(Packed<float>({0.125, 0.125}));
  }
  return c;
}

// After step 1, each touched row r (1, 5, 9) got the mean gradient [0.5, -0.5]: its Adagrad
// accumulators are 0.75 + 0.25 = 1 and its weights moved by -0.25 * [0.5, -0.5] / 1.
std::vector<float> PsTrainedRow(int64_t r) {
  return {PsRowInit(r, 0) - 0.125f, PsRowInit(r, 1) + 0.125f};
}
// The dense vector after step 1: init - 0.5 * mean(worker 0's, worker 1's gradient).
const std::vector<float> kPsDense = {-1.25f, -0.8125f, -0.375f, 0.0625f, 0.5f};

struct PsGroup {
  int64_t begin, end;
  std::vector<int64_t> ids;
};

TEST(CheckpointFixtures, PsV1Reads) {
  const std::string ckpt = kPsFixture + "/ckpt-3";
  EXPECT_EQ(Slurp(kPsFixture + "/LATEST"), "ckpt-3\n");

  CheckpointManifest manifest;
  ParseSingleBlockFile(ckpt + "/MANIFEST", Slurp(ckpt + "/MANIFEST"), "MANI", &manifest);
  CheckpointManifest want = PsManifest();
  EXPECT_GT(manifest.wall_time(), 1.7e9);
  want.set_wall_time(manifest.wall_time());
  ExpectProtoEq(manifest, want);

  for (const auto& [w, state] : PsWorkerStates()) {
    const std::string name = absl::StrCat("worker-", w, ".state");
    WorkerState got;
    ParseSingleBlockFile(name, Slurp(ckpt + "/" + name), "WSTA", &got);
    ExpectProtoEq(got, state);
  }

  // The shard files, block by block.
  const std::vector<PsGroup> groups[kPsShards] = {{{0, 4, {1}}, {8, 12, {9}}}, {{4, 8, {5}}}};
  const int64_t dense_begin[kPsShards] = {0, 3}, dense_size[kPsShards] = {3, 2};
  for (int s = 0; s < kPsShards; ++s) {
    SCOPED_TRACE(absl::StrCat("shard ", s));
    const std::string name = absl::StrCat("shard-", s, "-of-2");
    const std::vector<Block> blocks = Blocks(name, Slurp(ckpt + "/" + name));
    ASSERT_EQ(blocks.size(), 2 + 2 * groups[s].size() + 1);
    EXPECT_EQ(blocks[0].tag, "SHRD");
    InfoResponse header;
    ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
    EXPECT_NE(header.incarnation(), 0u);
    header.clear_incarnation();
    ExpectProtoEq(header, PsHeader(s));
    EXPECT_EQ(blocks[1].tag, "CONS");
    ConsistencyState cons;
    ASSERT_TRUE(cons.ParseFromString(blocks[1].payload));
    ExpectProtoEq(cons, PsConsistency(s));

    auto r = BlockReader::Open(ckpt + "/" + name);
    ASSERT_TRUE(r.ok()) << r.status();
    Block skip;
    ASSERT_TRUE(*(*r)->Next(&skip));  // SHRD
    ASSERT_TRUE(*(*r)->Next(&skip));  // CONS
    for (const PsGroup& g : groups[s]) {
      std::vector<int64_t> ids;
      std::vector<float> weights, accum;
      auto meta = LoadEmbeddingRows(r->get(), [&](const EmbeddingMeta&,
                                                  absl::Span<const int64_t> i, const float* w,
                                                  const float* st) {
        ids.insert(ids.end(), i.begin(), i.end());
        weights.insert(weights.end(), w, w + i.size() * kPsRowDim);
        accum.insert(accum.end(), st, st + i.size() * kPsRowDim);
        return absl::OkStatus();
      });
      ASSERT_TRUE(meta.ok()) << meta.status();
      EXPECT_EQ(meta->begin, g.begin);
      EXPECT_EQ(meta->end, g.end);
      EXPECT_EQ(meta->dim, 2);
      EXPECT_EQ(meta->optimizer, ADAGRAD);
      EXPECT_EQ(meta->state_floats, 2);
      EXPECT_EQ(meta->last_step, 1);
      EXPECT_EQ(ids, g.ids);
      ASSERT_EQ(g.ids.size(), 1u);
      EXPECT_EQ(weights, PsTrainedRow(g.ids[0]));
      EXPECT_EQ(accum, (std::vector<float>{1, 1}));
    }
    auto dense = LoadDenseSnapshot(r->get());
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_EQ(dense->begin, dense_begin[s]);
    EXPECT_EQ(dense->size, dense_size[s]);
    EXPECT_EQ(dense->optimizer, SGD);
    EXPECT_EQ(dense->state_floats, 0);
    EXPECT_EQ(dense->last_step, 1);
    EXPECT_EQ(dense->weights, std::vector<float>(kPsDense.begin() + dense_begin[s],
                                                 kPsDense.begin() + dense_begin[s] + dense_size[s]));
    auto end = (*r)->PeekTag();
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(*end, "");
  }

  // And through the restore path of the PS mode: the checkpoint is chosen and verified, and
  // shards of the same layout get back every row, the dense slices and the SYNC bookkeeping
  // (with worker 0's kept push); one shard re-partitions everything onto itself.
  auto choice = ChooseCheckpoint(kPsFixture);
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_TRUE(choice->has_value());
  EXPECT_EQ((*choice)->dir, ckpt);
  for (int shards : {2, 1}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    auto restored = PsShards(shards);
    ASSERT_EQ(static_cast<int>(restored.size()), shards);
    std::vector<float> dense;
    for (int s = 0; s < shards; ++s) {
      ShardServer& server = *restored[s];
      ASSERT_TRUE(server.RestoreCheckpoint((*choice)->chain).ok());
      EXPECT_EQ(server.Info().step(), 1);
      if (shards == 2) ExpectProtoEq(server.consistency().Save(), PsConsistency(s));
      std::vector<int64_t> ids;
      for (int64_t row = 0; row < kPsRows; ++row) {
        if (PartitionMap(kPsRows, kPsPartitions, shards).ShardOf(row) == s) ids.push_back(row);
      }
      PullRequest req;
      PackArray(ids.data(), static_cast<int64_t>(ids.size()), req.mutable_ids());
      req.set_want_dense(true);
      PullResponse resp;
      ASSERT_TRUE(server.Pull(req, &resp).ok());
      ASSERT_EQ(resp.rows().size(), ids.size() * kPsRowDim * sizeof(float));
      for (size_t i = 0; i < ids.size(); ++i) {
        std::vector<float> row(kPsRowDim);
        std::memcpy(row.data(), resp.rows().data() + i * kPsRowDim * sizeof(float),
                    kPsRowDim * sizeof(float));
        const int64_t id = ids[i];
        const bool trained = id == 1 || id == 5 || id == 9;
        const std::vector<float> want =
            trained ? PsTrainedRow(id) : std::vector<float>{PsRowInit(id, 0), PsRowInit(id, 1)};
        EXPECT_EQ(row, want) << "row " << id;
      }
      std::vector<float> slice(resp.dense().size() / sizeof(float));
      std::memcpy(slice.data(), resp.dense().data(), resp.dense().size());
      dense.insert(dense.end(), slice.begin(), slice.end());
    }
    EXPECT_EQ(dense, kPsDense);
  }
}

TEST(CheckpointFixtures, PsV1StillWrites) {
  const std::string dir = FreshDir("ps_v1");
  const double before = WallTimeNow();
  WritePsCheckpoint(dir);
  const double after = WallTimeNow();
  const std::string fresh = dir + "/ckpt-3", fixture = kPsFixture + "/ckpt-3";
  EXPECT_EQ(Slurp(dir + "/LATEST"), Slurp(kPsFixture + "/LATEST"));
  for (const char* file : {"worker-0.state", "worker-1.state"}) {
    EXPECT_EQ(Slurp(fresh + "/" + file), Slurp(fixture + "/" + file)) << file;
  }
  // The shard files: identical but for the writing server's incarnation in SHRD.
  for (const char* file : {"shard-0-of-2", "shard-1-of-2"}) {
    SCOPED_TRACE(file);
    const std::string committed = Slurp(fixture + "/" + file);
    const std::vector<Block> blocks = Blocks(file, committed);
    ASSERT_FALSE(blocks.empty());
    InfoResponse header;
    ASSERT_TRUE(header.ParseFromString(blocks[0].payload));
    EXPECT_EQ(ShardFileWithIncarnation(Slurp(fresh + "/" + file), header.incarnation()),
              committed);
  }
  // The MANIFEST: identical but for wall_time and the shard files' sizes (the incarnation is a
  // varint: its length varies), which must be the fresh files' sizes.
  CheckpointManifest written, committed;
  const std::string written_bytes = Slurp(fresh + "/MANIFEST");
  const std::string committed_bytes = Slurp(fixture + "/MANIFEST");
  ParseSingleBlockFile("fresh MANIFEST", written_bytes, "MANI", &written);
  ParseSingleBlockFile("fixture MANIFEST", committed_bytes, "MANI", &committed);
  EXPECT_GE(written.wall_time(), before - 1);
  EXPECT_LE(written.wall_time(), after + 1);
  ASSERT_EQ(written.file_size(), committed.file_size());
  for (int i = 0; i < written.file_size(); ++i) {
    EXPECT_EQ(written.file(i).bytes(), Slurp(fresh + "/" + written.file(i).name()).size());
    written.mutable_file(i)->set_bytes(committed.file(i).bytes());
  }
  written.set_wall_time(committed.wall_time());
  std::vector<Block> blocks = Blocks("fresh MANIFEST", written_bytes);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(Frame(blocks), written_bytes);
  blocks[0].payload = written.SerializeAsString();
  EXPECT_EQ(Frame(blocks), committed_bytes);
  std::system(("rm -rf " + dir).c_str());
}

TEST(CheckpointFixtures, RegenerateWhenAsked) {
  if (!Regenerating()) {
    GTEST_SKIP() << "set PSTRAIN_REGENERATE_FIXTURES=1 to rewrite " << kTrainV2Fixture << " and "
                 << kPsFixture;
  }
  // train_v1 is a fixture of an old version: today's code reads it but no longer writes it.
  ASSERT_EQ(std::system(
                ("rm -rf " + kTrainV2Fixture + " " + kTrainV3DeltaFixture + " " + kPsFixture)
                    .c_str()),
            0);
  WriteTrainCheckpoint(kTrainV2Fixture);
  WriteTrainDeltaCheckpoints(kTrainV3DeltaFixture);
  WritePsCheckpoint(kPsFixture);
}

}  // namespace
}  // namespace pstrain
