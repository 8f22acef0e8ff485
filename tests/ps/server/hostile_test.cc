// Every request field is hostile (docs/PS.md "Operations and security"): the shard refuses calls
// without the cluster secret (every method of the service, nothing changed), paths outside its
// job directory, steps far ahead (and nothing spins), NaN / Inf gradients, messages and answers
// above the cap, coordination calls with rounds or worker ids out of range; per-client state is
// bounded; shard 0's leases find a silent worker and end the waits on it at once.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "common/rpc/security.h"
#include "common/rpc/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "tests/ps/server/raw_calls.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_rpc.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";
constexpr int kDim = 3;
constexpr int64_t kRows = 1000;
constexpr int64_t kDense = 8;

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/hostile_", getpid(), "_", name);
  std::system(("rm -rf " + dir).c_str());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

struct Options {
  Consistency mode = ASYNC;
  int num_workers = 2;
  std::string secret = kSecret;
  std::string checkpoint_dir;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  absl::Duration lease = absl::Seconds(30);
  int64_t answer_budget_bytes = 0;
};

// One shard on loopback.
struct OneShard {
  explicit OneShard(const Options& opt = Options()) {
    ShardServer::Options o;
    o.data.rows = kRows;
    o.data.partitions = 1;
    o.data.row_dim = kDim;
    o.data.dense_size = kDense;
    o.data.sparse_optimizer.set_type(SGD);
    o.data.sparse_optimizer.set_learning_rate(1.0f);
    o.data.dense_optimizer.set_type(SGD);
    o.data.dense_optimizer.set_learning_rate(1.0f);
    o.consistency = opt.mode;
    o.num_workers = opt.num_workers;
    o.security.secret = opt.secret;
    o.security.max_message_bytes = opt.max_message_bytes;
    o.data.checkpoint_dir = opt.checkpoint_dir;
    o.lease = opt.lease;
    o.answer_budget_bytes = opt.answer_budget_bytes;
    security = o.security;
    auto s = ShardServer::Create(std::move(o));
    EXPECT_TRUE(s.ok()) << s.status();
    server = std::move(s).value();
    EXPECT_TRUE(server->Start("127.0.0.1:0").ok());
    address = absl::StrCat("127.0.0.1:", server->port());
  }
  // A stub whose calls carry `secret` ("" = none).
  std::unique_ptr<ParameterServer::Stub> Stub(const std::string& secret) const {
    RpcSecurity s = security;
    s.secret = secret;
    return ParameterServer::NewStub(MakeChannel(address, s, grpc::ChannelArguments()));
  }
  std::unique_ptr<ParameterServer::Stub> Authorized() const { return Stub(security.secret); }

  RpcSecurity security;
  std::unique_ptr<ShardServer> server;
  std::string address;
};

// A PS client of `shard`'s table that carries the cluster secret.
PsClient::Options ClientOf(const OneShard& shard) {
  PsClient::Options o;
  o.shards = {shard.address};
  o.rows = kRows;
  o.partitions = 1;
  o.row_dim = kDim;
  o.dense_size = kDense;
  o.security.secret = kSecret;
  return o;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d = absl::Seconds(10)) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

PushRequest MakePush(int worker, int64_t step, std::vector<int64_t> ids, std::vector<float> grads,
                     std::vector<float> dense = {}) {
  PushRequest p;
  p.set_worker_id(worker);
  p.set_step(step);
  PackArray(ids.data(), ids.size(), p.mutable_ids());
  PackArray(grads.data(), grads.size(), p.mutable_row_grads());
  if (!dense.empty()) PackArray(dense.data(), dense.size(), p.mutable_dense_grad());
  return p;
}

std::vector<float> PullRow(ShardServer* s, int64_t id) {
  PullRequest req;
  PackArray(&id, 1, req.mutable_ids());
  PullResponse resp;
  EXPECT_TRUE(s->Pull(req, &resp).ok());
  std::vector<float> out(kDim);
  std::memcpy(out.data(), resp.rows().data(), sizeof(float) * kDim);
  return out;
}

// Every method of the service, called without the secret or with a wrong one, is answered
// UNAUTHENTICATED and changes nothing; with the secret, the same calls go through.
TEST(Hostile, EveryMethodRefusesCallsWithoutTheSecret) {
  OneShard shard;
  const InfoResponse before = shard.server->Info();
  const google::protobuf::ServiceDescriptor* service =
      PullRequest::descriptor()->file()->FindServiceByName("ParameterServer");
  ASSERT_NE(service, nullptr);
  ASSERT_GE(service->method_count(), 7);
  // A push that would change a row if it were accepted, and a FINISH_JOB / COMPLETE.
  const std::string push = MakePush(0, 1, {5}, {1, 1, 1}).SerializeAsString();
  CoordinateRequest finish;
  finish.set_kind(CoordinateRequest::FINISH_JOB);
  for (const std::string& secret : {std::string(), std::string("wrong-secret-0123456789")}) {
    RpcSecurity s;
    s.secret = secret;
    grpc::GenericStub stub(MakeChannel(shard.address, s, grpc::ChannelArguments()));
    for (int m = 0; m < service->method_count(); ++m) {
      const auto* method = service->method(m);
      std::string payload;
      if (method->name() == "Push") payload = push;
      if (method->name() == "Coordinate") payload = finish.SerializeAsString();
      grpc::Slice slice(payload);
      grpc::ByteBuffer request(&slice, 1), response;
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      absl::Notification done;
      grpc::Status status;
      stub.UnaryCall(&ctx, absl::StrCat("/pstrain.ParameterServer/", method->name()),
                     grpc::StubOptions(), &request, &response, [&](grpc::Status st) {
                       status = st;
                       done.Notify();
                     });
      ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method->name() << " with secret '" << secret << "': " << status.error_message();
      EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr(kSecret)));
    }
  }
  const InfoResponse after = shard.server->Info();
  EXPECT_EQ(after.job_version(), before.job_version());
  EXPECT_FALSE(after.job_finished());
  EXPECT_EQ(PullRow(shard.server.get(), 5), PullRow(shard.server.get(), 5));
  const ShardStats stats = shard.server->Stats();
  EXPECT_EQ(stats.push_requests(), 0);
  EXPECT_EQ(stats.unauthenticated_calls(), 2 * service->method_count());
  // With the secret: answered.
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  InfoResponse info;
  ASSERT_TRUE(shard.Authorized()->Info(&ctx, InfoRequest(), &info).ok());
  EXPECT_EQ(info.num_workers(), 2);
  // The in-process channel (a host's own worker) carries the secret too.
  auto local = ParameterServer::NewStub(shard.server->InProcessChannel());
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  ASSERT_TRUE(local->Info(&ctx2, InfoRequest(), &info).ok());
}

TEST(Hostile, ClientsCarryTheSecretAndWrongOnesFailAtOnce) {
  OneShard shard;
  PsClient::Options o = ClientOf(shard);
  auto good = PsClient::Create(o);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->WaitForShards(absl::Seconds(10)).ok());
  o.security.secret = "another-secret-0123456789";
  auto bad = PsClient::Create(o);
  ASSERT_TRUE(bad.ok());
  const absl::Time t0 = absl::Now();
  const absl::Status s = (*bad)->WaitForShards(absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));  // not retried
  ShardRpc rpc(shard.address, o.security);
  EXPECT_EQ(rpc.Info(absl::Seconds(10)).status().code(), absl::StatusCode::kUnauthenticated);
}

// SaveShard WRITE writes only <checkpoint_dir>/ckpt-<step>/, never where the client says, and
// never into a committed checkpoint.
TEST(Hostile, CheckpointWritesStayInTheJobDirectory) {
  const std::string dir = TestDir("paths");
  const std::string elsewhere = TestDir("elsewhere");
  Options opt;
  opt.checkpoint_dir = dir;
  OneShard shard(opt);
  auto stub = shard.Authorized();
  auto save = [&](SaveShardRequest::Phase phase, int64_t round, const std::string& name) {
    SaveShardRequest req;
    req.set_phase(phase);
    req.set_round(round);
    req.set_name(name);
    SaveShardResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub->SaveShard(&ctx, req, &resp);
  };
  // A committed checkpoint at step 7.
  ASSERT_TRUE(PrepareCheckpointDir(dir, 7).ok());
  ASSERT_TRUE(save(SaveShardRequest::COPY, 1, "").ok());
  grpc::Status w = save(SaveShardRequest::WRITE, 1, "ckpt-7");
  ASSERT_TRUE(w.ok()) << w.error_message();
  CheckpointManifest manifest;
  manifest.set_step(7);
  manifest.set_num_shards(1);
  manifest.set_table_rows(kRows);
  manifest.set_partitions(1);
  manifest.set_row_dim(kDim);
  manifest.set_dense_size(kDense);
  auto* f = manifest.add_file();
  f->set_name("shard-0-of-1");
  auto size = ReadFileToString(dir + "/ckpt-7/shard-0-of-1");
  ASSERT_TRUE(size.ok());
  f->set_bytes(size->size());
  ASSERT_TRUE(CommitCheckpoint(dir, manifest, {{0, WorkerState()}}, 3).ok());
  const std::string committed = *size;

  for (const std::string& name :
       {elsewhere, std::string("../") + "ckpt-7", std::string("ckpt-7/../../x"), std::string(""),
        std::string("ckpt-07"), std::string("ckpt--1"), std::string("/etc"),
        std::string("ckpt-7\0x", 8)}) {
    ASSERT_TRUE(save(SaveShardRequest::COPY, 2, "").ok());
    const grpc::Status s = save(SaveShardRequest::WRITE, 2, name);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name << ": "
                                                                  << s.error_message();
  }
  // The committed checkpoint is never rewritten, nor is a complete one.
  ASSERT_TRUE(save(SaveShardRequest::COPY, 3, "").ok());
  grpc::Status s = save(SaveShardRequest::WRITE, 3, "ckpt-7");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  // A name whose directory the chief did not make.
  ASSERT_TRUE(save(SaveShardRequest::COPY, 4, "").ok());
  s = save(SaveShardRequest::WRITE, 4, "ckpt-9");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_FALSE(PathExists(dir + "/ckpt-9"));
  // A WRITE without its COPY.
  s = save(SaveShardRequest::WRITE, 5, "ckpt-8");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  EXPECT_EQ(*ReadFileToString(dir + "/ckpt-7/shard-0-of-1"), committed);
  EXPECT_FALSE(PathExists(elsewhere + "/shard-0-of-1"));
  auto choice = ChooseCheckpoint(dir);
  ASSERT_TRUE(choice.ok() && choice->has_value());
  EXPECT_EQ((*choice)->dir, dir + "/ckpt-7");

  // A shard without a job directory writes nothing.
  OneShard nodir;
  auto stub2 = nodir.Authorized();
  SaveShardRequest copy;
  copy.set_phase(SaveShardRequest::COPY);
  copy.set_round(1);
  SaveShardResponse resp;
  grpc::ClientContext c1;
  SetDeadline(&c1);
  ASSERT_TRUE(stub2->SaveShard(&c1, copy, &resp).ok());
  SaveShardRequest write = copy;
  write.set_phase(SaveShardRequest::WRITE);
  write.set_name("ckpt-1");
  grpc::ClientContext c2;
  SetDeadline(&c2);
  EXPECT_EQ(stub2->SaveShard(&c2, write, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// SYNC: a push of step 10^15 is refused, nothing spins, and the worker's real pushes go on
// (not answered `duplicate`).
TEST(Hostile, SyncStepFarAheadIsRefusedAndNothingSpins) {
  Options opt;
  opt.mode = SYNC;
  opt.num_workers = 1;
  OneShard shard(opt);
  auto stub = shard.Authorized();
  PushRequest far = MakePush(0, 1'000'000'000'000'000, {5}, {1, 1, 1});
  far.set_incarnation(1);
  far.set_sequence(1);
  PushResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status s = stub->Push(&ctx, far, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("steps past its last push"));
  // A pull of a step far ahead is refused too, not held.
  PullRequest pull;
  pull.set_worker_id(0);
  pull.set_step(1'000'000'000'000);
  PullResponse presp;
  grpc::ClientContext pctx;
  SetDeadline(&pctx);
  EXPECT_EQ(stub->Pull(&pctx, pull, &presp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const double cpu0 = CpuSeconds();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_LT(CpuSeconds() - cpu0, 0.25) << "a thread spins";
  EXPECT_EQ(shard.server->Info().step(), 0);

  PushRequest real = MakePush(0, 1, {5}, {1, 1, 1});
  real.set_incarnation(1);
  real.set_sequence(2);
  grpc::ClientContext rctx;
  SetDeadline(&rctx);
  ASSERT_TRUE(stub->Push(&rctx, real, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(shard.server->Info().step(), 1);  // applied (one worker)
}

// A SYNC step whose pushes are kept far ahead of the applied one (a restored state) is reached
// in one jump, not by counting up to it.
TEST(Hostile, SyncAppliesAFarStepWithoutCounting) {
  Options opt;
  opt.mode = SYNC;
  opt.num_workers = 1;
  OneShard shard(opt);
  ConsistencyState state;
  state.set_applied(0);
  const int64_t far = int64_t{1} << 50;
  state.add_pushed(far);
  state.add_done(false);
  auto* p = state.add_pending();
  p->set_step(far);
  p->set_worker(0);
  const int64_t id = 5;
  const float g[kDim] = {1, 1, 1};
  PackArray(&id, 1, p->mutable_ids());
  PackArray(g, kDim, p->mutable_row_grads());
  ASSERT_TRUE(shard.server->consistency().Restore(state).ok());
  const double cpu0 = CpuSeconds();
  shard.server->consistency().AdvanceSync();
  EXPECT_LT(CpuSeconds() - cpu0, 0.5);
  EXPECT_EQ(shard.server->consistency().applied_step(), far);
}

// A restored SYNC state's kept pushes get a push's checks: a foreign id, a bad gradient size, a
// NaN, a worker or a step out of range are refused at Restore, and the shard applies nothing
// (found by the shard_requests fuzzer: a kept push with a foreign id aborted the shard when its
// step was applied; fuzz/corpus/shard_requests/regression-sync-state-foreign-id).
TEST(Hostile, ARestoredStateWithABadKeptPushIsRefused) {
  Options opt;
  opt.mode = SYNC;
  opt.num_workers = 1;
  OneShard shard(opt);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* what;
    int64_t id;
    std::vector<float> grads;
    int worker;
    int64_t step;
  };
  for (const Case& c : std::vector<Case>{{"foreign id", int64_t{1} << 40, {1, 1, 1}, 0, 4},
                                         {"negative id", -1, {1, 1, 1}, 0, 4},
                                         {"short gradient", 5, {1, 1}, 0, 4},
                                         {"NaN gradient", 5, {1, nan, 1}, 0, 4},
                                         {"worker out of range", 5, {1, 1, 1}, 7, 4},
                                         {"step already applied", 5, {1, 1, 1}, 0, 2}}) {
    SCOPED_TRACE(c.what);
    ConsistencyState state;
    state.set_applied(2);
    state.add_pushed(4);
    state.add_done(false);
    auto* p = state.add_pending();
    p->set_step(c.step);
    p->set_worker(c.worker);
    PackArray(&c.id, 1, p->mutable_ids());
    PackArray(c.grads.data(), c.grads.size(), p->mutable_row_grads());
    EXPECT_EQ(shard.server->consistency().Restore(state).code(),
              absl::StatusCode::kInvalidArgument);
    shard.server->consistency().AdvanceSync();  // nothing kept: nothing applied, no abort
    EXPECT_EQ(shard.server->consistency().applied_step(), 0);
  }
}

// NaN or infinite gradients: INVALID_ARGUMENT, nothing applied, counted; over gRPC, in-process
// and through the client.
TEST(Hostile, NonFiniteGradientsAreRefused) {
  OneShard shard;
  const std::vector<float> row_before = PullRow(shard.server.get(), 5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  PushResponse resp;
  // A good row with a NaN row after it: nothing of the push is applied.
  EXPECT_EQ(shard.server->Push(MakePush(0, 1, {5, 6}, {1, 1, 1, 0, nan, 0}), &resp).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard.server->Push(MakePush(0, 1, {5}, {1, 1, 1}, {0, 0, 0, -inf, 0, 0, 0, 0}), &resp)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The direct path of a host's own worker.
  const int64_t id = 5;
  const float bad[kDim] = {inf, 0, 0};
  EXPECT_EQ(shard.server->PushDirect(0, 1, {&id, 1}, bad, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PullRow(shard.server.get(), 5), row_before);
  EXPECT_EQ(shard.server->Stats().nonfinite_pushes(), 3);
  // Through the client, as a diverging worker would push.
  PsClient::Options o = ClientOf(shard);
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitForShards(absl::Seconds(10)).ok());
  const float nan_row[kDim] = {nan, nan, nan};
  const absl::Status s = (*client)->PushAsync({&id, 1}, nan_row, nullptr, 1)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("NaN, infinite or huge"));
  EXPECT_EQ(PullRow(shard.server.get(), 5), row_before);
}

// Issue 26 item 3: a finite but huge gradient (3.4e38) passed the NaN guard, overflowed the
// optimizer's slots and froze the row and the dense vector. Above cluster.max_gradient_abs (1e6
// by default) a push is refused like a NaN one: nothing applied, counted; a large but legal one
// (1e5) still trains.
TEST(Hostile, HugeFiniteGradientsAreRefused) {
  OneShard shard;
  const std::vector<float> row_before = PullRow(shard.server.get(), 5);
  PushResponse resp;
  const float huge = 3.4e38f;
  absl::Status s = shard.server->Push(MakePush(0, 1, {5}, {huge, 0, 0}), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("|g| > cluster.max_gradient_abs"));
  EXPECT_EQ(shard.server->Push(MakePush(0, 1, {5}, {0, 0, 0}, {0, 0, 0, 0, -2e6f, 0, 0, 0}), &resp)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PullRow(shard.server.get(), 5), row_before);
  EXPECT_EQ(shard.server->Stats().nonfinite_pushes(), 2);
  // Within the cap: applied, and the row moves to a finite value.
  EXPECT_TRUE(shard.server->Push(MakePush(0, 1, {5}, {1e5f, 0, 0}), &resp).ok());
  const std::vector<float> row_after = PullRow(shard.server.get(), 5);
  EXPECT_NE(row_after, row_before);
  for (float x : row_after) EXPECT_TRUE(std::isfinite(x));
}

// Messages above the cap are refused by gRPC; a pull whose answer would exceed it (repeated ids)
// is refused before anything is gathered.
TEST(Hostile, OversizeMessagesAndAnswersAreRefused) {
  Options opt;
  opt.max_message_bytes = 1 << 20;
  OneShard shard(opt);
  RpcSecurity big = shard.security;
  big.max_message_bytes = 64 << 20;  // a client that would send more
  auto stub = ParameterServer::NewStub(MakeChannel(shard.address, big, grpc::ChannelArguments()));
  std::vector<int64_t> ids(200'000, 5);  // 1.6 MB of ids
  PullRequest pull;
  PackArray(ids.data(), ids.size(), pull.mutable_ids());
  PullResponse presp;
  grpc::ClientContext c1;
  SetDeadline(&c1);
  EXPECT_EQ(stub->Pull(&c1, pull, &presp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // 100k repeated ids fit the request (800 kB) but the answer would be 1.2 MB.
  ids.resize(100'000);
  pull.clear_ids();
  PackArray(ids.data(), ids.size(), pull.mutable_ids());
  grpc::ClientContext c2;
  SetDeadline(&c2);
  const grpc::Status s = stub->Pull(&c2, pull, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("above the largest message"));
  EXPECT_EQ(shard.server->Stats().pull_rows(), 0);
  // A legal pull still works.
  ids.resize(100);
  pull.clear_ids();
  PackArray(ids.data(), ids.size(), pull.mutable_ids());
  grpc::ClientContext c3;
  SetDeadline(&c3);
  EXPECT_TRUE(stub->Pull(&c3, pull, &presp).ok());
}

// Coordination calls with values out of range change nothing.
TEST(Hostile, CoordinationValuesOutOfRangeAreRefused) {
  OneShard shard;
  auto stub = shard.Authorized();
  auto call = [&](CoordinateRequest req) {
    CoordinateResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const absl::Time t0 = absl::Now();
    const grpc::Status s = stub->Coordinate(&ctx, req, &resp);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
    return s.error_code();
  };
  CoordinateRequest collect;
  collect.set_kind(CoordinateRequest::COLLECT);
  collect.set_round(1);
  collect.set_num_workers(20'000'000);
  EXPECT_EQ(call(collect), grpc::StatusCode::INVALID_ARGUMENT);
  CoordinateRequest complete;
  complete.set_kind(CoordinateRequest::COMPLETE);
  complete.set_round(int64_t{1} << 62);
  EXPECT_EQ(call(complete), grpc::StatusCode::FAILED_PRECONDITION);
  CoordinateRequest release = complete;
  release.set_kind(CoordinateRequest::RELEASE);
  EXPECT_EQ(call(release), grpc::StatusCode::FAILED_PRECONDITION);
  CoordinateRequest arrive;
  arrive.set_kind(CoordinateRequest::ARRIVE);
  arrive.set_worker_id(7);
  arrive.set_round(1);
  EXPECT_EQ(call(arrive), grpc::StatusCode::INVALID_ARGUMENT);
  CoordinateRequest far;
  far.set_kind(CoordinateRequest::REQUEST);
  far.set_target_step(int64_t{1} << 50);
  EXPECT_EQ(call(far), grpc::StatusCode::INVALID_ARGUMENT);
  CoordinateRequest finish;
  finish.set_kind(CoordinateRequest::FINISH_JOB);
  finish.set_worker_id(1);
  EXPECT_EQ(call(finish), grpc::StatusCode::PERMISSION_DENIED);
  ReportRequest report;
  report.set_worker_id(-3);
  report.set_phase(TRAINING_DONE);
  ReportResponse rresp;
  grpc::ClientContext rctx;
  SetDeadline(&rctx);
  EXPECT_EQ(stub->Report(&rctx, report, &rresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const InfoResponse info = shard.server->Info();
  EXPECT_EQ(info.checkpoint_round(), 0);
  EXPECT_EQ(info.checkpoint_done_round(), 0);
  EXPECT_FALSE(info.job_finished());
  // The job's rounds still work after all that.
  EXPECT_EQ(shard.server->coordinator().RequestCheckpoint(false), 1);
  ASSERT_TRUE(shard.server->coordinator().ArriveCheckpoint(1, 0, "s").ok());
  ASSERT_TRUE(shard.server->coordinator().CompleteCheckpoint(1, "ckpt-1", "").ok());
  EXPECT_EQ(shard.server->Info().checkpoint_done_round(), 1);
}

// The secret is checked on a call's headers, before its message is read: a call without it (or
// with a wrong one) that never sends its message is refused at once, while the same call with
// the secret waits for its message until its deadline, so the refusal came from the headers
// alone. Counted, nothing changed; gRPC health stays exempt.
TEST(Hostile, TheSecretIsCheckedBeforeTheMessageIsRead) {
  OneShard shard;
  const std::string push = "/pstrain.ParameterServer/Push";
  const absl::Time t0 = absl::Now();
  const grpc::Status none = testing::HeadersOnly(shard.address, shard.security, push, "",
                                                 absl::Seconds(8));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("carried none"));
  const grpc::Status wrong = testing::HeadersOnly(shard.address, shard.security, push,
                                                  "wrong-secret-0123456789", absl::Seconds(8));
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong.error_message();
  EXPECT_THAT(wrong.error_message(), HasSubstr("wrong cluster secret"));
  EXPECT_THAT(wrong.error_message(), ::testing::Not(HasSubstr(kSecret)));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(6));  // not at the deadlines
  const grpc::Status waits =
      testing::HeadersOnly(shard.address, shard.security, push, kSecret, absl::Seconds(1));
  EXPECT_EQ(waits.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << waits.error_message();
  const ShardStats stats = shard.server->Stats();
  EXPECT_EQ(stats.unauthenticated_calls(), 2);
  EXPECT_EQ(stats.push_requests(), 0);
  // Whole calls: refused without the secret, answered with it.
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  PushResponse resp;
  EXPECT_EQ(shard.Stub("")->Push(&ctx, MakePush(0, 1, {5}, {1, 1, 1}), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  EXPECT_TRUE(shard.Authorized()->Push(&ctx2, MakePush(0, 1, {5}, {0, 0, 0}), &resp).ok());
  EXPECT_EQ(shard.server->Stats().unauthenticated_calls(), 3);
}

// ASYNC checks worker ids, repeated rows and far steps too (issue 26 item 10: it took pushes from
// worker ids -1 and 2^31 - 1, a push naming a row twice, and a pull at step 2^63 - 1).
TEST(Hostile, AsyncWorkerIdsRepeatedRowsAndFarPullStepsAreRefused) {
  OneShard shard;  // ASYNC, workers [0, 2)
  PushResponse resp;
  const std::vector<float> row5 = PullRow(shard.server.get(), 5);
  const int64_t id5 = 5;
  const float grad[kDim] = {1, 1, 1};
  for (int32_t w : {-1, 2, std::numeric_limits<int32_t>::max()}) {
    const absl::Status s = shard.server->Push(MakePush(w, 1, {5}, {1, 1, 1}), &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "worker " << w << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("worker_id"));
    EXPECT_THAT(s.message(), HasSubstr("job has workers [0, 2)"));
    EXPECT_EQ(shard.server->PushDirect(w, 1, {&id5, 1}, grad, nullptr).code(),
              absl::StatusCode::kInvalidArgument)
        << "worker " << w;
  }
  EXPECT_EQ(PullRow(shard.server.get(), 5), row5);

  // A row twice in one push, in order or not, in-process or over gRPC: nothing applied.
  const absl::Status twice =
      shard.server->Push(MakePush(0, 1, {7, 5, 9, 5}, std::vector<float>(4 * kDim, 1.f)), &resp);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  EXPECT_THAT(twice.message(), HasSubstr("row 5 more than once"));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status wire = shard.Authorized()->Push(
      &ctx, MakePush(1, 1, {5, 5}, std::vector<float>(2 * kDim, 1.f)), &resp);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << wire.error_message();
  EXPECT_EQ(PullRow(shard.server.get(), 5), row5);
  // Distinct rows in any order still go, from every worker of the job.
  const std::vector<float> row9 = PullRow(shard.server.get(), 9);
  ASSERT_TRUE(shard.server->Push(MakePush(1, 1, {9, 3, 7}, std::vector<float>(3 * kDim, .5f)),
                                 &resp)
                  .ok());
  EXPECT_NE(PullRow(shard.server.get(), 9), row9);

  // Training pulls: the step at most 2^32 past the largest step pushed (1), the worker in range.
  PullRequest pull;
  PackArray(&id5, 1, pull.mutable_ids());
  pull.set_worker_id(0);
  pull.set_step(std::numeric_limits<int64_t>::max());
  const absl::Status far = shard.server->CheckPull(pull);
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument) << far;
  EXPECT_THAT(far.message(), HasSubstr("PullRequest.step"));
  EXPECT_THAT(far.message(), HasSubstr("expected a step in [0, 4294967297]"));
  PullResponse answer;
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  EXPECT_EQ(shard.Authorized()->Pull(&ctx2, pull, &answer).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  pull.set_step(int64_t{1} << 32);
  EXPECT_TRUE(shard.server->CheckPull(pull).ok());
  pull.set_worker_id(-1);
  EXPECT_EQ(shard.server->CheckPull(pull).code(), absl::StatusCode::kInvalidArgument);
  pull.set_step(0);  // not a training pull (an evaluation's): no worker's step
  EXPECT_TRUE(shard.server->CheckPull(pull).ok());
}

// One budget for the answers of all pulls in flight (issue 26 item 7: eight concurrent 1.4M-id
// pulls, 95 MB answers each, took a shard to 1.55 GB). With a budget of one largest message,
// concurrent pulls of more than half of it each are all answered, one at a time: the bytes in
// flight never exceed the budget. A budget below the message cap is refused when the shard is
// made.
TEST(Hostile, PullAnswersInFlightShareOneBudget) {
  Options opt;
  opt.max_message_bytes = 1 << 20;
  opt.answer_budget_bytes = 1 << 20;
  OneShard shard(opt);
  // 50,000 ids (repeats are legal in a pull): 600 kB of rows, 400 kB of request.
  PullRequest pull;
  std::vector<int64_t> ids(50000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % kRows);
  PackArray(ids.data(), ids.size(), pull.mutable_ids());
  ASSERT_TRUE(shard.server->CheckPull(pull).ok());
  ASSERT_GT(2 * shard.server->AnswerBytes(pull), opt.answer_budget_bytes);
  constexpr int kPulls = 8;
  const testing::PullResults r =
      testing::ConcurrentPulls(shard.Authorized().get(), pull, kPulls, absl::Seconds(60));
  for (int i = 0; i < kPulls; ++i) {
    ASSERT_TRUE(r.status[i].ok()) << i << ": " << r.status[i].error_message();
    EXPECT_EQ(r.answers[i].rows().size(), ids.size() * kDim * sizeof(float));
  }
  const AnswerBudget& budget = shard.server->answer_budget();
  EXPECT_EQ(budget.budget(), opt.answer_budget_bytes);
  EXPECT_GE(budget.peak(), shard.server->AnswerBytes(pull));
  EXPECT_LE(budget.peak(), budget.budget());
  std::printf("%d concurrent pulls: %lld of them waited for the budget\n", kPulls,
              static_cast<long long>(budget.waited()));
  shard.server->Shutdown(absl::Seconds(5));  // every call done, OnDone included
  EXPECT_EQ(budget.in_use(), 0);             // every answer's bytes came back

  // 0 is twice the message cap; a budget below the cap could never answer the largest pull.
  Options defaults;
  OneShard two(defaults);
  EXPECT_EQ(two.server->answer_budget().budget(), 2 * kDefaultMaxMessageBytes);
  ShardServer::Options o;
  o.data.rows = kRows;
  o.data.row_dim = kDim;
  o.answer_budget_bytes = o.security.max_message_bytes - 1;
  const auto small = ShardServer::Create(o);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("cluster.answer_budget_mb"));
}

// Per-client state is bounded: push states per worker id and in all.
TEST(Hostile, PushStatesAreBounded) {
  Options opt;
  opt.num_workers = Shard::kMaxPushWorkers + 10;  // worker ids are checked against the job's
  OneShard shard(opt);
  PushResponse resp;
  // Many incarnations of one worker: each is accepted (older ones are forgotten).
  for (uint64_t inc = 1; inc <= 50; ++inc) {
    PushRequest p = MakePush(0, 1, {5}, {0, 0, 0});
    p.set_incarnation(inc);
    p.set_sequence(1);
    ASSERT_TRUE(shard.server->Push(p, &resp).ok());
    EXPECT_FALSE(resp.duplicate());
  }
  // The newest incarnation still deduplicates its retries.
  PushRequest again = MakePush(0, 1, {5}, {0, 0, 0});
  again.set_incarnation(50);
  again.set_sequence(1);
  ASSERT_TRUE(shard.server->Push(again, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  // A job of more worker ids than that: state for kMaxPushWorkers of them.
  int refused = 0;
  for (int w = 0; w < Shard::kMaxPushWorkers + 10; ++w) {
    PushRequest p = MakePush(w, 1, {5}, {0, 0, 0});
    p.set_incarnation(1);
    p.set_sequence(1);
    const absl::Status s = shard.server->Push(p, &resp);
    if (s.code() == absl::StatusCode::kResourceExhausted) ++refused;
  }
  EXPECT_EQ(refused, 10);
}

// Shard 0's leases: a worker that stops calling is lost after the lease, the chief's wait for its
// arrival ends at once naming it, a SYNC pull that waits for it fails at once, and a call from
// it ends its loss.
TEST(Hostile, LeasesFindASilentWorker) {
  Options opt;
  opt.mode = SYNC;
  opt.lease = absl::Seconds(1);
  OneShard shard(opt);
  ShardRpc worker1(shard.address, shard.security, /*worker=*/1);
  ASSERT_TRUE(worker1.Info(absl::Seconds(5)).ok());  // worker 1's lease starts
  ShardRpc chief(shard.address, shard.security, /*worker=*/0);
  const int64_t round = shard.server->coordinator().RequestCheckpoint(false);
  ASSERT_TRUE(shard.server->coordinator().ArriveCheckpoint(round, 0, "zero").ok());
  // Worker 0 keeps its lease (the chief's waits name it); worker 1 says nothing more.
  const absl::Time t0 = absl::Now();
  auto arrivals = chief.WaitForArrivals(round, 2, absl::Seconds(60));
  const absl::Duration waited = absl::Now() - t0;
  EXPECT_EQ(arrivals.status().code(), absl::StatusCode::kFailedPrecondition) << arrivals.status();
  EXPECT_THAT(arrivals.status().message(), HasSubstr("worker 1 lost"));
  EXPECT_LT(waited, absl::Seconds(10));
  EXPECT_THAT(shard.server->coordinator().lost_workers(), ::testing::ElementsAre(1));
  EXPECT_EQ(shard.server->Info().lost_workers_size(), 1);

  // A SYNC pull of worker 0 that waits for worker 1's push fails at once.
  auto stub = shard.Authorized();
  PushRequest push = MakePush(0, 1, {5}, {1, 1, 1});
  PushResponse presp;
  grpc::ClientContext c1;
  SetDeadline(&c1);
  ASSERT_TRUE(stub->Push(&c1, push, &presp).ok());
  PullRequest pull;
  pull.set_worker_id(0);
  pull.set_step(2);
  PullResponse resp;
  grpc::ClientContext c2;
  SetDeadline(&c2, absl::Seconds(30));
  const absl::Time t1 = absl::Now();
  const grpc::Status s = stub->Pull(&c2, pull, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("worker 1 lost"));
  EXPECT_LT(absl::Now() - t1, absl::Seconds(5));

  // Worker 1 calls again: no longer lost.
  ASSERT_TRUE(worker1.Info(absl::Seconds(5)).ok());
  EXPECT_THAT(shard.server->coordinator().lost_workers(),
              ::testing::Not(::testing::Contains(1)));
}

}  // namespace
}  // namespace pstrain
