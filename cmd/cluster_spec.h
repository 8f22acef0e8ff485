// Where this host sits in a multi-host PS cluster: the address of every PS shard (one shard and
// one worker per host) and this host's index. Resolved from flags or the launcher's environment
// by the `pstrain host` command; library code never reads the environment itself.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// The PS port on hosts named without one (SageMaker, a bare host name in --cluster).
inline constexpr int kDefaultPsPort = 2223;
// SageMaker's resource config file. Its contents travel in `env` under this key (the launcher
// reads the file; library code reads neither files nor the environment).
inline constexpr char kSageMakerResourceConfig[] = "/opt/ml/input/config/resourceconfig.json";

struct ClusterSpec {
  std::vector<std::string> hosts;  // "host:port" of PS shard i (and worker i), i in [0, N)
  int index = 0;                   // this host, in [0, N); 0 is the chief
  std::string source;              // where the spec came from, for the log: "flags", "TF_CONFIG"...
};

// Resolves the cluster spec, first match wins:
//   1. flags: `cluster` ("h1:port,h2:port,...") and `index` >= 0 both given;
//   2. env TF_CONFIG: JSON {"cluster": {"ps": ["h:p", ...], ...}, "task": {"type": T, "index": i}}
//      The ps list gives the hosts. T "ps" is host i; "chief" is host 0; "worker" is host i, or
//      i + 1 when the cluster lists a chief (one chief/worker and one ps per host, so there must
//      be exactly as many of them as ps entries). "evaluator" is refused.
//   3. env SM_HOSTS (JSON list of names) and SM_CURRENT_HOST: host i = the i-th name, port 2223;
//      else the contents of SageMaker's resourceconfig.json (env[kSageMakerResourceConfig]):
//      {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], ...}, the same way.
//   4. env OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun) with `cluster` giving the hosts:
//      index = rank, size must equal the number of hosts.
// `env` holds the environment variables named above that are set (the launcher reads them).
// A --cluster entry without ":port" gets kDefaultPsPort. INVALID_ARGUMENT naming the flag or the
// variable and what was expected for malformed input, or when nothing gives a cluster.
absl::StatusOr<ClusterSpec> ResolveClusterSpec(absl::string_view cluster, int index,
                                               const std::map<std::string, std::string>& env);

// The environment variables ResolveClusterSpec looks at.
const std::vector<std::string>& ClusterEnvVariables();

}  // namespace pstrain
