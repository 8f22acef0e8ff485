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
#include <memory>
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


// `pstrain worker --max_restarts` (separate PS and worker processes, as a cluster manager runs
// them): the worker process is its own worker's agent. Its child is SIGKILLed after the first
// checkpoint; the agent starts another, which resumes and rejoins; both workers' agents end
// with 0, the restart is counted, and every record is trained by the checkpoints' accounting.
TEST(WorkerRestartTest, AWorkerProcessRestartsItsOwnWorker) {
  ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
  ASSERT_EQ(testing::Datagen(kTrainRows, 2, 1, Dir() + "/train"), 0);
  ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
  const std::string model = Dir() + "/model_worker";
  const std::vector<std::string> job = {
      "--train", Dir() + "/train/part-*", "--eval", Dir() + "/test/part-*", "--epochs",
      absl::StrCat(kEpochs), "--model_dir", model, "--set", "model.hidden=[16]", "--set",
      "features.categorical_vocab_size=5000", "--set", "threads.towers=1", "--set",
      "threads.intra_op_threads=1", "--set", "checkpoint.every_steps=100", "--set",
      "cluster.lease_ms=30000"};
  std::vector<std::unique_ptr<Subprocess>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string> argv = {PSTRAIN_BINARY, "ps", "--shard", absl::StrCat(s),
                                     "--num_shards", "2", "--num_workers", "2", "--port", "0",
                                     "--bind", "127.0.0.1"};
    argv.insert(argv.end(), job.begin(), job.end());
    shards.push_back(std::make_unique<Subprocess>());
    std::string error;
    ASSERT_TRUE(shards.back()->Start(argv, &error)) << error;
    const std::string line = shards.back()->ReadLineContaining("listening on", 60000);
    ASSERT_FALSE(line.empty()) << "shard " << s << " did not start";
    addresses.push_back(line.substr(line.rfind(' ') + 1));
  }
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int w = 0; w < 2; ++w) {
    std::vector<std::string> argv = {PSTRAIN_BINARY, "worker", "--ps",
                                     absl::StrCat(addresses[0], ",", addresses[1]), "--index",
                                     absl::StrCat(w), "--num_workers", "2", "--cores", "1",
                                     "--max_restarts", "1"};
    argv.insert(argv.end(), job.begin(), job.end());
    agents.push_back(std::make_unique<Subprocess>());
    std::string error;
    ASSERT_TRUE(agents.back()->Start(argv, &error)) << error;
  }
  // The supervised child of worker 1: a `pstrain worker --index 1` without --max_restarts.
  auto child_of_worker_1 = [&] {
    std::vector<int> out;
    for (int pid : testing::PidsMentioning(model)) {
      const std::string cmd = testing::Cmdline(pid);
      if (cmd.find(" worker ") != std::string::npos &&
          cmd.find("--index 1 ") != std::string::npos &&
          cmd.find("--max_restarts") == std::string::npos) {
        out.push_back(pid);
      }
    }
    return out;
  };
  std::vector<int> victim;
  const bool started = WaitFor(
      [&] {
        victim = child_of_worker_1();
        return victim.size() == 1 && PathExists(model + "/LATEST");
      },
      std::chrono::seconds(240));
  ASSERT_TRUE(started) << "worker 1's child and a checkpoint did not appear within 240 s";
  ASSERT_EQ(kill(victim[0], SIGKILL), 0);
  std::vector<int> again;
  EXPECT_TRUE(WaitFor(
      [&] {
        again = child_of_worker_1();
        return again.size() == 1 && again[0] != victim[0];
      },
      std::chrono::seconds(60)))
      << "worker 1's agent did not start another child within 60 s";
  for (auto& agent : agents) {
    const int status = agent->WaitExit(300000);
    EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  for (auto& shard : shards) {
    shard->Signal(SIGTERM);
    const int status = shard->WaitExit(30000);
    EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const auto summary = testing::ReadSummary(model).fields();
  EXPECT_EQ(summary.at("examples").number_value(), kTrainRows * kEpochs);
  EXPECT_EQ(summary.at("restarts").number_value(), 1);
  ASSERT_EQ(summary.at("restart_log").list_value().values_size(), 1);
  EXPECT_THAT(summary.at("restart_log").list_value().values(0).string_value(),
              HasSubstr("worker 1 failed (signal 9); restart 1 of 1"));
  EXPECT_EQ(testing::ProcessesLeft(model), 0);
  std::system(("rm -rf " + Dir()).c_str());
}

}  // namespace
}  // namespace pstrain
