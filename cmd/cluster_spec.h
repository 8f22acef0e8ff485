// Where a process sits in a multi-host PS job: the address of every PS shard and this process's
// role and index. Resolved from flags or the launcher's environment (TF_CONFIG, SageMaker's
// SM_HOSTS / resourceconfig.json, mpirun's OMPI_*) by `pstrain host`, `ps` and `worker`; library
// code never reads the environment itself. docs/PS.md "The cluster spec" states the precedence.
// Pure functions of their arguments (the environment comes in as a map): thread-safe.
#pragma once

#include <google/protobuf/struct.pb.h>

#include <map>
#include <optional>
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
  // TF_CONFIG's task is an evaluator: pstrain's chief evaluates, so such a task has nothing to do
  // (the command says so and exits 0, so that a TFJob with an evaluator replica still succeeds).
  bool evaluator = false;
};

// The deepest nesting of JSON arrays and objects that ParseEnvironmentJson accepts. TF_CONFIG and
// SageMaker's files nest 3 deep; protobuf's JSON parser takes time quadratic in the depth
// (20,000 levels took over 20 s, silently), so deeper input is refused before it is parsed. 32:
// protobuf itself refuses about 50 levels (each is two messages deep in a google.protobuf.Value,
// against its recursion limit of 100) with a message that names no depth.
inline constexpr int kMaxJsonDepth = 32;

// JSON from the launcher's environment (TF_CONFIG, SM_HOSTS, SageMaker's JSON files), parsed by
// protobuf's strict JSON parser into a google.protobuf.Value: one parser for all of it. Nesting
// deeper than kMaxJsonDepth is refused first by a linear scan (that allocates nothing).
// INVALID_ARGUMENT "<what>: expected ..." naming the byte offset of the level too deep, or
// protobuf's reason for malformed JSON.
absl::StatusOr<google::protobuf::Value> ParseEnvironmentJson(const std::string& text,
                                                             absl::string_view what);

// TF_CONFIG (Kubeflow's TFJob, SageMaker's TF containers, tf.distribute), as pstrain reads it:
//   {"cluster": {"chief"|"master": ["h:p"], "worker": [...], "ps": [...]},
//    "task": {"type": "chief"|"master"|"worker"|"ps"|"evaluator", "index": i}, ...}
// `master` is TF1's (Estimator's, SageMaker's) name for the chief; at most one of chief / master,
// with one entry. Other keys ("environment", "rpc_layer") are ignored. An evaluator is not listed
// in "cluster".
struct TfConfig {
  std::vector<std::string> ps;       // cluster.ps, "host:port" (a bare host gets kDefaultPsPort)
  std::vector<std::string> workers;  // the chief (or master) first, then cluster.worker
  bool has_chief = false;
  std::string task_type;
  int task_index = 0;
  // This task's worker index: the chief 0, worker i -> i + has_chief; -1 for ps and evaluator.
  int WorkerIndex() const;
};
// INVALID_ARGUMENT naming the key ("TF_CONFIG cluster.ps", "TF_CONFIG task.index") and what was
// expected, for malformed JSON, wrong types, an index past its list, or an unknown task type.
absl::StatusOr<TfConfig> ParseTfConfig(const std::string& text);

// Resolves the cluster spec of `pstrain host` (one PS shard and one worker per host), first match
// wins:
//   1. flags: `cluster` ("h1:port,h2:port,...") and `index` >= 0 both given;
//   2. SageMaker: env SM_HOSTS (JSON list of names) and SM_CURRENT_HOST, else the contents of
//      resourceconfig.json (env[kSageMakerResourceConfig]: {"current_host": "algo-1", "hosts":
//      [...]}): host i = the i-th name, port `default_port`. SageMaker before TF_CONFIG: inside
//      SageMaker the hosts are authoritative, and a TF container's TF_CONFIG is derived from them
//      (with its parameter-server option on it has "master"/"worker" tasks and a separate TF ps
//      process per host, which is not pstrain's shard);
//   3. env TF_CONFIG, when the PS and worker tasks are co-located (SageMaker's TF layout: ps[i] on
//      the host of worker i, the chief first, as many workers as ps): host i = worker i.
//      A TF_CONFIG with separate PS and worker pods (Kubeflow's TFJob) or a "ps" task is refused
//      with the commands to run instead (`pstrain ps` / `pstrain worker`); an "evaluator" task
//      gives a spec with evaluator = true;
//   4. env OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun) with `cluster` giving the hosts:
//      index = rank, size must equal the number of hosts.
// `env` holds the environment variables named above that are set (the launcher reads them).
// A --cluster entry without ":port" gets `default_port`. INVALID_ARGUMENT naming the flag or the
// variable and what was expected for malformed input, or when nothing gives a cluster.
absl::StatusOr<ClusterSpec> ResolveClusterSpec(absl::string_view cluster, int index,
                                               const std::map<std::string, std::string>& env,
                                               int default_port = kDefaultPsPort);

// `pstrain ps` from TF_CONFIG (a Kubeflow PS pod): shard = task.index of len(cluster.ps), listening
// on the port of cluster.ps[index], serving len(workers) workers. nullopt when TF_CONFIG is not
// set; an error when its task is not "ps" (naming the command to run instead).
struct PsTask {
  int shard = 0;
  int num_shards = 1;
  int port = 0;
  int num_workers = 0;
};
absl::StatusOr<std::optional<PsTask>> PsTaskFromEnvironment(
    const std::map<std::string, std::string>& env);

// `pstrain worker` from TF_CONFIG (a Kubeflow chief or worker pod): the ps list, this worker's
// index (the chief is 0) and the worker count. nullopt when TF_CONFIG is not set; evaluator = true
// for an evaluator task; an error for a "ps" task.
struct WorkerTask {
  std::vector<std::string> ps;
  int index = 0;
  int num_workers = 1;
  bool evaluator = false;
};
absl::StatusOr<std::optional<WorkerTask>> WorkerTaskFromEnvironment(
    const std::map<std::string, std::string>& env);

// The environment variables the functions above look at.
const std::vector<std::string>& ClusterEnvVariables();

// Those of them that are set, plus the contents of `resource_config` (SageMaker's
// resourceconfig.json) under kSageMakerResourceConfig when that file exists. An error only when
// the file exists and cannot be read.
absl::StatusOr<std::map<std::string, std::string>> ReadClusterEnvironment(
    const std::string& resource_config);

}  // namespace pstrain
