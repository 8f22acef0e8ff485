#include "worker/data/file_list.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FileListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pstrain_file_list_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0); }

  std::string Write(const std::string& rel, const std::string& contents) {
    const std::string path = absl::StrCat(dir_, "/", rel);
    const size_t slash = path.rfind('/');
    EXPECT_TRUE(MakeDirs(path.substr(0, slash)).ok());
    EXPECT_TRUE(WriteFileAtomic(path, contents).ok());
    return path;
  }

  std::string dir_;
};

TEST_F(FileListTest, RegularFileIsItself) {
  const std::string f = Write("a.tsv", "x\n");
  auto files = ExpandPath(f);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(f));
}

TEST_F(FileListTest, DirectoryListsRegularFilesSortedSkippingHiddenAndSubdirs) {
  Write("d/b.tsv", "b");
  Write("d/a.tsv", "a");
  Write("d/.hidden", "h");
  Write("d/sub/c.tsv", "c");
  auto files = ExpandPath(dir_ + "/d");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/d/a.tsv", dir_ + "/d/b.tsv"));
  // A trailing slash does not double it.
  files = ExpandPath(dir_ + "/d/");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/d/a.tsv", dir_ + "/d/b.tsv"));
}

TEST_F(FileListTest, GlobMatchesSortedAndNoMatchNamesThePattern) {
  Write("g/part-2.tsv", "");
  Write("g/part-10.tsv", "");
  Write("g/part-1.tsv", "");
  Write("g/other.txt", "");
  auto files = ExpandPath(dir_ + "/g/part-*.tsv");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files,
              ElementsAre(dir_ + "/g/part-1.tsv", dir_ + "/g/part-10.tsv", dir_ + "/g/part-2.tsv"));
  files = ExpandPath(dir_ + "/g/part-[12].tsv");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/g/part-1.tsv", dir_ + "/g/part-2.tsv"));

  auto none = ExpandPath(dir_ + "/g/*.parquet");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr(dir_ + "/g/*.parquet"));
}

TEST_F(FileListTest, MissingPathIsNotFoundNamingIt) {
  auto r = ExpandPath(dir_ + "/nope.tsv");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/nope.tsv"));
  // The vector overload stops at the first missing path.
  const std::string f = Write("a.tsv", "");
  auto v = ExpandPath(std::vector<std::string>{f, dir_ + "/gone"});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr(dir_ + "/gone"));
}

TEST_F(FileListTest, VectorOverloadConcatenatesInOrder) {
  const std::string b = Write("b.tsv", "");
  const std::string a = Write("a.tsv", "");
  auto files = ExpandPath(std::vector<std::string>{b, a, b});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(b, a, b));
}

TEST_F(FileListTest, ManifestWithRelativePrefixAndRepeatedKey) {
  Write("data/day0/p0.tsv", "0");
  Write("data/day0/p1.tsv", "1");
  const std::string m = Write(
      "m/train.manifest",
      "[ {\"prefix\": \"../data/\"},\n \"day0/p0.tsv\", \"day0/p1.tsv\",\n \"day0/p0.tsv\" ]\n");
  auto files = ExpandPath(m);
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string p = dir_ + "/m/../data/";
  EXPECT_THAT(*files, ElementsAre(p + "day0/p0.tsv", p + "day0/p1.tsv", p + "day0/p0.tsv"));
}

TEST_F(FileListTest, ManifestWithAbsolutePrefixAndEscapes) {
  Write("data/a b.tsv", "");
  Write("data/\xC3\xA9.tsv", "");  // é
  const std::string m =
      Write("abs.manifest",
            absl::StrCat("[{\"prefix\":\"", dir_, "\\/data/\"},\"a b.tsv\",\"\\u00e9.tsv\"]"));
  auto files = ExpandPath(m);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir_ + "/data/a b.tsv", dir_ + "/data/\xC3\xA9.tsv"));
}

TEST_F(FileListTest, ManifestRefusesS3Prefix) {
  const std::string m = Write("s3.manifest", "[{\"prefix\": \"s3://bucket/path/\"}, \"k\"]");
  auto r = ExpandPath(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("s3://bucket/path/"));
  EXPECT_THAT(r.status().message(), HasSubstr("local"));
}

TEST_F(FileListTest, ManifestMissingKeyNamesManifestAndKey) {
  const std::string m = Write("x.manifest", "[{\"prefix\": \"\"}, \"absent.tsv\"]");
  auto r = ExpandPath(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(m));
  EXPECT_THAT(r.status().message(), HasSubstr("absent.tsv"));
}

TEST_F(FileListTest, BadManifestJsonReportsTheOffset) {
  const std::string m = Write("bad.manifest", "[{\"prefix\": \"d/\"}, \"a\" \"b\"]");
  auto r = ExpandPath(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(m));
  EXPECT_THAT(r.status().message(), HasSubstr("offset 23"));  // the second string
}

struct BadCase {
  const char* text;
  const char* offset;  // "offset N"
  const char* what;
};

TEST(ParseManifest, RejectsEachMalformedShapeAtItsOffset) {
  const BadCase cases[] = {
      {"", "offset 0", "expected '['"},
      {"{\"prefix\": \"a\"}", "offset 0", "expected '['"},
      {"[]", "offset 1", "prefix object"},
      {"[\"k\"]", "offset 1", "prefix object"},
      {"[{\"prefix\": \"a\"}, \"k\", {\"prefix\": \"b\"}]", "offset 23", "must come first"},
      {"[{\"prefix\": \"a\"}, \"k\",]", "offset 22", "expected a key string"},
      {"[{\"prefix\": \"a\"}, \"k\"", "offset 21", "expected ']'"},
      {"[{\"prefix\": \"a\"}, \"k\"] x", "offset 23", "end of the file"},
      {"[{\"prefix\": \"a\"}, \"k", "offset 20", "unterminated string"},
      {"[{\"prefix\": \"a\"}, \"\\q\"]", "offset 19", "invalid escape"},
      {"[{\"prefix\": \"a\"}, \"\\u12\"]", "offset 23", "hex digits"},
      {"[{\"prefix\": \"a\"}, 3]", "offset 18", "expected a key string"},
      {"[{\"prefx\": \"a\"}]", "offset 15", "\"prefix\" member"},
      {"[{\"prefix\": 1}]", "offset 12", "expected a string"},
      {"[{\"prefix\": \"a\"}, \"\"]", "offset 20", "empty key"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.text);
    std::string prefix;
    std::vector<std::string> keys;
    const absl::Status s = ParseManifest(c.text, "m.manifest", &prefix, &keys);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("manifest m.manifest"));
    EXPECT_THAT(s.message(), HasSubstr(c.offset));
    EXPECT_THAT(s.message(), HasSubstr(c.what));
  }
}

TEST(ParseManifest, AcceptsWhitespaceExtraMembersAndSurrogates) {
  std::string prefix;
  std::vector<std::string> keys;
  ASSERT_TRUE(
      ParseManifest(" \n[ { \"note\" : \"x\" , \"prefix\" : \"p/\" } , \"\\ud83d\\ude00\" ] \n",
                    "m", &prefix, &keys)
          .ok());
  EXPECT_EQ(prefix, "p/");
  EXPECT_THAT(keys, ElementsAre("\xF0\x9F\x98\x80"));
}

}  // namespace
}  // namespace pstrain
