// The PS processes in a hostile world, as real processes on loopback: a shard listens on
// loopback unless told otherwise and prints the address it really listens on; beyond loopback it
// needs the cluster secret (from the environment or a chmod-600 file, never a flag), and refuses
// calls without it; a worker that stops answering (SIGSTOP: a hung or partitioned host) is found
// within the lease and the job fails naming it and the last good checkpoint; a stop signal ends
// a process that waits for a dead peer within its grace period.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/common/metrics/http_scrape.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing::ProcessesMentioning;
using testing::RunToExit;
using testing::Subprocess;

constexpr char kSecret[] = "c0ffee0123456789c0ffee0123456789";

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/hostile_proc_", getpid()); }

// A `pstrain ps` of a tiny table, with `extra` flags.
std::vector<std::string> PsArgs(std::vector<std::string> extra) {
  std::vector<std::string> a = {PSTRAIN_BINARY, "ps",     "--port",     "0",    "--rows", "1000",
                                "--row_dim",    "3",      "--dense_size", "8"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The port of a "listening on HOST:PORT[ ...]" line.
int PortOf(const std::string& line, const std::string& host) {
  const std::string prefix = "listening on " + host + ":";
  const size_t at = line.find(prefix);
  if (at == std::string::npos) return -1;
  int port = -1;
  std::string rest = line.substr(at + prefix.size());
  rest = rest.substr(0, rest.find(' '));
  return absl::SimpleAtoi(rest, &port) ? port : -1;
}

grpc::Status CallInfo(int port, const std::string& secret) {
  RpcSecurity s;
  s.secret = secret;
  auto stub = ParameterServer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port), s, grpc::ChannelArguments()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  InfoResponse info;
  return stub->Info(&ctx, InfoRequest(), &info);
}

void StopCleanly(Subprocess* p) {
  ASSERT_TRUE(p->Signal(SIGTERM));
  const int status = p->WaitExit(30000);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

class HostileProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    unsetenv("PSTRAIN_CLUSTER_SECRET");
  }
  void TearDown() override {
    unsetenv("PSTRAIN_CLUSTER_SECRET");
    std::system(("rm -rf " + Dir()).c_str());
  }
};

TEST_F(HostileProcessTest, LoopbackByDefaultAndTheBannerSaysWhere) {
  Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start(PsArgs({}), &error)) << error;
  const std::string line = ps.ReadLineContaining("listening on", 60000);
  const int port = PortOf(line, "127.0.0.1");
  ASSERT_GT(port, 0) << line;
  EXPECT_TRUE(CallInfo(port, "").ok());  // no secret configured: loopback callers are trusted
  StopCleanly(&ps);
}

TEST_F(HostileProcessTest, BeyondLoopbackNeedsTheSecretAndRefusesCallsWithoutIt) {
  // No secret: refused at start, saying how to give one.
  Subprocess open;
  std::string error;
  ASSERT_TRUE(open.Start(PsArgs({"--bind", "0.0.0.0"}), &error)) << error;
  const int refused = open.WaitExit(60000);
  ASSERT_TRUE(refused >= 0 && WIFEXITED(refused));
  EXPECT_EQ(WEXITSTATUS(refused), 2);

  // The secret from the environment.
  setenv("PSTRAIN_CLUSTER_SECRET", kSecret, 1);
  Subprocess ps;
  ASSERT_TRUE(ps.Start(PsArgs({"--bind", "0.0.0.0"}), &error)) << error;
  unsetenv("PSTRAIN_CLUSTER_SECRET");
  const std::string line = ps.ReadLineContaining("listening on", 60000);
  EXPECT_THAT(line, HasSubstr("calls need the cluster secret"));
  const int port = PortOf(line, "0.0.0.0");
  ASSERT_GT(port, 0) << line;
  EXPECT_EQ(CallInfo(port, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallInfo(port, "not-the-secret-0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallInfo(port, kSecret).ok());
  StopCleanly(&ps);

  // The secret from a file: only one that other users cannot read.
  const std::string file = Dir() + "/secret";
  ASSERT_TRUE(WriteFileAtomic(file, std::string(kSecret) + "\n").ok());
  ASSERT_EQ(chmod(file.c_str(), 0644), 0);
  std::string mode_error;
  std::string command;
  for (const std::string& a :
       PsArgs({"--bind", "0.0.0.0", "--set", "cluster.secret_file=" + file})) {
    command += a + " ";
  }
  EXPECT_EQ(testing::RunShell(command, 60, &mode_error), 2) << mode_error;
  EXPECT_THAT(mode_error, HasSubstr(file + " may be read by other users (mode 644); chmod 600 it"));
  ASSERT_EQ(chmod(file.c_str(), 0600), 0);
  Subprocess from_file;
  ASSERT_TRUE(
      from_file.Start(PsArgs({"--bind", "0.0.0.0", "--set", "cluster.secret_file=" + file}),
                      &error))
      << error;
  const int port2 = PortOf(from_file.ReadLineContaining("listening on", 60000), "0.0.0.0");
  ASSERT_GT(port2, 0);
  EXPECT_EQ(CallInfo(port2, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallInfo(port2, kSecret).ok());
  StopCleanly(&from_file);
}

// A worker waiting for a shard that never comes still ends within its grace after SIGTERM.
TEST_F(HostileProcessTest, StopSignalEndsAWorkerWaitingForADeadPeer) {
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "500", "--out", Dir() + "/data"},
                      120000),
            0);
  Subprocess worker;
  std::string error;
  // Port 1 on loopback: nothing listens there.
  ASSERT_TRUE(worker.Start({PSTRAIN_BINARY, "worker", "--ps", "127.0.0.1:1", "--index", "0",
                            "--num_workers", "1", "--train", Dir() + "/data/part-*",
                            "--model_dir", Dir() + "/model", "--stop_grace_s", "2",
                            "--connect_timeout_s", "600"},
                           &error))
      << error;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(worker.Signal(SIGTERM));
  const int status = worker.WaitExit(30000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(status >= 0) << "the worker did not end after SIGTERM";
  EXPECT_LT(seconds, 10);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 124) << status;
}

// A worker that stops answering (SIGSTOP: hung, or cut off) is lost once its lease expires: the
// chief stops the job naming it and the last good checkpoint, long before any barrier timeout.
TEST_F(HostileProcessTest, AHungWorkerIsFoundWithinTheLeaseAndNamed) {
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "20000", "--files", "2", "--out",
                       Dir() + "/data"},
                      120000),
            0);
  const std::string model = Dir() + "/model";
  const std::vector<std::string> job = {
      "--train", Dir() + "/data/part-*", "--model_dir", model, "--epochs", "1000", "--set",
      "model.hidden=[16]", "--set", "features.categorical_vocab_size=5000", "--set",
      "cluster.lease_ms=3000", "--set", "checkpoint.every_steps=20", "--set",
      "threads.towers=1"};
  auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), job.begin(), job.end());
    return head;
  };
  Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start(with({PSTRAIN_BINARY, "ps", "--port", "0", "--num_workers", "2"}), &error))
      << error;
  const int port = PortOf(ps.ReadLineContaining("listening on", 60000), "127.0.0.1");
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::unique_ptr<Subprocess>> workers;
  const std::string chief_log = Dir() + "/chief.err";
  for (int w = 0; w < 2; ++w) {
    workers.push_back(std::make_unique<Subprocess>());
    // The chief's stderr goes to a file, to read its message.
    std::vector<std::string> argv = {"/bin/sh", "-c",
                                     w == 0 ? "exec \"$0\" \"$@\" 2>" + chief_log
                                            : "exec \"$0\" \"$@\""};
    for (const std::string& a : with({PSTRAIN_BINARY, "worker", "--ps", address, "--index",
                                      absl::StrCat(w), "--num_workers", "2",
                                      "--barrier_timeout_s", "3600"})) {
      argv.push_back(a);
    }
    ASSERT_TRUE(workers.back()->Start(argv, &error)) << error;
  }
  // Training, with a checkpoint committed.
  const auto start = std::chrono::steady_clock::now();
  while (!PathExists(model + "/LATEST") &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(PathExists(model + "/LATEST"));
  ASSERT_TRUE(workers[1]->Signal(SIGSTOP));
  const auto t0 = std::chrono::steady_clock::now();
  const int status = workers[0]->WaitExit(60000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  workers[1]->Signal(SIGKILL);
  ASSERT_TRUE(status >= 0) << "the chief did not notice the hung worker within 60 s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  // The lease (3 s) plus its check and the chief's reaction.
  EXPECT_LT(seconds, 3 + 10);
  StopCleanly(&ps);
  auto log = ReadFileToString(chief_log);
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, HasSubstr("worker 1 lost"));
  EXPECT_THAT(*log, HasSubstr("last good checkpoint: " + model + "/ckpt-"));
  EXPECT_EQ(ProcessesMentioning(model), 0);
}

// A host whose shard 0 stops answering (SIGSTOP of host 0: hung, or cut off) stops its worker on
// the lost lease and then exits, within the lease plus 10 s of that stop, with exit code 1,
// naming shard 0 and the last good checkpoint (PsJob's lease watch, then the host's bounded
// shutdown: cmd/host.cc). The bound also holds by construction: a worker that must stop ends its
// process within kFailedExitLimit (cmd/stop_signal.h) whatever its shutdown still waits for.
TEST_F(HostileProcessTest, AHostExitsWithinTheLeasePlusTenSecondsAfterItsWorkerStopsOnALostLease) {
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "20000", "--files", "2", "--out",
                       Dir() + "/data"},
                      120000),
            0);
  const std::string model = Dir() + "/model";
  constexpr int kLeaseMs = 5000;
  const std::string cluster =
      absl::StrCat("127.0.0.1:", testing::FreePort(), ",127.0.0.1:", testing::FreePort());
  std::vector<std::unique_ptr<Subprocess>> hosts;
  std::vector<std::string> logs;
  for (int h = 0; h < 2; ++h) {
    logs.push_back(absl::StrCat(Dir(), "/host", h, ".err"));
    std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>" + logs.back()};
    for (const std::string& a :
         {std::string(PSTRAIN_BINARY), std::string("host"), std::string("--cluster"), cluster,
          std::string("--index"), absl::StrCat(h), std::string("--train"),
          Dir() + "/data/part-*", std::string("--model_dir"), model, std::string("--epochs"),
          std::string("1000"), std::string("--barrier_timeout_s"), std::string("3600"),
          std::string("--set"), std::string("model.hidden=[16]"), std::string("--set"),
          std::string("features.categorical_vocab_size=5000"), std::string("--set"),
          absl::StrCat("cluster.lease_ms=", kLeaseMs), std::string("--set"),
          std::string("checkpoint.every_steps=20"), std::string("--set"),
          std::string("threads.towers=1")}) {
      argv.push_back(a);
    }
    hosts.push_back(std::make_unique<Subprocess>());
    std::string error;
    ASSERT_TRUE(hosts.back()->Start(argv, &error)) << error;
  }
  // Training, with a checkpoint committed.
  const auto start = std::chrono::steady_clock::now();
  while (!PathExists(model + "/LATEST") &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(PathExists(model + "/LATEST")) << "no checkpoint within 120 s";
  ASSERT_TRUE(hosts[0]->Signal(SIGSTOP));
  const auto sigstop = std::chrono::steady_clock::now();
  // Host 1's worker stops once shard 0 has been silent for longer than the lease.
  const auto stopped_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::chrono::steady_clock::time_point stopped;
  bool stop_seen = false;
  while (!stop_seen && std::chrono::steady_clock::now() < stopped_by) {
    auto log = ReadFileToString(logs[1]);
    stop_seen = log.ok() && log->find("worker 1 stops:") != std::string::npos;
    stopped = std::chrono::steady_clock::now();
    if (!stop_seen) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (stop_seen) {
    std::printf("host 1's worker stopped %.1f s after host 0's SIGSTOP\n",
                std::chrono::duration<double>(stopped - sigstop).count());
  }
  int status = -1;
  if (stop_seen) status = hosts[1]->WaitExit(60000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  hosts[0]->Signal(SIGKILL);
  hosts[1]->Signal(SIGKILL);
  auto log = ReadFileToString(logs[1]);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE(stop_seen) << "host 1's worker did not stop within 60 s of shard 0's silence:\n"
                         << *log;
  ASSERT_TRUE(status >= 0) << "host 1 did not exit within 60 s of its worker's stop:\n" << *log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::printf("host 1 exited %.1f s after its worker stopped\n", seconds);
  EXPECT_LT(seconds, kLeaseMs / 1000.0 + 10) << *log;
  EXPECT_THAT(*log, HasSubstr("shard 0 (127.0.0.1:"));
  EXPECT_THAT(*log, HasSubstr("last good checkpoint: " + model + "/ckpt-"));
  // It ended by itself, not by the failure's exit deadline (cmd/stop_signal.h ExitWithin).
  EXPECT_THAT(*log, ::testing::Not(HasSubstr("had not ended")));
  hosts.clear();
  EXPECT_EQ(ProcessesMentioning(model), 0);
}

}  // namespace
}  // namespace pstrain
