#include "common/config.h"

#include <dirent.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

TEST(Config, EveryFileInConfigsLoadsAndValidates) {
  const std::string dir = std::string(PSTRAIN_SOURCE_DIR) + "/configs";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  int loaded = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 10 || name.substr(name.size() - 10) != ".textproto") continue;
    SCOPED_TRACE(name);
    auto c = LoadConfigFile(dir + "/" + name);
    ASSERT_TRUE(c.ok()) << c.status();
    // Config files may omit data paths (the flags supply them); validate everything else.
    Config copy = *c;
    for (auto& ch : *copy.mutable_data()->mutable_train()) if (ch.path_size() == 0) ch.add_path("x");
    for (auto& ch : *copy.mutable_data()->mutable_eval()) if (ch.path_size() == 0) ch.add_path("x");
    EXPECT_TRUE(ValidateConfig(copy).ok()) << ValidateConfig(copy);
    ++loaded;
  }
  closedir(d);
  EXPECT_GE(loaded, 1);
}

TEST(Config, UnknownFieldIsRefusedWithLocation) {
  auto c = ParseConfigText("model { embeding_dim: 8 }", "x.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("x.textproto:1"));
  EXPECT_THAT(c.status().message(), HasSubstr("embeding_dim"));
}

TEST(Config, BadValueIsRefused) {
  auto c = ParseConfigText("model { embedding_dim: \"eight\" }", "y.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("y.textproto:1"));
}

TEST(Config, OverrideScalarsEnumsStringsAndLists) {
  Config c;
  ASSERT_TRUE(ApplyOverride("train.batch_size=512", &c).ok());
  ASSERT_TRUE(ApplyOverride("model.type=FM", &c).ok());
  ASSERT_TRUE(ApplyOverride("train.model_dir=/tmp/x y", &c).ok());
  ASSERT_TRUE(ApplyOverride("model.hidden=[64, 32]", &c).ok());
  ASSERT_TRUE(ApplyOverride("data.train[0].path=[\"a\", \"b\"]", &c).ok());
  ASSERT_TRUE(ApplyOverride("data.train[0].weight=0.5", &c).ok());
  EXPECT_EQ(c.train().batch_size(), 512);
  EXPECT_EQ(c.model().type(), FM);
  EXPECT_EQ(c.train().model_dir(), "/tmp/x y");
  ASSERT_EQ(c.model().hidden_size(), 2);
  EXPECT_EQ(c.model().hidden(1), 32);
  ASSERT_EQ(c.data().train_size(), 1);
  EXPECT_EQ(c.data().train(0).path_size(), 2);
  EXPECT_DOUBLE_EQ(c.data().train(0).weight(), 0.5);
}

TEST(Config, OverrideErrorsNameThePath) {
  Config c;
  absl::Status s = ApplyOverride("train.batchsize=3", &c);
  EXPECT_THAT(s.message(), HasSubstr("batchsize"));
  s = ApplyOverride("train.batch_size=lots", &c);
  EXPECT_THAT(s.message(), HasSubstr("train.batch_size"));
  s = ApplyOverride("model.type=XGBOOST", &c);
  EXPECT_THAT(s.message(), HasSubstr("model.type"));
  s = ApplyOverride("novalue", &c);
  EXPECT_FALSE(s.ok());
  s = ApplyOverride("data.train[3].weight=1", &c);
  EXPECT_THAT(s.message(), HasSubstr("past its end"));
}

TEST(Config, ValidationNamesTheField) {
  Config c;
  c.mutable_model()->set_embedding_dim(-3);
  absl::Status s = ValidateConfig(c);
  EXPECT_THAT(s.message(), HasSubstr("model.embedding_dim"));
  c = Config();
  c.mutable_data()->set_max_bad_record_fraction(2);
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("data.max_bad_record_fraction"));
  c = Config();
  c.mutable_sparse_optimizer()->set_learning_rate(0);
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("sparse_optimizer.learning_rate"));
  c = Config();
  c.mutable_cluster()->set_consistency(BOUNDED);
  c.mutable_cluster()->set_staleness(-1);
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("cluster.staleness: must be >= 0"));
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("BOUNDED"));
  c = Config();
  c.mutable_cluster()->set_dense_sync_steps(0);
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("cluster.dense_sync_steps: must be >= 1"));
  c.mutable_cluster()->set_dense_sync_steps(2);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.mutable_cluster()->set_consistency(SYNC);  // where it does not apply (as prefetch_pulls)
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(Config, DefaultsResolveThreadsFromCores) {
  ThreadConfig t;
  ResolveThreadDefaults(2, &t);
  EXPECT_EQ(t.towers(), 2);
  EXPECT_EQ(t.intra_op_threads(), 1);
  EXPECT_GE(t.inter_op_threads(), 1);
  ThreadConfig u;
  u.set_towers(1);
  ResolveThreadDefaults(8, &u);
  EXPECT_EQ(u.intra_op_threads(), 8);
}

// The schema defaults are the tuned values (docs/PERFORMANCE.md "What the tuning found"), and an
// absent dense optimizer becomes Adam 1e-3 while an explicit one is kept.
TEST(Config, SchemaDefaultsAndDenseOptimizerDefault) {
  Config c;
  EXPECT_FLOAT_EQ(c.sparse_optimizer().initial_accumulator(), 1e-4f);
  EXPECT_EQ(c.train().batch_size(), 256);
  ApplyConfigDefaults(&c);
  EXPECT_EQ(c.dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c.dense_optimizer().learning_rate(), 1e-3f);
  EXPECT_EQ(c.sparse_optimizer().type(), ADAGRAD);
  ASSERT_TRUE(ApplyOverride("dense_optimizer.learning_rate=0.01", &c).ok());
  ApplyConfigDefaults(&c);
  EXPECT_EQ(c.dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c.dense_optimizer().learning_rate(), 0.01f);

  Config explicit_sgd;
  explicit_sgd.mutable_dense_optimizer()->set_type(SGD);
  ApplyConfigDefaults(&explicit_sgd);
  EXPECT_EQ(explicit_sgd.dense_optimizer().type(), SGD);
  EXPECT_FLOAT_EQ(explicit_sgd.dense_optimizer().learning_rate(), 0.05f);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// A config of the defaults with `sets` applied ("TRAIN" adds a train channel without eval: a
// training config), refused by ValidateConfig with `error`.
struct ConfigErrorCase {
  std::vector<const char*> sets;
  std::string error;
};

void ExpectConfigErrors(const std::vector<ConfigErrorCase>& cases) {
  for (const ConfigErrorCase& c : cases) {
    Config config;
    ApplyConfigDefaults(&config);
    for (const char* set : c.sets) {
      if (std::string(set) == "TRAIN") {
        Channel* ch = config.mutable_data()->add_train();
        ch->set_name("train");
        ch->add_path("x");
        ch->set_format(CRITEO_TSV);
        continue;
      }
      ASSERT_TRUE(ApplyOverride(set, &config).ok()) << set;
    }
    const absl::Status s = ValidateConfig(config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_EQ(s.message(), c.error);
  }
}

// Learning-rate schedules are validated with the config, naming the field and what is expected.
TEST(Config, ScheduleErrorsNameTheField) {
  ExpectConfigErrors({
      {{"dense_optimizer.schedule.decay=COSINE"},
       "config dense_optimizer.schedule.decay_steps: must be > 0 for decay COSINE, got 0"},
      {{"sparse_optimizer.schedule.warmup_steps=-1"},
       "config sparse_optimizer.schedule.warmup_steps: must be >= 0, got -1"},
      {{"sparse_optimizer.schedule.decay=EXPONENTIAL", "sparse_optimizer.schedule.decay_steps=10",
        "sparse_optimizer.schedule.decay_rate=1.5"},
       "config sparse_optimizer.schedule.decay_rate: must be in (0, 1], got 1.5"},
      {{"dense_optimizer.schedule.min_factor=-0.5"},
       "config dense_optimizer.schedule.min_factor: must be in [0, 1], got -0.5"},
  });
  Config ok;
  ApplyConfigDefaults(&ok);
  for (const char* set : {"dense_optimizer.schedule.warmup_steps=100",
                          "dense_optimizer.schedule.decay=STEP",
                          "dense_optimizer.schedule.decay_steps=1000"}) {
    ASSERT_TRUE(ApplyOverride(set, &ok).ok()) << set;
  }
  EXPECT_TRUE(ValidateConfig(ok).ok()) << ValidateConfig(ok);
}

// Early stopping, keep_best and the validation split are validated with the config, naming the
// field and what is expected.
TEST(Config, EarlyStoppingErrorsNameTheField) {
  ExpectConfigErrors({
      {{"data.validation_fraction=1"}, "config data.validation_fraction: must be in [0, 1), got 1"},
      {{"data.validation_fraction=-0.1"},
       "config data.validation_fraction: must be in [0, 1), got -0.1"},
      {{"train.early_stopping.patience_evals=-2"},
       "config train.early_stopping.patience_evals: must be >= 0 (0 = never stop), got -2"},
      {{"train.early_stopping.min_delta=-0.5"},
       "config train.early_stopping.min_delta: must be finite and >= 0, got -0.5"},
      {{"TRAIN", "train.early_stopping.patience_evals=2", "train.eval_every_steps=10"},
       "config train.early_stopping: needs evaluation data: an eval channel (data.eval, --eval) "
       "or data.validation_fraction > 0"},
      {{"TRAIN", "checkpoint.keep_best=true"},
       "config checkpoint.keep_best: needs evaluation data: an eval channel (data.eval, --eval) "
       "or data.validation_fraction > 0"},
      {{"checkpoint.keep_best=true", "checkpoint.every_seconds=0"},
       "config checkpoint.keep_best: needs periodic checkpoints (checkpoint.every_steps or "
       "every_seconds > 0): the best is chosen among them"},
      {{"data.validation_fraction=0.1", "train.early_stopping.patience_evals=2"},
       "config train.early_stopping.patience_evals: needs periodic evaluations: set "
       "train.eval_every_steps > 0 (or checkpoint.keep_best: true, which evaluates every "
       "checkpoint)"},
  });
  Config ok;
  ApplyConfigDefaults(&ok);
  for (const char* set : {"data.validation_fraction=0.1", "train.early_stopping.patience_evals=2",
                          "train.early_stopping.metric=LOGLOSS", "checkpoint.keep_best=true",
                          "checkpoint.every_steps=50"}) {
    ASSERT_TRUE(ApplyOverride(set, &ok).ok()) << set;
  }
  EXPECT_TRUE(ValidateConfig(ok).ok()) << ValidateConfig(ok);
}

}  // namespace
}  // namespace pstrain
