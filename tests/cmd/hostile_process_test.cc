// The PS processes in a hostile world, as real processes on loopback: a shard listens on
// loopback unless told otherwise and prints the address it really listens on; beyond loopback it
// needs the cluster secret (from the environment or a chmod-600 file, never a flag), and refuses
// calls without it; a worker that stops answering (SIGSTOP: a hung or partitioned host) is found
// within the lease and the job fails naming it and the last good checkpoint; a stop signal ends
// a process that waits for a dead peer within its grace period.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/common/metrics/http_scrape.h"
#include "tests/ps/server/raw_calls.h"
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

// Peak resident memory (VmHWM) of process `pid`, in bytes; -1 if unknown.
int64_t PeakRss(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    absl::string_view rest(line);
    if (!absl::ConsumePrefix(&rest, "VmHWM:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kb = 0;
    return absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &kb) ? kb * 1024 : -1;
  }
  return -1;
}

// Issue 26 item 2, as it was found: six concurrent unauthenticated 95 MB pushes took a fresh
// shard from 34 MB to 698 MB (the message was read and parsed before the handler checked the
// secret). Now the secret is checked on the headers and the messages are never taken in: the
// shard's peak memory grows by less than one message, and calls with the secret still work.
TEST_F(HostileProcessTest, UnauthenticatedHugePushesDoNotRaiseTheShardsMemory) {
  setenv("PSTRAIN_CLUSTER_SECRET", kSecret, 1);
  Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start(PsArgs({"--set", "cluster.max_message_mb=128"}), &error)) << error;
  unsetenv("PSTRAIN_CLUSTER_SECRET");
  const int port = PortOf(ps.ReadLineContaining("listening on", 60000), "127.0.0.1");
  ASSERT_GT(port, 0);
  ASSERT_TRUE(CallInfo(port, kSecret).ok());
  const int64_t before = PeakRss(ps.pid());
  ASSERT_GT(before, 0);

  PushRequest push;
  push.set_worker_id(0);
  push.set_step(1);
  push.mutable_row_grads()->assign(size_t{95} << 20, '\0');
  const std::string bytes = push.SerializeAsString();
  push.Clear();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);  // shared by the calls: one copy in this process
  RpcSecurity s;
  s.secret = "not-the-secret-0123456789";
  s.max_message_bytes = int64_t{128} << 20;
  grpc::GenericStub stub(MakeChannel(absl::StrCat("127.0.0.1:", port), s,
                                     grpc::ChannelArguments()));
  constexpr int kCalls = 6;
  std::vector<grpc::ClientContext> ctx(kCalls);
  std::vector<grpc::ByteBuffer> responses(kCalls);
  std::vector<grpc::Status> status(kCalls);
  absl::BlockingCounter done(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    ctx[i].set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stub.UnaryCall(&ctx[i], "/pstrain.ParameterServer/Push", grpc::StubOptions(), &request,
                   &responses[i], [&, i](grpc::Status st) {
                     status[i] = st;
                     done.DecrementCount();
                   });
  }
  done.Wait();
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(status[i].error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << i << ": " << status[i].error_message();
  }
  const int64_t after = PeakRss(ps.pid());
  std::printf("shard peak memory: %.1f MB before, %.1f MB after %d unauthenticated 95 MB pushes\n",
              before / 1e6, after / 1e6, kCalls);
  EXPECT_LT(after - before, int64_t{64} << 20);
  EXPECT_TRUE(CallInfo(port, kSecret).ok());
  StopCleanly(&ps);
}

// Issue 26 item 7, as it was found: eight concurrent 1.4M-id pulls (95 MB answers) took a shard to
// 1.55 GB; the message cap bounds one answer, not their sum. With cluster.answer_budget_mb the
// answers in flight hold at most the budget (the process about twice that: an answer and its
// serialized copy), every pull is still answered, and the shard's peak memory says so. Measured
// (2 cores): 233-240 MB of growth with a 128 MiB budget, 1.67 GB without one. The shard runs with
// one malloc arena: glibc's per-thread arenas keep the pages of answers freed on other gRPC
// threads (another 140-180 MB here, more with more threads), which is the allocator's cache, not
// answers in flight.
TEST_F(HostileProcessTest, ConcurrentHugePullsStayWithinTheAnswerBudget) {
  constexpr int kRowDim = 64;
  Subprocess ps;
  std::string error;
  setenv("MALLOC_ARENA_MAX", "1", 1);
  ASSERT_TRUE(ps.Start({PSTRAIN_BINARY, "ps", "--port", "0", "--rows", "1000", "--row_dim",
                        absl::StrCat(kRowDim), "--dense_size", "8", "--set",
                        "cluster.max_message_mb=128", "--set", "cluster.answer_budget_mb=128"},
                       &error))
      << error;
  unsetenv("MALLOC_ARENA_MAX");
  const int port = PortOf(ps.ReadLineContaining("listening on", 60000), "127.0.0.1");
  ASSERT_GT(port, 0);
  ASSERT_TRUE(CallInfo(port, "").ok());
  const int64_t before = PeakRss(ps.pid());
  ASSERT_GT(before, 0);

  // 400,000 ids (repeats are legal in a pull): 3.2 MB asked, 102 MB answered.
  PullRequest pull;
  std::vector<int64_t> ids(400000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 1000);
  pull.set_ids(ids.data(), ids.size() * sizeof(int64_t));
  RpcSecurity s;
  s.max_message_bytes = int64_t{128} << 20;
  auto stub = ParameterServer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port), s, grpc::ChannelArguments()));
  constexpr int kPulls = 8;
  testing::PullResults r =
      testing::ConcurrentPulls(stub.get(), pull, kPulls, absl::Seconds(120));
  for (int i = 0; i < kPulls; ++i) {
    EXPECT_TRUE(r.status[i].ok()) << i << ": " << r.status[i].error_message();
    EXPECT_EQ(r.answers[i].rows().size(), ids.size() * kRowDim * sizeof(float)) << i;
  }
  r.answers.clear();
  const int64_t after = PeakRss(ps.pid());
  std::printf("shard peak memory: %.1f MB before, %.1f MB after %d concurrent 102 MB pulls\n",
              before / 1e6, after / 1e6, kPulls);
  EXPECT_LT(after - before, int64_t{3 * 128} << 20);
  StopCleanly(&ps);
}

// `--bind ::1` listens on IPv6 loopback and says so with brackets (issue 26 item 10: it failed
// with "address in use, or not an address of this host").
TEST_F(HostileProcessTest, BindsAnIpv6AddressAndPrintsItInBrackets) {
  std::ifstream in("/proc/net/if_inet6");
  const std::string inet6((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (inet6.find("00000000000000000000000000000001") == std::string::npos) {
    GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  }
  Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start(PsArgs({"--bind", "::1"}), &error)) << error;
  const std::string line = ps.ReadLineContaining("listening on", 60000);
  const int port = PortOf(line, "[::1]");
  ASSERT_GT(port, 0) << "banner: '" << line << "'";
  auto stub = ParameterServer::NewStub(
      MakeChannel(absl::StrCat("[::1]:", port), RpcSecurity(), grpc::ChannelArguments()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  InfoResponse info;
  const grpc::Status st = stub->Info(&ctx, InfoRequest(), &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  StopCleanly(&ps);
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
