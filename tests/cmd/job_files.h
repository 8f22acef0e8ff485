// Test helpers for the files of a job run by the real binary: its data, made by `pstrain
// datagen`, its config's channels, running it with a log, and its <model_dir>/summary.json.
#pragma once

#include <google/protobuf/struct.pb.h>
#include <sys/wait.h>
#include <google/protobuf/util/json_util.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/file.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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

// summary.json as a protobuf Struct (fields() by name). A missing or malformed file is a test
// failure (EXPECT), and the result is then empty.
inline google::protobuf::Struct ReadSummary(const std::string& model_dir) {
  google::protobuf::Struct summary;
  auto text = ReadFileToString(model_dir + "/summary.json");
  EXPECT_TRUE(text.ok()) << text.status();
  if (text.ok()) {
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &summary).ok()) << *text;
  }
  return summary;
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

}  // namespace testing
}  // namespace pstrain
