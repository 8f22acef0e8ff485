#include "cmd/cluster_spec.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/status.h"

namespace pstrain {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Value;

absl::Status Bad(absl::string_view what, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", expected));
}

// "host:port" with a port in [1, 65535]; a bare host gets kDefaultPsPort.
absl::StatusOr<std::string> HostPort(absl::string_view entry, absl::string_view what,
                                     int default_port = kDefaultPsPort) {
  if (entry.empty()) return Bad(what, "a non-empty host[:port] entry");
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos) return absl::StrCat(entry, ":", default_port);
  int port = 0;
  if (colon == 0 || !absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return Bad(what, absl::StrCat("host:port with a port in [1, 65535], got '", entry, "'"));
  }
  return std::string(entry);
}

absl::StatusOr<std::vector<std::string>> HostList(absl::string_view list, absl::string_view what,
                                                  int default_port) {
  std::vector<std::string> hosts;
  for (absl::string_view e : absl::StrSplit(list, ',')) {
    ASSIGN_OR_RETURN(std::string h, HostPort(e, what, default_port));
    hosts.push_back(std::move(h));
  }
  return hosts;
}

absl::StatusOr<std::vector<std::string>> StringList(const Value& v, absl::string_view what) {
  if (v.kind_case() != Value::kListValue || v.list_value().values_size() == 0) {
    return Bad(what, "a non-empty JSON list of strings");
  }
  std::vector<std::string> out;
  for (const Value& e : v.list_value().values()) {
    if (e.kind_case() != Value::kStringValue) return Bad(what, "a JSON list of strings");
    out.push_back(e.string_value());
  }
  return out;
}

// "host" of "host:port".
std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

absl::StatusOr<std::vector<std::string>> TfList(const google::protobuf::Map<std::string, Value>& jobs,
                                                const char* name) {
  auto it = jobs.find(name);
  if (it == jobs.end()) return std::vector<std::string>{};
  const std::string what = absl::StrCat("TF_CONFIG cluster.", name);
  ASSIGN_OR_RETURN(std::vector<std::string> entries, StringList(it->second, what));
  std::vector<std::string> out;
  for (const std::string& e : entries) {
    ASSIGN_OR_RETURN(std::string h, HostPort(e, what));
    out.push_back(std::move(h));
  }
  return out;
}

// Host i of `pstrain host` from a TF_CONFIG whose ps and worker tasks are co-located.
absl::StatusOr<ClusterSpec> HostFromTfConfig(const std::string& text) {
  ASSIGN_OR_RETURN(TfConfig tf, ParseTfConfig(text));
  ClusterSpec spec;
  spec.source = "TF_CONFIG";
  if (tf.task_type == "evaluator") {
    spec.evaluator = true;
    return spec;
  }
  if (tf.ps.empty()) return Bad("TF_CONFIG", "a \"cluster\".\"ps\" list (the PS shards)");
  if (tf.task_type == "ps") {
    return Bad("TF_CONFIG task.type",
               absl::StrCat("chief, master or worker for `pstrain host`, got ps (index ",
                            tf.task_index, "): a PS-only task runs `pstrain ps`, which reads "
                            "TF_CONFIG too"));
  }
  // `pstrain host` runs shard i and worker i in one process: only when the job was laid out that
  // way. In a Kubeflow TFJob every replica is its own pod, and two pods must not both become host i.
  bool colocated = tf.workers.size() == tf.ps.size();
  for (size_t i = 0; colocated && i < tf.ps.size(); ++i) {
    colocated = HostOf(tf.ps[i]) == HostOf(tf.workers[i]);
  }
  if (!colocated) {
    return Bad("TF_CONFIG cluster",
               absl::StrCat("each ps task on the host of the worker with its index (the chief "
                            "first) for `pstrain host`, which runs both in one process; this job "
                            "has ", tf.ps.size(), " ps (", tf.ps[0], "...) and ", tf.workers.size(),
                            " chief/worker tasks (", tf.workers.empty() ? "none" : tf.workers[0],
                            "...) on separate hosts: run `pstrain ps` in the ps tasks and `pstrain "
                            "worker` in the chief and worker tasks (both read TF_CONFIG)"));
  }
  spec.hosts = tf.ps;
  spec.index = tf.WorkerIndex();
  return spec;
}

// Hosts `names` (SageMaker names, no port), this one `current`; `source` names where they came
// from in messages.
absl::StatusOr<ClusterSpec> SageMakerSpec(const std::vector<std::string>& names,
                                          const std::string& current, const std::string& source,
                                          const std::string& current_what, int port) {
  ClusterSpec spec;
  spec.source = source;
  spec.index = -1;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty() || names[i].find(':') != std::string::npos) {
      return Bad(source, absl::StrCat("host names without ':', got '", names[i], "'"));
    }
    if (names[i] == current) spec.index = static_cast<int>(i);
    spec.hosts.push_back(absl::StrCat(names[i], ":", port));
  }
  if (spec.index < 0) {
    return Bad(current_what, absl::StrCat("one of ", source, " [", absl::StrJoin(names, ","),
                                          "], got '", current, "'"));
  }
  return spec;
}

absl::StatusOr<ClusterSpec> FromSageMaker(const std::string& hosts, const std::string* current,
                                          int port) {
  ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(hosts, "SM_HOSTS"));
  ASSIGN_OR_RETURN(std::vector<std::string> names, StringList(v, "SM_HOSTS"));
  if (current == nullptr) return Bad("SM_CURRENT_HOST", "to be set when SM_HOSTS is");
  return SageMakerSpec(names, *current, "SM_HOSTS", "SM_CURRENT_HOST", port);
}

// resourceconfig.json: {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], ...}.
absl::StatusOr<ClusterSpec> FromResourceConfig(const std::string& text, int port) {
  const std::string what = kSageMakerResourceConfig;
  ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(text, what));
  if (v.kind_case() != Value::kStructValue) return Bad(what, "a JSON object");
  const auto& f = v.struct_value().fields();
  auto hosts = f.find("hosts");
  auto current = f.find("current_host");
  if (hosts == f.end()) return Bad(what, "a \"hosts\" list");
  if (current == f.end() || current->second.kind_case() != Value::kStringValue) {
    return Bad(what, "a \"current_host\" string");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names,
                   StringList(hosts->second, absl::StrCat(what, " hosts")));
  return SageMakerSpec(names, current->second.string_value(), what,
                       absl::StrCat(what, " current_host"), port);
}

}  // namespace

// JSON is parsed by protobuf's (strict) JSON parser into google.protobuf.Value: one parser for the
// whole project's JSON-in-the-environment, no hand-written second one. Only its depth is checked
// here first, by a scan that knows strings (brackets inside them do not count) and nothing else.
absl::StatusOr<Value> ParseEnvironmentJson(const std::string& text,
                                           absl::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return Bad(what, absl::StrCat("JSON nested at most ", kMaxJsonDepth,
                                      " deep (arrays and objects), got deeper at byte ", i));
      }
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced input is the parser's to name
    }
  }
  Value v;
  auto s = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!s.ok()) return Bad(what, absl::StrCat("valid JSON (", s.message().ToString(), ")"));
  return v;
}

int TfConfig::WorkerIndex() const {
  if (task_type == "chief" || task_type == "master") return 0;
  if (task_type == "worker") return task_index + (has_chief ? 1 : 0);
  return -1;
}

absl::StatusOr<TfConfig> ParseTfConfig(const std::string& text) {
  ASSIGN_OR_RETURN(Value v, ParseEnvironmentJson(text, "TF_CONFIG"));
  if (v.kind_case() != Value::kStructValue) return Bad("TF_CONFIG", "a JSON object");
  const auto& top = v.struct_value().fields();
  auto cluster = top.find("cluster");
  if (cluster == top.end() || cluster->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG", "a \"cluster\" object");
  }
  const auto& jobs = cluster->second.struct_value().fields();
  TfConfig tf;
  ASSIGN_OR_RETURN(tf.ps, TfList(jobs, "ps"));
  ASSIGN_OR_RETURN(std::vector<std::string> chief, TfList(jobs, "chief"));
  ASSIGN_OR_RETURN(std::vector<std::string> master, TfList(jobs, "master"));
  ASSIGN_OR_RETURN(std::vector<std::string> workers, TfList(jobs, "worker"));
  if (!chief.empty() && !master.empty()) {
    return Bad("TF_CONFIG cluster", "either \"chief\" or \"master\" (TF1's name for it), not both");
  }
  if (chief.size() + master.size() > 1) {
    return Bad("TF_CONFIG cluster.chief", "one entry (there is one chief)");
  }
  tf.workers = chief.empty() ? master : chief;
  tf.has_chief = !tf.workers.empty();
  tf.workers.insert(tf.workers.end(), workers.begin(), workers.end());

  auto task = top.find("task");
  if (task == top.end() || task->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG", "a \"task\" object with \"type\" and \"index\"");
  }
  const auto& t = task->second.struct_value().fields();
  auto type = t.find("type");
  auto index = t.find("index");
  if (type == t.end() || type->second.kind_case() != Value::kStringValue) {
    return Bad("TF_CONFIG task.type", "a string (chief, master, worker, ps or evaluator)");
  }
  tf.task_type = type->second.string_value();
  if (index != t.end()) {
    const double d = index->second.number_value();
    if (index->second.kind_case() != Value::kNumberValue || d < 0 || d != std::floor(d) ||
        d > 1e6) {
      return Bad("TF_CONFIG task.index", "a non-negative integer");
    }
    tf.task_index = static_cast<int>(d);
  }
  size_t listed = 0;
  if (tf.task_type == "ps") {
    listed = tf.ps.size();
  } else if (tf.task_type == "worker") {
    listed = workers.size();
  } else if (tf.task_type == "chief" || tf.task_type == "master") {
    if (tf.task_type == "chief" ? chief.empty() : master.empty()) {
      return Bad("TF_CONFIG cluster", absl::StrCat("a \"", tf.task_type, "\" list for a ",
                                                   tf.task_type, " task"));
    }
    listed = 1;
  } else if (tf.task_type == "evaluator") {
    return tf;  // not listed in "cluster"
  } else {
    return Bad("TF_CONFIG task.type",
               absl::StrCat("chief, master, worker, ps or evaluator, got '", tf.task_type, "'"));
  }
  if (static_cast<size_t>(tf.task_index) >= listed) {
    return Bad("TF_CONFIG task.index",
               absl::StrCat("an index below the ", listed, " \"", tf.task_type,
                            "\" entries of cluster, got ", tf.task_index));
  }
  return tf;
}

absl::StatusOr<std::optional<PsTask>> PsTaskFromEnvironment(
    const std::map<std::string, std::string>& env) {
  auto it = env.find("TF_CONFIG");
  if (it == env.end()) return std::nullopt;
  ASSIGN_OR_RETURN(TfConfig tf, ParseTfConfig(it->second));
  if (tf.task_type != "ps") {
    return Bad("TF_CONFIG task.type",
               absl::StrCat("ps for `pstrain ps`, got ", tf.task_type, " (index ", tf.task_index,
                            "): run `pstrain worker` in chief and worker tasks (`pstrain host` "
                            "where each host runs one ps and one worker task)"));
  }
  PsTask task;
  task.shard = tf.task_index;
  task.num_shards = static_cast<int>(tf.ps.size());
  const std::string& me = tf.ps[tf.task_index];
  absl::SimpleAtoi(me.substr(me.rfind(':') + 1), &task.port);  // HostPort checked it
  task.num_workers = static_cast<int>(tf.workers.size());
  return task;
}

absl::StatusOr<std::optional<WorkerTask>> WorkerTaskFromEnvironment(
    const std::map<std::string, std::string>& env) {
  auto it = env.find("TF_CONFIG");
  if (it == env.end()) return std::nullopt;
  ASSIGN_OR_RETURN(TfConfig tf, ParseTfConfig(it->second));
  WorkerTask task;
  if (tf.task_type == "evaluator") {
    task.evaluator = true;
    return task;
  }
  if (tf.task_type == "ps") {
    return Bad("TF_CONFIG task.type",
               absl::StrCat("chief, master or worker for `pstrain worker`, got ps (index ",
                            tf.task_index, "): run `pstrain ps` in ps tasks"));
  }
  if (tf.ps.empty()) return Bad("TF_CONFIG", "a \"cluster\".\"ps\" list (the PS shards)");
  task.ps = tf.ps;
  task.index = tf.WorkerIndex();
  task.num_workers = static_cast<int>(tf.workers.size());
  return task;
}

absl::StatusOr<std::map<std::string, std::string>> ReadClusterEnvironment(
    const std::string& resource_config) {
  std::map<std::string, std::string> env;
  for (const std::string& name : ClusterEnvVariables()) {
    if (const char* v = std::getenv(name.c_str())) env[name] = v;
  }
  if (!resource_config.empty()) {
    absl::StatusOr<std::string> rc = ReadFileToString(resource_config);
    if (rc.ok()) {
      env[kSageMakerResourceConfig] = *rc;
    } else if (!absl::IsNotFound(rc.status())) {
      return rc.status();
    }
  }
  return env;
}

const std::vector<std::string>& ClusterEnvVariables() {
  static const auto* names = new std::vector<std::string>{
      "TF_CONFIG", "SM_HOSTS", "SM_CURRENT_HOST", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};
  return *names;
}

absl::StatusOr<ClusterSpec> ResolveClusterSpec(absl::string_view cluster, int index,
                                               const std::map<std::string, std::string>& env,
                                               int default_port) {
  auto get = [&env](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  if (!cluster.empty() && index >= 0) {
    ClusterSpec spec;
    spec.source = "flags";
    ASSIGN_OR_RETURN(spec.hosts, HostList(cluster, "--cluster", default_port));
    if (index >= static_cast<int>(spec.hosts.size())) {
      return Bad("--index", absl::StrCat("an index below the ", spec.hosts.size(),
                                         " hosts of --cluster, got ", index));
    }
    spec.index = index;
    return spec;
  }
  if (const std::string* sm = get("SM_HOSTS")) {
    return FromSageMaker(*sm, get("SM_CURRENT_HOST"), default_port);
  }
  if (const std::string* rc = get(kSageMakerResourceConfig)) {
    return FromResourceConfig(*rc, default_port);
  }
  if (const std::string* tf = get("TF_CONFIG")) return HostFromTfConfig(*tf);
  if (const std::string* rank = get("OMPI_COMM_WORLD_RANK")) {
    if (cluster.empty()) {
      return Bad("OMPI_COMM_WORLD_RANK is set", "--cluster to list the hosts (rank i = host i)");
    }
    ClusterSpec spec;
    spec.source = "OMPI_COMM_WORLD_RANK";
    ASSIGN_OR_RETURN(spec.hosts, HostList(cluster, "--cluster", default_port));
    const std::string* size = get("OMPI_COMM_WORLD_SIZE");
    int r = -1, n = -1;
    if (!absl::SimpleAtoi(*rank, &r) || r < 0) {
      return Bad("OMPI_COMM_WORLD_RANK", absl::StrCat("a non-negative integer, got '", *rank, "'"));
    }
    if (size == nullptr || !absl::SimpleAtoi(*size, &n) ||
        n != static_cast<int>(spec.hosts.size())) {
      return Bad("OMPI_COMM_WORLD_SIZE",
                 absl::StrCat("the number of --cluster hosts (", spec.hosts.size(), "), got '",
                              size ? *size : "<unset>", "'"));
    }
    if (r >= n) return Bad("OMPI_COMM_WORLD_RANK", absl::StrCat("a rank below ", n));
    spec.index = r;
    return spec;
  }
  if (!cluster.empty()) return Bad("--cluster", "--index too (or SM_HOSTS / TF_CONFIG / mpirun)");
  return absl::InvalidArgumentError(
      "no cluster spec: pass --cluster=h1:port,h2:port --index=i, or set SM_HOSTS and "
      "SM_CURRENT_HOST (or provide /opt/ml/input/config/resourceconfig.json), or TF_CONFIG, or "
      "run under mpirun with --cluster");
}

}  // namespace pstrain
