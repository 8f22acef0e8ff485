// serving/request_rows.h: the rows of a Predict request parse as the trainer's readers parse the
// same values, and every bad value is refused naming its row and field.
#include "serving/request_rows.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace {

FeatureSpec CriteoSpec() {
  FeatureConfig c;  // the CRITEO preset: I1..I13 numeric, C1..C26 categorical
  c.set_categorical_vocab_size(1000);
  return *FeatureSpec::Create(c);
}

// A Criteo line: label, 13 counts, 26 hex keys; some values missing.
std::string CriteoLine(int i) {
  std::vector<std::string> cols = {absl::StrCat(i % 2)};
  for (int f = 0; f < 13; ++f) cols.push_back(f % 4 == 1 ? "" : absl::StrCat(i * 7 + f - 2));
  for (int f = 0; f < 26; ++f) {
    cols.push_back(f % 5 == 3 ? "" : absl::StrCat(absl::Hex(0x1000a0b0u + i * 31 + f)));
  }
  return absl::StrJoin(cols, "\t");
}

// The trainer's parse of `lines` (criteo_tsv or csv with `header`).
RawRows ParsedByTheTrainer(DataFormat format, const FeatureSpec& spec, const std::string& header,
                           const std::vector<std::string>& lines) {
  auto parser = CreateRecordParser(format, spec, header);
  EXPECT_TRUE(parser.ok()) << parser.status();
  RawRows rows;
  rows.Clear(spec.num_fields());
  std::vector<RecordRef> refs;
  const std::string file = "lines";
  for (size_t i = 0; i < lines.size(); ++i) refs.push_back({lines[i], &file, i + 1});
  std::vector<absl::Status> errors;
  (*parser)->Parse(refs, &rows, &errors);
  EXPECT_TRUE(errors.empty());
  return rows;
}

void ExpectSameValues(const RawRows& a, const RawRows& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.present, b.present);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.value, b.value);
}

TEST(RequestRows, TsvRowsParseAsTheCriteoReader) {
  const FeatureSpec spec = CriteoSpec();
  std::vector<std::string> lines;
  for (int i = 0; i < 20; ++i) lines.push_back(CriteoLine(i));
  const RawRows want = ParsedByTheTrainer(CRITEO_TSV, spec, "", lines);
  // With the label column, as the training files are.
  PredictRequest with_label;
  with_label.set_rows_have_label(true);
  for (const std::string& l : lines) with_label.add_rows(l);
  RawRows got;
  ASSERT_TRUE(ParseRequestRows(with_label, spec, &got).ok());
  ExpectSameValues(got, want);
  // Without it: the 39 feature columns (a trailing newline is allowed).
  PredictRequest bare;
  for (const std::string& l : lines) bare.add_rows(l.substr(l.find('\t') + 1) + "\n");
  RawRows got_bare;
  ASSERT_TRUE(ParseRequestRows(bare, spec, &got_bare).ok());
  ExpectSameValues(got_bare, want);
}

TEST(RequestRows, CsvRowsAndFeatureListsParseAsTheCsvReader) {
  const FeatureSpec spec = CriteoSpec();
  std::vector<std::string> names;
  for (const auto& f : spec.fields()) names.push_back(f.name);
  const std::string header = "label," + absl::StrJoin(names, ",");
  std::vector<std::string> lines;
  for (int i = 0; i < 10; ++i) {
    std::string l = CriteoLine(i);
    for (char& c : l) c = c == '\t' ? ',' : c;
    lines.push_back(l);
  }
  std::vector<std::string> odd = {"1", "3.5", "-2"};  // decimals, and text a CSV key hashes
  odd.resize(14);
  odd.push_back("not-hex-text");
  odd.resize(40);
  lines.push_back(absl::StrJoin(odd, ","));
  const RawRows want = ParsedByTheTrainer(CSV, spec, header, lines);
  PredictRequest csv;
  csv.set_row_format(PredictRequest::CSV);
  for (const std::string& l : lines) csv.add_rows(l.substr(l.find(',') + 1));
  RawRows got;
  absl::Status s = ParseRequestRows(csv, spec, &got);
  ASSERT_TRUE(s.ok()) << s;
  ExpectSameValues(got, want);

  // The same rows as feature lists: numbers, hex text, raw keys; missing ones left out.
  PredictRequest lists;
  for (int r = 0; r < want.size(); ++r) {
    FeatureList* ex = lists.add_examples();
    for (int f = spec.num_fields() - 1; f >= 0; --f) {  // any order
      const size_t i = static_cast<size_t>(r) * spec.num_fields() + f;
      if (!want.present[i]) continue;
      Feature* feat = ex->add_feature();
      feat->set_name(spec.field(f).name);
      if (spec.field(f).kind == NUMERIC) {
        feat->set_number(want.value[i]);
      } else if (f % 2 == 0) {
        feat->set_key(want.key[i]);
      } else {
        feat->set_number(static_cast<double>(want.key[i] & 0xffffffff));
        if ((want.key[i] >> 32) != 0) feat->set_key(want.key[i]);
      }
    }
  }
  RawRows got_lists;
  s = ParseRequestRows(lists, spec, &got_lists);
  ASSERT_TRUE(s.ok()) << s;
  ExpectSameValues(got_lists, want);
}

TEST(RequestRows, BadValuesNameTheRowAndField) {
  const FeatureSpec spec = CriteoSpec();
  const std::string good = CriteoLine(3).substr(CriteoLine(3).find('\t') + 1);
  auto with = [&](int field, const std::string& value) {
    std::vector<std::string> cols = absl::StrSplit(good, '\t');
    cols[field] = value;
    return absl::StrJoin(cols, "\t");
  };
  struct Case {
    std::string name;
    PredictRequest request;
    std::string says;
  };
  std::vector<Case> cases;
  auto rows = [](std::vector<std::string> r, PredictRequest::RowFormat format =
                                                 PredictRequest::TSV) {
    PredictRequest q;
    q.set_row_format(format);
    for (auto& l : r) q.add_rows(l);
    return q;
  };
  cases.push_back({"few", rows({good, "1\t2\t3"}), "row 1: 3 tab-separated values, expected 39"});
  cases.push_back({"many", rows({good + "\t1\t2"}), "row 0: more than 39 tab-separated values"});
  cases.push_back({"label", rows({good}), ""});  // fine: no label expected
  cases.back().request.set_rows_have_label(true);
  cases.back().says = "row 0: 39 tab-separated values, expected 40 (the label and";
  cases.push_back({"count", rows({good, good, with(2, "12x")}),
                   "row 2, field 3 (I3): bad number '12x': expected an integer"});
  cases.push_back({"nan", rows({with(0, "nan")}), "row 0, field 1 (I1): bad number 'nan'"});
  cases.push_back({"inf", rows({with(12, "1e999")}), "row 0, field 13 (I13): bad number"});
  cases.push_back({"hex", rows({with(20, "zz")}),
                   "row 0, field 21 (C8): bad key 'zz': expected 1..16 hex digits"});
  cases.push_back({"long hex", rows({with(13, "12345678901234567")}), "field 14 (C1): bad key"});
  {
    std::string csv = good;
    for (char& c : csv) c = c == '\t' ? ',' : c;
    cases.push_back({"csv", rows({csv, csv.substr(0, csv.rfind(','))}, PredictRequest::CSV),
                     "row 1: 38 comma-separated values, expected 39"});
  }
  PredictRequest both = rows({good});
  both.add_examples();
  cases.push_back({"both", both, "rows or examples, not both"});
  auto example = [](const std::string& name, auto set) {
    PredictRequest q;
    q.add_examples();
    Feature* f = q.add_examples()->add_feature();
    f->set_name(name);
    set(f);
    return q;
  };
  cases.push_back({"name", example("I99", [](Feature* f) { f->set_number(1); }),
                   "example 1, feature 0: no field named 'I99'"});
  cases.push_back({"key for numeric", example("I2", [](Feature* f) { f->set_key(5); }),
                   "example 1, field 2 (I2): a key for a numeric field"});
  cases.push_back({"fraction key", example("C2", [](Feature* f) { f->set_number(1.5); }),
                   "example 1, field 15 (C2): number 1.5 for a categorical field"});
  cases.push_back({"negative key", example("C2", [](Feature* f) { f->set_number(-1); }),
                   "for a categorical field"});
  cases.push_back({"nan number", example("I1", [](Feature* f) { f->set_number(NAN); }),
                   "example 1, field 1 (I1): number is not finite"});
  cases.push_back({"text number", example("I1", [](Feature* f) { f->set_text("x1"); }),
                   "example 1, field 1 (I1): bad number 'x1'"});
  {
    PredictRequest q;
    FeatureList* ex = q.add_examples();
    ex->add_feature()->set_name("C3");
    ex->add_feature()->set_name("C3");
    cases.push_back({"twice", q, "example 0, field 16 (C3): given twice"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RawRows out;
    absl::Status s = ParseRequestRows(c.request, spec, &out);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.says), absl::string_view::npos) << s;
  }
}

// proto3 keeps an enum value it does not know as its number: row_format 7 was read as TSV. It is
// refused naming the field and the values it takes, for rows and examples alike.
TEST(RequestRows, AnUnknownRowFormatIsRefusedNamingTheValidOnes) {
  const FeatureSpec spec = CriteoSpec();
  PredictRequest request;
  request.add_rows(CriteoLine(1).substr(CriteoLine(1).find('\t') + 1));
  ASSERT_TRUE(CheckRequestFields(request).ok());
  request.set_row_format(static_cast<PredictRequest::RowFormat>(7));
  RawRows rows;
  absl::Status s = ParseRequestRows(request, spec, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "row_format 7: expected TSV (0) or CSV (1)");
  request.set_row_format(static_cast<PredictRequest::RowFormat>(-2));
  request.clear_rows();
  request.add_examples();
  EXPECT_EQ(ParseRequestRows(request, spec, &rows).message(),
            "row_format -2: expected TSV (0) or CSV (1)");
}

}  // namespace
}  // namespace pstrain
