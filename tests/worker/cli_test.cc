// BuildConfig: the effective config of the pstrain commands.
#include "worker/cli.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// Without --config the dense optimizer is Adam 1e-3, and --set tunes that Adam.
TEST(BuildConfig, AbsentDenseOptimizerIsAdamBeforeOverrides) {
  TrainingFlags flags;
  flags.train = {"/nonexistent/train.tsv"};
  flags.format = "criteo_tsv";
  auto c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c->dense_optimizer().learning_rate(), 1e-3f);

  flags.set = {"dense_optimizer.learning_rate=0.003"};
  c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c->dense_optimizer().learning_rate(), 3e-3f);
}

}  // namespace
}  // namespace pstrain
