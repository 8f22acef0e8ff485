// The security of a PS process, from what its launcher may read (docs/PS.md "Operations and
// security"): the cluster secret from cluster.secret_file or the environment variable
// PSTRAIN_CLUSTER_SECRET (never from a flag's value: command lines are visible to every user of
// the machine), TLS from cluster.tls's PEM files, the message cap from the config.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// The environment variable that may carry the cluster secret.
inline constexpr char kSecretEnvVariable[] = "PSTRAIN_CLUSTER_SECRET";

// Whether `address` (a bind address or a "host:port") names the loopback interface only:
// 127.x.y.z, localhost or ::1.
bool IsLoopbackAddress(const std::string& address);

// The process's RpcSecurity: the secret of cluster.secret_file, else of `env`'s
// PSTRAIN_CLUSTER_SECRET; cluster.tls's files read; max_message_bytes = `max_message_bytes`.
// `bind`: the address a shard of this process listens on ("" = no shard): a shard that listens
// beyond loopback without a secret is refused (FAILED_PRECONDITION saying how to give one).
// Errors name the file or the variable.
absl::StatusOr<RpcSecurity> ClusterSecurity(const Config& config,
                                            const std::map<std::string, std::string>& env,
                                            const std::string& bind, int64_t max_message_bytes);

// The process's environment's PSTRAIN_CLUSTER_SECRET, if set (read by the commands' main code).
std::map<std::string, std::string> SecretEnvironment();

}  // namespace pstrain
