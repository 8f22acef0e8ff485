// worker/train/checkpoint.h: checkpoints of in-process parameters (`pstrain train`, allreduce).
// (Their bytes are pinned by tests/checkpoint/fixtures_test.cc; stop-and-resume runs by
// trainer_test.cc.)
#include "worker/train/checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using pstrain::testing::FreshDir;
using pstrain::testing::Slurp;

struct Params {
  explicit Params(int64_t rows = 10) {
    config.mutable_model()->set_embedding_dim(2);
    config.mutable_model()->add_hidden(2);
    model = std::move(Model::Create(config.model(), 2)).value();
    params = std::move(LocalParams::Create(*model, rows, config, 1)).value();
    description = std::move(DescribeModel(config)).value();
  }
  // One update of rows 1 and 7 and the dense vector.
  void Train(int64_t step) {
    const std::vector<int64_t> ids = {1, 7};
    const std::vector<float> grads(ids.size() * params->row_dim(), 0.5f);
    const std::vector<float> dense(params->dense_size(), 0.25f);
    ASSERT_TRUE(params->Push(ids, grads.data(), dense.data(), step).ok());
  }
  Config config;
  std::unique_ptr<Model> model;
  std::unique_ptr<LocalParams> params;
  ModelDescription description;
};

std::vector<std::string> Files(const std::string& ckpt) {
  std::vector<std::string> out;
  for (const char* f : {"shard-0-of-1", "worker-0.state", "MANIFEST"}) {
    out.push_back(Slurp(ckpt + "/" + f));
  }
  return out;
}

// A checkpoint at the step LATEST already names (a scheduled checkpoint on the last step, then
// the final one; or a finished job resumed) leaves the committed checkpoint as it is. It used to
// be rewritten in place: its MANIFEST was removed first, so a crash during the rewrite left LATEST
// naming an incomplete checkpoint (with checkpoint.keep = 1, the job then refused to start).
TEST(LocalCheckpoint, ASaveAtTheCommittedStepLeavesItAsItIs) {
  const std::string dir = FreshDir("same_step");
  Params p;
  p.Train(1);
  WorkerState state;
  state.set_step(5);
  state.set_examples(100);
  auto first = SaveCheckpoint(dir, state, *p.params, /*keep=*/1, p.description);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<std::string> committed = Files(*first);
  state.set_examples(101);  // would change worker-0.state (and the MANIFEST's wall_time would)
  auto again = SaveCheckpoint(dir, state, *p.params, 1, p.description);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(Files(*first), committed);

  // A later step is written as usual, and retention (keep 1) removes the older one.
  p.Train(6);
  state.set_step(6);
  auto next = SaveCheckpoint(dir, state, *p.params, 1, p.description);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, dir + "/ckpt-6");
  EXPECT_FALSE(PathExists(*first));

  // A committed checkpoint that no longer verifies is written again.
  std::string shard = Slurp(*next + "/shard-0-of-1");
  shard[20] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(*next + "/shard-0-of-1", shard).ok());
  ASSERT_FALSE(IsCommittedCheckpoint(dir, 6));
  ASSERT_TRUE(SaveCheckpoint(dir, state, *p.params, 1, p.description).ok());
  EXPECT_TRUE(IsCommittedCheckpoint(dir, 6));
  Params restored;
  WorkerState restored_state;
  auto r = RestoreLatestCheckpoint(dir, restored.params.get(), &restored_state,
                                   restored.description);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status();
  EXPECT_EQ(restored_state.examples(), 101);
  const EmbeddingSnapshot a = p.params->embedding()->Snapshot();
  const EmbeddingSnapshot b = restored.params->embedding()->Snapshot();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.state, b.state);
  std::system(("rm -rf " + dir).c_str());
}

// Every checkpoint records the model it was trained for, and a restore for another feature layout
// or model shape is refused naming the field, also when the shapes agree (a hash seed changes no
// shape: before, such a checkpoint was restored silently and every row meant another feature).
TEST(LocalCheckpoint, RecordsTheModelAndRefusesAnother) {
  const std::string dir = FreshDir("describe");
  Params p;
  p.Train(1);
  WorkerState state;
  state.set_step(1);
  auto saved = SaveCheckpoint(dir, state, *p.params, 1, p.description);
  ASSERT_TRUE(saved.ok()) << saved.status();
  CheckpointManifest manifest;
  ASSERT_TRUE(ReadManifest(*saved, &manifest).ok());
  EXPECT_EQ(manifest.version(), kManifestVersion);
  ASSERT_TRUE(manifest.has_model());
  EXPECT_EQ(manifest.model().features().field_size(), 39);
  EXPECT_EQ(manifest.model().features().hash_seed(), 0x5eedu);
  EXPECT_EQ(manifest.model().model().embedding_dim(), 2);
  EXPECT_EQ(manifest.model().init_seed(), 42u);

  struct Case {
    const char* what;
    std::function<void(Config*)> change;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"hash seed", [](Config* c) { c->mutable_features()->set_hash_seed(7); },
       "features.hash_seed: 24301 in the checkpoint, 7 in the config"},
      {"vocab", [](Config* c) { c->mutable_features()->set_categorical_vocab_size(999); },
       "features.field[13] 'C1'.vocab_size: 1000000 in the checkpoint, 999 in the config"},
      {"numeric mode", [](Config* c) { c->mutable_features()->set_numeric_mode(DENSE); },
       "features.field[0] 'I1'.numeric_mode: LOG_SQUARED_BUCKET in the checkpoint, DENSE"},
      {"fields",
       [](Config* c) {
         FieldSpec* f = c->mutable_features()->add_field();
         f->set_name("extra");
       },
       "features: 39 fields in the checkpoint, 40 in the config (field[39] 'extra'"},
      {"embedding dim", [](Config* c) { c->mutable_model()->set_embedding_dim(3); },
       "model.embedding_dim: 2 in the checkpoint, 3 in the config"},
      {"layers", [](Config* c) { c->mutable_model()->add_hidden(4); },
       "model.hidden: [2] in the checkpoint, [2, 4] in the config"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Config other = p.config;
    c.change(&other);
    auto wanted = DescribeModel(other);
    ASSERT_TRUE(wanted.ok()) << wanted.status();
    Params restored;  // the same shapes: only the description tells the difference
    WorkerState restored_state;
    auto r = RestoreLatestCheckpoint(dir, restored.params.get(), &restored_state, *wanted);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find(c.field), absl::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find(*saved), absl::string_view::npos) << r.status();
    EXPECT_EQ(restored.params->embedding()->Snapshot().rows(), 0);  // nothing was loaded
  }
  // What changes no saved value's meaning is accepted: the optimizer, the label's name, the
  // precision, the seed of rows never trained (they come from the checkpoint's own rule).
  Config same = p.config;
  same.mutable_sparse_optimizer()->set_type(SGD);
  same.mutable_features()->set_label_name("clicked");
  same.mutable_train()->set_seed(99);
  Params restored;
  WorkerState restored_state;
  auto r = RestoreLatestCheckpoint(dir, restored.params.get(), &restored_state,
                                   *DescribeModel(same));
  EXPECT_TRUE(r.ok()) << r.status();
  std::system(("rm -rf " + dir).c_str());
}

// ---- Incremental checkpoints (checkpoint.incremental_every) ----

// Every value a checkpoint holds: the rows with their optimizer slots, the dense weights and
// slots, and the stores' steps.
struct Values {
  explicit Values(LocalParams& p)
      : rows(p.embedding()->Snapshot()), dense(p.dense()->Snapshot()) {}
  EmbeddingSnapshot rows;
  DenseSnapshot dense;
};

void ExpectSameValues(const Values& a, const Values& b) {
  EXPECT_EQ(a.rows.ids, b.rows.ids);
  EXPECT_EQ(a.rows.weights, b.rows.weights);
  EXPECT_EQ(a.rows.state, b.rows.state);
  EXPECT_EQ(a.rows.last_step, b.rows.last_step);
  EXPECT_EQ(a.dense.weights, b.dense.weights);
  EXPECT_EQ(a.dense.state, b.dense.state);
  EXPECT_EQ(a.dense.last_step, b.dense.last_step);
}

// A replica of 2000 rows trained a few steps at a time on random rows (a few percent per step),
// checkpointed after each few steps with deltas.
struct IncrementalJob {
  explicit IncrementalJob(const std::string& dir, int every) : dir(dir), deltas(every) {}
  // `steps` steps, each updating 40 random rows and the dense vector.
  void Train(int steps) {
    for (int i = 0; i < steps; ++i) {
      ++step;
      std::vector<int64_t> ids;
      for (int64_t r = 0; r < p.params->embedding()->end(); ++r) {
        if (rng.UniformDouble() < 0.02) ids.push_back(r);
      }
      std::vector<float> grads(ids.size() * p.params->row_dim());
      for (float& g : grads) g = static_cast<float>(rng.UniformDouble() - 0.5);
      std::vector<float> dense(p.params->dense_size());
      for (float& g : dense) g = static_cast<float>(rng.UniformDouble() - 0.5);
      ASSERT_TRUE(p.params->Push(ids, grads.data(), dense.data(), step).ok());
    }
  }
  std::string Save() {
    WorkerState state;
    state.set_step(step);
    auto saved = SaveCheckpoint(dir, state, *p.params, /*keep=*/30, p.description, &deltas);
    EXPECT_TRUE(saved.ok()) << saved.status();
    return saved.ok() ? *saved : "";
  }
  const std::string dir;
  Params p{2000};
  ReplicaDeltas deltas;
  Rng rng{11};
  int64_t step = 0;
};

CheckpointManifest ManifestOf(const std::string& ckpt) {
  CheckpointManifest m;
  EXPECT_TRUE(ReadManifest(ckpt, &m).ok()) << ckpt;
  return m;
}

// Restores the newest usable checkpoint of `dir` into a fresh replica; returns its directory.
std::string RestoreInto(const std::string& dir, Params* fresh, ReplicaDeltas* deltas = nullptr) {
  WorkerState state;
  auto r = RestoreLatestCheckpoint(dir, fresh->params.get(), &state, fresh->description, deltas);
  EXPECT_TRUE(r.ok() && r->has_value()) << r.status();
  return r.ok() && r->has_value() ? **r : "";
}

// A full checkpoint and 10 deltas (incremental_every 11): each delta holds only the rows updated
// since the checkpoint before it, names its base and parent, and the restore of the last one
// (the chain) is bit-identical to the live parameters: every row, optimizer slot, dense value and
// step. The 12th checkpoint is full again.
TEST(IncrementalCheckpoint, FullPlusTenDeltasRestoresBitIdentically) {
  const std::string dir = FreshDir("incremental");
  IncrementalJob job(dir, 11);
  std::vector<std::string> ckpts;
  for (int c = 0; c < 11; ++c) {
    job.Train(c == 0 ? 60 : 3);  // most rows trained before the full one
    ckpts.push_back(job.Save());
  }
  const CheckpointManifest full = ManifestOf(ckpts[0]);
  EXPECT_FALSE(full.has_delta());
  EXPECT_EQ(full.version(), kManifestVersion);
  const int64_t full_bytes = full.file(0).bytes();
  for (int c = 1; c <= 10; ++c) {
    SCOPED_TRACE(ckpts[c]);
    const CheckpointManifest m = ManifestOf(ckpts[c]);
    ASSERT_TRUE(m.has_delta());
    EXPECT_EQ(m.version(), kDeltaManifestVersion);
    EXPECT_EQ(m.delta().base_step(), 60);
    EXPECT_EQ(m.delta().parent_step(), 60 + 3 * (c - 1));
    EXPECT_EQ(m.delta().depth(), c);
    // 3 steps of 2% of the rows: about 6% of them, where the full one holds most of the table.
    EXPECT_LT(m.file(0).bytes() * 3, full_bytes);
  }
  const Values live(*job.p.params);
  Params restored(2000);
  EXPECT_EQ(RestoreInto(dir, &restored), ckpts[10]);
  ExpectSameValues(Values(*restored.params), live);

  job.Train(3);
  EXPECT_FALSE(ManifestOf(job.Save()).has_delta());  // the 12th: full
  std::system(("rm -rf " + dir).c_str());
}

// A delta made after a restore builds on the restored checkpoint and holds the rows updated
// since the restore; the chain then restores bit-identically again.
TEST(IncrementalCheckpoint, DeltasAfterARestoreContinueTheChain) {
  const std::string dir = FreshDir("incremental_resume");
  {
    IncrementalJob job(dir, 5);
    for (int c = 0; c < 3; ++c) {
      job.Train(2);
      job.Save();
    }
  }
  // A second process: restore (ckpt-6, a delta of depth 2), train, save.
  IncrementalJob job(dir, 5);
  job.step = 6;
  EXPECT_EQ(RestoreInto(dir, &job.p, &job.deltas), dir + "/ckpt-6");
  job.Train(2);
  const CheckpointManifest m = ManifestOf(job.Save());
  ASSERT_TRUE(m.has_delta());
  EXPECT_EQ(m.delta().parent_step(), 6);
  EXPECT_EQ(m.delta().base_step(), 2);
  EXPECT_EQ(m.delta().depth(), 3);
  Params restored(2000);
  EXPECT_EQ(RestoreInto(dir, &restored), dir + "/ckpt-8");
  ExpectSameValues(Values(*restored.params), Values(*job.p.params));
  std::system(("rm -rf " + dir).c_str());
}

// A broken delta (a flipped byte, a missing file, a missing MANIFEST; in the newest delta or in a
// link of its chain) falls back to the newest checkpoint whose chain is whole, which restores the
// values the job had then; never DATA_LOSS while an older good chain exists.
TEST(IncrementalCheckpoint, ABrokenDeltaFallsBackToTheLastGoodChain) {
  const std::string dir = FreshDir("incremental_broken");
  IncrementalJob job(dir, 10);
  std::vector<Values> at;
  for (int c = 0; c < 6; ++c) {  // ckpt-2 full, ckpt-4 .. ckpt-12 deltas
    job.Train(2);
    job.Save();
    at.emplace_back(*job.p.params);
  }
  auto ckpt = [&](int c) { return CheckpointPath(dir, 2 * (c + 1)); };
  struct Break {
    const char* what;
    int checkpoint;  // whose file breaks
    std::function<void(const std::string&)> apply;
    int expect;  // the checkpoint restored then
  };
  const std::vector<Break> breaks = {
      {"a flipped byte in the newest delta", 5,
       [](const std::string& c) {
         std::string b = Slurp(c + "/shard-0-of-1");
         b[b.size() / 2] ^= 0x10;
         ASSERT_TRUE(WriteFileAtomic(c + "/shard-0-of-1", b).ok());
       },
       4},
      {"a missing shard file in a link", 3,
       [](const std::string& c) { ASSERT_EQ(std::remove((c + "/shard-0-of-1").c_str()), 0); }, 2},
      {"a missing MANIFEST in a link", 1,
       [](const std::string& c) { ASSERT_EQ(std::remove((c + "/MANIFEST").c_str()), 0); }, 0},
  };
  for (const Break& b : breaks) {
    SCOPED_TRACE(b.what);
    b.apply(ckpt(b.checkpoint));
    auto choice = ChooseCheckpoint(dir);
    ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
    EXPECT_EQ((*choice)->dir, ckpt(b.expect));
    EXPECT_EQ((*choice)->chain.size(), static_cast<size_t>(b.expect + 1));
    Params restored(2000);
    EXPECT_EQ(RestoreInto(dir, &restored), ckpt(b.expect));
    ExpectSameValues(Values(*restored.params), at[b.expect]);
  }
  // The refusal names the checkpoint and the broken link.
  auto chain = VerifyCheckpointChain(ckpt(4));
  ASSERT_FALSE(chain.ok());
  EXPECT_EQ(chain.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(chain.status().message().find(absl::StrCat("a delta of ckpt-2): the link ckpt-8 of its chain")),
            absl::string_view::npos)
      << chain.status();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace pstrain
