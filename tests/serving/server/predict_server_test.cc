// serving/server/predict_server.h in process, against hostile model directories and requests
// (issue 26): a version whose MODEL is a FIFO is refused without waiting on it and skipped for the
// newest version that reads, at the start and on a reload; Shutdown cancels a reload in progress
// instead of waiting for it; a request that does not parse, or names a row format that does not
// exist, is INVALID_ARGUMENT saying so.
#include "serving/server/predict_server.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pstrain/serving.grpc.pb.h"
#include "serving/export.h"
#include "tests/serving/serving_test_util.h"
#include "tests/serving/server/raw_predict.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_serving::FreshDir;
using testing_serving::SmallDescription;
using testing_serving::SmallModel;

// Version v of the export base `base`: a small model whose step is v.
void ExportVersion(const std::string& base, int64_t v) {
  std::unique_ptr<ServingModel> m = SmallModel(SmallDescription(), 100 + v, v);
  ASSERT_NE(m, nullptr);
  ExportOptions o;
  o.version = v;
  absl::StatusOr<ExportInfo> info = WriteExport(*m, base, o);
  ASSERT_TRUE(info.ok()) << info.status();
}

// Version v whose MODEL is a FIFO, renamed into place as an export is. Nothing ever writes to it:
// a reader that opened it for reading would block for ever.
void FifoVersion(const std::string& base, int64_t v) {
  const std::string staging = absl::StrCat(base, "/.tmp-fifo-", v);
  ASSERT_EQ(::mkdir(staging.c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((staging + "/" + kExportFileName).c_str(), 0600), 0);
  ASSERT_EQ(std::rename(staging.c_str(), absl::StrCat(base, "/", v).c_str()), 0);
}

PredictServer::Options ServerOptions(const std::string& base) {
  PredictServer::Options o;
  o.model_path = base;
  o.watch = false;
  o.batching.threads = 1;
  return o;
}

TEST(PredictServerHostile, AFifoVersionIsSkippedForTheNewestVersionThatReads) {
  const std::string base = FreshDir("fifo_versions");
  ExportVersion(base, 1);
  FifoVersion(base, 3);
  // The start: version 3 is refused without a wait, version 1 is served.
  absl::StatusOr<std::unique_ptr<PredictServer>> server =
      PredictServer::Start(ServerOptions(base));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->model()->origin().version, 1);
  // A version newer than the one served but older than the FIFO loads.
  ExportVersion(base, 2);
  absl::StatusOr<bool> changed = (*server)->LoadNewest();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ((*server)->model()->origin().version, 2);
  // Nothing newer reads now: the error names the FIFO, and version 2 stays.
  changed = (*server)->LoadNewest();
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(changed.status().message()),
              HasSubstr(absl::StrCat("open ", base, "/3/MODEL: not a regular file (a FIFO)")));
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr("still serving version 2"));
  EXPECT_EQ((*server)->model()->origin().version, 2);
  (*server)->Shutdown(absl::Seconds(1));
  std::system(("rm -rf " + base).c_str());
}

// A reload that takes long (here: a fake read that ends only when cancelled, or after a minute)
// must not hold up a stop.
TEST(PredictServerHostile, ShutdownCancelsAReloadInProgress) {
  const std::string base = FreshDir("slow_reload");
  ExportVersion(base, 1);
  absl::Notification entered;
  PredictServer::Options o = ServerOptions(base);
  o.watch = true;
  o.read_export = [&](const std::string& dir, const ReadExportOptions& ro)
      -> absl::StatusOr<std::unique_ptr<ServingModel>> {
    if (dir != base + "/2") return ReadExport(dir, ro);
    entered.Notify();
    if (ro.cancel == nullptr || !ro.cancel->WaitForNotificationWithTimeout(absl::Seconds(60))) {
      return absl::DeadlineExceededError("the load was never cancelled");
    }
    return absl::CancelledError("cancelled");
  };
  absl::StatusOr<std::unique_ptr<PredictServer>> server = PredictServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ExportVersion(base, 2);  // the watcher starts the load
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const absl::Time start = absl::Now();
  (*server)->Shutdown(absl::ZeroDuration());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ((*server)->model()->origin().version, 1);
  server->reset();
  std::system(("rm -rf " + base).c_str());
}

// Garbage bytes from a caller with the admin token: Reload answers INVALID_ARGUMENT naming the
// message it expected (it was gRPC's bare UNIMPLEMENTED), and loads nothing.
TEST(PredictServerHostile, AReloadOfGarbageIsInvalidArgumentSayingWhy) {
  const std::string base = FreshDir("bad_reload");
  ExportVersion(base, 1);
  PredictServer::Options o = ServerOptions(base);
  o.admin_token = "t0ken";
  absl::StatusOr<std::unique_ptr<PredictServer>> server = PredictServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  const std::string junk("\xff\xff\xff\xff\x0f garbage");
  const grpc::Status bad = testing_serving::RawCall(channel, "Reload", junk, "Bearer t0ken");
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_THAT(bad.error_message(),
              HasSubstr(absl::StrCat("the request (", junk.size(),
                                     " bytes) is not a pstrain.ReloadRequest")));
  // Without the token the bytes are not even parsed.
  const grpc::Status denied = testing_serving::RawCall(channel, "Reload", junk, "Bearer nope");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  // A well-formed (empty) ReloadRequest with the token still reloads.
  const grpc::Status good = testing_serving::RawCall(channel, "Reload", "", "Bearer t0ken");
  EXPECT_TRUE(good.ok()) << good.error_message();
  EXPECT_EQ((*server)->stats().reloads, 0);  // nothing newer to load
  (*server)->Shutdown(absl::Seconds(1));
  server->reset();
  std::system(("rm -rf " + base).c_str());
}

TEST(PredictServerHostile, BadRequestsAreInvalidArgumentSayingWhy) {
  const std::string base = FreshDir("bad_requests");
  ExportVersion(base, 1);
  absl::StatusOr<std::unique_ptr<PredictServer>> server =
      PredictServer::Start(ServerOptions(base));
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  auto deadline = [](grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  };
  // Bytes that are not a PredictRequest (gRPC's own parse answered UNIMPLEMENTED, no detail).
  const std::string junk("\xff\xff\xff\xff\x0f garbage");
  const grpc::Status raw = testing_serving::RawPredict(channel, junk);
  EXPECT_EQ(raw.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << raw.error_message();
  EXPECT_THAT(raw.error_message(),
              HasSubstr(absl::StrCat("the request (", junk.size(),
                                     " bytes) is not a pstrain.PredictRequest")));
  auto stub = Predictor::NewStub(channel);
  // The same for the other methods (both were gRPC's bare UNIMPLEMENTED, no detail).
  const grpc::Status info = testing_serving::RawCall(channel, "GetModelInfo", junk);
  EXPECT_EQ(info.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << info.error_message();
  EXPECT_THAT(info.error_message(),
              HasSubstr(absl::StrCat("the request (", junk.size(),
                                     " bytes) is not a pstrain.ModelInfoRequest")));
  // Reload parses only a caller's with the admin token (this server has none: it is off).
  const grpc::Status reload = testing_serving::RawCall(channel, "Reload", junk);
  EXPECT_EQ(reload.error_code(), grpc::StatusCode::PERMISSION_DENIED) << reload.error_message();
  // A row format that does not exist (proto3 keeps it as the number 7): not TSV.
  PredictRequest request;
  request.add_rows("1\t2\t3\t4");
  request.set_row_format(static_cast<PredictRequest::RowFormat>(7));
  for (bool with_rows : {true, false}) {
    PredictRequest r = request;
    if (!with_rows) r.clear_rows();
    grpc::ClientContext ctx;
    deadline(&ctx);
    PredictResponse response;
    const grpc::Status s = stub->Predict(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << with_rows;
    EXPECT_THAT(s.error_message(), HasSubstr("row_format 7: expected TSV (0) or CSV (1)"));
  }
  // The same rows as TSV score, from the same server.
  request.set_row_format(PredictRequest::TSV);
  grpc::ClientContext ctx;
  deadline(&ctx);
  PredictResponse response;
  const grpc::Status s = stub->Predict(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.probabilities_size(), 1);
  EXPECT_EQ(response.model_version(), 1);
  EXPECT_EQ((*server)->stats().rejected, 3);
  (*server)->Shutdown(absl::Seconds(1));
  std::system(("rm -rf " + base).c_str());
}

}  // namespace
}  // namespace pstrain
