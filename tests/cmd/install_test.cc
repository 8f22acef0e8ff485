// `cmake --install` into a staging prefix gives a binary that runs on its own (with the shipped
// configs beside it), and the Dockerfile's runtime stage names every Debian package whose shared
// library the binary links (ldd mapped to packages with dpkg -S), so the image cannot drift from
// the build. The image itself is not built here: `FROM debian:12` needs a container registry,
// which this machine cannot reach (docs/DEPLOY.md "Containers").
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string BuildDir() {
  const std::string bin = PSTRAIN_BINARY;
  return bin.substr(0, bin.rfind('/'));
}

TEST(Install, StagedBinaryRunsWithItsConfigs) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/install_", getpid());
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat("rm -rf ", prefix, " && cmake --install ", BuildDir(),
                                           " --prefix ", prefix),
                              120, &out),
            0)
      << out;
  EXPECT_TRUE(PathExists(prefix + "/bin/pstrain"));
  EXPECT_TRUE(PathExists(prefix + "/share/pstrain/configs/deepfm_criteo.textproto"));
  EXPECT_TRUE(PathExists(prefix + "/share/doc/pstrain/DEPLOY.md"));
  ASSERT_EQ(testing::RunShell(prefix + "/bin/pstrain --version", 30, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("pstrain "));
  ASSERT_EQ(testing::RunShell(absl::StrCat(prefix, "/bin/pstrain config --config ", prefix,
                                           "/share/pstrain/configs/avazu.textproto --train x.csv "
                                           "--eval y.csv"),
                              30, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("label_name: \"click\""));
  // The Python reader runs from the prefix (NumPy only); the serve client finds its protos.
  const std::string python = prefix + "/share/pstrain/python";
  EXPECT_TRUE(PathExists(python + "/../proto/pstrain/serving.proto"));
  EXPECT_TRUE(PathExists(python + "/../proto/grpc/health/v1/health.proto"));
  EXPECT_TRUE(PathExists(python + "/serve_client.py"));
  ASSERT_EQ(testing::RunShell(absl::StrCat("cd / && /usr/bin/python3 -c 'import sys; ",
                                           "sys.path.insert(0, \"", python, "\"); ",
                                           "import pstrain_checkpoint as p; print(p.__file__)'"),
                              30, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr(python + "/pstrain_checkpoint.py"));
  testing::RunShell("rm -rf " + prefix, 30, &out);
}

TEST(Install, DockerfileRuntimeStageHasEveryLinkedLibrarysPackage) {
  std::string packages;
  // Debian 12 merges /lib into /usr/lib: dpkg knows a library by either path.
  ASSERT_EQ(testing::RunShell(absl::StrCat("for f in $(ldd ", PSTRAIN_BINARY,
                                           " | awk '/=>/{print $3}'); do p=$(realpath $f); "
                                           "dpkg -S $p 2>/dev/null || dpkg -S ${p#/usr}; done | "
                                           "cut -d: -f1 | sort -u"),
                              60, &packages),
            0)
      << packages;
  auto dockerfile = ReadFileToString(std::string(PSTRAIN_SOURCE_DIR) + "/Dockerfile");
  ASSERT_TRUE(dockerfile.ok());
  const std::string runtime = dockerfile->substr(dockerfile->rfind("FROM debian:12"));
  int checked = 0;
  for (absl::string_view p : absl::StrSplit(packages, '\n', absl::SkipWhitespace())) {
    if (p == "libc6" || p == "libgcc-s1") continue;  // in every Debian image
    EXPECT_THAT(runtime, HasSubstr(std::string(p))) << "add " << p << " to the Dockerfile's runtime stage";
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace pstrain
