// A stopped host under `pstrain local --hosts 2 --max_restarts 1` (issue 26, item 9): SIGSTOP of
// host 1's process (its shard: hung, as a host that stops answering) while the job trains; and
// the same of host 0 (shard 0, found by the lease's other side: shard 0 silent). Under
// --max_restarts a host runs its worker as a child process, which the SIGSTOP does not stop, and
// whose lease on shard 0 its own long-poll used to renew: nobody was lost, every worker waited on
// the stopped shard for the calls' budget (60 s), and then the launcher waited its kill timeout
// (120 s) for the stopped host to take a SIGTERM. Now the lease watches the training loop
// (worker/train/job_control.h LoopHeartbeat): the workers' loops, stuck on the stopped shard,
// stop within the lease, the chief fails the job, the launcher SIGKILLs the stopped host at once
// and restarts the job from its last checkpoint, and the job ends right: every record trained
// once by the checkpoints' accounting, the restart counted, no process left. Every wait is
// bounded; whatever happens, the test continues and kills what it stopped.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
constexpr int kEpochs = 12;
constexpr int kLeaseMs = 5000;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/stopped_host_", getpid()); }

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

// The launcher's output (stdout and stderr: its lines and host 0's), line by line with the time
// each arrived, read on its own thread so that the pipe never fills. The destructor kills the
// launcher if it still runs (its hosts die with it), then joins the reader at the pipe's end.
class LauncherOutput {
 public:
  explicit LauncherOutput(Subprocess* launcher)
      : launcher_(launcher), reader_([this] {
          const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(9);
          while (std::chrono::steady_clock::now() < end) {
            // Every line worth keeping has a space; "" is the end of the output (or the time).
            const std::string line = launcher_->ReadLineContaining(" ", 540000);
            if (line.empty()) break;
            std::lock_guard<std::mutex> lock(mu_);
            lines_.push_back({std::chrono::steady_clock::now(), line});
          }
          ended_ = true;
        }) {}
  ~LauncherOutput() {
    launcher_->Signal(SIGKILL);  // nothing once it was reaped
    reader_.join();
  }

  // When the first line containing `needle` arrived, waiting up to `limit` for it.
  bool WaitForLine(const std::string& needle, std::chrono::seconds limit,
                   std::chrono::steady_clock::time_point* at) {
    return WaitFor(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          for (const auto& [when, line] : lines_) {
            if (line.find(needle) != std::string::npos) {
              *at = when;
              return true;
            }
          }
          return false;
        },
        limit);
  }
  // Whether the reader reached the end of the output within `limit`: after the launcher exits,
  // its last lines may still be in the pipe when the exit is seen.
  bool WaitForEnd(std::chrono::seconds limit) {
    return WaitFor([&] { return ended_.load(); }, limit);
  }
  std::string All() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> text;
    for (const auto& l : lines_) text.push_back(l.second);
    return absl::StrJoin(text, "\n");
  }

 private:
  Subprocess* const launcher_;
  std::mutex mu_;
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> lines_;
  std::atomic<bool> ended_{false};
  std::thread reader_;  // last: it starts once the members above exist
};

// The stopped host: 1 (a shard the workers' loops wait on), or 0 (shard 0 too: the workers find
// it silent for longer than the lease, and host 1's supervisor does not restart its worker into a
// job whose shard 0 does not answer).
class StoppedHostTest : public ::testing::TestWithParam<int> {};

TEST_P(StoppedHostTest, AStoppedHostIsFoundWithinTheLeaseAndTheJobRestartsAndEndsRight) {
  const int victim = GetParam();
  ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
  ASSERT_EQ(testing::Datagen(kTrainRows, 2, 1, Dir() + "/train"), 0);
  ASSERT_EQ(testing::Datagen(2000, 0, 2, Dir() + "/test"), 0);
  const std::string model = Dir() + "/model";
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  for (const std::string& a :
       {std::string(PSTRAIN_BINARY), std::string("local"), std::string("--hosts"),
        std::string("2"), std::string("--max_restarts"), std::string("1"),
        std::string("--train"), Dir() + "/train/part-*", std::string("--eval"),
        Dir() + "/test/part-*", std::string("--epochs"), absl::StrCat(kEpochs),
        std::string("--model_dir"), model, std::string("--set"),
        std::string("model.hidden=[16]"), std::string("--set"),
        std::string("features.categorical_vocab_size=5000"), std::string("--set"),
        std::string("threads.towers=1"), std::string("--set"),
        std::string("threads.intra_op_threads=1"), std::string("--set"),
        std::string("checkpoint.every_steps=20"), std::string("--set"),
        absl::StrCat("cluster.lease_ms=", kLeaseMs)}) {
    argv.push_back(a);
  }
  // The launcher's --kill_timeout_s stays at its default (120 s): a stopped host must not wait
  // for it.
  Subprocess local;
  std::string error;
  ASSERT_TRUE(local.Start(argv, &error)) << error;
  std::vector<int> stopped;  // continued and killed on every way out
  struct Release {
    std::vector<int>* pids;
    ~Release() {
      for (int pid : *pids) {
        kill(pid, SIGKILL);
        kill(pid, SIGCONT);
      }
    }
  } release{&stopped};
  LauncherOutput out(&local);

  // Both hosts and their supervised workers up, and a checkpoint committed.
  std::vector<int> host;
  const bool started = WaitFor(
      [&] {
        host = JobProcesses(model, " host ", victim);
        return host.size() == 1 && JobProcesses(model, " host ", 1 - victim).size() == 1 &&
               JobProcesses(model, " worker ", 1).size() == 1 &&
               JobProcesses(model, " worker ", 0).size() == 1 && PathExists(model + "/LATEST");
      },
      std::chrono::seconds(240));
  if (!started) {
    local.Signal(SIGKILL);
    FAIL() << "the job did not start 2 hosts and 2 workers with a checkpoint within 240 s (or "
              "it ended first: make it longer):\n"
           << out.All();
  }
  ASSERT_EQ(kill(host[0], SIGSTOP), 0);
  stopped.push_back(host[0]);
  const auto sigstop = std::chrono::steady_clock::now();

  // The job restarts within the lease plus a margin for the chief's stop, its host's exit and a
  // loaded machine: far below the old 60 s call budget + 120 s kill timeout.
  std::chrono::steady_clock::time_point restarted_at;
  const bool restarted =
      out.WaitForLine("restart 1 of 1: the job resumes from", std::chrono::seconds(100),
                      &restarted_at);
  if (!restarted) local.Signal(SIGKILL);
  ASSERT_TRUE(restarted) << "no restart within 100 s of host " << victim << "'s SIGSTOP:\n"
                         << out.All();
  const double seconds = std::chrono::duration<double>(restarted_at - sigstop).count();
  std::printf("the job restarted %.1f s after host %d's SIGSTOP (lease %.1f s)\n", seconds,
              victim, kLeaseMs / 1000.0);
  EXPECT_LT(seconds, kLeaseMs / 1000.0 + 25) << out.All();

  const int status = local.WaitExit(300000);
  if (status < 0) local.Signal(SIGKILL);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "pstrain local did not exit:\n" << out.All();
  // Its last lines ("pstrain local: done") may still be in the pipe: read to the end first.
  EXPECT_TRUE(out.WaitForEnd(std::chrono::seconds(60)))
      << "the launcher's output did not end within 60 s of its exit (a process still holds it)";
  const std::string all = out.All();
  EXPECT_EQ(WEXITSTATUS(status), 0) << all;
  // The stopped host was killed at once, not after the kill timeout.
  EXPECT_THAT(all, HasSubstr(absl::StrCat("pstrain local: host ", victim,
                                          " is stopped (it cannot take a SIGTERM): SIGKILL")));
  EXPECT_THAT(all, ::testing::Not(HasSubstr("still running 120 s after SIGTERM")));
  // The chief's message (host 0 and its worker print to the launcher's terminal): its stuck
  // loop, or shard 0's silence.
  EXPECT_THAT(all, HasSubstr(victim == 1 ? "its training loop has trained no step for"
                                         : "worker 0 stops: shard 0 (127.0.0.1:"));
  EXPECT_THAT(all, HasSubstr("pstrain local: done"));
  const auto summary = testing::ReadSummary(model).fields();
  EXPECT_EQ(summary.at("examples").number_value(), kTrainRows * kEpochs);
  EXPECT_EQ(summary.at("restarts").number_value(), 1);
  EXPECT_EQ(ProcessesMentioning(model), 0);
  std::system(("rm -rf " + Dir()).c_str());
}

INSTANTIATE_TEST_SUITE_P(Hosts, StoppedHostTest, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat("Host", i.param);
                         });

}  // namespace
}  // namespace pstrain
