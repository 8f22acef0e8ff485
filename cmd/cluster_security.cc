#include "cmd/cluster_security.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace pstrain {

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address;
  if (absl::StartsWith(host, "[")) {  // [::1]:port
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos
                                                                : host.find(']') - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {  // host:port
    host = host.substr(0, host.find(':'));
  }
  return absl::StartsWith(host, "127.") || host == "localhost" || host == "::1";
}

std::map<std::string, std::string> SecretEnvironment() {
  std::map<std::string, std::string> env;
  if (const char* v = std::getenv(kSecretEnvVariable)) env[kSecretEnvVariable] = v;
  return env;
}

absl::StatusOr<RpcSecurity> ClusterSecurity(const Config& config,
                                            const std::map<std::string, std::string>& env,
                                            const std::string& bind, int64_t max_message_bytes) {
  RpcSecurity s;
  s.max_message_bytes = max_message_bytes;
  const ClusterConfig& c = config.cluster();
  if (!c.secret_file().empty()) {
    auto secret = ReadSecretFile(c.secret_file());
    if (!secret.ok()) {
      return absl::Status(secret.status().code(),
                          absl::StrCat("cluster.secret_file: ", secret.status().message()));
    }
    s.secret = *secret;
  } else if (auto it = env.find(kSecretEnvVariable); it != env.end()) {
    s.secret = it->second;
    RpcSecurity check;
    check.secret = s.secret;
    if (absl::Status v = ValidateRpcSecurity(check); !v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kSecretEnvVariable, ": ", v.message()));
    }
  }
  if (c.has_tls()) {
    for (auto [path, out, what] :
         {std::tuple{c.tls().ca(), &s.ca_pem, "ca"}, std::tuple{c.tls().cert(), &s.cert_pem, "cert"},
          std::tuple{c.tls().key(), &s.key_pem, "key"}}) {
      auto pem = ReadFileToString(path);
      if (!pem.ok()) {
        return absl::Status(pem.status().code(), absl::StrCat("cluster.tls.", what, ": ",
                                                              pem.status().message()));
      }
      if (!absl::StrContains(*pem, "-----BEGIN ")) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster.tls.", what, ": ", path, " is not a PEM file"));
      }
      *out = *pem;
    }
  }
  RpcSecurity check = s;
  if (check.max_message_bytes <= 0) check.max_message_bytes = kDefaultMaxMessageBytes;
  if (absl::Status v = ValidateRpcSecurity(check); !v.ok()) return v;
  if (!bind.empty() && !IsLoopbackAddress(bind) && s.secret.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the shard would listen on ", bind, " without a cluster secret, and anyone who reaches "
        "its port could change the job: give every process of the job the same secret in a file "
        "(cluster.secret_file, chmod 600; e.g. `openssl rand -hex 32 > secret`) or in the "
        "environment variable ", kSecretEnvVariable, ", or listen on loopback only (--bind "
        "127.0.0.1)"));
  }
  return s;
}

}  // namespace pstrain
