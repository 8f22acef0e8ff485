// ListSpec.attention_target from the config to the model: FeatureSpec resolves and checks the
// target field (naming both fields), ModelInputsOf hands it to Model::Create, Resolved() keeps it,
// and ValidateConfig refuses the model types that cannot attend.
#include <string>
#include <vector>

#include "common/config.h"
#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"

namespace pstrain {
namespace {

FeatureConfig Features(const std::string& target_kind_or_list) {
  FeatureConfig features;
  features.set_preset(NO_PRESET);
  FieldSpec* item = features.add_field();
  item->set_name("item");
  item->set_vocab_size(100);
  if (target_kind_or_list == "numeric") item->set_kind(NUMERIC);
  if (target_kind_or_list == "list") item->mutable_list();
  FieldSpec* history = features.add_field();
  history->set_name("history");
  history->set_share_rows_with(target_kind_or_list == "numeric" ? "" : "item");
  if (target_kind_or_list == "numeric") history->clear_share_rows_with();
  history->set_vocab_size(100);
  history->mutable_list()->set_combiner(SUM);
  history->mutable_list()->set_attention_target("item");
  return features;
}

TEST(TargetAttentionTest, FeatureSpecResolvesTheTarget) {
  auto spec = FeatureSpec::Create(Features(""));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelInputs inputs = ModelInputsOf(*spec);
  ASSERT_EQ(inputs.attention.size(), 1u);
  EXPECT_EQ(inputs.attention[0].field, 1);
  EXPECT_EQ(inputs.attention[0].target, 0);
  EXPECT_EQ(inputs.attention[0].hidden, std::vector<int>{36});
  // Resolved() keeps it (checkpoints record the features).
  auto again = FeatureSpec::Create(spec->Resolved());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->field(1).attention_target, 0);
  EXPECT_EQ(again->field(1).attention_hidden, std::vector<int>{36});
}

TEST(TargetAttentionTest, BadTargetsAreRefusedNamingBothFields) {
  struct Case {
    std::string setup, expect;
  };
  for (const Case& c : {Case{"missing", "no such field"}, Case{"self", "the field itself"},
                        Case{"list", "holds lists"}, Case{"numeric", "NUMERIC"}}) {
    FeatureConfig features = Features(c.setup == "list" || c.setup == "numeric" ? c.setup : "");
    if (c.setup == "missing") features.mutable_field(1)->mutable_list()->set_attention_target("nope");
    if (c.setup == "self") features.mutable_field(1)->mutable_list()->set_attention_target("history");
    auto spec = FeatureSpec::Create(features);
    ASSERT_FALSE(spec.ok()) << c.setup;
    EXPECT_NE(spec.status().message().find(c.expect), std::string::npos) << spec.status();
    EXPECT_NE(spec.status().message().find("'history'"), std::string::npos) << spec.status();
  }
  FeatureConfig wide = Features("");
  wide.mutable_field(1)->mutable_list()->add_attention_hidden(0);
  EXPECT_FALSE(FeatureSpec::Create(wide).ok());
}

TEST(TargetAttentionTest, ConfigValidationRefusesModelsThatCannotAttend) {
  Config config;
  *config.mutable_features() = Features("");
  config.mutable_model()->set_type(DIN);
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
  config.mutable_model()->set_type(LR);
  const absl::Status st = ValidateConfig(config);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("attention_target"), std::string::npos) << st;
}

}  // namespace
}  // namespace pstrain
