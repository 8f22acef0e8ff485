// A network partition, with real processes on real links: two `pstrain host` processes, each in
// its own network namespace, joined by veth pairs to a bridge in a third namespace (nothing of
// the machine's own network is touched; tests/emulated_hosts.h, scripts/emulate_hosts.sh).
// While the job trains, host 1's link is cut (its veth set down on the bridge side) for longer
// than the lease, both processes staying alive. The chief
// must stop within the lease plus a margin with a message naming host 1, host 1 must end by
// itself too, and nothing may hang: every wait is bounded. The namespaces (and with them the
// veths and the bridge) are removed whatever happens. Needs root (CAP_NET_ADMIN / CAP_SYS_ADMIN)
// and iproute2's `ip netns` (scripts/install_deps.sh); skipped with the reason otherwise.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/emulated_hosts.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::RunShell;

// Short, so that the test is quick, but not so short that a loaded 2-core machine (two hosts
// training, other builds beside them) starves a lease renewal: at 3 s a host was counted lost
// seconds after it started, before the cut.
constexpr int kLeaseMs = 5000;
// Detection within the lease plus this: the lease check, a held call's end, the chief's reaction.
constexpr double kMarginS = 30;
constexpr char kSecret[] = "5ec4e75ec4e75ec4e75ec4e75ec4e7ab";

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/partition_", getpid()); }

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(PartitionTest, AHostCutOffLongerThanTheLeaseIsFoundAndNamedAndNothingHangs) {
  auto network = std::make_unique<testing::EmulatedHosts>(2);
  const std::string why = network->Create();
  if (!why.empty()) GTEST_SKIP() << why;
  std::string out;
  RunShell("rm -rf " + Dir() + " && mkdir -p " + Dir(), 30, &out);
  ASSERT_EQ(testing::RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "20000", "--files", "2",
                                "--out", Dir() + "/data"},
                               120000),
            0);
  const std::string model = Dir() + "/model";
  const std::string cluster =
      absl::StrCat(network->address(0), ":2223,", network->address(1), ":2223");
  std::vector<std::unique_ptr<testing::Subprocess>> hosts;
  for (int h = 0; h < 2; ++h) {
    // ip netns exec runs the host in its namespace; the secret comes from the environment.
    const std::string command = absl::StrCat(
        "PSTRAIN_CLUSTER_SECRET=", kSecret, " exec ip netns exec ", network->ns(h), " ",
        PSTRAIN_BINARY, " host --cluster ", cluster, " --index ", h, " --bind 0.0.0.0",
        " --train '", Dir(), "/data/part-*' --model_dir ", model, " --epochs 1000",
        " --set model.hidden=[16] --set features.categorical_vocab_size=5000",
        " --set cluster.lease_ms=", kLeaseMs, " --set checkpoint.every_steps=20",
        " --set threads.towers=1 --connect_timeout_s 60 --barrier_timeout_s 3600",
        " --stop_grace_s 60 > ", Dir(), "/host", h, ".log 2>&1");
    hosts.push_back(std::make_unique<testing::Subprocess>());
    std::string error;
    ASSERT_TRUE(hosts.back()->Start({"/bin/sh", "-c", command}, &error)) << error;
  }
  // Training across the link, with a checkpoint committed.
  const auto start = std::chrono::steady_clock::now();
  while (!PathExists(model + "/LATEST") && SecondsSince(start) < 180 &&
         hosts[0]->WaitExit(0) < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(PathExists(model + "/LATEST"))
      << *ReadFileToString(Dir() + "/host0.log") << "\n--- host 1:\n"
      << *ReadFileToString(Dir() + "/host1.log");

  ASSERT_TRUE(network->SetLink(1, false));
  const auto cut = std::chrono::steady_clock::now();
  const int chief = hosts[0]->WaitExit(static_cast<int>((kLeaseMs / 1000.0 + kMarginS) * 1000));
  const double chief_s = SecondsSince(cut);
  // Host 1 is cut off from shard 0 and from the chief: it must end by itself as well, while the
  // link is still down (its calls fail by their deadlines and retries; SIGTERM would take its
  // --stop_grace_s).
  const int other = hosts[1]->WaitExit(120000);
  const double other_s = SecondsSince(cut);
  const bool restored = network->SetLink(1, true);
  auto log0 = ReadFileToString(Dir() + "/host0.log");
  auto log1 = ReadFileToString(Dir() + "/host1.log");
  ASSERT_TRUE(log0.ok() && log1.ok());
  ASSERT_GE(chief, 0) << "the chief did not stop within the lease + " << kMarginS << " s\n"
                      << *log0;
  EXPECT_TRUE(WIFEXITED(chief) && WEXITSTATUS(chief) != 0) << chief << "\n" << *log0;
  EXPECT_GT(chief_s, 0.0);
  EXPECT_LT(chief_s, kLeaseMs / 1000.0 + kMarginS);
  // The message names the cut-off host: as worker 1 or by its shard's address.
  EXPECT_THAT(*log0, AnyOf(HasSubstr("worker 1"), HasSubstr(network->address(1))))
      << *log0;
  EXPECT_THAT(*log0, HasSubstr("last good checkpoint: " + model + "/ckpt-")) << *log0;
  ASSERT_GE(other, 0) << "host 1 did not end by itself within 120 s of the cut\n" << *log1;
  EXPECT_TRUE(WIFEXITED(other) && WEXITSTATUS(other) != 0) << other << "\n" << *log1;
  // Not before its lease ran out: a slow link is not a cut one.
  EXPECT_GE(other_s, kLeaseMs / 1000.0);
  std::fprintf(stderr, "partition: chief stopped %.1f s after the cut, host 1 %.1f s after it\n",
               chief_s, other_s);
  for (const std::string* log : {&*log0, &*log1}) {  // their reasons, for the test's output
    for (absl::string_view line : absl::StrSplit(*log, '\n')) {
      if (absl::StrContains(line, " stops: ")) std::fprintf(stderr, "  %.*s\n",
                                                            static_cast<int>(line.size()),
                                                            line.data());
    }
  }
  // Host 1 names shard 0, which it could not reach.
  EXPECT_THAT(*log1, HasSubstr("shard 0 (" + network->address(0) + ":2223) not reached"))
      << *log1;
  EXPECT_TRUE(restored);
  // The last good checkpoint is intact: LATEST names a committed directory.
  auto latest = ReadLatest(model);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_TRUE(PathExists(CheckpointPath(model, *latest) + "/MANIFEST")) << *latest;

  hosts.clear();
  EXPECT_EQ(testing::ProcessesMentioning(model), 0);
  network.reset();
  EXPECT_FALSE(testing::EmulatedHosts(2).Exists());
  RunShell("rm -rf " + Dir(), 30, &out);
}

}  // namespace
}  // namespace pstrain
