// `pstrain local --hosts N [training flags]`: an N-host asynchronous PS job on this machine. Runs
// N `pstrain host` processes (this binary, /proc/self/exe) on loopback with
// --cluster=127.0.0.1:p0,...,127.0.0.1:pN-1 --index=i and the same training flags.
//
// Ports: the launcher binds N sockets to 127.0.0.1:0 at once (so the N ports differ), closes them
// and hands the ports to the hosts. Another process could take one in between; a host whose shard
// cannot listen exits with code 3, and the launcher then stops the others and starts the whole
// cluster again on fresh ports (up to 3 attempts). Letting shards bind port 0 themselves would
// need a second round of messages to tell every host the others' ports.
//
// Output: host 0 (the chief) writes to this terminal; host i > 0 to <model_dir>/host-<i>/output.log
// (shown path on failure). Signals: SIGINT / SIGTERM are forwarded to the hosts as SIGTERM: the
// hosts write a checkpoint of the job and exit 0, and so does the launcher. If a host fails, the
// others get SIGTERM. Hosts still running --kill_timeout_s after a SIGTERM get SIGKILL; every
// child is reaped, and a child dies with the launcher (PR_SET_PDEATHSIG).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_security.h"
#include "common/rpc/security.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/spawn.h"

namespace pstrain {
namespace {

constexpr int kExitCannotListen = 3;  // see cmd_host.cc
constexpr int kAttempts = 3;

// N distinct free loopback ports (all bound at once, then released).
bool PickPorts(int n, std::vector<int>* ports, std::string* error) {
  std::vector<int> fds;
  bool ok = true;
  for (int i = 0; i < n && ok; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      *error = absl::StrCat("picking a free port: ", std::strerror(errno));
      ok = false;
    } else {
      ports->push_back(ntohs(a.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  return ok;
}

struct Child {
  pid_t pid = -1;
  int status = -1;  // wait status once reaped
  std::string log;  // "" = the terminal
};

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Describe(int status) {
  return WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                           : absl::StrCat("signal ", WTERMSIG(status));
}

// How one cluster attempt ended, besides the launcher's exit code.
struct Outcome {
  bool retry = false;       // a host could not listen on its port (and nothing else went wrong)
  bool signalled = false;   // the user stopped the job (SIGINT / SIGTERM)
  bool usage_error = false;  // a host exited 2: a bad flag or config, a restart would not help
  std::string failure;      // "host 1 failed (signal 9)": the first host that failed
};

// Runs one cluster attempt; returns the launcher's exit code.
int RunCluster(const std::vector<std::string>& base_args, int n, const std::string& model_dir,
               int kill_timeout_s, int metrics_port, const sigset_t& signals, Outcome* outcome) {
  *outcome = Outcome();
  bool* retry = &outcome->retry;
  std::vector<int> ports;
  std::string error;
  if (!PickPorts(n, &ports, &error)) {
    std::fprintf(stderr, "pstrain local: %s\n", error.c_str());
    return 1;
  }
  std::vector<std::string> addresses;
  for (int p : ports) addresses.push_back(absl::StrCat("127.0.0.1:", p));
  const std::string cluster = absl::StrJoin(addresses, ",");
  std::printf("pstrain local: starting %d hosts on %s; host 0 prints here, host i > 0 logs to "
              "%s/host-<i>/output.log\n", n, cluster.c_str(), model_dir.c_str());
  std::fflush(stdout);
  std::vector<Child> children(n);
  for (int i = 1; i < n; ++i) {
    const std::string dir = absl::StrCat(model_dir, "/host-", i);
    if (absl::Status s = MakeDirs(dir); !s.ok()) {
      std::fprintf(stderr, "pstrain local: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    children[i].log = dir + "/output.log";
  }
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {"/proc/self/exe", "host"};
    args.insert(args.end(), base_args.begin(), base_args.end());
    args.push_back("--cluster=" + cluster);
    args.push_back(absl::StrCat("--index=", i));
    if (metrics_port > 0) args.push_back(absl::StrCat("--metrics_port=", metrics_port + i));
    args.push_back("--bind=127.0.0.1");
    // The hosts share this machine: each one's automatic thread settings (threads.* = 0) divide
    // its share of the cores, not all of them.
    args.push_back(absl::StrCat(
        "--cores=", std::max(1, Launch().cpus.cpus / n)));
    SpawnOptions so;
    so.argv = std::move(args);
    if (i > 0) so.output_file = children[i].log;
    const absl::StatusOr<pid_t> pid = Spawn(so);
    if (!pid.ok()) {
      std::fprintf(stderr, "pstrain local: host %d: %s\n", i,
                   std::string(pid.status().message()).c_str());
      for (int j = 0; j < i; ++j) kill(children[j].pid, SIGKILL);
      for (int j = 0; j < i; ++j) waitpid(children[j].pid, nullptr, 0);
      return 1;
    }
    children[i].pid = *pid;
  }

  int alive = n, code = 0;
  bool stopping = false;
  bool signalled = false;  // stopped by the user: success if every host saved and exited 0
  auto stop_all = [&](int sig) {
    for (const Child& c : children) {
      if (c.status < 0) kill(c.pid, sig);
    }
  };
  std::chrono::steady_clock::time_point kill_at;
  while (alive > 0) {
    // Reap whoever exited (SIGCHLD is blocked and merely wakes the wait below).
    for (int i = 0; i < n; ++i) {
      Child& c = children[i];
      if (c.status >= 0) continue;
      int status;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.status = status;
      --alive;
      const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (failed && signalled) code = 1;
      if (failed && !stopping) {
        std::fprintf(stderr, "pstrain local: host %d failed (%s)%s; stopping the others\n", i,
                     Describe(status).c_str(),
                     c.log.empty() ? "" : (" - see " + c.log).c_str());
        *retry = ExitCode(status) == kExitCannotListen;
        outcome->usage_error = ExitCode(status) == 2;
        outcome->failure = absl::StrCat("host ", i, " failed (", Describe(status), ")");
        code = 1;
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(kill_timeout_s);
        stop_all(SIGTERM);
      }
    }
    if (alive == 0) break;
    timespec wait = {3600, 0};
    if (stopping) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            kill_at - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        std::fprintf(stderr, "pstrain local: hosts still running %d s after SIGTERM: SIGKILL\n",
                     kill_timeout_s);
        stop_all(SIGKILL);
        for (Child& c : children) {
          if (c.status < 0 && waitpid(c.pid, &c.status, 0) == c.pid) --alive;
        }
        break;
      }
      wait = {static_cast<time_t>(left / 1000), static_cast<long>(left % 1000) * 1000000};
    }
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if ((sig == SIGINT || sig == SIGTERM) && !stopping) {
      std::fprintf(stderr,
                   "pstrain local: %s: stopping the hosts; they write a checkpoint of the job "
                   "(run the same command to resume)\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      signalled = true;
      outcome->signalled = true;
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(kill_timeout_s);
      stop_all(SIGTERM);
    }
  }
  if (code != 0) return code;
  *retry = false;
  return 0;
}

// summary.json gets "restarts" and "restart_log" (why, and from which checkpoint): the chief
// wrote its workers' restarts by their hosts there (cmd/worker_supervisor.h); the restarts of the
// whole job are added to them.
void AddRestartsToSummary(const std::string& model_dir, int restarts,
                          const std::vector<std::string>& log) {
  const std::string path = model_dir + "/summary.json";
  auto text = ReadFileToString(path);
  google::protobuf::Struct summary;
  if (!text.ok() || !google::protobuf::util::JsonStringToMessage(*text, &summary).ok()) {
    std::fprintf(stderr, "pstrain local: could not read %s to count the restarts\n",
                 path.c_str());
    return;
  }
  auto& count = (*summary.mutable_fields())["restarts"];
  count.set_number_value(count.number_value() + restarts);
  auto* list = (*summary.mutable_fields())["restart_log"].mutable_list_value();
  for (const std::string& line : log) list->add_values()->set_string_value(line);
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(summary, &json, o).ok() ||
      !WriteFileAtomic(path, json).ok()) {
    std::fprintf(stderr, "pstrain local: could not write %s\n", path.c_str());
  }
}

void PrintSummary(const std::string& model_dir) {
  const std::string path = model_dir + "/summary.json";
  auto text = ReadFileToString(path);
  google::protobuf::Struct summary;
  if (!text.ok() || !google::protobuf::util::JsonStringToMessage(*text, &summary).ok()) {
    std::fprintf(stderr, "pstrain local: could not read %s\n", path.c_str());
    return;
  }
  auto num = [&summary](const char* key) {
    auto it = summary.fields().find(key);
    return it == summary.fields().end() ? std::nan("") : it->second.number_value();
  };
  if (auto it = summary.fields().find("preempted");
      it != summary.fields().end() && it->second.bool_value()) {
    auto ck = summary.fields().find("checkpoint");
    std::printf("pstrain local: stopped after %.0f examples; checkpoint %s; run the same command "
                "to resume\n",
                num("examples"),
                ck == summary.fields().end() ? "?" : ck->second.string_value().c_str());
    return;
  }
  std::printf("pstrain local: done: %.0f hosts, %.0f examples at %.0f ex/s, test AUC %.5f "
              "logloss %.5f; model dir %s\n",
              num("hosts"), num("examples"), num("examples_per_sec"), num("test_auc"),
              num("test_logloss"), model_dir.c_str());
}

}  // namespace

int RunLocal(int argc, char** argv) {
  FlagSet flags("local",
                "Runs an N-host asynchronous PS job on this machine: N `pstrain host` processes "
                "on loopback ports, with the training flags given here.\nHost 0 (the chief) "
                "prints here and writes <model_dir>/summary.json; host i > 0 logs to "
                "<model_dir>/host-<i>/. Ctrl-C or SIGTERM stops all hosts after a checkpoint of the job; the "
                "same command resumes it.");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  int hosts = 2, kill_timeout_s = 120, max_restarts = 0;
  flags.Int("hosts", &hosts, "number of hosts N (each one PS shard + one worker)");
  flags.Int("max_restarts", &max_restarts,
            "restarts of the whole job after a host failed (died, was killed, lost its peers), "
            "as torchrun's --max_restarts: every host is stopped and the job starts again from "
            "its last checkpoint; each restart is logged and counted in summary.json");
  flags.Int("kill_timeout_s", &kill_timeout_s,
            "seconds between SIGTERM and SIGKILL when stopping the hosts (time to write a "
            "checkpoint)");
  Config config;
  if (auto code = ParseTrainingCommand("local", argc, argv, &flags, tf, &config)) return *code;
  if (hosts < 1 || hosts > 64) {
    std::fprintf(stderr, "pstrain local: --hosts must be in [1, 64], got %d\n", hosts);
    return 2;
  }
  if (config.data().train_size() == 0) {
    std::fprintf(stderr, "pstrain local: no training data: pass --train PATH or set data.train\n");
    return 2;
  }
  // Forward every flag but the launcher's own.
  std::vector<std::string> base_args =
      ForwardedArgs(argc, argv, {"hosts", "kill_timeout_s", "max_restarts", "metrics_port"});
  // ASYNC: each host restarts its own dead worker while the others train on (docs/PS.md
  // "Recovery"); a dead host (its shard) restarts the whole job here.
  if (max_restarts > 0) base_args.push_back(absl::StrCat("--max_restarts=", max_restarts));
  // Fewer train files than hosts (Kaggle's train.txt is one file): record sharding.
  {
    Config sharded = config;
    auto notes = ShardByRecordWhenTooFewFiles(&sharded, hosts);
    if (!notes.ok()) {
      std::fprintf(stderr, "pstrain local: %s\n", std::string(notes.status().message()).c_str());
      return 2;
    }
    for (const std::string& n : *notes) std::fprintf(stderr, "pstrain local: %s\n", n.c_str());
    for (int i = 0; i < sharded.data().train_size(); ++i) {
      if (sharded.data().train(i).shard_policy() != config.data().train(i).shard_policy()) {
        base_args.push_back(absl::StrCat("--set=data.train[", i, "].shard_policy=SHARD_BY_RECORD"));
      }
    }
  }
  const std::string model_dir = config.train().model_dir();
  if (absl::Status s = MakeDirs(model_dir); !s.ok()) {
    std::fprintf(stderr, "pstrain local: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // The job's calls carry a secret (docs/PS.md "Operations and security"): the user's
  // (cluster.secret_file or PSTRAIN_CLUSTER_SECRET, which the hosts read themselves), else a
  // random one for this job, handed to the hosts in their environment, never on a command line.
  if (config.cluster().secret_file().empty() && std::getenv(kSecretEnvVariable) == nullptr) {
    auto secret = RandomSecret();
    if (!secret.ok()) {
      std::fprintf(stderr, "pstrain local: %s\n", secret.status().ToString().c_str());
      return 1;
    }
    setenv(kSecretEnvVariable, secret->c_str(), 1);
  }
  // Signals are taken synchronously by sigtimedwait in RunCluster; children unblock them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  if (max_restarts < 0) {
    std::fprintf(stderr, "pstrain local: --max_restarts must be >= 0, got %d\n", max_restarts);
    return 2;
  }
  int code = 1;
  int port_attempts = 0, restarts = 0;
  std::vector<std::string> restart_log;
  while (true) {
    Outcome outcome;
    code = RunCluster(base_args, hosts, model_dir, kill_timeout_s, tf.metrics_port, signals,
                      &outcome);
    if (outcome.retry && ++port_attempts < kAttempts) {
      std::fprintf(stderr, "pstrain local: a host could not listen on its port; retrying on "
                   "fresh ports (attempt %d of %d)\n", port_attempts + 1, kAttempts);
      continue;
    }
    if (code == 0 || outcome.signalled || outcome.usage_error || restarts >= max_restarts) {
      if (code != 0 && !outcome.signalled && max_restarts > 0 && restarts >= max_restarts) {
        std::fprintf(stderr, "pstrain local: %s; no restart left (--max_restarts %d)\n",
                     outcome.failure.c_str(), max_restarts);
      }
      break;
    }
    ++restarts;
    const std::string from = LatestPathOr(JobCheckpointDir(config), "the beginning");
    restart_log.push_back(absl::StrCat(outcome.failure, "; restarted from ", from));
    std::fprintf(stderr, "pstrain local: %s; restart %d of %d: the job resumes from %s\n",
                 outcome.failure.c_str(), restarts, max_restarts, from.c_str());
  }
  if (code == 0) {
    if (max_restarts > 0) AddRestartsToSummary(model_dir, restarts, restart_log);
    PrintSummary(model_dir);
  }
  return code;
}

}  // namespace pstrain
