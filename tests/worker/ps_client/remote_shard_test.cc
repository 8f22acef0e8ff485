// RemoteShard (worker/ps_client/shard_endpoint.h) against a real shard on loopback: pushes reach
// the shard in ticket order whatever order Push() is called in (the shard applies one client's
// pushes at most once and drops a sequence at or below the last it applied, so an out-of-order
// send would lose updates), and a pull's answer lands in the part.
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/env.h"
#include "common/rpc/security.h"
#include "common/rpc/timer.h"
#include "gtest/gtest.h"
#include "ps/server/shard_server.h"
#include "worker/ps_client/shard_endpoint.h"

namespace pstrain {
namespace {

constexpr int kRowDim = 2;
constexpr int64_t kDense = 4;

struct OneShard {
  std::unique_ptr<ShardServer> server;
  Timer timer;
  std::unique_ptr<ShardEndpoint> endpoint;

  OneShard() {
    ShardServer::Options so;
    so.data.rows = 10;
    so.data.partitions = 1;
    so.data.row_dim = kRowDim;
    so.data.dense_size = kDense;
    so.data.sparse_optimizer.set_type(SGD);
    so.data.sparse_optimizer.set_learning_rate(1.0f);
    so.data.dense_optimizer.set_type(SGD);
    so.data.dense_optimizer.set_learning_rate(1.0f);
    auto s = ShardServer::Create(so);
    EXPECT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    EXPECT_TRUE(server->Start("127.0.0.1:0").ok());
    RemoteShardOptions r;
    r.shard = 0;
    r.address = absl::StrCat("127.0.0.1:", server->port());
    r.channel = MakeChannel(r.address, RpcSecurity(), grpc::ChannelArguments());
    r.row_dim = kRowDim;
    r.dense_begin = 0;
    r.dense_size = kDense;
    r.policy.attempt_timeout = absl::Seconds(10);
    r.policy.budget = absl::Seconds(30);
    r.timer = &timer;
    r.env = Env::Default();
    endpoint = MakeRemoteShard(std::move(r));
  }
  ~OneShard() {
    endpoint->Shutdown();
    server->Shutdown(absl::ZeroDuration());
  }
};

// A push of gradient `g` for row 3 (both floats), sequence `sequence`.
PushPart RowPush(float g, uint64_t sequence) {
  PushPart part;
  PushRequest& r = part.request;
  r.set_worker_id(0);
  r.set_incarnation(77);
  r.set_step(static_cast<int64_t>(sequence));
  r.set_sequence(sequence);
  const int64_t id = 3;
  r.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  const float grads[kRowDim] = {g, g};
  r.set_row_grads(std::string(reinterpret_cast<const char*>(grads), sizeof(grads)));
  return part;
}

float PulledRow3(OneShard& s) {
  PullPart part;
  const int64_t id = 3;
  part.request.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  absl::Notification done;
  absl::Status status;
  s.endpoint->Pull(&part, [&](absl::Status st) {
    status = st;
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_NE(part.rows, nullptr);
  if (part.rows == nullptr) return 0;
  float v;
  std::memcpy(&v, part.rows, sizeof(v));
  return v;
}

TEST(RemoteShardTest, PushesAreSentInTicketOrderWhateverOrderTheyAreGivenIn) {
  OneShard s;
  ASSERT_EQ(PulledRow3(s), 0.0f);  // rows start at zero
  // Tickets 0, 1, 2 for sequences 1, 2, 3; handed over in the reverse order, from threads.
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 3; ++i) tickets.push_back(s.endpoint->ReservePush());
  std::vector<PushPart> parts;
  for (int i = 0; i < 3; ++i) parts.push_back(RowPush(1.0f + i, i + 1));
  std::atomic<int> ok{0}, finished{0};
  std::vector<std::thread> threads;
  for (int i = 2; i >= 0; --i) {
    threads.emplace_back([&, i] {
      s.endpoint->Push(tickets[i], &parts[i], [&](absl::Status st) {
        if (st.ok()) ok.fetch_add(1);
        finished.fetch_add(1);
      });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3000 && finished.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(finished.load(), 3);
  EXPECT_EQ(ok.load(), 3);
  // SGD with learning rate 1 over a batch of one: every push applied, none dropped as a
  // duplicate: 0 - (1 + 2 + 3).
  EXPECT_EQ(PulledRow3(s), -6.0f);
  for (const PushPart& p : parts) EXPECT_NE(p.incarnation, 0u);  // the shard's, answered
}

TEST(RemoteShardTest, APullLandsItsDenseSliceAndNamesTheShardWhenItFails) {
  OneShard s;
  std::vector<float> dense(kDense, -1.0f);
  PullPart part;
  part.request.set_want_dense(true);
  part.dense_out = dense.data();
  absl::Notification done;
  absl::Status status;
  s.endpoint->Pull(&part, [&](absl::Status st) {
    status = st;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(status.ok()) << status;
  for (float v : dense) EXPECT_EQ(v, 0.0f);
  EXPECT_GE(part.dense_version, 0);
  EXPECT_NE(part.incarnation, 0u);

  // An id outside the table: the shard refuses, and the error names the shard and the method.
  PullPart bad;
  const int64_t id = 99;
  bad.request.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  absl::Notification bad_done;
  s.endpoint->Pull(&bad, [&](absl::Status st) {
    status = st;
    bad_done.Notify();
  });
  ASSERT_TRUE(bad_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(status.ok());
  EXPECT_NE(std::string(status.message()).find("shard 0 (127.0.0.1:"), std::string::npos)
      << status;
  EXPECT_NE(std::string(status.message()).find("Pull failed"), std::string::npos) << status;
}

}  // namespace
}  // namespace pstrain
