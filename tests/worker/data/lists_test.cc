// List fields (FieldSpec.list, share_rows_with) through the data layer: config validation, the
// FeatureSpec's encoding (combiners, empty lists, truncation, shared rows, Batch::offsets), and
// the CSV and TFRecord readers, bad input included; readers and writers that cannot carry lists
// refuse them.
#include <cmath>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/hash.h"
#include "common/random.h"
#include "common/record_frame.h"
#include "aialgs/record.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorflow/example.pb.h"
#include "tests/worker/data/formats/format_test_util.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/data/formats/recordio.h"
#include "worker/data/formats/registry.h"

namespace pstrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing_util::TempDir;

// label, item (single), hist (a list sharing item's rows), kw (a list of its own), price.
FeatureConfig ListConfig(Combiner combiner = MEAN, int max_length = 4,
                         ListOverflow overflow = TRUNCATE) {
  FeatureConfig c;
  c.set_preset(NO_PRESET);
  FieldSpec* item = c.add_field();
  item->set_name("item");
  item->set_vocab_size(1000);
  FieldSpec* hist = c.add_field();
  hist->set_name("hist");
  hist->set_share_rows_with("item");
  hist->mutable_list()->set_combiner(combiner);
  hist->mutable_list()->set_max_length(max_length);
  hist->mutable_list()->set_overflow(overflow);
  hist->mutable_list()->set_weights_key("hist_w");
  FieldSpec* kw = c.add_field();
  kw->set_name("kw");
  kw->set_vocab_size(50);
  kw->mutable_list()->set_combiner(SUM);
  kw->mutable_list()->set_separator(";");
  FieldSpec* price = c.add_field();
  price->set_name("price");
  price->set_kind(NUMERIC);
  price->set_numeric_mode(DENSE);
  return c;
}

FeatureSpec Spec(const FeatureConfig& c) {
  auto spec = FeatureSpec::Create(c);
  PSTRAIN_CHECK(spec.ok()) << spec.status();
  return *std::move(spec);
}

absl::Status CreateError(const FeatureConfig& c) { return FeatureSpec::Create(c).status(); }

// ---- Config ---------------------------------------------------------------------------------

TEST(ListConfig, RefusesBadListsNamingTheField) {
  FeatureConfig c = ListConfig();
  c.mutable_field(3)->mutable_list();  // price is NUMERIC
  EXPECT_THAT(std::string(CreateError(c).message()),
              AllOf(HasSubstr("'price'"), HasSubstr("only CATEGORICAL fields may hold lists")));
  for (int bad : {0, -1, kMaxListLength + 1}) {
    c = ListConfig();
    c.mutable_field(1)->mutable_list()->set_max_length(bad);
    EXPECT_THAT(std::string(CreateError(c).message()),
                AllOf(HasSubstr("'hist'"), HasSubstr("max_length: must be in [1, 4096]")));
  }
  for (const char* bad : {"", ",", "\t", "a,b", "\""}) {
    c = ListConfig();
    c.mutable_field(2)->mutable_list()->set_separator(bad);
    EXPECT_THAT(std::string(CreateError(c).message()),
                AllOf(HasSubstr("'kw'"), HasSubstr("separator"))) << bad;
  }
  c = ListConfig();
  c.mutable_field(1)->mutable_list()->set_weights_key("kw");
  EXPECT_THAT(std::string(CreateError(c).message()), HasSubstr("weights_key 'kw'"));
  // ValidateConfig runs the same per-field checks.
  Config config;
  *config.mutable_features() = ListConfig();
  config.mutable_features()->mutable_field(2)->mutable_list()->set_separator(",");
  EXPECT_THAT(std::string(ValidateConfig(config).message()),
              AllOf(HasSubstr("features.field[2]"), HasSubstr("separator")));
}

TEST(ListConfig, RefusesAMissingOrChainedShareTargetNamingBoth) {
  FeatureConfig c = ListConfig();
  c.mutable_field(1)->set_share_rows_with("itme");
  EXPECT_THAT(std::string(CreateError(c).message()),
              AllOf(HasSubstr("'hist'"), HasSubstr("'itme'"), HasSubstr("does not exist")));
  c = ListConfig();
  c.mutable_field(2)->set_share_rows_with("hist");  // hist shares item's: a chain
  EXPECT_THAT(std::string(CreateError(c).message()),
              AllOf(HasSubstr("'kw'"), HasSubstr("'hist'"), HasSubstr("no chains")));
  c = ListConfig();
  c.mutable_field(2)->set_share_rows_with("price");
  EXPECT_THAT(std::string(CreateError(c).message()), HasSubstr("NUMERIC"));
}

TEST(ListConfig, SharedRowsAndResolvedRoundTrip) {
  const FeatureSpec spec = Spec(ListConfig());
  EXPECT_TRUE(spec.has_lists());
  const auto& item = spec.field(0);
  const auto& hist = spec.field(1);
  EXPECT_EQ(hist.offset, item.offset);
  EXPECT_EQ(hist.rows, item.rows);
  EXPECT_EQ(hist.seed, item.seed);
  EXPECT_EQ(spec.field(2).offset, 1000u);  // hist adds no rows
  EXPECT_EQ(spec.total_rows(), 1000u + 50 + 2);
  const FeatureSpec again = Spec(spec.Resolved());
  EXPECT_EQ(again.Resolved().SerializeAsString(), spec.Resolved().SerializeAsString());
  EXPECT_EQ(again.field(1).offset, hist.offset);
  EXPECT_TRUE(again.field(1).list);
  EXPECT_EQ(again.field(2).separator, ";");
  EXPECT_EQ(again.field(1).weights_key, "hist_w");
  EXPECT_THAT(std::string(spec.RefuseLists("serve requests").message()),
              AllOf(HasSubstr("'hist'"), HasSubstr("serve requests do not support")));
}

// ---- Encoding -------------------------------------------------------------------------------

TEST(ListEncode, CombinersEmptyListsTruncationAndSharedRows) {
  for (Combiner combiner : {MEAN, SUM, SQRTN}) {
    const FeatureSpec spec = Spec(ListConfig(combiner, /*max_length=*/3));
    RawRows raw;
    raw.Clear(4);
    // Row 0: item 7, hist [7 (w 1), 9 (w 3), 7 (w 2), 11 (w 5: cut by max_length 3)], kw empty.
    int r = raw.AddRow(1.f);
    raw.SetCategorical(r, 0, 7);
    raw.StartList(r, 1);
    raw.AddToList(r, 1, 7, 1.0);
    raw.AddToList(r, 1, 9, 3.0);
    raw.AddToList(r, 1, 7, 2.0);
    raw.AddToList(r, 1, 11, 5.0);
    raw.StartList(r, 2);
    raw.SetNumeric(r, 3, 2.0);
    // Row 1: nothing at all.
    raw.AddRow(0.f);
    Batch batch;
    batch.Clear(4);
    spec.Encode(raw, &batch);
    ASSERT_EQ(batch.size, 2);
    ASSERT_EQ(batch.offsets, (std::vector<int32_t>{0, 1, 4, 5, 6, 7, 8, 9, 10}));
    // hist's 7 is item's 7: one row.
    EXPECT_EQ(batch.ids[1], batch.ids[0]);
    EXPECT_EQ(batch.ids[3], batch.ids[0]);
    EXPECT_NE(batch.ids[2], batch.ids[0]);
    const double want_norm = combiner == MEAN ? 1.0 / 6 : combiner == SQRTN ? 1.0 / std::sqrt(14.0) : 1.0;
    EXPECT_FLOAT_EQ(batch.values[1], 1.0 * want_norm) << Combiner_Name(combiner);
    EXPECT_FLOAT_EQ(batch.values[2], 3.0 * want_norm) << Combiner_Name(combiner);
    EXPECT_FLOAT_EQ(batch.values[3], 2.0 * want_norm) << Combiner_Name(combiner);
    // An empty list and a missing one are the field's missing row, scale 1.
    EXPECT_EQ(batch.ids[4], static_cast<int64_t>(spec.field(2).offset));
    EXPECT_EQ(batch.values[4], 1.f);
    EXPECT_EQ(batch.ids[7], static_cast<int64_t>(spec.field(1).offset));
    EXPECT_EQ(batch.values[7], 1.f);
    EXPECT_EQ(batch.entries(2), 10);
  }
}

TEST(ListEncode, WithoutListsTheBatchHasNoOffsets) {
  FeatureConfig c = ListConfig();
  c.mutable_field(1)->clear_list();
  c.mutable_field(2)->clear_list();
  const FeatureSpec spec = Spec(c);
  EXPECT_FALSE(spec.has_lists());
  RawRows raw;
  raw.Clear(4);
  raw.AddRow(1.f);
  raw.SetCategorical(0, 1, 7);
  raw.SetCategorical(0, 0, 7);
  Batch batch;
  batch.Clear(4);
  spec.Encode(raw, &batch);
  EXPECT_TRUE(batch.offsets.empty());
  EXPECT_EQ(batch.ids.size(), 4u);
  EXPECT_EQ(batch.ids[0], batch.ids[1]);  // shared rows without lists too
}

TEST(ListEncode, MaxEntriesPerExampleBoundsTheBatch) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 4));
  EXPECT_EQ(spec.max_entries_per_example(), 1 + 4 + 64 + 1);  // kw keeps the default 64
  DataConfig data;
  data.add_train()->set_format(CSV);
  PipelineOptions o = OptionsFromConfig(data, /*train=*/true, /*batch_size=*/40000000, 0, 1, 1);
  // 40M examples x 70 entries > 2^31 - 1
  auto pipeline = Pipeline::Create(std::move(o), spec);
  ASSERT_FALSE(pipeline.ok());
  EXPECT_THAT(std::string(pipeline.status().message()), HasSubstr("more than 2^31 - 1"));
}

// ---- CSV ------------------------------------------------------------------------------------

TEST(ListCsv, ReadsListsWithWeightsAndEmptyColumns) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 3));
  TempDir dir;
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(
      dir, CSV, spec,
      "label,item,hist,kw,price\n"
      "1,a1,a1|b2:0.5|ff,x;y,3\n"
      "0,,,,\n"
      "1,a1,1|2|3|4|5,x,1\n",
      &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(rows.size(), 3);
  const size_t h0 = rows.Cell(0, 1);
  ASSERT_EQ(rows.ListSize(h0), 3u);
  EXPECT_EQ(rows.list_key[rows.list_begin[h0]], 0xa1u);  // hex, as a categorical column
  EXPECT_EQ(rows.list_key[rows.list_begin[h0] + 1], 0xb2u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[h0] + 1], 0.5);
  EXPECT_EQ(rows.list_key[rows.list_begin[h0] + 2], 0xffu);
  EXPECT_EQ(rows.key[rows.Cell(0, 0)], 0xa1u);
  EXPECT_EQ(rows.ListSize(rows.Cell(0, 2)), 2u);
  EXPECT_EQ(rows.list_key[rows.list_begin[rows.Cell(0, 2)]], HashBytes("x"));
  // An empty column is an empty list.
  EXPECT_EQ(rows.present[rows.Cell(1, 1)], 1);
  EXPECT_EQ(rows.ListSize(rows.Cell(1, 1)), 0u);
  // Five ids, max_length 3: truncated and counted.
  EXPECT_EQ(rows.ListSize(rows.Cell(2, 1)), 3u);
  EXPECT_EQ(rows.truncated_lists, 1u);
}

TEST(ListCsv, BadListsNameTheRecordAndField) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 3, REFUSE));
  TempDir dir;
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(dir, CSV, spec,
                                               "label,item,hist,kw,price\n"
                                               "1,a,1|2|3|4,x,1\n"
                                               "1,a,1||3,x,1\n"
                                               "1,a,1:zz,x,1\n"
                                               "1,a,1|2,x,1\n",
                                               &errors);
  EXPECT_EQ(rows.size(), 1);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_THAT(std::string(errors[0].message()),
              AllOf(HasSubstr("line 2"), HasSubstr("'hist'"), HasSubstr("4 ids"),
                    HasSubstr("max_length 3")));
  EXPECT_THAT(std::string(errors[1].message()),
              AllOf(HasSubstr("hist"), HasSubstr("empty id 2")));
  EXPECT_THAT(std::string(errors[2].message()), AllOf(HasSubstr("hist"), HasSubstr("'1:zz'")));
  // The good row after the bad ones holds exactly its own list (nothing left over).
  EXPECT_EQ(rows.ListSize(rows.Cell(0, 1)), 2u);
  EXPECT_EQ(rows.list_key.size(), 3u);  // hist [1, 2] and kw [x]
}

// ---- LibSVM ---------------------------------------------------------------------------------

TEST(ListLibSvm, ReadsFieldIdValueTriplesBesideThePairs) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 3));
  TempDir dir;
  std::vector<absl::Status> errors;
  // Pairs: item, price (the single-valued fields, in order); triples: 1 = hist, 2 = kw.
  const RawRows rows = testing_util::ParseText(dir, LIBSVM, spec,
                                               "1 1:5:1 7:1 2:9:2 1:6:0.5 3:2.5\n"
                                               "0 8:1 0:1\n"
                                               "1 9:1 1:1:1 1:2:1 1:3:1 1:4:1 0:1\n",
                                               &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(rows.size(), 3);
  EXPECT_EQ(rows.key[rows.Cell(0, 0)], 7u);
  EXPECT_EQ(rows.value[rows.Cell(0, 3)], 2.5);
  const size_t h = rows.Cell(0, 1);
  ASSERT_EQ(rows.ListSize(h), 2u);
  EXPECT_EQ(rows.list_key[rows.list_begin[h]], 5u);
  EXPECT_EQ(rows.list_key[rows.list_begin[h] + 1], 6u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[h] + 1], 0.5);
  EXPECT_EQ(rows.ListSize(rows.Cell(0, 2)), 1u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[rows.Cell(0, 2)]], 2.0);
  EXPECT_EQ(rows.present[rows.Cell(1, 1)], 1);  // no triples: an empty list
  EXPECT_EQ(rows.ListSize(rows.Cell(1, 1)), 0u);
  EXPECT_EQ(rows.ListSize(rows.Cell(2, 1)), 3u);  // 4 ids, max_length 3
  EXPECT_EQ(rows.truncated_lists, 1u);
}

TEST(ListLibSvm, BadTriplesNameTheRecordAndField) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 3, REFUSE));
  TempDir dir;
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(dir, LIBSVM, spec,
                                               "1 7:1 0:5:1 0:1\n"
                                               "1 7:1 1:x:1 0:1\n"
                                               "1 7:1 1:1:1 1:2:1 1:3:1 1:4:1 0:1\n"
                                               "1 7:1\n"
                                               "1 7:1 1:1:1 0:1\n",
                                               &errors);
  EXPECT_EQ(rows.size(), 1);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_THAT(std::string(errors[0].message()),
              AllOf(HasSubstr("line 1"), HasSubstr("field 0 is not a list field")));
  EXPECT_THAT(std::string(errors[1].message()), AllOf(HasSubstr("line 2"), HasSubstr("'1:x:1'")));
  EXPECT_THAT(std::string(errors[2].message()),
              AllOf(HasSubstr("line 3"), HasSubstr("'hist'"), HasSubstr("4 ids")));
  EXPECT_THAT(std::string(errors[3].message()),
              AllOf(HasSubstr("line 4"), HasSubstr("found 1 id:value pairs, expected 2")));
  EXPECT_EQ(rows.list_key.size(), 1u);
}

// ---- TFRecord -------------------------------------------------------------------------------

tensorflow::Example Example(float label) {
  tensorflow::Example ex;
  (*ex.mutable_features()->mutable_feature())["label"].mutable_float_list()->add_value(label);
  return ex;
}
void Ints(tensorflow::Example* ex, const std::string& key, std::vector<int64_t> v) {
  auto* l = (*ex->mutable_features()->mutable_feature())[key].mutable_int64_list();
  for (int64_t x : v) l->add_value(x);
}
void Floats(tensorflow::Example* ex, const std::string& key, std::vector<float> v) {
  auto* l = (*ex->mutable_features()->mutable_feature())[key].mutable_float_list();
  for (float x : v) l->add_value(x);
}

RawRows ParseExamples(const FeatureSpec& spec, const std::vector<tensorflow::Example>& examples,
                      std::vector<absl::Status>* errors) {
  TempDir dir;
  std::string bytes;
  for (const auto& ex : examples) AppendTFRecordFrame(ex.SerializeAsString(), &bytes);
  return testing_util::ParseFile(TFRECORD, spec, dir.Write("l.tfrecords", bytes), errors);
}

TEST(ListTFRecord, ReadsIdsAndWeightsInAnyOrder) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 4));
  tensorflow::Example a = Example(1);
  Ints(&a, "item", {5});
  Ints(&a, "hist", {5, 6, 7});
  Floats(&a, "hist_w", {1.f, 0.25f, 2.f});
  auto* kw = (*a.mutable_features()->mutable_feature())["kw"].mutable_bytes_list();
  kw->add_value("x");
  kw->add_value("y");
  tensorflow::Example b = Example(0);
  Ints(&b, "hist", {});
  std::vector<absl::Status> errors;
  const RawRows rows = ParseExamples(spec, {a, b}, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(rows.size(), 2);
  const size_t h = rows.Cell(0, 1);
  ASSERT_EQ(rows.ListSize(h), 3u);
  EXPECT_EQ(rows.list_key[rows.list_begin[h] + 2], 7u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[h] + 1], 0.25);
  EXPECT_EQ(rows.ListSize(rows.Cell(0, 2)), 2u);
  EXPECT_EQ(rows.list_key[rows.list_begin[rows.Cell(0, 2)] + 1], HashBytes("y"));
  EXPECT_EQ(rows.present[rows.Cell(1, 1)], 1);
  EXPECT_EQ(rows.ListSize(rows.Cell(1, 1)), 0u);
}

TEST(ListTFRecord, BadListsNameTheRecordAndField) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 4, REFUSE));
  tensorflow::Example mismatch = Example(1);
  Ints(&mismatch, "hist", {1, 2, 3});
  Floats(&mismatch, "hist_w", {1.f, 2.f});
  tensorflow::Example orphan = Example(1);
  Floats(&orphan, "hist_w", {1.f});
  tensorflow::Example too_long = Example(1);
  Ints(&too_long, "hist", {1, 2, 3, 4, 5});
  tensorflow::Example floats = Example(1);
  Floats(&floats, "hist", {1.f});
  tensorflow::Example good = Example(0);
  Ints(&good, "hist", {1, 2});
  std::vector<absl::Status> errors;
  const RawRows rows = ParseExamples(spec, {mismatch, orphan, too_long, floats, good}, &errors);
  ASSERT_EQ(rows.size(), 1);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_THAT(std::string(errors[0].message()),
              AllOf(HasSubstr("record 1"), HasSubstr("'hist'"), HasSubstr("2 weights"),
                    HasSubstr("for 3 ids")));
  EXPECT_THAT(std::string(errors[1].message()),
              AllOf(HasSubstr("record 2"), HasSubstr("'hist'"), HasSubstr("without ids")));
  EXPECT_THAT(std::string(errors[2].message()),
              AllOf(HasSubstr("record 3"), HasSubstr("'hist'"), HasSubstr("5 ids")));
  EXPECT_THAT(std::string(errors[3].message()),
              AllOf(HasSubstr("record 4"), HasSubstr("'hist'"), HasSubstr("float_list")));
  EXPECT_EQ(rows.ListSize(rows.Cell(0, 1)), 2u);
  EXPECT_EQ(rows.list_key.size(), 2u);
}

// ---- RecordIO -------------------------------------------------------------------------------

aialgs::data::Record RecordWithLabel(float label) {
  aialgs::data::Record r;
  (*r.mutable_label())["values"].mutable_float32_tensor()->add_values(label);
  return r;
}

RawRows ParseRecords(const FeatureSpec& spec, const std::vector<aialgs::data::Record>& records,
                     std::vector<absl::Status>* errors) {
  TempDir dir;
  std::string bytes;
  for (const auto& r : records) AppendRecordIOFrame(r.SerializeAsString(), &bytes);
  return testing_util::ParseFile(RECORDIO, spec, dir.Write("l.rec", bytes), errors);
}

TEST(ListRecordIO, ListsAreSparseTensorsOfTheirOwnBesideTheRowTensor) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 4));
  aialgs::data::Record a = RecordWithLabel(1);
  auto* row = (*a.mutable_features())["values"].mutable_float64_tensor();
  row->add_keys(0);  // item
  row->add_values(7);
  auto* hist = (*a.mutable_features())["hist"].mutable_float32_tensor();
  for (uint64_t id : {5, 6, 7}) hist->add_keys(id);
  for (float w : {1.f, 0.5f, 2.f}) hist->add_values(w);
  auto* kw = (*a.mutable_features())["kw"].mutable_int32_tensor();
  kw->add_keys(9);  // no values: weight 1
  std::vector<absl::Status> errors;
  const RawRows rows = ParseRecords(spec, {a}, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(rows.size(), 1);
  EXPECT_EQ(rows.key[rows.Cell(0, 0)], 7u);
  const size_t h = rows.Cell(0, 1);
  ASSERT_EQ(rows.ListSize(h), 3u);
  EXPECT_EQ(rows.list_key[rows.list_begin[h] + 2], 7u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[h] + 1], 0.5);
  ASSERT_EQ(rows.ListSize(rows.Cell(0, 2)), 1u);
  EXPECT_EQ(rows.list_weight[rows.list_begin[rows.Cell(0, 2)]], 1.0);
}

TEST(ListRecordIO, BadListsNameTheRecordAndField) {
  const FeatureSpec spec = Spec(ListConfig(MEAN, 2, REFUSE));
  aialgs::data::Record mismatch = RecordWithLabel(1);
  auto* t = (*mismatch.mutable_features())["hist"].mutable_float64_tensor();
  t->add_keys(1);
  t->add_keys(2);
  t->add_values(1);
  aialgs::data::Record too_long = RecordWithLabel(1);
  auto* u = (*too_long.mutable_features())["hist"].mutable_float64_tensor();
  for (uint64_t id : {1, 2, 3}) u->add_keys(id);
  aialgs::data::Record in_row = RecordWithLabel(1);
  auto* row = (*in_row.mutable_features())["values"].mutable_float64_tensor();
  row->add_keys(1);  // hist's index in the row tensor
  row->add_values(5);
  std::vector<absl::Status> errors;
  const RawRows rows = ParseRecords(spec, {mismatch, too_long, in_row}, &errors);
  EXPECT_EQ(rows.size(), 0);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_THAT(std::string(errors[0].message()),
              AllOf(HasSubstr("record 1"), HasSubstr("'hist'"), HasSubstr("1 weights (values) for 2 ids")));
  EXPECT_THAT(std::string(errors[1].message()),
              AllOf(HasSubstr("record 2"), HasSubstr("'hist'"), HasSubstr("3 ids")));
  EXPECT_THAT(std::string(errors[2].message()),
              AllOf(HasSubstr("record 3"), HasSubstr("'hist'"), HasSubstr("tensor of its own")));
}

// ---- Writers: lists round-trip between formats -----------------------------------------------

RawRows RandomListRows(const FeatureSpec& spec, int n, uint64_t seed) {
  Rng rng(seed);
  RawRows rows;
  rows.Clear(spec.num_fields());
  for (int r = 0; r < n; ++r) {
    const int row = rows.AddRow(static_cast<float>(rng.Uniform(2)));
    rows.SetCategorical(row, 0, rng.Next() >> rng.Uniform(64));
    for (int f : {1, 2}) {
      rows.StartList(row, f);
      const int len = static_cast<int>(rng.Uniform(4));  // within max_length 4, empty included
      for (int j = 0; j < len; ++j) {
        // Weights: 1, or float32-exact values (TFRecord stores float32), only where the field
        // has a weights_key.
        const double w = f == 1 && rng.Uniform(2) ? static_cast<float>(rng.UniformDouble()) : 1.0;
        rows.AddToList(row, f, rng.Next() >> rng.Uniform(64), w);
      }
    }
    rows.SetNumeric(row, 3, static_cast<float>(rng.Normal()));
  }
  return rows;
}

::testing::AssertionResult SameLists(const RawRows& a, const RawRows& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " rows";
  for (int r = 0; r < a.size(); ++r) {
    if (a.labels[r] != b.labels[r]) return ::testing::AssertionFailure() << "row " << r << " label";
    for (int f = 0; f < a.num_fields; ++f) {
      const size_t i = a.Cell(r, f);
      if (a.ListSize(i) != b.ListSize(i)) {
        return ::testing::AssertionFailure() << "row " << r << " field " << f << ": list of "
                                             << a.ListSize(i) << " vs " << b.ListSize(i);
      }
      for (uint32_t j = 0; j < a.ListSize(i); ++j) {
        if (a.list_key[a.list_begin[i] + j] != b.list_key[b.list_begin[i] + j] ||
            a.list_weight[a.list_begin[i] + j] != b.list_weight[b.list_begin[i] + j]) {
          return ::testing::AssertionFailure() << "row " << r << " field " << f << " id " << j;
        }
      }
      if (a.ListSize(i) == 0 && (a.present[i] != b.present[i] || a.key[i] != b.key[i] ||
                                 a.value[i] != b.value[i])) {
        return ::testing::AssertionFailure() << "row " << r << " field " << f << " value";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

RawRows WriteAndRead(DataFormat format, const FeatureSpec& spec, const RawRows& rows,
                     const TempDir& dir, const std::string& name) {
  auto writer = CreateRecordWriter(format, spec, dir.File(name));
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return RawRows();
  EXPECT_TRUE((*writer)->Write(rows, 0, rows.size()).ok());
  EXPECT_TRUE((*writer)->Close().ok());
  std::vector<absl::Status> errors;
  RawRows back = testing_util::ParseFile(format, spec, dir.File(name), &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
  return back;
}

TEST(ListWriters, TFRecordToCsvToTFRecordKeepsIdsAndWeights) {
  const FeatureSpec spec = Spec(ListConfig());
  const RawRows rows = RandomListRows(spec, 300, 7);
  TempDir dir;
  const RawRows tf = WriteAndRead(TFRECORD, spec, rows, dir, "a.tfrecords");
  EXPECT_TRUE(SameLists(tf, rows));
  const RawRows csv = WriteAndRead(CSV, spec, tf, dir, "b.csv");
  EXPECT_TRUE(SameLists(csv, rows));
  const RawRows again = WriteAndRead(TFRECORD, spec, csv, dir, "c.tfrecords");
  EXPECT_TRUE(SameLists(again, rows));
  EXPECT_EQ(testing_util::ReadAll(dir.File("a.tfrecords")), testing_util::ReadAll(dir.File("c.tfrecords")));
  // LibSVM writes a numeric field's index as its id.
  RawRows want = rows;
  for (int r = 0; r < want.size(); ++r) want.key[want.Cell(r, 3)] = 3;
  const RawRows libsvm = WriteAndRead(LIBSVM, spec, rows, dir, "d.libsvm");
  EXPECT_TRUE(SameLists(libsvm, want));
  // RecordIO stores keys as doubles: exact below 2^53.
  RawRows small = rows;
  for (uint64_t& k : small.key) k >>= 11;
  const RawRows recordio = WriteAndRead(RECORDIO, spec, small, dir, "e.rec");
  EXPECT_TRUE(SameLists(recordio, small));
}

TEST(ListWriters, RefuseWhatTheFormatCannotHold) {
  FeatureConfig c = ListConfig();
  c.mutable_field(1)->mutable_list()->clear_weights_key();
  const FeatureSpec spec = Spec(c);
  RawRows rows;
  rows.Clear(4);
  rows.AddRow(1.f);
  rows.StartList(0, 1);
  rows.AddToList(0, 1, 5, 0.5);
  TempDir dir;
  auto writer = CreateRecordWriter(TFRECORD, spec, dir.File("w.tfrecords"));
  ASSERT_TRUE(writer.ok());
  EXPECT_THAT(std::string((*writer)->Write(rows, 0, 1).message()),
              AllOf(HasSubstr("'hist'"), HasSubstr("no list.weights_key")));
  rows.list_weight[0] = std::nan("");
  auto csv = CreateRecordWriter(CSV, spec, dir.File("w.csv"));
  ASSERT_TRUE(csv.ok());
  EXPECT_THAT(std::string((*csv)->Write(rows, 0, 1).message()),
              AllOf(HasSubstr("'hist'"), HasSubstr("non-finite weight")));
}

// ---- What cannot carry lists yet refuses them ------------------------------------------------

TEST(ListFormats, ReadersAndWritersWithoutListsRefuseThem) {
  const FeatureSpec spec = Spec(ListConfig());
  for (DataFormat format : {CRITEO_TSV}) {
    auto parser = CreateRecordParser(format, spec, "");
    ASSERT_FALSE(parser.ok()) << DataFormat_Name(format);
    EXPECT_THAT(std::string(parser.status().message()),
                AllOf(HasSubstr("'hist'"), HasSubstr("not support list fields yet")));
  }
  TempDir dir;
  for (DataFormat format : {CRITEO_TSV}) {
    auto writer = CreateRecordWriter(format, spec, dir.File("out"));
    ASSERT_FALSE(writer.ok()) << DataFormat_Name(format);
    EXPECT_THAT(std::string(writer.status().message()), HasSubstr("'hist'"));
  }
}

}  // namespace
}  // namespace pstrain
