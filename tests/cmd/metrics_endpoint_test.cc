// The metrics of running processes, scraped over HTTP: `pstrain ps --metrics_port` serves its
// shard's families (valid exposition, the pulls it served counted), and its gRPC health service
// answers SERVING. The worker's families and the periodic flush of metrics.jsonl are checked in
// process (tests/worker/train/progress_test.cc).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/common/metrics/exposition.h"
#include "tests/common/metrics/http_scrape.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

using testing::FreePort;

// grpc.health.v1.Health/Check with an empty HealthCheckRequest (service ""), as Kubernetes'
// gRPC probe sends it; returns the status enum of the response (1 = SERVING), -1 on error.
int HealthCheck(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request, response;
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  if (!cq.Next(&tag, &ok) || !ok || !status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; }: 08 <varint>, or empty for UNKNOWN (0).
  if (bytes.empty()) return 0;
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

TEST(MetricsEndpoint, PsShardServesMetricsAndHealth) {
  const int metrics_port = FreePort();
  testing::Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start({PSTRAIN_BINARY, "ps", "--port", "0", "--bind", "127.0.0.1", "--rows",
                        "1000", "--row_dim", "4", "--dense_size", "8", "--metrics_port",
                        absl::StrCat(metrics_port), "--set", "features.categorical_vocab_size=100"},
                       &error))
      << error;
  const std::string line = ps.ReadLineContaining("listening on", 60000);
  ASSERT_THAT(line, HasSubstr("127.0.0.1:"));
  const std::string address = line.substr(line.rfind(' ') + 1);

  EXPECT_EQ(HealthCheck(address), 1);  // SERVING

  // Two pulls through the real protocol, then the scrape counts them.
  auto stub = ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    PullRequest req;
    req.set_want_dense(true);
    PullResponse resp;
    EXPECT_TRUE(stub->Pull(&ctx, req, &resp).ok());
  }
  std::vector<testing::Sample> samples;
  const std::string body = testing::ScrapeMetrics(metrics_port);
  ASSERT_EQ(testing::CheckExposition(body, &samples), "") << body;
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_ps_pull_requests_total", "shard=\"0\""), 2) << body;
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_ps_rows_owned", "shard=\"0\""), 1000) << body;
  EXPECT_GT(testing::SampleValue(samples, "pstrain_ps_memory_bytes", "shard=\"0\""), 0) << body;
  EXPECT_EQ(testing::SampleValue(samples, "pstrain_ps_request_seconds_count",
                                 "rpc=\"pull\",shard=\"0\""),
            2)
      << body;
  EXPECT_TRUE(ps.Signal(SIGTERM));
  EXPECT_EQ(ps.WaitExit(60000), 0);
}

// The endpoint binds loopback by default: not reachable on another address of this host is not
// testable here, but a bad bind address is an error at startup, not a crash.
TEST(MetricsEndpoint, BadAddressIsAnErrorAtStartup) {
  testing::Subprocess ps;
  std::string error;
  ASSERT_TRUE(ps.Start({"/bin/sh", "-c",
                        absl::StrCat(PSTRAIN_BINARY, " ps --port 0 --rows 10 --row_dim 2 "
                                                     "--dense_size 2 --metrics_port 1 "
                                                     "--metrics_bind 203.0.113.1 2>&1")},
                       &error))
      << error;
  EXPECT_THAT(ps.ReadLineContaining("metrics endpoint", 60000), HasSubstr("cannot listen on"));
  const int status = ps.WaitExit(60000);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
}

}  // namespace
}  // namespace pstrain
