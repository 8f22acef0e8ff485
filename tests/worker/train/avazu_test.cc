// configs/avazu.textproto trains with the real binary on an Avazu-shaped CSV (the 24 columns of
// Kaggle's Avazu train.gz, `click` label, hex ids, decimal C14..C21, quoted fields with commas)
// whose clicks come from a planted logistic model; the training file is gzipped, as Avazu's is.
// The model must beat chance clearly on held-out rows. Also: the CSV quoting rules (RFC 4180).
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"
#include "worker/data/formats/csv.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/avazu_", getpid()); }

// Rows shaped like Avazu's: `id,click,hour,C1,banner_pos,site_id,...,C21`. The click probability
// is a logistic function of site_category, app_category x hour of day, device_type, banner_pos
// and C14, so a model that uses those fields (and their interaction) can learn it.
std::string AvazuCsv(int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % n); };
  std::string out =
      "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
      "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,"
      "C17,C18,C19,C20,C21\n";
  const char* models[] = {"\"iPhone, 6s\"", "8a4875bd", "\"Galaxy \"\"S5\"\"\"", "1f0bc64f",
                          "d787e91b"};
  for (int i = 0; i < rows; ++i) {
    const int hod = pick(24), site_cat = pick(8), app_cat = pick(6), dev_type = pick(3);
    const int banner = pick(2), c14 = pick(40);
    const double logit = -1.3 + 0.9 * ((site_cat % 3) - 1) + 0.8 * (banner ? 1 : -1) * 0.6 +
                         ((app_cat + hod / 6) % 3 == 0 ? 1.1 : -0.4) + 0.5 * (dev_type - 1) +
                         (c14 < 8 ? 0.9 : 0.0);
    const int click = std::uniform_real_distribution<double>(0, 1)(rng) < 1 / (1 + std::exp(-logit));
    absl::StrAppendFormat(
        &out, "%u%06d,%d,141021%02d,1005,%d,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%s,%d,0,%d,"
              "320,50,%d,0,35,-1,79\n",
        seed, i, click, hod, banner, 0x1000 + pick(300), 0x2000 + pick(200), 0x3000 + site_cat,
        0x4000 + pick(300), 0x5000 + pick(100), 0x6000 + app_cat, 0x7000 + pick(5000),
        0x8000 + pick(8000), models[pick(5)], dev_type, 15000 + c14, 1700 + c14 / 4);
  }
  return out;
}

TEST(AvazuTest, ShippedConfigTrainsOnAvazuShapedGzipCsv) {
  const std::string dir = Dir();
  std::string out;
  ASSERT_EQ(testing::RunShell("rm -rf " + dir + " && mkdir -p " + dir, 30, &out), 0);
  ASSERT_TRUE(WriteFileAtomic(dir + "/train.csv", AvazuCsv(30000, 1)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/test.csv", AvazuCsv(6000, 2)).ok());
  ASSERT_EQ(testing::RunShell("gzip " + dir + "/train.csv", 60, &out), 0) << out;
  const std::string cmd = absl::StrCat(
      PSTRAIN_BINARY, " train --config ", PSTRAIN_SOURCE_DIR, "/configs/avazu.textproto",
      " --train ", dir, "/train.csv.gz --eval ", dir, "/test.csv --model_dir ", dir, "/model",
      " --set model.hidden=[32,32] --set threads.towers=1 --set threads.intra_op_threads=1",
      " --set threads.inter_op_threads=1 --set train.global_batch_size=128 --epochs 2");
  ASSERT_EQ(testing::RunShell(cmd, 600, &out), 0) << out;
  auto summary = ReadFileToString(dir + "/model/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  std::printf("summary.json: %s", summary->c_str());
  EXPECT_THAT(*summary, HasSubstr("\"examples\":60000"));
  EXPECT_THAT(*summary, HasSubstr("\"eval_examples\":6000"));
  EXPECT_THAT(*summary, HasSubstr("\"bad_records\":0"));
  const size_t at = summary->find("\"test_auc\":");
  ASSERT_NE(at, std::string::npos);
  double auc = 0;
  ASSERT_TRUE(absl::SimpleAtod(summary->substr(at + 11, summary->find(',', at) - at - 11), &auc));
  // The planted model's own AUC on such rows is ~0.75; chance is 0.5.
  EXPECT_GT(auc, 0.68) << *summary;
  testing::RunShell("rm -rf " + dir, 30, &out);
}

TEST(CsvQuoting, Rfc4180FieldsAndWhatIsRefused) {
  std::vector<absl::string_view> f;
  std::string storage;
  ASSERT_TRUE(SplitCsvLine(R"(a,"b,c","say ""hi""",,"")", &f, &storage).ok());
  EXPECT_THAT(f, ElementsAre("a", "b,c", "say \"hi\"", "", ""));
  ASSERT_TRUE(SplitCsvLine("plain,line", &f, &storage).ok());
  EXPECT_THAT(f, ElementsAre("plain", "line"));
  ASSERT_TRUE(SplitCsvLine(R"("x")", &f, &storage).ok());
  EXPECT_THAT(f, ElementsAre("x"));
  // A newline inside quotes: the line ends with the quote open.
  absl::Status s = SplitCsvLine(R"(1,"multi)", &f, &storage);
  EXPECT_THAT(std::string(s.message()), HasSubstr("column 2: a quoted field is not closed"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("newlines inside quoted fields are not supported"));
  s = SplitCsvLine(R"("a"b,c)", &f, &storage);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected ',' or the end of the line"));
  s = SplitCsvLine(R"(a,b"c)", &f, &storage);
  EXPECT_THAT(std::string(s.message()), HasSubstr("column 2: a '\"' inside an unquoted field"));
}

}  // namespace
}  // namespace pstrain
