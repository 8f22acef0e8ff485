// Serve requests carry list fields (FieldSpec.list) as the training formats do: a text row's list
// column is a CSV list column ("a|b:0.5|c", the field's separator), read by the CSV reader's own
// code (ParseListText); an example's list field is its `text` in the same syntax, or one `key` /
// whole `number` (a list of one id). The rows encode (FeatureSpec::Encode) to the very batch the
// CSV reader's rows of the same lines encode to. Bad lists are INVALID_ARGUMENT naming the
// request row and the field.
#include <algorithm>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving/request_rows.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// item (single), hist (a list sharing item's rows, MEAN), kw (a list of its own, SUM, ';'), price.
FeatureConfig ListConfig(int max_length = 3, ListOverflow overflow = TRUNCATE) {
  FeatureConfig c;
  c.set_preset(NO_PRESET);
  FieldSpec* item = c.add_field();
  item->set_name("item");
  item->set_vocab_size(1000);
  FieldSpec* hist = c.add_field();
  hist->set_name("hist");
  hist->set_share_rows_with("item");
  hist->mutable_list()->set_combiner(MEAN);
  hist->mutable_list()->set_max_length(max_length);
  hist->mutable_list()->set_overflow(overflow);
  FieldSpec* kw = c.add_field();
  kw->set_name("kw");
  kw->set_vocab_size(50);
  kw->mutable_list()->set_combiner(SUM);
  kw->mutable_list()->set_separator(";");
  FieldSpec* price = c.add_field();
  price->set_name("price");
  price->set_kind(NUMERIC);
  return c;
}

FeatureSpec Spec(const FeatureConfig& c) {
  auto spec = FeatureSpec::Create(c);
  PSTRAIN_CHECK(spec.ok()) << spec.status();
  return *std::move(spec);
}

absl::StatusOr<RawRows> Parse(const PredictRequest& request, const FeatureSpec& spec) {
  RawRows rows;
  RETURN_IF_ERROR(ParseRequestRows(request, spec, &rows));
  return rows;
}

void ExpectSameBatch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.offsets, b.offsets);
}

const char* const kLines[] = {"a1,a1|b2:0.5|ff,x;y,3", ",,,", "a1,1|2|3|4|5,x,1", "7,,z,"};

TEST(RequestRowsLists, CsvRowsEncodeAsTheCsvReaderReadsTheSameLines) {
  const FeatureSpec spec = Spec(ListConfig());
  testing_util::TempDir dir;
  std::string file = "label,item,hist,kw,price\n";
  PredictRequest request;
  request.set_row_format(PredictRequest::CSV);
  for (const char* line : kLines) {
    absl::StrAppend(&file, "0,", line, "\n");
    request.add_rows(line);
  }
  std::vector<absl::Status> errors;
  const RawRows read = testing_util::ParseText(dir, CSV, spec, file, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  absl::StatusOr<RawRows> served = Parse(request, spec);
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ(served->size(), 4);
  // The list ids as written: hex, a weight after ':', text hashed; five ids cut to max_length 3.
  const size_t h0 = served->Cell(0, 1);
  ASSERT_EQ(served->ListSize(h0), 3u);
  EXPECT_EQ(served->list_key[served->list_begin[h0] + 1], 0xb2u);
  EXPECT_EQ(served->list_weight[served->list_begin[h0] + 1], 0.5);
  EXPECT_EQ(served->list_key[served->list_begin[served->Cell(0, 2)]], HashBytes("x"));
  EXPECT_EQ(served->ListSize(served->Cell(2, 1)), 3u);
  EXPECT_EQ(served->truncated_lists, 1u);
  Batch from_file, from_request;
  spec.Encode(read, &from_file);
  spec.Encode(*served, &from_request);
  ASSERT_FALSE(from_request.offsets.empty());
  ExpectSameBatch(from_request, from_file);
}

TEST(RequestRowsLists, TsvRowsAndLabelsTakeListsToo) {
  const FeatureSpec spec = Spec(ListConfig());
  PredictRequest csv, tsv;
  csv.set_row_format(PredictRequest::CSV);
  tsv.set_row_format(PredictRequest::TSV);
  tsv.set_rows_have_label(true);
  for (const char* line : kLines) {
    csv.add_rows(line);
    std::string t = absl::StrCat("1,", line);
    std::replace(t.begin(), t.end(), ',', '\t');
    tsv.add_rows(t);
  }
  // "x;y" and "z" are not hex: a TSV row's single categorical refuses them, a list item is
  // hashed as in every text format.
  absl::StatusOr<RawRows> a = Parse(csv, spec);
  absl::StatusOr<RawRows> b = Parse(tsv, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  Batch ea, eb;
  spec.Encode(*a, &ea);
  spec.Encode(*b, &eb);
  ExpectSameBatch(eb, ea);
}

TEST(RequestRowsLists, ExamplesTakeAListAsTextOrOneIdAsKeyOrNumber) {
  const FeatureSpec spec = Spec(ListConfig());
  PredictRequest rows, examples;
  rows.set_row_format(PredictRequest::CSV);
  rows.add_rows("a1,a1|b2:0.5|ff,x;y,3");
  rows.add_rows("a1,c3,10,");
  rows.add_rows("a1,,,");
  FeatureList* e = examples.add_examples();
  Feature* f = e->add_feature();
  f->set_name("hist");
  f->set_text("a1|b2:0.5|ff");
  f = e->add_feature();
  f->set_name("kw");
  f->set_text("x;y");
  f = e->add_feature();
  f->set_name("item");
  f->set_key(0xa1);
  f = e->add_feature();
  f->set_name("price");
  f->set_number(3);
  e = examples.add_examples();
  f = e->add_feature();
  f->set_name("item");
  f->set_text("a1");
  f = e->add_feature();
  f->set_name("hist");
  f->set_key(0xc3);
  f = e->add_feature();
  f->set_name("kw");
  f->set_number(16);  // key 16 = hex "10"
  e = examples.add_examples();
  f = e->add_feature();
  f->set_name("item");
  f->set_key(0xa1);
  f = e->add_feature();
  f->set_name("hist");
  f->set_text("");  // an empty list: the missing row, as an absent field
  absl::StatusOr<RawRows> a = Parse(rows, spec);
  absl::StatusOr<RawRows> b = Parse(examples, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  Batch ea, eb;
  spec.Encode(*a, &ea);
  spec.Encode(*b, &eb);
  ExpectSameBatch(eb, ea);
}

TEST(RequestRowsLists, BadListsNameTheRowAndField) {
  const FeatureSpec spec = Spec(ListConfig(3, REFUSE));
  struct Case {
    std::string row;
    std::vector<std::string> want;
  };
  const Case cases[] = {
      {"a1,1|2|3|4,x,1", {"row 1, field 2 (hist)", "has 4 ids, more than its list.max_length 3",
                          "REFUSE"}},
      {"a1,1||3,x,1", {"row 1, field 2 (hist)", "empty id 2"}},
      {"a1,1|:0.5,x,1", {"row 1, field 2 (hist)", "bad list item ':0.5'"}},
      {"a1,1,x:w,1", {"row 1, field 3 (kw)", "bad list item 'x:w'"}},
  };
  for (const Case& c : cases) {
    PredictRequest request;
    request.set_row_format(PredictRequest::CSV);
    request.add_rows("a1,a1,x,1");
    request.add_rows(c.row);
    const absl::Status s = Parse(request, spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.row;
    for (const std::string& w : c.want) {
      EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << c.row;
    }
  }
  PredictRequest request;
  request.add_examples();
  Feature* f = request.add_examples()->add_feature();
  f->set_name("hist");
  f->set_text("1|2|3|4");
  EXPECT_THAT(std::string(Parse(request, spec).status().message()),
              AllOf(HasSubstr("example 1, field 2 (hist)"),
                    HasSubstr("more than its list.max_length")));
}

}  // namespace
}  // namespace pstrain
