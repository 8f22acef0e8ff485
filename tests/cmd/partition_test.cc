// A network partition, with real processes on real links: two `pstrain host` processes, each in
// its own network namespace, joined by veth pairs to a bridge in a third namespace (nothing of
// the machine's own network is touched). While the job trains, host 1's link is cut (its veth
// set down on the bridge side) for longer than the lease, both processes staying alive. The chief
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

// Three namespaces, two hosts' and the bridge's; names carry the test's pid (concurrent runs) and
// stay within the kernel's 15 characters.
class Network {
 public:
  Network() : tag_(absl::StrCat(getpid() % 1000000)) {}
  ~Network() { Remove(); }

  std::string ns(int host) const { return absl::StrCat("pst", tag_, host == 0 ? "a" : "b"); }
  std::string address(int host) const { return absl::StrCat("10.77.0.", host + 1); }

  // Builds the network; "" on success, else why it cannot be built here.
  std::string Create() {
    std::string out;
    if (RunShell("command -v ip", 10, &out) != 0) {
      return "iproute2's ip is not installed (scripts/install_deps.sh installs it)";
    }
    Remove();  // a previous run's leftovers of the same pid
    if (RunShell("ip netns add " + bridge_ns(), 20, &out) != 0) {
      return "cannot create a network namespace here (needs root / CAP_SYS_ADMIN): " + out;
    }
    created_ = true;
    std::string script = absl::StrCat("set -e; B=", bridge_ns(),
                                      "; ip -n $B link add br0 type bridge; ",
                                      "ip -n $B link set br0 up; ip -n $B link set lo up");
    for (int h = 0; h < 2; ++h) {
      const std::string n = ns(h), v = peer(h);
      absl::StrAppend(&script, "; ip netns add ", n, "; ip -n ", n, " link set lo up; ip -n ", n,
                      " link add eth0 type veth peer name ", v, " netns $B; ip -n ", n,
                      " addr add ", address(h), "/24 dev eth0; ip -n ", n, " link set eth0 up; ",
                      "ip -n $B link set ", v, " master br0; ip -n $B link set ", v, " up");
    }
    if (RunShell(script, 60, &out) != 0) return "cannot build the veth / bridge network: " + out;
    return "";
  }

  // Cuts (or restores) host h's link on the bridge side: packets to and from it are dropped,
  // without a reset; both ends' processes keep running.
  bool SetLink(int h, bool up) {
    std::string out;
    const std::string state = up ? " up" : " down";
    return RunShell(absl::StrCat("ip -n ", bridge_ns(), " link set ", peer(h), state), 20, &out) ==
           0;
  }

  void Remove() {
    std::string out;
    for (const std::string& n : {ns(0), ns(1), bridge_ns()}) {
      RunShell("ip netns del " + n + " 2>/dev/null", 20, &out);
    }
  }

  bool Exists() const {
    std::string out;
    RunShell("ip netns list", 10, &out);
    return out.find("pst" + tag_) != std::string::npos;
  }

 private:
  std::string bridge_ns() const { return absl::StrCat("pst", tag_, "r"); }
  std::string peer(int host) const { return absl::StrCat("v", tag_, host == 0 ? "a" : "b"); }

  const std::string tag_;
  bool created_ = false;
};

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(PartitionTest, AHostCutOffLongerThanTheLeaseIsFoundAndNamedAndNothingHangs) {
  auto network = std::make_unique<Network>();
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
  EXPECT_FALSE(Network().Exists());
  RunShell("rm -rf " + Dir(), 30, &out);
}

}  // namespace
}  // namespace pstrain
