#include "cmd/sagemaker.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <google/protobuf/struct.pb.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cmd/cluster_spec.h"
#include "common/env.h"
#include "common/file.h"
#include "common/status.h"

extern char** environ;

namespace pstrain {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status Bad(const std::string& what, const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", expected));
}

const char* EnvVar(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A file that may be absent: nullopt when it is, its text otherwise.
absl::StatusOr<std::optional<std::string>> ReadOptional(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (text.ok()) return std::optional<std::string>(*std::move(text));
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  return text.status();
}

// inputdataconfig.json: {"train": {"TrainingInputMode": "Pipe", "S3DistributionType":
// "ShardedByS3Key", "CompressionType": "Gzip", ...}, ...}.
absl::Status ParseInputDataConfig(const std::string& text, const std::string& what,
                                  SageMakerContract* out) {
  ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(text, what));
  if (v.kind_case() != Value::kStructValue) return Bad(what, "a JSON object of channels");
  for (const auto& [name, channel] : v.struct_value().fields()) {
    if (channel.kind_case() != Value::kStructValue) {
      return Bad(absl::StrCat(what, " \"", name, "\""), "an object");
    }
    auto& in = out->channels[name];
    const auto& f = channel.struct_value().fields();
    auto str = [&f](const char* key) {
      auto it = f.find(key);
      return it == f.end() ? std::string() : absl::AsciiStrToLower(it->second.string_value());
    };
    in.pipe = str("TrainingInputMode") == "pipe";
    in.sharded = str("S3DistributionType") == "shardedbys3key";
    in.gzip = str("CompressionType") == "gzip";
  }
  return absl::OkStatus();
}

}  // namespace

std::string SageMakerPath(absl::string_view path) {
  const char* root = EnvVar("PSTRAIN_SAGEMAKER_ROOT");
  std::string r = root == nullptr ? "" : root;
  while (!r.empty() && r.back() == '/') r.pop_back();
  return absl::StrCat(r, path);
}

absl::Status ParseHyperparameters(const std::string& text, const std::string& what,
                                  SageMakerContract* out) {
  ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(text, what));
  if (v.kind_case() != Value::kStructValue) {
    return Bad(what, "a JSON object of string values (SageMaker's hyperparameters)");
  }
  // protobuf's Struct is a map: sort the keys so that the --set order is stable.
  std::map<std::string, Value> sorted(v.struct_value().fields().begin(),
                                      v.struct_value().fields().end());
  for (const auto& [key, value] : sorted) {
    const std::string where = absl::StrCat(what, " \"", key, "\"");
    if (absl::StartsWith(key, "sagemaker_") || absl::StartsWith(key, "_")) continue;
    if (value.kind_case() != Value::kStringValue) {
      return Bad(where, "a string value (SageMaker passes every hyperparameter as a string)");
    }
    const std::string& val = value.string_value();
    if (key == "config") {
      for (absl::string_view c : absl::StrSplit(val, ',', absl::SkipEmpty())) {
        out->config_files.emplace_back(c);
      }
    } else if (key == "format") {
      out->format = val;
    } else if (key == "epochs") {
      if (!absl::SimpleAtoi(val, &out->epochs) || out->epochs < 1) {
        return Bad(where, absl::StrCat("a positive integer, got '", val, "'"));
      }
    } else if (key.find_first_of(".[") != std::string::npos) {
      out->sets.push_back(absl::StrCat(key, "=", val));
    } else {
      return Bad(where, "\"config\", \"format\", \"epochs\" or a config field path such as "
                        "\"train.batch_size\" (applied as --set)");
    }
  }
  return absl::OkStatus();
}

std::string SageMakerFailureFile() {
  struct stat st;
  const bool active =
      EnvVar("SM_HOSTS") || EnvVar("SM_MODEL_DIR") || EnvVar("SM_TRAINING_ENV") ||
      ::stat(SageMakerPath("/opt/ml/input/config/resourceconfig.json").c_str(), &st) == 0;
  return active ? SageMakerPath("/opt/ml/output/failure") : "";
}

absl::StatusOr<SageMakerContract> ReadSageMakerContract() {
  SageMakerContract c;
  const std::string resource_config = SageMakerPath("/opt/ml/input/config/resourceconfig.json");
  ASSIGN_OR_RETURN(std::optional<std::string> rc, ReadOptional(resource_config));
  c.active = EnvVar("SM_HOSTS") || EnvVar("SM_MODEL_DIR") || EnvVar("SM_TRAINING_ENV") ||
             rc.has_value();
  if (!c.active) return c;

  // Hosts: only for the single-host check of `pstrain train`; `host` resolves them itself.
  auto hosts_from = [&c](const Value& v) {
    for (const Value& h : v.list_value().values()) c.hosts.push_back(h.string_value());
  };
  if (const char* sm = EnvVar("SM_HOSTS")) {
    ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(sm, "SM_HOSTS"));
    if (v.kind_case() != Value::kListValue) return Bad("SM_HOSTS", "a JSON list of host names");
    hosts_from(v);
  } else if (rc.has_value()) {
    ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(*rc, resource_config));
    if (v.kind_case() == Value::kStructValue) {
      auto it = v.struct_value().fields().find("hosts");
      if (it != v.struct_value().fields().end()) hosts_from(it->second);
    }
  }

  c.model_dir = EnvVar("SM_MODEL_DIR") ? EnvVar("SM_MODEL_DIR") : SageMakerPath("/opt/ml/model");
  const std::string checkpoints = SageMakerPath("/opt/ml/checkpoints");
  if (Env::Default()->IsDirectory(checkpoints)) c.checkpoint_dir = checkpoints;
  c.failure_file = SageMakerPath("/opt/ml/output/failure");
  c.data_dir = SageMakerPath("/opt/ml/input/data");

  // Channels: SM_CHANNEL_<NAME> (the toolkit's), inputdataconfig.json's (every container's), and
  // the directories under /opt/ml/input/data (file mode).
  const std::string input_config = SageMakerPath("/opt/ml/input/config/inputdataconfig.json");
  ASSIGN_OR_RETURN(std::optional<std::string> idc, ReadOptional(input_config));
  if (idc.has_value()) RETURN_IF_ERROR(ParseInputDataConfig(*idc, input_config, &c));
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv = *e;
    if (!absl::ConsumePrefix(&kv, "SM_CHANNEL_")) continue;
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos || eq == 0) continue;
    const std::string upper(kv.substr(0, eq));
    // SM_CHANNEL_TRAIN names channel "train": match a known channel case-insensitively.
    std::string name = absl::AsciiStrToLower(upper);
    for (const auto& [known, unused] : c.channels) {
      if (absl::EqualsIgnoreCase(known, upper)) name = known;
    }
    c.channels[name].dir = std::string(kv.substr(eq + 1));
  }
  for (auto& [name, in] : c.channels) {
    if (in.dir.empty()) in.dir = absl::StrCat(c.data_dir, "/", name);
  }

  const std::string hp = SageMakerPath("/opt/ml/input/config/hyperparameters.json");
  ASSIGN_OR_RETURN(std::optional<std::string> hp_text, ReadOptional(hp));
  if (hp_text.has_value()) RETURN_IF_ERROR(ParseHyperparameters(*hp_text, hp, &c));
  return c;
}

std::unique_ptr<FailureCapture> FailureCapture::Start(const std::string& failure_file) {
  if (failure_file.empty()) return nullptr;
  int fds[2], wake[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  const int original = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  if (original < 0 || ::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (original >= 0) ::close(original);
    return nullptr;
  }
  std::fflush(stderr);
  // The write end becomes fd 2 (without O_CLOEXEC: children write their errors to it too).
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[1]);
  std::unique_ptr<FailureCapture> f(
      new FailureCapture(failure_file, original, fds[0], wake[0], wake[1]));
  f->pump_ = std::thread([p = f.get()] { p->Pump(); });
  return f;
}

FailureCapture::FailureCapture(std::string path, int original_stderr, int read_fd, int wake_read,
                               int wake_write)
    : path_(std::move(path)),
      original_stderr_(original_stderr),
      read_fd_(read_fd),
      wake_read_(wake_read),
      wake_write_(wake_write) {}

FailureCapture::~FailureCapture() { Finish(0); }

void FailureCapture::Pump() {
  constexpr size_t kKeep = 16 << 10;
  char buf[4096];
  while (true) {
    pollfd p[2] = {{read_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    // Waits for output (or Finish's wake-up) without a timeout; once stopping, a silent writer
    // (a stray child holding the pipe) ends the drain after 2 s.
    const int ready = ::poll(p, stop_ ? 1 : 2, stop_ ? 2000 : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (ready == 0 && stop_)) return;
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;  // the wake-up: loop, stop_ set
    const ssize_t n = ::read(read_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // every writer closed
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(original_stderr_, buf + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // the real stderr is gone: keep capturing
      done += w;
    }
    tail_.append(buf, n);
    if (tail_.size() > 2 * kKeep) tail_.erase(0, tail_.size() - kKeep);
  }
}

void FailureCapture::Finish(int exit_code) {
  if (finished_) return;
  finished_ = true;
  std::fflush(stderr);
  ::dup2(original_stderr_, STDERR_FILENO);  // closes this process's write end of the pipe
  stop_ = true;
  const char wake = 1;
  while (::write(wake_write_, &wake, 1) < 0 && errno == EINTR) {
  }
  pump_.join();
  ::close(read_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
  if (exit_code == 0) {
    ::close(original_stderr_);
    return;
  }
  // The reason: the last error line a command printed ("pstrain <command>: ..."), else the last
  // non-empty line. SageMaker shows the first 1024 characters as the job's FailureReason.
  std::vector<std::string> lines = absl::StrSplit(tail_, '\n', absl::SkipWhitespace());
  std::string reason;
  for (auto it = lines.rbegin(); it != lines.rend() && reason.empty(); ++it) {
    if (absl::StartsWith(*it, "pstrain ")) reason = *it;
  }
  if (reason.empty() && !lines.empty()) reason = lines.back();
  if (reason.empty()) reason = "pstrain failed without an error message";
  const std::string text = absl::StrCat(reason, " (exit code ", exit_code, ")\n");
  const size_t slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) MakeDirs(path_.substr(0, slash)).IgnoreError();
  if (absl::Status s = WriteFileAtomic(path_, text); !s.ok()) {
    dprintf(original_stderr_, "pstrain: could not write the failure file: %s\n",
            s.ToString().c_str());
  }
  ::close(original_stderr_);
}

}  // namespace pstrain
