// HoldCallbackQueue (common/rpc/callback_queue.h) forced: channels whose last reference goes
// inside their own callback, on gRPC's callback thread. With the queue held, the queue and its
// threads outlive every one of them (the same threads before and after) and the process runs on.
// Without the hold, each such release tore the queue down from its own thread: the thread check
// failed every run, and gRPC 1.51 aborted about half of them first ("ref_counted.h:183 assertion
// failed: prior > 0").
#include "common/rpc/callback_queue.h"

#include <grpc/support/cpu.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The thread ids of gRPC's callback queue threads in this process (grpc_core::Thread names them).
std::set<std::string> NextingThreads() {
  std::set<std::string> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "nexting_thread") tids.insert(e->d_name);
  }
  closedir(dir);
  return tids;
}

TEST(HoldCallbackQueue, AChannelsLastReferenceMayGoOnItsCallbackThread) {
  HoldCallbackQueue();
  // The queue starts Clamp(cores / 2, 2, 16) threads (completion_queue_cc.cc), which name
  // themselves once they run.
  const size_t expected = std::clamp(gpr_cpu_num_cores() / 2, 2u, 16u);
  std::set<std::string> threads = NextingThreads();
  for (int i = 0; i < 1000 && threads.size() < expected; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    threads = NextingThreads();
  }
  ASSERT_EQ(threads.size(), expected) << "the callback queue's threads after HoldCallbackQueue";
  std::set<std::string> seen;
  constexpr int kChannels = 200;
  for (int i = 0; i < kChannels; ++i) {
    // A lame channel: the call fails at once, no network. Only `channel` and the call's context
    // hold it once the stub is gone.
    auto* channel = new std::shared_ptr<grpc::Channel>(grpc::CreateChannel("", nullptr));
    auto* ctx = new grpc::ClientContext;
    grpc::Slice empty("", 0);
    auto* request = new grpc::ByteBuffer(&empty, 1);
    auto* response = new grpc::ByteBuffer;
    absl::Notification released, done;
    std::thread::id callback_thread;
    grpc::GenericStub(*channel).UnaryCall(
        ctx, "/pstrain.Test/None", grpc::StubOptions(), request, response,
        [&, channel, ctx, request, response](grpc::Status) {
          // The stub (and its reference) is gone before this callback lets go of the last two.
          released.WaitForNotificationWithTimeout(absl::Seconds(10));
          callback_thread = std::this_thread::get_id();
          delete response;
          delete request;
          delete ctx;
          delete channel;  // the last reference, on this gRPC thread
          done.Notify();
        });
    // The queue's threads while this call's callback waits: the ones from before.
    seen.merge(NextingThreads());
    released.Notify();
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)))
        << "channel " << i << ": its call did not complete";
    ASSERT_NE(callback_thread, std::this_thread::get_id());
    // Time for the callback thread to poll the queue again (where a torn-down queue aborts).
    absl::SleepFor(absl::Milliseconds(10));
  }
  seen.merge(NextingThreads());
  EXPECT_EQ(seen, threads) << "the callback queue was torn down and made again";
}

}  // namespace
}  // namespace pstrain
