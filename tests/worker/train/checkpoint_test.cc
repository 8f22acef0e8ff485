// worker/train/checkpoint.h: checkpoints of in-process parameters (`pstrain train`, allreduce).
// (Their bytes are pinned by tests/checkpoint/fixtures_test.cc; stop-and-resume runs by
// trainer_test.cc.)
#include "worker/train/checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/file.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

std::string FreshDir(const std::string& name) {
  std::string templ = testing::TempDir() + "/" + name + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return testing::TempDir() + "/" + name;
  return templ;
}

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

struct Params {
  Params() {
    config.mutable_model()->set_embedding_dim(2);
    config.mutable_model()->add_hidden(2);
    model = std::move(Model::Create(config.model(), 2)).value();
    params = std::move(LocalParams::Create(*model, 10, config, 1)).value();
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

}  // namespace
}  // namespace pstrain
