#include "common/rpc/security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

class SecretInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SecretInterceptor(const std::string* secret) : secret_(secret) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kSecretMetadataKey, *secret_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const secret_;  // the factory's, which the channel keeps alive
};

class SecretInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SecretInterceptorFactory(std::string secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new SecretInterceptor(&secret_);
  }

 private:
  const std::string secret_;
};

// Compares in time that depends on the lengths only.
bool ConstantTimeEquals(const char* a, size_t na, const std::string& b) {
  unsigned char diff = na == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    diff |= static_cast<unsigned char>(i < na ? a[i] : 0) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

// The one verdict on a call's secret (`got` null: the call carried none), for both checks.
absl::Status CheckSecret(const std::string& want, const absl::string_view* got) {
  if (want.empty()) return absl::OkStatus();
  if (got == nullptr) {
    return absl::UnauthenticatedError(
        "this PS shard requires the cluster secret (see docs/PS.md \"Operations and security\"); "
        "the call carried none");
  }
  if (!ConstantTimeEquals(got->data(), got->size(), want)) {
    return absl::UnauthenticatedError("the call carried a wrong cluster secret");
  }
  return absl::OkStatus();
}

absl::string_view SliceView(const grpc_slice& s) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                           GRPC_SLICE_LENGTH(s));
}

// The state of the auth metadata processor: gRPC's server-auth filter calls Process with a call's
// initial metadata (the headers, :path among them) before the call's message is read, and holds
// the call until `done` is called; a status other than OK cancels the call with that status.
struct SecretGate {
  std::string secret;
  std::shared_ptr<std::atomic<int64_t>> refused;  // may be null

  static void Process(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    const auto* gate = static_cast<const SecretGate*>(state);
    absl::string_view path, value;
    bool has_secret = false;
    for (size_t i = 0; i < num_md; ++i) {
      const absl::string_view key = SliceView(md[i].key);
      if (key == ":path") {
        path = SliceView(md[i].value);
      } else if (key == kSecretMetadataKey && !has_secret) {  // the first, as the handlers'
        value = SliceView(md[i].value);
        has_secret = true;
      }
    }
    absl::Status s = absl::StartsWith(path, kExemptPathPrefix)
                         ? absl::OkStatus()
                         : CheckSecret(gate->secret, has_secret ? &value : nullptr);
    if (s.ok()) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    if (gate->refused != nullptr) gate->refused->fetch_add(1, std::memory_order_relaxed);
    const std::string message(s.message());  // gRPC copies it
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
  }
  static void Destroy(void* state) { delete static_cast<SecretGate*>(state); }
};

// Server credentials over a core credentials object, so that the secret's processor can be set
// on insecure credentials too (grpc::InsecureServerCredentials() aborts on
// SetAuthMetadataProcessor in gRPC 1.51, while the core's insecure credentials run the
// server-auth filter like any other).
class GatedServerCredentials final : public grpc::ServerCredentials {
 public:
  // Makes the core credentials (the base class's constructor has initialized gRPC) and sets
  // the secret's processor on them.
  explicit GatedServerCredentials(const RpcSecurity& s,
                                  std::shared_ptr<std::atomic<int64_t>> refused) {
    if (s.tls()) {
      grpc_ssl_pem_key_cert_pair pair = {s.key_pem.c_str(), s.cert_pem.c_str()};
      grpc_ssl_server_certificate_config* config =
          grpc_ssl_server_certificate_config_create(s.ca_pem.c_str(), &pair, 1);
      creds_ = grpc_ssl_server_credentials_create_with_options(
          grpc_ssl_server_credentials_create_options_using_config(
              GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, config));
    } else {
      creds_ = grpc_insecure_server_credentials_create();
    }
    auto* gate = new SecretGate{s.secret, std::move(refused)};
    grpc_server_credentials_set_auth_metadata_processor(
        creds_, grpc_auth_metadata_processor{&SecretGate::Process, &SecretGate::Destroy, gate});
  }
  ~GatedServerCredentials() override { grpc_server_credentials_release(creds_); }
  // The processor is this class's own.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    PSTRAIN_CHECK(false) << "GatedServerCredentials has its own auth metadata processor";
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* creds_ = nullptr;
};

}  // namespace

int64_t MaxMessageBytes(const Config& config, int num_fields, int row_dim, int64_t dense_size) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (config.cluster().max_message_mb() > 0) {
    return std::min(kMax, int64_t{config.cluster().max_message_mb()} << 20);
  }
  const int64_t towers = std::max<int64_t>(64, config.threads().towers());
  const int64_t examples = std::max<int64_t>(config.train().batch_size() * towers,
                                             config.train().eval_batch_size());
  const int64_t rows = examples * std::max(1, num_fields);
  const int64_t largest = rows * (8 + 4 * int64_t{std::max(1, row_dim)}) + 4 * dense_size;
  return std::min(kMax, std::max(kDefaultMaxMessageBytes, 2 * largest + (int64_t{1} << 20)));
}

absl::Status ValidateCredential(absl::string_view value, absl::string_view what) {
  if (value.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", value.size(), " bytes; expected at least ", kMinSecretBytes));
  }
  for (char c : value) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " must be printable ASCII without spaces (e.g. `openssl rand -hex 32`)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRpcSecurity(const RpcSecurity& s) {
  if (!s.secret.empty()) RETURN_IF_ERROR(ValidateCredential(s.secret, "the cluster secret"));
  const int tls_parts = !s.ca_pem.empty() + !s.cert_pem.empty() + !s.key_pem.empty();
  if (tls_parts != 0 && tls_parts != 3) {
    return absl::InvalidArgumentError(
        "cluster.tls: expected all of ca, cert and key (or none of them)");
  }
  if (s.max_message_bytes <= 0 || s.max_message_bytes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the largest message must be in [1, 2^31 - 1] bytes, got ", s.max_message_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomSecret() {
  unsigned char bytes[32];
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening", "/dev/urandom");
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return ErrnoError("reading", "/dev/urandom");
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, absl::string_view what) {
  const std::string file = absl::StrCat(what, " file");  // before stat: ErrnoError reads errno
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError(file, path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("%s file %s may be read by other users (mode %03o); chmod 600 it", what,
                        path, st.st_mode & 0777));
  }
  constexpr int64_t kMaxBytes = 4096;
  if (st.st_size > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " has ", st.st_size,
                                                   " bytes; expected at most ", kMaxBytes));
  }
  // Opened again as a regular file (OpenRegularFile): what replaced it since stat is refused or
  // read to the same bound.
  auto text = ReadFileToString(path, kMaxBytes);
  if (!text.ok()) return text.status();
  std::string value(absl::StripAsciiWhitespace(*text));
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is empty"));
  }
  if (absl::Status s = ValidateCredential(value, what); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return value;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  return ReadCredentialFile(path, "the cluster secret");
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const RpcSecurity& s, std::shared_ptr<std::atomic<int64_t>> refused) {
  if (!s.secret.empty()) return std::make_shared<GatedServerCredentials>(s, std::move(refused));
  if (!s.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = s.ca_pem;
  o.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(o);
}

grpc::ChannelArguments MakeChannelArguments(const RpcSecurity& s) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(s.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(s.max_message_bytes));
  return args;
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
SecretInterceptors(const std::string& secret) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  if (!secret.empty()) out.push_back(std::make_unique<SecretInterceptorFactory>(secret));
  return out;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const RpcSecurity& s,
                                           grpc::ChannelArguments args) {
  args.SetMaxReceiveMessageSize(static_cast<int>(s.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(s.max_message_bytes));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (s.tls()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = s.ca_pem;
    o.pem_private_key = s.key_pem;
    o.pem_cert_chain = s.cert_pem;
    creds = grpc::SslCredentials(o);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args,
                                                                 SecretInterceptors(s.secret));
}

absl::Status SecretChecker::Check(const grpc::ServerContextBase& ctx) const {
  if (secret_.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kSecretMetadataKey);
  if (it == md.end()) return CheckSecret(secret_, nullptr);
  const absl::string_view got(it->second.data(), it->second.size());
  return CheckSecret(secret_, &got);
}

}  // namespace pstrain
