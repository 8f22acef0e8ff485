#include "cmd/cluster_spec.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace pstrain {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Value;

absl::Status Bad(absl::string_view what, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", expected));
}

// "host:port" with a port in [1, 65535]; a bare host gets kDefaultPsPort.
absl::StatusOr<std::string> HostPort(absl::string_view entry, absl::string_view what) {
  if (entry.empty()) return Bad(what, "a non-empty host[:port] entry");
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos) return absl::StrCat(entry, ":", kDefaultPsPort);
  int port = 0;
  if (colon == 0 || !absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return Bad(what, absl::StrCat("host:port with a port in [1, 65535], got '", entry, "'"));
  }
  return std::string(entry);
}

absl::StatusOr<std::vector<std::string>> HostList(absl::string_view list, absl::string_view what) {
  std::vector<std::string> hosts;
  for (absl::string_view e : absl::StrSplit(list, ',')) {
    ASSIGN_OR_RETURN(std::string h, HostPort(e, what));
    hosts.push_back(std::move(h));
  }
  return hosts;
}

// JSON is parsed by protobuf's (strict) JSON parser into google.protobuf.Value: one parser for the
// whole project's JSON-in-the-environment, no hand-written second one.
absl::StatusOr<Value> ParseJson(const std::string& text, absl::string_view what) {
  Value v;
  auto s = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!s.ok()) return Bad(what, absl::StrCat("valid JSON (", s.message().ToString(), ")"));
  return v;
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

absl::StatusOr<ClusterSpec> FromTfConfig(const std::string& text) {
  ASSIGN_OR_RETURN(Value v, ParseJson(text, "TF_CONFIG"));
  if (v.kind_case() != Value::kStructValue) return Bad("TF_CONFIG", "a JSON object");
  const auto& top = v.struct_value().fields();
  auto cluster = top.find("cluster");
  if (cluster == top.end() || cluster->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG", "a \"cluster\" object");
  }
  const auto& jobs = cluster->second.struct_value().fields();
  auto ps = jobs.find("ps");
  if (ps == jobs.end()) return Bad("TF_CONFIG", "a \"cluster\".\"ps\" list (the PS shards)");
  ClusterSpec spec;
  spec.source = "TF_CONFIG";
  ASSIGN_OR_RETURN(std::vector<std::string> names, StringList(ps->second, "TF_CONFIG cluster.ps"));
  for (const std::string& n : names) {
    ASSIGN_OR_RETURN(std::string h, HostPort(n, "TF_CONFIG cluster.ps"));
    spec.hosts.push_back(std::move(h));
  }
  auto task = top.find("task");
  if (task == top.end() || task->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG", "a \"task\" object with \"type\" and \"index\"");
  }
  const auto& t = task->second.struct_value().fields();
  auto type = t.find("type");
  auto index = t.find("index");
  if (type == t.end() || type->second.kind_case() != Value::kStringValue) {
    return Bad("TF_CONFIG task.type", "a string (ps, chief or worker)");
  }
  int i = 0;
  if (index != t.end()) {
    const double d = index->second.number_value();
    if (index->second.kind_case() != Value::kNumberValue || d < 0 || d != std::floor(d)) {
      return Bad("TF_CONFIG task.index", "a non-negative integer");
    }
    i = static_cast<int>(d);
  }
  const std::string& tt = type->second.string_value();
  const int chiefs = jobs.count("chief") ? jobs.at("chief").list_value().values_size() : 0;
  const int workers = jobs.count("worker") ? jobs.at("worker").list_value().values_size() : 0;
  if (tt != "ps" && chiefs + workers != static_cast<int>(spec.hosts.size())) {
    return Bad("TF_CONFIG cluster",
               absl::StrCat("one chief/worker per ps entry (pstrain host runs both on each host), "
                            "got ", chiefs + workers, " chief/worker and ", spec.hosts.size(),
                            " ps"));
  }
  if (tt == "ps") {
    spec.index = i;
  } else if (tt == "chief") {
    spec.index = 0;
  } else if (tt == "worker") {
    spec.index = i + (chiefs > 0 ? 1 : 0);
  } else {
    return Bad("TF_CONFIG task.type", absl::StrCat("ps, chief or worker, got '", tt, "'"));
  }
  if (spec.index >= static_cast<int>(spec.hosts.size())) {
    return Bad("TF_CONFIG task.index",
               absl::StrCat("a host index below ", spec.hosts.size(), ", got ", spec.index));
  }
  return spec;
}

// Hosts `names` (SageMaker names, no port), this one `current`; `source` names where they came
// from in messages.
absl::StatusOr<ClusterSpec> SageMakerSpec(const std::vector<std::string>& names,
                                          const std::string& current, const std::string& source,
                                          const std::string& current_what) {
  ClusterSpec spec;
  spec.source = source;
  spec.index = -1;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty() || names[i].find(':') != std::string::npos) {
      return Bad(source, absl::StrCat("host names without ':', got '", names[i], "'"));
    }
    if (names[i] == current) spec.index = static_cast<int>(i);
    spec.hosts.push_back(absl::StrCat(names[i], ":", kDefaultPsPort));
  }
  if (spec.index < 0) {
    return Bad(current_what, absl::StrCat("one of ", source, " [", absl::StrJoin(names, ","),
                                          "], got '", current, "'"));
  }
  return spec;
}

absl::StatusOr<ClusterSpec> FromSageMaker(const std::string& hosts, const std::string* current) {
  ASSIGN_OR_RETURN(Value v, ParseJson(hosts, "SM_HOSTS"));
  ASSIGN_OR_RETURN(std::vector<std::string> names, StringList(v, "SM_HOSTS"));
  if (current == nullptr) return Bad("SM_CURRENT_HOST", "to be set when SM_HOSTS is");
  return SageMakerSpec(names, *current, "SM_HOSTS", "SM_CURRENT_HOST");
}

// resourceconfig.json: {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], ...}.
absl::StatusOr<ClusterSpec> FromResourceConfig(const std::string& text) {
  const std::string what = kSageMakerResourceConfig;
  ASSIGN_OR_RETURN(Value v, ParseJson(text, what));
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
                       absl::StrCat(what, " current_host"));
}

}  // namespace

const std::vector<std::string>& ClusterEnvVariables() {
  static const auto* names = new std::vector<std::string>{
      "TF_CONFIG", "SM_HOSTS", "SM_CURRENT_HOST", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};
  return *names;
}

absl::StatusOr<ClusterSpec> ResolveClusterSpec(absl::string_view cluster, int index,
                                               const std::map<std::string, std::string>& env) {
  auto get = [&env](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  if (!cluster.empty() && index >= 0) {
    ClusterSpec spec;
    spec.source = "flags";
    ASSIGN_OR_RETURN(spec.hosts, HostList(cluster, "--cluster"));
    if (index >= static_cast<int>(spec.hosts.size())) {
      return Bad("--index", absl::StrCat("an index below the ", spec.hosts.size(),
                                         " hosts of --cluster, got ", index));
    }
    spec.index = index;
    return spec;
  }
  if (const std::string* tf = get("TF_CONFIG")) return FromTfConfig(*tf);
  if (const std::string* sm = get("SM_HOSTS")) return FromSageMaker(*sm, get("SM_CURRENT_HOST"));
  if (const std::string* rc = get(kSageMakerResourceConfig)) return FromResourceConfig(*rc);
  if (const std::string* rank = get("OMPI_COMM_WORLD_RANK")) {
    if (cluster.empty()) {
      return Bad("OMPI_COMM_WORLD_RANK is set", "--cluster to list the hosts (rank i = host i)");
    }
    ClusterSpec spec;
    spec.source = "OMPI_COMM_WORLD_RANK";
    ASSIGN_OR_RETURN(spec.hosts, HostList(cluster, "--cluster"));
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
  if (!cluster.empty()) return Bad("--cluster", "--index too (or TF_CONFIG / SM_HOSTS / mpirun)");
  return absl::InvalidArgumentError(
      "no cluster spec: pass --cluster=h1:port,h2:port --index=i, or set TF_CONFIG, or "
      "SM_HOSTS and SM_CURRENT_HOST (or provide /opt/ml/input/config/resourceconfig.json), or run "
      "under mpirun with --cluster");
}

}  // namespace pstrain
