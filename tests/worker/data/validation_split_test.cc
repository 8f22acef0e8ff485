#include "worker/data/validation_split.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The split is a function of the record's bytes: stable, close to the fraction, nested (a record
// held out at fraction f is held out at every larger fraction), blind to trailing line ends.
TEST(ValidationSplit, FractionNestingAndLineEnds) {
  int held10 = 0, held30 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const std::string r = absl::StrCat(i % 2, "\t", i, "\t\tabc", i * 7);
    const bool a = InValidationSplit(r, 0.1), b = InValidationSplit(r, 0.3);
    held10 += a;
    held30 += b;
    if (a) EXPECT_TRUE(b) << r;
    EXPECT_EQ(InValidationSplit(r, 0.1), a);
    EXPECT_EQ(InValidationSplit(r + "\n", 0.1), a);
    EXPECT_EQ(InValidationSplit(r + "\r\n", 0.1), a);
    EXPECT_FALSE(InValidationSplit(r, 0));
  }
  EXPECT_NEAR(held10, 0.1 * n, 0.01 * n);
  EXPECT_NEAR(held30, 0.3 * n, 0.015 * n);
}

// Golden values: a change of the hash would move records between training and validation, so a
// resumed job would train on its validation data. These must never change.
TEST(ValidationSplit, Golden) {
  std::string got;
  for (int i = 0; i < 32; ++i) {
    got += InValidationSplit(absl::StrCat("record ", i), 0.5) ? '1' : '0';
  }
  EXPECT_EQ(got, "00011000000100010110000110101011");
}

}  // namespace
}  // namespace pstrain
