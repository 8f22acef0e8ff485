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
// others get SIGTERM. Hosts still running --kill_timeout_s after a SIGTERM get SIGKILL, and a
// stopped host (SIGSTOP: it would take the SIGTERM only once continued) gets it at once; every
// child is reaped, and a child dies with the launcher (PR_SET_PDEATHSIG).
#include <arpa/inet.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_security.h"
#include "common/env.h"
#include "common/rpc/security.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/stop_signal.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/spawn.h"
#include "common/status.h"

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
  bool stopped = false;  // SIGSTOP / SIGTSTP, not continued since (it cannot take a SIGTERM)
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

// A stop signal for the cluster loop (StopSignals::on_stop): the signal, 0 once taken.
std::atomic<int> g_stop_signal{0};

// The cluster's settings for every attempt.
struct ClusterOptions {
  std::vector<std::string> base_args;  // every host's flags but its place in the cluster
  int hosts = 2;
  std::string model_dir;
  int kill_timeout_s = 120;
  int metrics_port = 0;  // host i gets metrics_port + i (0 = off)
  sigset_t wake;         // SIGCHLD: a host exited, or g_stop_signal was set
};

// One cluster attempt: N hosts started, reaped as they exit, stopped together.
class ClusterAttempt {
 public:
  ClusterAttempt(const ClusterOptions& options, Outcome* outcome)
      : o_(options), outcome_(outcome), children_(options.hosts), alive_(options.hosts) {}

  // Starts the hosts on fresh ports; returns the launcher's exit code on failure (printed).
  std::optional<int> Start();
  // Until every host exited; returns the launcher's exit code.
  int Wait();

 private:
  void ReapExited();
  // SIGTERM to every host still running, SIGKILL kill_timeout_s later (a stopped one at once).
  void BeginStopping();
  // SIGKILL to host i if it is stopped (KillIfStopped: it cannot take a SIGTERM).
  void KillIfStopped(int i);
  void SignalAll(int sig) {
    for (const Child& c : children_) {
      if (c.status < 0) kill(c.pid, sig);
    }
  }

  const ClusterOptions& o_;
  Outcome* const outcome_;
  std::vector<Child> children_;
  int alive_;
  int code_ = 0;
  bool stopping_ = false;
  bool signalled_ = false;  // stopped by the user: success if every host saved and exited 0
  absl::Duration kill_at_;  // on Env::Default()'s monotonic clock
};

std::optional<int> ClusterAttempt::Start() {
  const int n = o_.hosts;
  std::vector<int> ports;
  std::string error;
  if (!PickPorts(n, &ports, &error)) return CommandError("local", error, 1);
  std::vector<std::string> addresses;
  for (int p : ports) addresses.push_back(absl::StrCat("127.0.0.1:", p));
  const std::string cluster = absl::StrJoin(addresses, ",");
  std::printf("pstrain local: starting %d hosts on %s; host 0 prints here, host i > 0 logs to "
              "%s/host-<i>/output.log\n", n, cluster.c_str(), o_.model_dir.c_str());
  std::fflush(stdout);
  for (int i = 1; i < n; ++i) {
    const std::string dir = absl::StrCat(o_.model_dir, "/host-", i);
    if (absl::Status s = MakeDirs(dir); !s.ok()) return CommandError("local", s.message(), 1);
    children_[i].log = dir + "/output.log";
  }
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {"/proc/self/exe", "host"};
    args.insert(args.end(), o_.base_args.begin(), o_.base_args.end());
    args.push_back("--cluster=" + cluster);
    args.push_back(absl::StrCat("--index=", i));
    if (o_.metrics_port > 0) args.push_back(absl::StrCat("--metrics_port=", o_.metrics_port + i));
    args.push_back("--bind=127.0.0.1");
    // The hosts share this machine: each one's automatic thread settings (threads.* = 0) divide
    // its share of the cores, not all of them.
    args.push_back(absl::StrCat("--cores=", std::max(1, Launch().cpus.cpus / n)));
    SpawnOptions so;
    so.argv = std::move(args);
    if (i > 0) so.output_file = children_[i].log;
    const absl::StatusOr<pid_t> pid = Spawn(so);
    if (!pid.ok()) {
      CommandError("local", absl::StrCat("host ", i, ": ", pid.status().message()), 1);
      for (int j = 0; j < i; ++j) kill(children_[j].pid, SIGKILL);
      for (int j = 0; j < i; ++j) waitpid(children_[j].pid, nullptr, 0);
      return 1;
    }
    children_[i].pid = *pid;
  }
  return std::nullopt;
}

void ClusterAttempt::BeginStopping() {
  stopping_ = true;
  kill_at_ = Env::Default()->MonotonicNow() + absl::Seconds(o_.kill_timeout_s);
  SignalAll(SIGTERM);
  for (int i = 0; i < o_.hosts; ++i) KillIfStopped(i);
}

void ClusterAttempt::KillIfStopped(int i) {
  Child& c = children_[i];
  if (c.status >= 0 || !c.stopped) return;
  // A stopped host would take the SIGTERM only once continued: it cannot write a checkpoint, and
  // its peers have stopped (they found it by their lease). Waiting --kill_timeout_s for it would
  // only delay the restart.
  std::fprintf(stderr, "pstrain local: host %d is stopped (it cannot take a SIGTERM): SIGKILL\n",
               i);
  kill(c.pid, SIGKILL);
}

void ClusterAttempt::ReapExited() {
  for (int i = 0; i < o_.hosts; ++i) {
    Child& c = children_[i];
    if (c.status >= 0) continue;
    int status;
    // A stop or a continuation is reported first (SIGCHLD wakes the loop for those too); then
    // look again, for an exit that came after it.
    bool exited = false;
    while (waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) == c.pid) {
      if (WIFSTOPPED(status)) {
        if (!c.stopped) {
          std::fprintf(stderr, "pstrain local: host %d is stopped (signal %d)%s\n", i,
                       WSTOPSIG(status),
                       stopping_ ? "" : "; its peers find it by their lease");
        }
        c.stopped = true;
        if (stopping_) KillIfStopped(i);
      } else if (WIFCONTINUED(status)) {
        c.stopped = false;
      } else {
        exited = true;
        break;
      }
    }
    if (!exited) continue;
    c.status = status;
    --alive_;
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && signalled_) code_ = 1;
    if (failed && !stopping_) {
      std::fprintf(stderr, "pstrain local: host %d failed (%s)%s; stopping the others\n", i,
                   Describe(status).c_str(), c.log.empty() ? "" : (" - see " + c.log).c_str());
      outcome_->retry = ExitCode(status) == kExitCannotListen;
      outcome_->usage_error = ExitCode(status) == 2;
      outcome_->failure = absl::StrCat("host ", i, " failed (", Describe(status), ")");
      code_ = 1;
      BeginStopping();
    }
  }
}

int ClusterAttempt::Wait() {
  while (alive_ > 0) {
    // Reap whoever exited (SIGCHLD is blocked and merely wakes the wait below).
    ReapExited();
    if (alive_ == 0) break;
    timespec wait = {3600, 0};
    if (stopping_) {
      const int64_t left =
          absl::ToInt64Milliseconds(kill_at_ - Env::Default()->MonotonicNow());
      if (left <= 0) {
        std::fprintf(stderr, "pstrain local: hosts still running %d s after SIGTERM: SIGKILL\n",
                     o_.kill_timeout_s);
        SignalAll(SIGKILL);
        for (Child& c : children_) {
          if (c.status < 0 && waitpid(c.pid, &c.status, 0) == c.pid) --alive_;
        }
        break;
      }
      wait = {static_cast<time_t>(left / 1000), static_cast<long>(left % 1000) * 1000000};
    }
    sigtimedwait(&o_.wake, nullptr, &wait);
    const int sig = g_stop_signal.exchange(0);
    if (sig != 0 && !stopping_) {
      std::fprintf(stderr,
                   "pstrain local: %s: stopping the hosts; they write a checkpoint of the job "
                   "(run the same command to resume)\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      signalled_ = true;
      outcome_->signalled = true;
      BeginStopping();
    }
  }
  if (code_ != 0) return code_;
  outcome_->retry = false;
  return 0;
}

// Runs one cluster attempt; returns the launcher's exit code.
int RunCluster(const ClusterOptions& options, Outcome* outcome) {
  *outcome = Outcome();
  ClusterAttempt attempt(options, outcome);
  if (std::optional<int> code = attempt.Start()) return *code;
  return attempt.Wait();
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

// Every host's flags: the launcher's own removed, --max_restarts passed on, and record sharding
// when the train channels have fewer files than hosts (Kaggle's train.txt is one file).
absl::StatusOr<std::vector<std::string>> HostArgs(int argc, char** argv, const Config& config,
                                                  int hosts, int max_restarts) {
  std::vector<std::string> args =
      ForwardedArgs(argc, argv, {"hosts", "kill_timeout_s", "max_restarts", "metrics_port"});
  // ASYNC: each host restarts its own dead worker while the others train on (docs/PS.md
  // "Recovery"); a dead host (its shard) restarts the whole job here.
  if (max_restarts > 0) args.push_back(absl::StrCat("--max_restarts=", max_restarts));
  Config sharded = config;
  ASSIGN_OR_RETURN(std::vector<std::string> notes, ShardByRecordWhenTooFewFiles(&sharded, hosts));
  for (const std::string& n : notes) std::fprintf(stderr, "pstrain local: %s\n", n.c_str());
  for (int i = 0; i < sharded.data().train_size(); ++i) {
    if (sharded.data().train(i).shard_policy() != config.data().train(i).shard_policy()) {
      args.push_back(absl::StrCat("--set=data.train[", i, "].shard_policy=SHARD_BY_RECORD"));
    }
  }
  return args;
}

// The job's calls carry a secret (docs/PS.md "Operations and security"): the user's
// (cluster.secret_file or PSTRAIN_CLUSTER_SECRET, which the hosts read themselves), else a
// random one for this job, handed to the hosts in their environment, never on a command line.
absl::Status EnsureClusterSecret(const Config& config) {
  if (!config.cluster().secret_file().empty() || std::getenv(kSecretEnvVariable) != nullptr) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string secret, RandomSecret());
  setenv(kSecretEnvVariable, secret.c_str(), 1);
  return absl::OkStatus();
}

// Stop signals wake the cluster loop: SIGCHLD (blocked here, taken by its sigtimedwait) is sent
// to this thread with the signal in g_stop_signal. Each one is taken; a repeated one does not
// end the launcher (its hosts are checkpointing).
void WakeOnStopSignals(ClusterOptions* options) {
  sigemptyset(&options->wake);
  sigaddset(&options->wake, SIGCHLD);
  sigprocmask(SIG_BLOCK, &options->wake, nullptr);
  StopSignals& signals = InstallStopSignals();
  signals.repeat_ends_process = false;
  signals.on_stop = [waiter = pthread_self()](int sig) {
    g_stop_signal = sig;
    pthread_kill(waiter, SIGCHLD);
  };
  signals.served = true;
}

// Runs the cluster, on fresh ports when a host could not listen (kAttempts), and again from the
// last checkpoint after a failure, up to max_restarts times; returns the launcher's exit code.
int RunWithRestarts(const ClusterOptions& options, const Config& config, int max_restarts) {
  int port_attempts = 0, restarts = 0;
  std::vector<std::string> restart_log;
  while (true) {
    Outcome outcome;
    const int code = RunCluster(options, &outcome);
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
      if (code == 0) {
        if (max_restarts > 0) AddRestartsToSummary(options.model_dir, restarts, restart_log);
        PrintSummary(options.model_dir);
      }
      return code;
    }
    ++restarts;
    const std::string from = LatestPathOr(JobCheckpointDir(config), "the beginning");
    restart_log.push_back(absl::StrCat(outcome.failure, "; restarted from ", from));
    std::fprintf(stderr, "pstrain local: %s; restart %d of %d: the job resumes from %s\n",
                 outcome.failure.c_str(), restarts, max_restarts, from.c_str());
  }
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
  ClusterOptions o;
  int max_restarts = 0;
  flags.Int("hosts", &o.hosts, "number of hosts N (each one PS shard + one worker)");
  flags.Int("max_restarts", &max_restarts,
            "restarts of the whole job after a host failed (died, was killed, lost its peers), "
            "as torchrun's --max_restarts: every host is stopped and the job starts again from "
            "its last checkpoint; each restart is logged and counted in summary.json");
  flags.Int("kill_timeout_s", &o.kill_timeout_s,
            "seconds between SIGTERM and SIGKILL when stopping the hosts (time to write a "
            "checkpoint)");
  Config config;
  if (auto code = ParseTrainingCommand("local", argc, argv, &flags, tf, &config)) return *code;
  if (o.hosts < 1 || o.hosts > 64) {
    return CommandError("local", absl::StrCat("--hosts must be in [1, 64], got ", o.hosts), 2);
  }
  if (config.data().train_size() == 0) {
    return CommandError("local", "no training data: pass --train PATH or set data.train", 2);
  }
  absl::StatusOr<std::vector<std::string>> args =
      HostArgs(argc, argv, config, o.hosts, max_restarts);
  if (!args.ok()) return CommandError("local", args.status().message(), 2);
  o.base_args = *std::move(args);
  o.model_dir = config.train().model_dir();
  o.metrics_port = tf.metrics_port;
  if (absl::Status s = MakeDirs(o.model_dir); !s.ok()) return CommandError("local", s.message(), 1);
  if (absl::Status s = EnsureClusterSecret(config); !s.ok()) {
    return CommandError("local", s.ToString(), 1);
  }
  WakeOnStopSignals(&o);
  if (max_restarts < 0) {
    return CommandError("local", absl::StrCat("--max_restarts must be >= 0, got ", max_restarts),
                        2);
  }
  return RunWithRestarts(o, config, max_restarts);
}

}  // namespace pstrain
