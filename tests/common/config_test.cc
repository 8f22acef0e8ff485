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
  c = Config();
  EXPECT_EQ(c.checkpoint().incremental_every(), 1);  // every checkpoint full unless asked
  c.mutable_checkpoint()->set_incremental_every(0);
  EXPECT_THAT(ValidateConfig(c).message(),
              HasSubstr("checkpoint.incremental_every: must be >= 1 (1: every checkpoint is "
                        "full), got 0"));
  c.mutable_checkpoint()->set_incremental_every(10);
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(Config, AnswerBudgetIsBoundedAndFitsTheLargestMessage) {
  Config c;
  EXPECT_EQ(c.cluster().answer_budget_mb(), 0);  // twice the largest message
  c.mutable_cluster()->set_answer_budget_mb(-1);
  EXPECT_THAT(ValidateConfig(c).message(),
              HasSubstr("cluster.answer_budget_mb: must be in [0, 1048576]"));
  c.mutable_cluster()->set_answer_budget_mb((1 << 20) + 1);
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("got 1048577"));
  c.mutable_cluster()->set_max_message_mb(256);
  c.mutable_cluster()->set_answer_budget_mb(128);
  EXPECT_THAT(ValidateConfig(c).message(),
              HasSubstr("cluster.answer_budget_mb: must be at least cluster.max_message_mb (256)"));
  c.mutable_cluster()->set_answer_budget_mb(256);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.mutable_cluster()->set_max_message_mb(0);  // computed: the shard checks it when it starts
  c.mutable_cluster()->set_answer_budget_mb(1);
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(Config, DefaultsResolveThreadsFromCores) {
  Config t;
  ResolveThreadDefaults(2, &t);
  EXPECT_EQ(t.threads().towers(), 2);
  EXPECT_EQ(t.threads().intra_op_threads(), 1);
  EXPECT_GE(t.threads().inter_op_threads(), 1);
  Config u;
  u.mutable_threads()->set_towers(1);
  ResolveThreadDefaults(8, &u);
  EXPECT_EQ(u.threads().intra_op_threads(), 8);
}

// The rules of docs/CONFIG.md "The update batch": with train.global_batch_size, the cores change
// the towers and threads that compute a step, never the step's examples; without it, the update
// batch is towers x batch_size and grows with the cores.
struct Shape {
  int towers, intra, inter, batch;
  int64_t step;
};
Shape Resolve(int cores, int global, int workers = 1, int worker = 0) {
  Config c;
  if (global > 0) c.mutable_train()->set_global_batch_size(global);
  ResolveThreadDefaults(cores, &c, /*omp_num_threads=*/0, worker, workers);
  return {c.threads().towers(), c.threads().intra_op_threads(), c.threads().inter_op_threads(),
          c.train().batch_size(), StepBatch(c.train(), c.threads(), worker, workers)};
}

TEST(Config, AGlobalBatchKeepsTheStepWhateverTheCores) {
  // {cores, towers, intra_op, inter_op, per-tower batch} with global_batch_size 512. From 8
  // cores on, inter_op / 2 cores are left to the parsers and the trainer thread.
  const int expected[][5] = {{1, 1, 1, 1, 512},  {2, 2, 1, 1, 256},  {4, 4, 1, 2, 128},
                             {8, 6, 1, 4, 86},   {16, 14, 1, 4, 37}, {72, 16, 4, 4, 32},
                             {96, 16, 5, 4, 32}};
  for (const auto& e : expected) {
    const Shape s = Resolve(e[0], 512);
    SCOPED_TRACE(testing::Message() << e[0] << " cores");
    EXPECT_EQ(s.step, 512);  // the update batch
    EXPECT_EQ(s.towers, e[1]);
    EXPECT_EQ(s.intra, e[2]);
    EXPECT_EQ(s.inter, e[3]);
    EXPECT_EQ(s.batch, e[4]);
    EXPECT_LE(s.towers * s.intra, e[0]);  // never more compute threads than cores
  }
  // A share that does not divide: the towers split it, the largest share is the capacity.
  const Shape odd = Resolve(12, 500);
  EXPECT_EQ(odd.step, 500);
  EXPECT_EQ(odd.towers, 10);
  EXPECT_EQ(odd.batch, 50);  // ceil(500 / 10)
  // A small global batch: towers of at least 32 examples, the rest intra-op threads.
  const Shape small = Resolve(16, 64);
  EXPECT_EQ(small.towers, 2);
  EXPECT_EQ(small.intra, 7);
  EXPECT_EQ(small.batch, 32);
  // Below 32 examples in all: one tower.
  EXPECT_EQ(Resolve(16, 20).towers, 1);
}

TEST(Config, AGlobalBatchIsSharedByTheWorkers) {
  // 4 workers (PS hosts or allreduce ranks) of 4 cores share 512: 128 each, 4 towers of 32.
  for (int w = 0; w < 4; ++w) {
    const Shape s = Resolve(4, 512, 4, w);
    EXPECT_EQ(s.step, 128);
    EXPECT_EQ(s.towers, 4);
    EXPECT_EQ(s.batch, 32);
  }
  // 3 workers share 512 as 171 + 171 + 170.
  EXPECT_EQ(Resolve(8, 512, 3, 0).step, 171);
  EXPECT_EQ(Resolve(8, 512, 3, 1).step, 171);
  EXPECT_EQ(Resolve(8, 512, 3, 2).step, 170);
}

TEST(Config, WithoutAGlobalBatchTheUpdateBatchGrowsWithTheCores) {
  // The schema default (global_batch_size 0): a tower per core of batch_size 256 each.
  const int cores[] = {1, 2, 16, 72};
  for (int n : cores) {
    const Shape s = Resolve(n, 0);
    EXPECT_EQ(s.towers, n);
    EXPECT_EQ(s.intra, 1);
    EXPECT_EQ(s.batch, 256);
    EXPECT_EQ(s.step, 256 * n);
  }
}

// A config that validates: one train channel, the Criteo preset.
Config ValidMinimalConfig() {
  Config c;
  c.mutable_data()->add_train()->add_path("x");
  c.mutable_data()->mutable_train(0)->set_format(CRITEO_TSV);
  c.mutable_features()->set_preset(CRITEO);
  return c;
}

// What validation says of `c` ("" when it accepts it).
std::string Refusal(const Config& c) { return std::string(ValidateConfig(c).message()); }

TEST(Config, GlobalBatchValidation) {
  Config c = ValidMinimalConfig();
  ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.mutable_train()->set_global_batch_size(512);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.mutable_train()->set_batch_size(256);  // both: which one would the user mean?
  EXPECT_THAT(Refusal(c),
              HasSubstr("train.batch_size: is derived from train.global_batch_size (512 here)"));
  c.mutable_train()->clear_batch_size();
  c.mutable_train()->set_global_batch_size(-1);
  EXPECT_THAT(Refusal(c), HasSubstr("train.global_batch_size"));
  // Sizes that would only fail as an allocation are refused by name.
  c.mutable_train()->set_global_batch_size(2000000000);
  EXPECT_THAT(Refusal(c),
              HasSubstr("train.global_batch_size: must be in [0, 1048576]"));
  c.mutable_train()->set_global_batch_size(0);
  c.mutable_train()->set_eval_batch_size(2000000000);
  EXPECT_THAT(Refusal(c), HasSubstr("train.eval_batch_size"));
  c.mutable_train()->set_eval_batch_size(4096);
  c.mutable_threads()->set_towers(20001);
  EXPECT_THAT(Refusal(c),
              HasSubstr("threads.towers: must be in [0, 1024]"));
}

// The configs that aborted the process (issue 26 item 5: std::bad_alloc, std::system_error, a
// failed check after 5.1 GB) are refused by validation, naming the field, before anything is
// allocated.
TEST(Config, ModelSizesAreBoundedBeforeAnyAllocation) {
  Config c = ValidMinimalConfig();
  ASSERT_TRUE(ValidateConfig(c).ok());
  c.mutable_model()->add_hidden(2000000000);
  EXPECT_THAT(Refusal(c),
              HasSubstr("model.hidden[0]: must be in [1, 65536], got 2000000000"));
  c.mutable_model()->clear_hidden();
  for (int i = 0; i < 20001; ++i) c.mutable_model()->add_hidden(1);
  EXPECT_THAT(Refusal(c),
              HasSubstr("model.hidden: at most 64 layers, got 20001"));
  c.mutable_model()->clear_hidden();
  for (int i = 0; i < 8; ++i) c.mutable_model()->add_hidden(65536);  // 7 x 65536^2 floats
  EXPECT_THAT(Refusal(c), HasSubstr("more than 268435456"));
  c.mutable_model()->clear_hidden();
  c.mutable_model()->set_embedding_dim(5000);
  EXPECT_THAT(Refusal(c),
              HasSubstr("model.embedding_dim: must be in [1, 1024], got 5000"));
  c.mutable_model()->set_embedding_dim(16);
  c.mutable_threads()->set_towers(10000);
  EXPECT_THAT(Refusal(c), HasSubstr("threads.towers"));
  c.mutable_threads()->set_towers(0);
  c.mutable_train()->set_batch_size(2000000000);
  EXPECT_THAT(Refusal(c), HasSubstr("train.batch_size"));
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

namespace pstrain {
namespace {

// model.blocks (the block grammar) is checked by ValidateConfig, naming the field.
TEST(Config, ModelBlocksAreValidated) {
  auto expect_bad = [](const std::string& text, const std::string& needle) {
    auto c = ParseConfigText(text, "x.textproto");
    ASSERT_TRUE(c.ok()) << c.status();
    Config copy = *c;
    copy.mutable_data()->add_train()->add_path("x");
    const absl::Status s = ValidateConfig(copy);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle)) << text;
  };
  expect_bad("model { type: DEEPFM blocks { cross_layers: 2 } }", "is a fixed preset");
  expect_bad("model { type: DCN_V2 blocks { cross_layers: 0 } }", "model.blocks.cross_layers");
  expect_bad("model { type: DCN_V2 blocks { cross_rank: -1 } }", "model.blocks.cross_rank");
  expect_bad("model { type: DCN_V2 blocks { cross_experts: -2 } }", "model.blocks.cross_experts");
  expect_bad("model { type: DCN_V2 blocks { cross_experts: 4 } }", "model.blocks.cross_experts");
  expect_bad("model { type: DLRM blocks { bottom_hidden: [64, 0] } }",
             "model.blocks.bottom_hidden[1]");
  auto ok = ParseConfigText("model { type: DLRM blocks { bottom_hidden: [64] } }", "x");
  ASSERT_TRUE(ok.ok());
  Config copy = *ok;
  copy.mutable_data()->add_train()->add_path("x");
  EXPECT_TRUE(ValidateConfig(copy).ok()) << ValidateConfig(copy);
}

}  // namespace
}  // namespace pstrain
