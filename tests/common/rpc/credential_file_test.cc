// The files that hold credentials (common/rpc/security.h ReadCredentialFile): the cluster
// secret's (cluster.secret_file) and serve's admin token (--admin_token_file). What each refusal
// says, that a FIFO is refused without waiting for a writer, and that no error carries the
// credential itself.
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/temp_files.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kGood[] = "0123456789abcdef-credential";

class CredentialFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshDir("credential_file"); }
  // `content` at dir/name with `mode`.
  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, content).ok());
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  std::string dir_;
};

TEST_F(CredentialFileTest, ReadsTheStrippedContentOfAnOwnerOnlyFile) {
  const std::string path = Write("token", absl::StrCat("\n  ", kGood, " \n"), 0600);
  absl::StatusOr<std::string> token = ReadCredentialFile(path, "the admin token");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kGood);
  absl::StatusOr<std::string> secret = ReadSecretFile(path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(*secret, kGood);
  // 0400 (read-only for the owner) is as good as 0600.
  ASSERT_EQ(chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(ReadCredentialFile(path, "the admin token").ok());
}

TEST_F(CredentialFileTest, AFileOthersMayReadIsRefusedSayingToChmod600) {
  for (mode_t mode : {0604, 0640, 0644, 0666, 0601}) {
    const std::string path = Write("token", kGood, mode);
    absl::StatusOr<std::string> token = ReadCredentialFile(path, "the admin token");
    ASSERT_FALSE(token.ok()) << mode;
    EXPECT_TRUE(absl::IsPermissionDenied(token.status())) << token.status();
    EXPECT_THAT(token.status().message(),
                HasSubstr(absl::StrFormat("the admin token file %s may be read by other users "
                                          "(mode %03o); chmod 600 it",
                                          path, mode)));
  }
}

TEST_F(CredentialFileTest, BadContentIsRefusedNamingTheFileNeverTheContent) {
  struct Case {
    std::string content;
    std::string error;
  };
  const Case cases[] = {
      {"0123456789abcde", "the admin token has 15 bytes; expected at least 16"},
      {"0123456789abcdef 0123456789", "the admin token must be printable ASCII without spaces"},
      {"0123456789abcdef\x01-0123", "the admin token must be printable ASCII without spaces"},
      {"0123456789abcdef\xc3\xa9-0123", "must be printable ASCII without spaces"},
      {" \n\t\n", "is empty"},
      {"", "is empty"},
      {std::string(4097, 'a'), "has 4097 bytes; expected at most 4096"},
  };
  for (const Case& c : cases) {
    const std::string path = Write("token", c.content, 0600);
    absl::StatusOr<std::string> token = ReadCredentialFile(path, "the admin token");
    ASSERT_FALSE(token.ok()) << c.error;
    EXPECT_TRUE(absl::IsInvalidArgument(token.status())) << token.status();
    EXPECT_THAT(token.status().message(), HasSubstr(c.error));
    EXPECT_THAT(token.status().message(), HasSubstr(path));
    EXPECT_THAT(token.status().message(), Not(HasSubstr("0123456789")));
  }
  // 4096 bytes is the most, and enough.
  const std::string path = Write("token", std::string(4096, 'a'), 0600);
  EXPECT_TRUE(ReadCredentialFile(path, "the admin token").ok());
}

TEST_F(CredentialFileTest, AFifoADirectoryAndAMissingFileAreRefusedAtOnce) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens it: a reader that opened it blocking would wait here for ever.
  absl::StatusOr<std::string> token = ReadCredentialFile(fifo, "the admin token");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(),
              HasSubstr("the admin token file " + fifo + " is not a regular file"));
  token = ReadCredentialFile(dir_, "the admin token");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("is not a regular file"));
  token = ReadCredentialFile(dir_ + "/missing", "the admin token");
  ASSERT_FALSE(token.ok());
  EXPECT_TRUE(absl::IsNotFound(token.status())) << token.status();
  EXPECT_THAT(token.status().message(), HasSubstr("the admin token file " + dir_ + "/missing"));
}

TEST_F(CredentialFileTest, TheClusterSecretKeepsItsNameInEveryError) {
  EXPECT_THAT(ReadSecretFile(Write("secret", kGood, 0644)).status().message(),
              HasSubstr("the cluster secret file " + dir_ + "/secret may be read by other users"));
  EXPECT_THAT(ReadSecretFile(Write("secret", "short", 0600)).status().message(),
              HasSubstr("the cluster secret has 5 bytes; expected at least 16"));
  RpcSecurity security;
  security.secret = "short";
  EXPECT_THAT(ValidateRpcSecurity(security).message(),
              HasSubstr("the cluster secret has 5 bytes; expected at least 16"));
  security.secret = "0123456789abcdef 0123";
  EXPECT_THAT(ValidateRpcSecurity(security).message(),
              HasSubstr("the cluster secret must be printable ASCII without spaces"));
  security.secret = kGood;
  EXPECT_TRUE(ValidateRpcSecurity(security).ok());
}

}  // namespace
}  // namespace pstrain
