// TLS between a worker and a shard (cluster.tls, common/rpc/security.h): certificates made by
// scripts/make_cluster_certs.sh; a client with the cluster's CA and its own certificate trains
// against the shard; a client without TLS, or with a certificate of another CA, is refused; the
// secret is still checked inside TLS.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "tests/ps/server/raw_calls.h"
#include "tests/shell.h"
#include "worker/ps_client/ps_client.h"

namespace pstrain {
namespace {

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/tls_", getpid()); }

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string out;
    if (testing::RunShell("command -v openssl", 10, &out) != 0) {
      skip_ = "openssl is not installed (scripts/install_deps.sh installs it)";
      return;
    }
    std::system(("rm -rf " + Dir()).c_str());
    const std::string script = std::string(PSTRAIN_SOURCE_DIR) + "/scripts/make_cluster_certs.sh";
    ASSERT_EQ(testing::RunShell("bash " + script + " " + Dir() + "/a 127.0.0.1:1", 120, &out), 0)
        << out;
    ASSERT_EQ(testing::RunShell("bash " + script + " " + Dir() + "/b 127.0.0.1:1", 120, &out), 0)
        << out;
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static RpcSecurity Security(const std::string& cluster) {
    RpcSecurity s;
    s.secret = kSecret;
    s.ca_pem = *ReadFileToString(Dir() + "/" + cluster + "/ca.pem");
    s.cert_pem = *ReadFileToString(Dir() + "/" + cluster + "/127.0.0.1.pem");
    s.key_pem = *ReadFileToString(Dir() + "/" + cluster + "/127.0.0.1.key");
    return s;
  }

  // A shard of a tiny table (SGD, learning rate 1) with cluster `cluster`'s TLS and secret,
  // started on loopback; its address in *address.
  static std::unique_ptr<ShardServer> StartShard(const std::string& cluster,
                                                 std::string* address) {
    ShardServer::Options o;
    o.data.rows = 100;
    o.data.row_dim = 2;
    o.data.dense_size = 4;
    o.data.sparse_optimizer.set_type(SGD);
    o.data.sparse_optimizer.set_learning_rate(1.0f);
    o.data.dense_optimizer = o.data.sparse_optimizer;
    o.security = Security(cluster);
    auto server = ShardServer::Create(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    EXPECT_TRUE((*server)->Start("127.0.0.1:0").ok());
    *address = absl::StrCat("127.0.0.1:", (*server)->port());
    return *std::move(server);
  }

  static std::string skip_;
};
std::string TlsTest::skip_;

PsClient::Options ClientOptions(const std::string& address, const RpcSecurity& security) {
  PsClient::Options o;
  o.shards = {address};
  o.rows = 100;
  o.partitions = 1;
  o.row_dim = 2;
  o.dense_size = 4;
  o.security = security;
  o.rpc_deadline_ms = 2000;
  o.rpc_retries = 1;
  return o;
}

TEST_F(TlsTest, MutualTlsTrainsAndRefusesStrangers) {
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  std::string address;
  auto server = StartShard("a", &address);
  ASSERT_NE(server, nullptr);

  // The cluster's own client: pulls and pushes go through TLS.
  auto client = PsClient::Create(ClientOptions(address, Security("a")));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitForShards(absl::Seconds(20)).ok());
  const int64_t id = 7;
  const float grad[2] = {1.0f, 2.0f};
  ASSERT_TRUE((*client)->Push({&id, 1}, grad, nullptr, 1).ok());
  float row[2];
  ASSERT_TRUE((*client)->Pull({&id, 1}, row, nullptr).ok());
  EXPECT_FLOAT_EQ(row[0], -1.0f);
  EXPECT_FLOAT_EQ(row[1], -2.0f);

  // Without TLS: the handshake fails, nothing reaches the shard.
  RpcSecurity plain;
  plain.secret = kSecret;
  auto insecure = PsClient::Create(ClientOptions(address, plain));
  ASSERT_TRUE(insecure.ok());
  EXPECT_FALSE((*insecure)->WaitForShards(absl::Seconds(3)).ok());
  // A certificate of another cluster's CA: refused by both sides' verification.
  auto stranger = PsClient::Create(ClientOptions(address, Security("b")));
  ASSERT_TRUE(stranger.ok());
  EXPECT_FALSE((*stranger)->WaitForShards(absl::Seconds(3)).ok());
  // TLS without the secret: still UNAUTHENTICATED.
  RpcSecurity no_secret = Security("a");
  no_secret.secret.clear();
  auto anonymous = PsClient::Create(ClientOptions(address, no_secret));
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ((*anonymous)->WaitForShards(absl::Seconds(5)).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(server->Stats().push_requests(), 1);
}

// Inside TLS too, the secret is checked on a call's headers, before its message is read: a
// call without it that never sends its message is refused at once; with it, the call waits for
// its message.
TEST_F(TlsTest, TheSecretIsCheckedBeforeTheMessageIsRead) {
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  std::string address;
  auto server = StartShard("a", &address);
  ASSERT_NE(server, nullptr);
  const std::string push = "/pstrain.ParameterServer/Push";
  const absl::Time t0 = absl::Now();
  const grpc::Status none =
      testing::HeadersOnly(address, Security("a"), push, "", absl::Seconds(8));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(6));
  const grpc::Status waits =
      testing::HeadersOnly(address, Security("a"), push, kSecret, absl::Seconds(1));
  EXPECT_EQ(waits.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << waits.error_message();
  EXPECT_EQ(server->Stats().unauthenticated_calls(), 1);
  EXPECT_EQ(server->Stats().push_requests(), 0);
}

}  // namespace
}  // namespace pstrain
