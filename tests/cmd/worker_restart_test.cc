// Per-worker recovery in ASYNC, with real processes: `pstrain local --hosts 3 --max_restarts 2`
// runs each host's worker as a child of its host (cmd/worker_supervisor.h). The test SIGKILLs
// host 1's worker (not its shard) after the first committed checkpoint. Host 1 restarts it; the
// new worker resumes from the last checkpoint and rejoins, while the hosts and the other workers
// keep running (the same processes from start to end; the launcher never restarts the job); the
// job ends by itself with every record of the data trained once by the accounting of the
// checkpoints (summary.json's examples: the restarted worker counts from its checkpoint's
// position, so a record it trained twice after it, or skipped, would change the count); the
// restart is logged and counted in summary.json; no process is left. Every wait is bounded.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::JobProcesses;
using testing::ProcessesMentioning;
using testing::Subprocess;

constexpr int kTrainRows = 20000;
constexpr int kEpochs = 40;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/worker_restart_", getpid()); }

bool Alive(int pid) { return kill(pid, 0) == 0; }

// Waits (bounded) until `done()`; false at the deadline.
template <typename F>
bool WaitFor(F done, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(WorkerRestartTest, AKilledWorkerIsRestartedAndRejoinsWhileTheOthersTrainOn) {
  ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
  ASSERT_EQ(testing::Datagen(kTrainRows, 3, 1, Dir() + "/train"), 0);
  ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
  const std::string model = Dir() + "/model";
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(
      {PSTRAIN_BINARY, "local", "--hosts", "3", "--max_restarts", "2", "--train",
       Dir() + "/train/part-*", "--eval", Dir() + "/test/part-*", "--epochs",
       absl::StrCat(kEpochs), "--model_dir", model, "--kill_timeout_s", "30", "--set",
       "model.hidden=[16]", "--set", "features.categorical_vocab_size=5000", "--set",
       "threads.towers=1", "--set", "threads.intra_op_threads=1", "--set",
       "checkpoint.every_steps=100",
       // The restarted worker must be back before its lease runs out, also on a loaded machine.
       "--set", "cluster.lease_ms=30000"},
      &error))
      << error;
  // The launcher's stdout on its own thread (the pipe never fills): every "pstrain local:" line.
  std::vector<std::string> launcher;
  std::thread reader([&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(8);
    while (std::chrono::steady_clock::now() < end) {
      std::string line = local.ReadLineContaining("pstrain local:", 480000);
      if (line.empty()) return;  // EOF or the time is up
      launcher.push_back(line);
      if (line.find("pstrain local: done") != std::string::npos) return;
    }
  });

  // Every host and worker up, and a checkpoint committed: the victim then has a position to
  // resume from.
  std::vector<int> hosts, workers;
  const bool started = WaitFor(
      [&] {
        hosts = JobProcesses(model, " host ");
        workers = JobProcesses(model, " worker ");
        return hosts.size() == 3 && workers.size() == 3 && PathExists(model + "/LATEST");
      },
      std::chrono::seconds(240));
  std::vector<int> victim = JobProcesses(model, " worker ", 1);
  const std::vector<int> others = {JobProcesses(model, " worker ", 0).at(0),
                                   JobProcesses(model, " worker ", 2).at(0)};
  if (!started || victim.size() != 1) {
    local.Signal(SIGKILL);
    reader.join();
    FAIL() << "the job did not start 3 hosts and 3 workers with a checkpoint within 240 s "
           << "(or it ended first: make it longer); hosts " << hosts.size() << ", workers "
           << workers.size();
  }
  ASSERT_EQ(kill(victim[0], SIGKILL), 0);
  // Host 1 starts a new worker 1 (another pid), bounded.
  std::vector<int> again;
  const bool restarted = WaitFor(
      [&] {
        again = JobProcesses(model, " worker ", 1);
        return again.size() == 1 && again[0] != victim[0];
      },
      std::chrono::seconds(60));
  // Meanwhile nothing else stopped: the three hosts and workers 0 and 2 are the same processes.
  for (int pid : hosts) EXPECT_TRUE(Alive(pid)) << "host process " << pid << " ended";
  for (int pid : others) EXPECT_TRUE(Alive(pid)) << "worker process " << pid << " ended";
  reader.join();
  const int status = local.WaitExit(120000);
  ASSERT_TRUE(restarted) << "host 1 did not restart its worker within 60 s";
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_FALSE(launcher.empty());
  EXPECT_THAT(launcher.back(), HasSubstr("pstrain local: done"));
  // One cluster start: the launcher never restarted the whole job.
  int starts = 0;
  for (const std::string& line : launcher) starts += line.find("starting 3 hosts") != std::string::npos;
  EXPECT_EQ(starts, 1);

  const auto summary = testing::ReadSummary(model).fields();
  EXPECT_EQ(summary.at("examples").number_value(), kTrainRows * kEpochs);
  EXPECT_EQ(summary.at("restarts").number_value(), 1);
  ASSERT_EQ(summary.at("restart_log").list_value().values_size(), 1);
  const std::string entry = summary.at("restart_log").list_value().values(0).string_value();
  EXPECT_THAT(entry, HasSubstr("host 1: worker 1 failed (signal 9); restart 1 of 2: it resumes "
                               "from " + model + "/ckpt-"));
  // The new worker resumed from a checkpoint (the one the restart names, unless a round that
  // the dead worker had joined committed in between).
  auto log1 = ReadFileToString(model + "/host-1/output.log");
  ASSERT_TRUE(log1.ok());
  EXPECT_THAT(*log1, HasSubstr(entry));
  EXPECT_THAT(*log1, HasSubstr("resumed from " + model + "/ckpt-"));
  EXPECT_EQ(ProcessesMentioning(model), 0);
  std::system(("rm -rf " + Dir()).c_str());
}

}  // namespace
}  // namespace pstrain
