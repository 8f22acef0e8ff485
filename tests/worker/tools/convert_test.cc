#include "worker/tools/convert.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

using testing_util::CriteoSpec;
using testing_util::ParseFile;
using testing_util::ReadAll;
using testing_util::SameRows;
using testing_util::TempDir;
using testing_util::WriteRows;

void Append(const RawRows& from, int r, RawRows* to) {
  const size_t f = from.num_fields, i = static_cast<size_t>(r) * f;
  to->labels.push_back(from.labels[r]);
  to->present.insert(to->present.end(), from.present.begin() + i, from.present.begin() + i + f);
  to->key.insert(to->key.end(), from.key.begin() + i, from.key.begin() + i + f);
  to->value.insert(to->value.end(), from.value.begin() + i, from.value.begin() + i + f);
}

// Rows of the files, in order. Numeric keys are zeroed (only LibSVM has them: the field index).
RawRows ReadFiles(const std::vector<std::string>& files, DataFormat format) {
  const FeatureSpec spec = CriteoSpec();
  RawRows all;
  all.Clear(spec.num_fields());
  for (const std::string& file : files) {
    std::vector<absl::Status> errors;
    const RawRows rows = ParseFile(format, spec, file, &errors);
    EXPECT_TRUE(errors.empty()) << errors[0];
    for (int r = 0; r < rows.size(); ++r) Append(rows, r, &all);
  }
  for (int r = 0; r < all.size(); ++r) {
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (spec.field(f).kind == NUMERIC)
        all.key[static_cast<size_t>(r) * spec.num_fields() + f] = 0;
    }
  }
  return all;
}

// The rows sorted by their contents, to compare as multisets.
RawRows Sorted(const RawRows& rows) {
  const size_t f = rows.num_fields;
  std::vector<int> order(rows.size());
  for (int i = 0; i < rows.size(); ++i) order[i] = i;
  auto tie = [&](int r) {
    const size_t i = r * f;
    return std::make_tuple(
        rows.labels[r],
        std::vector<uint8_t>(rows.present.begin() + i, rows.present.begin() + i + f),
        std::vector<uint64_t>(rows.key.begin() + i, rows.key.begin() + i + f),
        std::vector<double>(rows.value.begin() + i, rows.value.begin() + i + f));
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return tie(a) < tie(b); });
  RawRows out;
  out.Clear(rows.num_fields);
  for (int r : order) Append(rows, r, &out);
  return out;
}

RawRows Generated(int n, bool fill_missing) {
  DatagenOptions o;
  o.seed = 21;
  o.fill_missing = fill_missing;
  auto data = SyntheticData::Create(o);
  PSTRAIN_CHECK(data.ok()) << data.status();
  RawRows all;
  all.Clear(SyntheticData::kNumFields);
  PSTRAIN_CHECK(data->Generate(n, 1,
                               [&](const RawRows& rows, absl::Span<const float>) {
                                 for (int r = 0; r < rows.size(); ++r) Append(rows, r, &all);
                                 return absl::OkStatus();
                               })
                    .ok());
  return all;
}

ConvertOptions Options(const std::string& input, DataFormat from, DataFormat to,
                       const std::string& out) {
  ConvertOptions o;
  o.inputs = {input};
  o.from = from;
  o.to = to;
  o.out_dir = out;
  return o;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

class ConvertPairTest : public ::testing::TestWithParam<std::tuple<DataFormat, DataFormat>> {};

TEST_P(ConvertPairTest, KeepsOrderOrShufflesAPermutation) {
  const auto [from, to] = GetParam();
  TempDir dir;
  const RawRows rows = Generated(1200, from == LIBSVM || to == LIBSVM);
  const FeatureSpec spec = CriteoSpec();
  const std::string input = dir.File("input" + DataFormatExtension(from));
  WriteRows(from, spec, input, rows);
  const RawRows original = ReadFiles({input}, from);

  // In order.
  auto plain = Convert(Options(input, from, to, dir.File("plain")));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rows, 1200);
  EXPECT_EQ(plain->files.size(), 1u);
  EXPECT_TRUE(SameRows(ReadFiles(plain->files, to), original));

  // And back, shuffled, into small files.
  ConvertOptions back = Options(dir.File("plain"), to, from, dir.File("back"));
  back.shuffle = true;
  back.shuffle_seed = 5;
  back.target_file_bytes = 60000;
  auto shuffled = Convert(back);
  ASSERT_TRUE(shuffled.ok()) << shuffled.status();
  EXPECT_GT(shuffled->files.size(), 1u);
  const RawRows got = ReadFiles(shuffled->files, from);
  EXPECT_FALSE(SameRows(got, original));  // the order changed
  EXPECT_TRUE(SameRows(Sorted(got), Sorted(original)));
  // No bucket files are left behind.
  EXPECT_EQ(std::system(("ls -a " + dir.File("back") + " | grep -q shuffle").c_str()) == 0, false);
}

INSTANTIATE_TEST_SUITE_P(
    AllPairs, ConvertPairTest,
    ::testing::Combine(::testing::Values(CRITEO_TSV, CSV, LIBSVM, TFRECORD, RECORDIO),
                       ::testing::Values(CRITEO_TSV, CSV, LIBSVM, TFRECORD, RECORDIO)),
    [](const auto& info) {
      return DataFormatName(std::get<0>(info.param)) + "_to_" +
             DataFormatName(std::get<1>(info.param));
    });

TEST(ConvertTest, ShuffleIsDeterministicAndSeedDependent) {
  TempDir dir;
  const FeatureSpec spec = CriteoSpec();
  const std::string input = dir.File("in.tsv");
  WriteRows(CRITEO_TSV, spec, input, Generated(3000, false));
  std::vector<RawRows> runs;
  for (uint64_t seed : {9, 9, 10}) {
    ConvertOptions o =
        Options(input, CRITEO_TSV, TFRECORD, dir.File(absl::StrCat("o", runs.size())));
    o.shuffle = true;
    o.shuffle_seed = seed;
    o.target_file_bytes = 200000;  // several buckets
    auto result = Convert(o);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_GT(result->buckets, 1);
    runs.push_back(ReadFiles(result->files, TFRECORD));
  }
  EXPECT_TRUE(SameRows(runs[0], runs[1]));
  EXPECT_FALSE(SameRows(runs[0], runs[2]));
  EXPECT_TRUE(SameRows(Sorted(runs[0]), Sorted(runs[2])));
}

TEST(ConvertTest, SplitsNearTheTargetSize) {
  TempDir dir;
  const std::string input = dir.File("in.tsv");
  WriteRows(CRITEO_TSV, CriteoSpec(), input, Generated(4000, false));
  for (bool shuffle : {false, true}) {
    ConvertOptions o = Options(input, CRITEO_TSV, RECORDIO, dir.File(shuffle ? "s" : "p"));
    o.target_file_bytes = 50000;
    o.shuffle = shuffle;
    auto result = Convert(o);
    ASSERT_TRUE(result.ok()) << result.status();
    uint64_t total = 0;
    for (size_t i = 0; i < result->files.size(); ++i) {
      const uint64_t size = FileSize(result->files[i]);
      total += size;
      EXPECT_LE(size, 50000u + 1000) << result->files[i];  // at most about a row over
      if (i + 1 < result->files.size()) {
        EXPECT_GE(size, 50000u) << result->files[i];
      }
    }
    EXPECT_EQ(total, result->bytes);
    EXPECT_EQ(result->files[0], dir.File(std::string(shuffle ? "s" : "p") + "/part-00000.rec"));
    EXPECT_EQ(result->rows, 4000);
  }
}

// The real TFRecord sample (written by TensorFlow) to every other format and back.
TEST(ConvertTest, RealTfrecordsRoundTrip) {
  ASSERT_SHARED_DATA(input, "criteo/criteo_sample.tr.tfrecords");
  const RawRows original = ReadFiles({input}, TFRECORD);
  ASSERT_EQ(original.size(), 160);
  for (DataFormat format : {CRITEO_TSV, CSV, LIBSVM, RECORDIO}) {
    TempDir dir;
    auto there = Convert(Options(input, TFRECORD, format, dir.File("there")));
    ASSERT_TRUE(there.ok()) << DataFormatName(format) << ": " << there.status();
    // Numeric values were float32 in the Example: as doubles they survive every format exactly.
    EXPECT_TRUE(SameRows(ReadFiles(there->files, format), original)) << DataFormatName(format);
    auto back = Convert(Options(dir.File("there"), format, TFRECORD, dir.File("back")));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(SameRows(ReadFiles(back->files, TFRECORD), original)) << DataFormatName(format);
  }
}

TEST(ConvertTest, BadRecordsFailWithTheirPlaceOrAreSkipped) {
  ASSERT_SHARED_DATA(kaggle, "criteo/kaggle_train_head10k.tsv");
  TempDir dir;
  const std::string tsv = ReadAll(kaggle).substr(0, 200000);
  std::string lines = tsv.substr(0, tsv.rfind('\n') + 1);
  const size_t third = lines.find('\n', lines.find('\n') + 1) + 1;
  lines.insert(third, "1\tnot-a-number\n");  // line 3
  const std::string input = dir.Write("bad.tsv", lines);
  auto strict = Convert(Options(input, CRITEO_TSV, CSV, dir.File("a")));
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("bad.tsv:line 3"), absl::string_view::npos)
      << strict.status();
  ConvertOptions lenient = Options(input, CRITEO_TSV, CSV, dir.File("b"));
  lenient.max_bad_record_fraction = 0.01;
  auto skipped = Convert(lenient);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->bad_records, 1);
  EXPECT_GT(skipped->rows, 100);
}

TEST(ConvertTest, MissingValuesCannotGoToLibsvm) {
  TempDir dir;
  const std::string input = dir.File("in.tsv");
  WriteRows(CRITEO_TSV, CriteoSpec(), input, Generated(50, false));
  const auto result = Convert(Options(input, CRITEO_TSV, LIBSVM, dir.File("x")));
  EXPECT_FALSE(result.ok());
}

int RunPstrain(const std::string& args, const TempDir& dir, std::string* output) {
  const std::string log = dir.File("log.txt");
  const int status =
      std::system((std::string(PSTRAIN_BINARY) + " " + args + " >" + log + " 2>&1").c_str());
  *output = ReadAll(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ConvertCommandTest, ConvertsAndExplainsItsFlags) {
  ASSERT_SHARED_DATA(sample, "criteo/criteo_sample.tr.tfrecords");
  TempDir dir;
  std::string output;
  EXPECT_EQ(RunPstrain("convert --help", dir, &output), 0);
  EXPECT_NE(output.find("--target_file_mb"), std::string::npos) << output;
  EXPECT_EQ(RunPstrain("convert --from tsv --to csv --out " + dir.File("x"), dir, &output), 2);
  ASSERT_EQ(
      RunPstrain("convert --input " + sample +
                     " --from tfrecord --to tsv --shuffle_seed 3 --target_file_mb 0.01 --out " +
                     dir.File("out"),
                 dir, &output),
      0)
      << output;
  EXPECT_NE(output.find("160 rows"), std::string::npos) << output;
  EXPECT_FALSE(ReadAll(dir.File("out/part-00001.tsv")).empty());
}

}  // namespace
}  // namespace pstrain
