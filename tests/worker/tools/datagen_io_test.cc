// End-to-end: generated rows written in every format read back unchanged; `pstrain datagen` as a
// process.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"
#include "worker/eval/metrics.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

using testing_util::CriteoSpec;
using testing_util::ParseFile;
using testing_util::ReadAll;
using testing_util::SameRows;
using testing_util::TempDir;

constexpr int kF = SyntheticData::kNumFields;

// LibSVM reads a numeric field's id back as its field index; no other format keeps numeric keys.
RawRows WithoutNumericKeys(RawRows rows) {
  for (int r = 0; r < rows.size(); ++r) {
    for (int f = 0; f < SyntheticData::kNumNumeric; ++f)
      rows.key[static_cast<size_t>(r) * kF + f] = 0;
  }
  return rows;
}

void Append(const RawRows& from, RawRows* to) {
  to->labels.insert(to->labels.end(), from.labels.begin(), from.labels.end());
  to->present.insert(to->present.end(), from.present.begin(), from.present.end());
  to->key.insert(to->key.end(), from.key.begin(), from.key.end());
  to->value.insert(to->value.end(), from.value.begin(), from.value.end());
}

class DatagenFormatTest : public ::testing::TestWithParam<DataFormat> {};

TEST_P(DatagenFormatTest, FilesReadBackToTheGeneratedRows) {
  const DataFormat format = GetParam();
  TempDir dir;
  DatagenOptions o;
  o.seed = 4;
  o.chunk_rows = 1000;
  o.fill_missing = format == LIBSVM;
  auto data = SyntheticData::Create(o);
  ASSERT_TRUE(data.ok()) << data.status();
  DatagenOutput out;
  out.dir = dir.File("data");
  out.format = format;
  out.rows = 2500;
  out.files = 3;
  out.threads = 2;
  auto result = WriteSyntheticData(*data, out);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->files.size(), 3u);

  RawRows expected;
  expected.Clear(kF);
  std::vector<float> probs;
  ASSERT_TRUE(data->Generate(2500, 1,
                             [&](const RawRows& rows, absl::Span<const float> p) {
                               Append(rows, &expected);
                               probs.insert(probs.end(), p.begin(), p.end());
                               return absl::OkStatus();
                             })
                  .ok());

  const FeatureSpec spec = CriteoSpec();
  RawRows got;
  got.Clear(kF);
  const int per_file[3] = {834, 833, 833};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(result->files[i],
              dir.File("data/part-0000" + std::to_string(i) + DataFormatExtension(format)));
    std::vector<absl::Status> errors;
    const RawRows rows = ParseFile(format, spec, result->files[i], &errors);
    EXPECT_TRUE(errors.empty()) << errors[0];
    EXPECT_EQ(rows.size(), per_file[i]);
    Append(rows, &got);
  }
  ASSERT_TRUE(SameRows(WithoutNumericKeys(got), WithoutNumericKeys(expected)));
  // The teacher sees the same thing in the files: same probabilities, same Bayes metrics.
  for (int r = 0; r < got.size(); ++r) {
    ASSERT_EQ(static_cast<float>(1 / (1 + std::exp(-data->TeacherLogit(got, r)))), probs[r]);
  }
  EXPECT_DOUBLE_EQ(result->bayes_auc, ComputeAuc(probs, expected.labels).value());
  EXPECT_NEAR(result->bayes_logloss, ComputeLogLoss(probs, expected.labels).value(), 1e-12);
  EXPECT_GT(result->bayes_auc, 0.74);

  const std::string json = ReadAll(dir.File("data/teacher.json"));
  for (const char* key : {"bayes_auc", "bayes_logloss", "rows", "positive_rate", "seed",
                          "teacher_seed", "format", "cardinalities", "files"}) {
    EXPECT_NE(json.find(std::string("\"") + key + "\":"), std::string::npos) << key;
  }
  EXPECT_NE(json.find("\"rows\":2500"), std::string::npos) << json;
  EXPECT_NE(json.find("\"format\":\"" + DataFormatName(format) + "\""), std::string::npos);
  EXPECT_NE(json.find("\"C3\":100000"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Formats, DatagenFormatTest,
                         ::testing::Values(CRITEO_TSV, CSV, LIBSVM, TFRECORD, RECORDIO),
                         [](const auto& info) { return DataFormatName(info.param); });

TEST(DatagenWriteTest, LibsvmNeedsFillMissing) {
  TempDir dir;
  auto data = SyntheticData::Create(DatagenOptions());
  ASSERT_TRUE(data.ok());
  DatagenOutput out;
  out.dir = dir.File("x");
  out.format = LIBSVM;
  out.rows = 10;
  const auto result = WriteSyntheticData(*data, out);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("fill_missing"), absl::string_view::npos);
}

int RunPstrain(const std::string& args, const TempDir& dir, std::string* output) {
  const std::string log = dir.File("log.txt");
  const int status =
      std::system((std::string(PSTRAIN_BINARY) + " " + args + " >" + log + " 2>&1").c_str());
  *output = ReadAll(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string JsonValue(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 3;
  return json.substr(begin, json.find_first_of(",}", begin) - begin);
}

TEST(DatagenCommandTest, WritesFilesAndTeacherJson) {
  TempDir dir;
  std::string output;
  ASSERT_EQ(
      RunPstrain("datagen --rows 3000 --seed 7 --teacher_seed 2 --format csv --files 2 --threads 2 "
                 "--out " +
                     dir.File("train"),
                 dir, &output),
      0)
      << output;
  EXPECT_NE(output.find("AUC"), std::string::npos) << output;
  EXPECT_FALSE(ReadAll(dir.File("train/part-00000.csv")).empty());
  EXPECT_FALSE(ReadAll(dir.File("train/part-00001.csv")).empty());
  const std::string train = ReadAll(dir.File("train/teacher.json"));
  EXPECT_EQ(JsonValue(train, "rows"), "3000");
  EXPECT_EQ(JsonValue(train, "seed"), "7");
  EXPECT_EQ(JsonValue(train, "teacher_seed"), "2");
  EXPECT_EQ(JsonValue(train, "format"), "\"csv\"");
  const double auc = std::stod(JsonValue(train, "bayes_auc"));
  EXPECT_GT(auc, 0.72);
  EXPECT_LT(auc, 0.88);
  EXPECT_GT(std::stod(JsonValue(train, "bayes_logloss")), 0.3);
  EXPECT_NEAR(std::stod(JsonValue(train, "positive_rate")), 0.25, 0.03);
  // A test set: another seed, the same teacher.
  ASSERT_EQ(RunPstrain("datagen --rows 1000 --seed 8 --teacher_seed 2 --format tfrecord --out " +
                           dir.File("test"),
                       dir, &output),
            0)
      << output;
  const std::string test = ReadAll(dir.File("test/teacher.json"));
  EXPECT_EQ(JsonValue(test, "bias"), JsonValue(train, "bias"));
  EXPECT_FALSE(ReadAll(dir.File("test/part-00000.tfrecords")).empty());
}

TEST(DatagenCommandTest, HighCardinalityFieldsAreRecordedInTeacherJson) {
  TempDir dir;
  std::string output;
  ASSERT_EQ(RunPstrain("datagen --rows 2000 --high_cardinality_fields C3,C9 --high_cardinality "
                       "4294967296 --high_cardinality_zipf_exponent 0.7 --out " +
                           dir.File("wide"),
                       dir, &output),
            0)
      << output;
  const std::string json = ReadAll(dir.File("wide/teacher.json"));
  EXPECT_NE(json.find("\"high_cardinality_fields\":[\"C3\",\"C9\"]"), std::string::npos) << json;
  EXPECT_EQ(JsonValue(json, "high_cardinality"), "4294967296");
  EXPECT_EQ(JsonValue(json, "high_cardinality_zipf_exponent"), "0.69999999999999996");
  EXPECT_EQ(JsonValue(json, "C3"), "4294967296");  // in "cardinalities"
  EXPECT_EQ(JsonValue(json, "C4"), "100000");
  // Without the option teacher.json has none of these keys.
  ASSERT_EQ(RunPstrain("datagen --rows 10 --out " + dir.File("plain"), dir, &output), 0) << output;
  EXPECT_EQ(ReadAll(dir.File("plain/teacher.json")).find("high_cardinality"), std::string::npos);
  // Bad values: exit 2 naming the flag or option.
  for (const std::string& bad : {std::string("--high_cardinality_fields C27 --high_cardinality 9"),
                                 std::string("--high_cardinality_fields C3 --high_cardinality "
                                             "4294967297"),
                                 std::string("--high_cardinality 1000")}) {
    EXPECT_EQ(RunPstrain("datagen --rows 10 " + bad + " --out " + dir.File("bad"), dir, &output),
              2)
        << bad;
    EXPECT_NE(output.find("high_cardinality"), std::string::npos) << bad << ": " << output;
  }
}

TEST(DatagenCommandTest, HelpAndBadFlags) {
  TempDir dir;
  std::string output;
  EXPECT_EQ(RunPstrain("datagen --help", dir, &output), 0);
  EXPECT_NE(output.find("--teacher_seed"), std::string::npos) << output;
  EXPECT_NE(output.find("--max_cardinality"), std::string::npos) << output;
  EXPECT_EQ(RunPstrain("datagen --out " + dir.File("x"), dir, &output), 2);
  EXPECT_NE(output.find("--rows"), std::string::npos) << output;
  EXPECT_EQ(RunPstrain("datagen --rows 10 --format parquet --out " + dir.File("x"), dir, &output),
            2);
  EXPECT_NE(output.find("parquet"), std::string::npos) << output;
  EXPECT_EQ(RunPstrain("datagen --rows 10 --bogus 1 --out " + dir.File("x"), dir, &output), 2);
}

}  // namespace
}  // namespace pstrain
