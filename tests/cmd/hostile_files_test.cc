// FIFOs where pstrain reads its small files (issue 26 item 4): a LATEST or a MANIFEST that is a
// FIFO hung `predict` and `train` (and `train` ignored SIGTERM). Every such file is opened
// without blocking and refused for what it is (common/file.h OpenRegularFile; a checkpoint's
// MANIFEST is checked with lstat first, checkpoint/layout.h), so each command fails at once,
// naming the file, although nothing ever writes to the FIFO. The same for the files `train`
// appends to in its model dir: a FIFO planted as metrics.jsonl hung it before it read a batch
// (SIGTERM did not end it), and a symlink there had it append to a file outside the directory
// (common/file.h OpenForAppend refuses both). Real processes; every run is bounded by RunShell's
// timeout (exit 124 would be the hang).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/hostile_files_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

const char kConfig[] = R"pb(
  data { train { name: "train" format: CRITEO_TSV } }
  features { preset: CRITEO categorical_vocab_size: 1000 }
  model { type: LR }
  train { batch_size: 32 epochs: 1 log_every_steps: 100000 }
  threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

class HostileFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string out;
    ASSERT_EQ(testing::RunShell(absl::StrCat("rm -rf ", Dir(), " && mkdir -p ", Dir(), " && cd ",
                                             Dir(), " && ", P(),
                                             " datagen --rows 200 --seed 1 --out data"),
                                120, &out),
              0)
        << out;
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", kConfig).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  // `predict` and `train` on `model_dir`: each must fail (not hang: 124) naming `fifo`.
  static void ExpectCommandsRefuse(const std::string& model_dir, const std::string& fifo) {
    // exec: the command is timeout's own child, which it can kill (a `train` blocked on a FIFO
    // ignored SIGTERM, and a grandchild outliving sh would hold the output pipe open).
    const std::string predict =
        absl::StrCat("exec ", P(), " predict --model_dir ", model_dir, " --input ", Dir(),
                     "/data/part-00000.tsv --out ", Dir(), "/scores.txt");
    const std::string train = absl::StrCat("exec ", P(), " train --config ", Dir(),
                                           "/config.textproto --train '", Dir(),
                                           "/data/part-*' --model_dir ", model_dir);
    for (const std::string& command : {predict, train}) {
      SCOPED_TRACE(command);
      std::string out;
      const int code = testing::RunShell(command, 30, &out);
      // 124: timeout's TERM ended it; 137: its KILL 5 s later. A clean failure is 1 or 2.
      EXPECT_TRUE(code != 124 && code != 137) << "hung on the FIFO (" << code << "): " << out;
      EXPECT_TRUE(code > 0 && code < 124) << code << ": " << out;
      EXPECT_THAT(out, HasSubstr(fifo + ": not a regular file"));
    }
    EXPECT_FALSE(PathExists(Dir() + "/scores.txt"));
  }
};

TEST_F(HostileFilesTest, AFifoAsLatestFailsPredictAndTrainAtOnce) {
  const std::string model = Dir() + "/latest_fifo";
  ASSERT_TRUE(MakeDirs(model).ok());
  ASSERT_EQ(::mkfifo((model + "/LATEST").c_str(), 0600), 0);
  ExpectCommandsRefuse(model, model + "/LATEST");
}

TEST_F(HostileFilesTest, AFifoAsManifestFailsPredictAndTrainAtOnce) {
  const std::string model = Dir() + "/manifest_fifo";
  ASSERT_TRUE(MakeDirs(model + "/ckpt-5").ok());
  ASSERT_TRUE(WriteFileAtomic(model + "/LATEST", "ckpt-5\n").ok());
  ASSERT_EQ(::mkfifo((model + "/ckpt-5/MANIFEST").c_str(), 0600), 0);
  ExpectCommandsRefuse(model, model + "/ckpt-5/MANIFEST");
}

TEST_F(HostileFilesTest, AFifoOrASymlinkAsTrainsLogIsRefusedAtOnce) {
  const std::string outside = Dir() + "/outside.txt";
  ASSERT_TRUE(WriteFileAtomic(outside, "precious\n").ok());
  for (const bool fifo : {true, false}) {
    const std::string model = Dir() + (fifo ? "/log_fifo" : "/log_symlink");
    const std::string log = model + "/metrics.jsonl";
    ASSERT_TRUE(MakeDirs(model).ok());
    if (fifo) {
      ASSERT_EQ(::mkfifo(log.c_str(), 0600), 0);
    } else {
      ASSERT_EQ(::symlink(outside.c_str(), log.c_str()), 0);
    }
    std::string out;
    const int code = testing::RunShell(
        absl::StrCat("exec ", P(), " train --config ", Dir(), "/config.textproto --train '", Dir(),
                     "/data/part-*' --model_dir ", model),
        30, &out);
    EXPECT_TRUE(code != 124 && code != 137) << "hung on the FIFO (" << code << "): " << out;
    EXPECT_TRUE(code > 0 && code < 124) << code << ": " << out;
    EXPECT_THAT(out, HasSubstr(log + ": not a regular file (" + (fifo ? "a FIFO" : "a symlink")));
    EXPECT_EQ(ReadFileToString(outside).value_or(""), "precious\n");
  }
}

// A symlink named like each checkpoint `train` may write (ckpt-1 ... ckpt-20 -> a directory
// outside, which holds a MANIFEST of its own): the checkpoint goes into a real directory of the
// model dir, and nothing is written into the target or deleted from it (until 2026-11-29 the
// target's MANIFEST was removed and the checkpoint written there, where no reader would take it).
TEST_F(HostileFilesTest, ASymlinkNamedLikeTheNextCheckpointIsReplaced) {
  const std::string model = Dir() + "/ckpt_symlink";
  const std::string outside = Dir() + "/outside_ckpt";
  ASSERT_TRUE(MakeDirs(model).ok());
  ASSERT_TRUE(MakeDirs(outside).ok());
  ASSERT_TRUE(WriteFileAtomic(outside + "/MANIFEST", "precious\n").ok());
  for (int step = 1; step <= 20; ++step) {
    ASSERT_EQ(::symlink(outside.c_str(), absl::StrCat(model, "/ckpt-", step).c_str()), 0);
  }
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat("exec ", P(), " train --config ", Dir(),
                                           "/config.textproto --train '", Dir(),
                                           "/data/part-*' --model_dir ", model),
                              60, &out),
            0)
      << out;
  const std::string latest = ReadFileToString(model + "/LATEST").value_or("");
  ASSERT_FALSE(latest.empty()) << out;
  const std::string ckpt = absl::StrCat(model, "/", absl::StripAsciiWhitespace(latest));
  struct stat st;
  ASSERT_EQ(::lstat(ckpt.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << ckpt << " is not a real directory";
  EXPECT_TRUE(PathExists(ckpt + "/MANIFEST"));
  EXPECT_EQ(ReadFileToString(outside + "/MANIFEST").value_or(""), "precious\n");
  std::string listing;
  ASSERT_EQ(testing::RunShell("ls -A " + outside, 10, &listing), 0);
  EXPECT_EQ(listing, "MANIFEST\n") << "written outside the model dir";
}

}  // namespace
}  // namespace pstrain
