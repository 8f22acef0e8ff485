// datagen's history list field (DatagenOptions::history_mean_length): off by default (39 fields,
// no lists); on, a 40th list field of the item field's ids with the configured length law, which
// the teacher pools; the rows encode through SyntheticData::Features() (the history shares the
// item field's rows). tests/worker/train/train_step_test.cc trains on it.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

DatagenOptions WithHistory(double mean = 10, int max_length = 40) {
  DatagenOptions o;
  o.history_mean_length = mean;
  o.history_max_length = max_length;
  o.calibration_rows = 8192;
  return o;
}

TEST(DatagenHistory, OffByDefault) {
  auto data = SyntheticData::Create(DatagenOptions{});
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->has_history());
  RawRows rows;
  std::vector<float> probs;
  data->GenerateChunk(0, 100, &rows, &probs);
  EXPECT_EQ(rows.num_fields, SyntheticData::kNumFields);
  EXPECT_TRUE(rows.list_begin.empty());
  EXPECT_EQ(data->Features().field_size(), 0);
}

TEST(DatagenHistory, ListsOfTheItemFieldWithTheLengthLaw) {
  auto data = SyntheticData::Create(WithHistory(10, 40));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(data->has_history());
  RawRows rows;
  std::vector<float> probs;
  data->GenerateChunk(0, 4096, &rows, &probs);
  ASSERT_EQ(rows.num_fields, 40);
  const int item = SyntheticData::kNumNumeric + 2;  // C3
  double total = 0;
  uint32_t longest = 0;
  std::map<uint64_t, int> count;
  for (int r = 0; r < rows.size(); ++r) {
    const size_t cell = rows.Cell(r, 39);
    EXPECT_EQ(rows.present[cell], 1);
    total += rows.ListSize(cell);
    longest = std::max(longest, rows.ListSize(cell));
    for (uint32_t j = 0; j < rows.ListSize(cell); ++j) ++count[rows.list_key[rows.list_begin[cell] + j]];
  }
  // Geometric with mean 10, capped at 40: mean 10 (1 - (10/11)^40) ~ 9.78.
  EXPECT_NEAR(total / rows.size(), 9.78, 0.4);
  EXPECT_EQ(longest, 40u);
  // The history's most frequent id is the item field's most popular one (rank 1).
  const auto top = std::max_element(count.begin(), count.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  EXPECT_EQ(top->first, data->RankToKey(2, 1));
  (void)item;

  // The teacher reads the history: another history, another logit; the same, the same.
  RawRows changed = rows;
  const size_t cell = changed.Cell(0, 39);
  ASSERT_GT(changed.ListSize(cell), 0u);
  const double before = data->TeacherLogit(rows, 0);
  EXPECT_EQ(data->TeacherLogit(changed, 0), before);
  changed.list_key[changed.list_begin[cell]] ^= 0x5555;
  EXPECT_NE(data->TeacherLogit(changed, 0), before);

  // The rows encode with Features(): the history shares C3's rows.
  auto spec = FeatureSpec::Create(data->Features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->num_fields(), 40);
  EXPECT_EQ(spec->field(39).offset, spec->field(item).offset);
  Batch batch;
  batch.Clear(40);
  spec->Encode(rows, &batch);
  EXPECT_EQ(batch.offsets.size(), 4096u * 40 + 1);
}

TEST(DatagenHistory, RefusesBadOptions) {
  DatagenOptions o = WithHistory();
  o.history_max_length = 0;
  EXPECT_FALSE(SyntheticData::Create(o).ok());
  o = WithHistory();
  o.history_item_field = 26;
  EXPECT_FALSE(SyntheticData::Create(o).ok());
  o = WithHistory(-1);
  EXPECT_FALSE(SyntheticData::Create(o).ok());
}

// --history_pooling attention (DatagenOptions::history_attention): the same rows, another teacher
// that weights each history id by its similarity to the row's item. An id unlike the candidate
// (cos <= 0) adds nothing, so replacing it by another such id leaves the logit unchanged, which
// MEAN pooling never does.
TEST(DatagenHistory, AttentionTeacherWeightsIdsBySimilarityToTheItem) {
  DatagenOptions o = WithHistory(10, 40);
  auto mean = SyntheticData::Create(o);
  o.history_attention = true;
  auto attention = SyntheticData::Create(o);
  ASSERT_TRUE(mean.ok() && attention.ok()) << attention.status();
  RawRows rows, same;
  std::vector<float> mean_probs, probs;
  mean->GenerateChunk(0, 2000, &same, &mean_probs);
  attention->GenerateChunk(0, 2000, &rows, &probs);
  EXPECT_EQ(rows.key, same.key);
  EXPECT_EQ(rows.list_key, same.list_key);
  EXPECT_NE(probs, mean_probs);

  // Find rows whose history holds exactly one id: swapping that id changes the logit under both
  // teachers except when the attention teacher gives both ids weight 0.
  int changed_mean = 0, zero_weight = 0;
  for (int r = 0; r < rows.size(); ++r) {
    const size_t cell = rows.Cell(r, 39);
    if (rows.ListSize(cell) != 1) continue;
    RawRows other = rows;
    other.list_key[other.list_begin[cell]] ^= 0x5555;
    if (mean->TeacherLogit(other, r) != mean->TeacherLogit(rows, r)) ++changed_mean;
    if (attention->TeacherLogit(other, r) == attention->TeacherLogit(rows, r)) ++zero_weight;
  }
  EXPECT_GT(changed_mean, 50);
  // Two random ids both unlike the item: about a quarter of the rows.
  EXPECT_GT(zero_weight, changed_mean / 10);
  EXPECT_LT(zero_weight, changed_mean * 6 / 10);

  // Attention needs a history.
  DatagenOptions none;
  none.history_attention = true;
  EXPECT_FALSE(SyntheticData::Create(none).ok());
}

}  // namespace
}  // namespace pstrain
