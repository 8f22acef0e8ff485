// Test helpers for the files of a job run by the real binary: its data, made by `pstrain
// datagen`, its config's channels, running it with a log, and its <model_dir>/summary.json;
// and a `pstrain local` run to its end.
#pragma once

#include <google/protobuf/struct.pb.h>
#include <sys/wait.h>
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/file.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace testing {

// `pstrain datagen` of `rows` rows in `files` files (0: its default) with `seed` into `out`;
// returns its exit code (-1 if it could not run or took over 120 s).
inline int Datagen(int rows, int files, int seed, const std::string& out) {
  std::vector<std::string> argv = {PSTRAIN_BINARY, "datagen", "--rows", absl::StrCat(rows),
                                   "--seed", absl::StrCat(seed), "--out", out};
  if (files > 0) {
    argv.push_back("--files");
    argv.push_back(absl::StrCat(files));
  }
  return RunToExit(argv, 120000);
}

// The data section of a small test job's config: a train and an eval channel of Criteo TSV whose
// paths --train / --eval give, read in order (no file or window shuffle).
inline constexpr char kOrderedCriteoChannels[] = R"pb(
  data {
    train { name: "train" format: CRITEO_TSV }
    eval { name: "eval" format: CRITEO_TSV }
    shuffle_buffer: 0
    shuffle_files: false
  }
)pb";

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal, or timed out
  std::string out;     // stdout and stderr
};

// Runs `argv` with its output in `log` (RunLogged), at most `timeout_ms`.
inline CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& log,
                                int timeout_ms) {
  const int status = RunLogged(argv, log, timeout_ms);
  CommandResult r;
  r.out = ReadFileToString(log).value_or("");
  if (status >= 0 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

// A JSON object file as a protobuf Struct (fields() by name). A missing or malformed file is a
// test failure (EXPECT), and the result is then empty.
inline google::protobuf::Struct ReadJsonFile(const std::string& path) {
  google::protobuf::Struct json;
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  if (text.ok()) {
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &json).ok()) << *text;
  }
  return json;
}

// <model_dir>/summary.json (ReadJsonFile).
inline google::protobuf::Struct ReadSummary(const std::string& model_dir) {
  return ReadJsonFile(model_dir + "/summary.json");
}

// `pstrain export` of `model_dir` into `out_dir`; false, with a test failure naming its output, when
// it fails. Its output in `*log` when given.
inline bool ExportModel(const std::string& model_dir, const std::string& out_dir,
                        std::string* log = nullptr) {
  std::string out;
  const int rc = RunShell(
      absl::StrCat(PSTRAIN_BINARY, " export --model_dir ", model_dir, " --out ", out_dir, " 2>&1"),
      120, &out);
  EXPECT_EQ(rc, 0) << out;
  if (log != nullptr) *log = out;
  return rc == 0;
}

// Runs `pstrain local` (argv) to its end: "pstrain local: done" with the test AUC within 240 s,
// exit code 0, and no process mentioning `model_dir` left behind.
inline void RunLocal(const std::vector<std::string>& args, const std::string& model_dir) {
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(args, &error)) << error;
  EXPECT_THAT(local.ReadLineContaining("pstrain local: done", 240000),
              ::testing::HasSubstr("test AUC"));
  const int status = local.WaitExit(60000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ProcessesMentioning(model_dir), 0);
}

// Starts `pstrain local` (argv), waits until host 0 of 2 trains, lets it run for `run_ms`, sends
// SIGTERM (a preemption) and expects exit code 0: the job wrote its stop checkpoint.
inline void RunLocalUntilSigterm(const std::vector<std::string>& args, int run_ms) {
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(args, &error)) << error;
  ASSERT_THAT(local.ReadLineContaining("host 0/2 ready", 60000), ::testing::HasSubstr("training"));
  std::this_thread::sleep_for(std::chrono::milliseconds(run_ms));
  ASSERT_TRUE(local.Signal(SIGTERM));
  const int status = local.WaitExit(120000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// /proc/<pid>/cmdline with spaces between the arguments ("" once the process is gone).
inline std::string Cmdline(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  for (char& c : text) c = c == '\0' ? ' ' : c;
  return text;
}

// The processes of the job in `model_dir` running `pstrain <command>` (" host ", " worker ")
// with --index=<index> (-1: any index), as `pstrain local` and `pstrain host` start them.
inline std::vector<int> JobProcesses(const std::string& model_dir, const std::string& command,
                                     int index = -1) {
  std::vector<int> out;
  for (int pid : PidsMentioning(model_dir)) {
    const std::string cmd = Cmdline(pid);
    const std::string want = index < 0 ? "--index=" : absl::StrCat("--index=", index, " ");
    if (cmd.find(command) != std::string::npos && (cmd + " ").find(want) != std::string::npos) {
      out.push_back(pid);
    }
  }
  return out;
}

// A `pstrain train` stopped mid-epoch (train.max_steps=37) and resumed ends with the
// uninterrupted run's parameters, to the byte, having trained the same examples: `args(dir)` is
// the job's flags with --model_dir dir, both runs 2 epochs into `straight` and `stopped`.
template <typename ArgsFn>
void ExpectStopAndResumeEqualsUninterrupted(const ArgsFn& args, const std::string& straight,
                                            const std::string& stopped) {
  const std::string train = absl::StrCat(PSTRAIN_BINARY, " train ");
  std::string out;
  ASSERT_EQ(RunShell(absl::StrCat(train, args(straight), " --epochs 2"), 300, &out), 0) << out;
  ASSERT_EQ(
      RunShell(absl::StrCat(train, args(stopped), " --epochs 2 --set train.max_steps=37"), 300,
               &out),
      0)
      << out;
  EXPECT_EQ(ReadSummary(stopped).fields().at("steps").number_value(), 37);
  ASSERT_EQ(RunShell(absl::StrCat(train, args(stopped), " --epochs 2"), 300, &out), 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("resumed from " + stopped + "/ckpt-37"));
  const auto a = ReadSummary(straight).fields();
  const auto b = ReadSummary(stopped).fields();
  EXPECT_EQ(b.at("examples").number_value(), a.at("examples").number_value());
  EXPECT_EQ(b.at("test_auc").number_value(), a.at("test_auc").number_value());
  const std::string last = absl::StrCat("/ckpt-", a.at("steps").number_value(), "/shard-0-of-1");
  auto x = ReadFileToString(straight + last);
  auto y = ReadFileToString(stopped + last);
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(*x == *y) << "final parameters differ after stop and resume";
}

}  // namespace testing
}  // namespace pstrain
