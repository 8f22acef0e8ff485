// The security of the PS protocol, for both ends: who may call a shard, and how a channel to one
// is made (docs/PS.md "Operations and security").
//
//   - Cluster secret. Every call of a cluster carries the secret in its metadata
//     (kSecretMetadataKey), added by a client interceptor on every channel MakeChannel makes.
//     A shard checks it twice. First where gRPC reads a call's headers, before the call's
//     message is received (MakeServerCredentials: the server credentials' auth metadata
//     processor, which gRPC's server-auth filter runs on the initial metadata; a refused call
//     is cancelled there, so its message, up to max_message_bytes, is never read, buffered or
//     parsed). Then first thing in every handler (SecretChecker; the test of the shard
//     enumerates the service's methods, so none can forget), which also covers the in-process
//     channel, where no credentials run. A call without the secret, or with another value, is
//     answered UNAUTHENTICATED and changes nothing. The comparison takes the same time whatever
//     the value. Without TLS the secret crosses the network in the clear: it keeps out callers
//     that do not know it, not an eavesdropper on the path (use TLS for that).
//   - TLS (optional): the server's certificate and key, and the CA that signed the peers'
//     certificates; with a CA on the server side, clients must present a certificate it signed
//     (mutual TLS). gRPC's SSL credentials do the work.
//   - Message caps: both ends refuse messages above max_message_bytes (gRPC's
//     RESOURCE_EXHAUSTED), so no peer can make the other allocate more than that per call.
//
// A secret and the PEM files come from the process's launcher (cmd/: a file, an environment
// variable, or `pstrain local`'s random per-job secret), never from the library.
//
// Thread-safety: the values are immutable once made; SecretChecker and the channels may be used
// from any thread.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pstrain/config.pb.h"

namespace grpc {
class CallbackServerContext;
class ServerContextBase;
}  // namespace grpc

namespace pstrain {

// The metadata key that carries the cluster secret (lower case, as gRPC requires).
inline constexpr char kSecretMetadataKey[] = "x-pstrain-cluster-secret";
// The smallest secret accepted: 16 bytes (a random one is 32 bytes of hex, RandomSecret).
inline constexpr size_t kMinSecretBytes = 16;
// The largest message either end accepts when nothing else is said (RpcSecurity's default).
inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{64} << 20;

struct RpcSecurity {
  // The cluster secret; empty = no authentication (only allowed on a loopback bind, cmd/).
  std::string secret;
  // TLS: all three PEM texts, or none. ca_pem verifies the peer; cert_pem / key_pem are this
  // process's own certificate chain and key (a server's, and a client's for mutual TLS).
  std::string ca_pem, cert_pem, key_pem;
  // Messages larger than this are refused by both ends (> 0).
  int64_t max_message_bytes = kDefaultMaxMessageBytes;

  bool tls() const { return !cert_pem.empty(); }
};

// The largest message of a job's PS protocol: cluster.max_message_mb when set, else twice the
// largest legal pull answer or push request (a step's or an evaluation batch's rows, at most 64
// towers of train.batch_size, every field a distinct row, plus the whole dense vector) plus
// 1 MiB, at least kDefaultMaxMessageBytes, at most 2 GiB - 1.
int64_t MaxMessageBytes(const Config& config, int num_fields, int row_dim, int64_t dense_size);

// INVALID_ARGUMENT naming what is wrong: a secret shorter than kMinSecretBytes or with bytes
// that cannot travel in metadata (only printable ASCII, no spaces), TLS files given in part, a
// max_message_bytes <= 0 or above 2 GiB - 1 (gRPC's limit).
absl::Status ValidateRpcSecurity(const RpcSecurity& security);

// 32 random bytes as 64 hex digits, from the OS's random source (`pstrain local`'s per-job
// secret).
absl::StatusOr<std::string> RandomSecret();

// OK, or INVALID_ARGUMENT "<what> has N bytes; expected at least 16" / "<what> must be
// printable ASCII without spaces": what a secret or token sent in gRPC metadata must be.
absl::Status ValidateCredential(absl::string_view value, absl::string_view what);

// Reads a credential from a file: its content with surrounding whitespace removed, checked by
// ValidateCredential. The file must be a regular file (a FIFO or device is refused before a byte
// is read) of at most 4096 bytes that only its owner may read: mode & 077 is refused with a
// message saying to chmod 600. Errors name the file as "<what> file PATH".
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, absl::string_view what);

// The cluster secret (cluster.secret_file): ReadCredentialFile(path, "the cluster secret").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// The server's credentials: SSL (client certificates required and verified) when TLS is
// configured, else insecure; with a secret, the secret is checked on every call's initial
// metadata, before its message is read: a call without it or with another value ends
// UNAUTHENTICATED there (the message says which, never the secret) and adds 1 to `*refused`
// (if not null). gRPC's health service (paths under kExemptPathPrefix) is exempt: Kubernetes'
// probes carry no metadata (docs/PS.md "Who may call a shard").
inline constexpr char kExemptPathPrefix[] = "/grpc.health.v1.Health/";
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const RpcSecurity& security, std::shared_ptr<std::atomic<int64_t>> refused = nullptr);

// Channel arguments both ends share: the message caps.
grpc::ChannelArguments MakeChannelArguments(const RpcSecurity& security);

// A channel to `address` with this security: SSL credentials when TLS is configured, the secret
// added to every call's metadata when there is one, the message caps, and `args` on top.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const RpcSecurity& security,
                                           grpc::ChannelArguments args);

// Checks a call's secret against the server's, in constant time.
class SecretChecker {
 public:
  explicit SecretChecker(std::string secret) : secret_(std::move(secret)) {}
  // OK when no secret is configured or the call carries exactly it; UNAUTHENTICATED otherwise
  // (the message says which, never the secret).
  absl::Status Check(const grpc::ServerContextBase& ctx) const;
  bool enabled() const { return !secret_.empty(); }
  const std::string& secret() const { return secret_; }

 private:
  const std::string secret_;
};

// Adds the secret to every call of a channel (the interceptor MakeChannel installs), for channels
// made elsewhere (a server's in-process channel).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
SecretInterceptors(const std::string& secret);

}  // namespace pstrain
