// HoldCallbackQueue: keeps gRPC's process-wide callback completion queue for the life of the
// process, so that no release of a channel or server ever tears it down under a gRPC thread.
//
// Why. gRPC 1.51 on Linux (epoll1: iomgr does not run in the background) runs every callback-API
// completion, client and server, on the "nexting" threads of ONE completion queue per process
// (CompletionQueue::CallbackAlternativeCQ), reference-counted by the channels that made a
// callback call and the servers that serve callback services. The release of the last one shuts
// the queue down, joins its nexting threads and deletes it. When that release runs ON a nexting
// thread (the last std::shared_ptr<grpc::Channel> dropped inside a callback: a ClientContext holds
// one), the thread "joins" itself (pthread_join's EDEADLK is ignored), deletes the queue it is
// still polling, and the next cq_next on it aborts the process:
//   ref_counted.h:183 assertion failed: prior > 0
// (the queue's internal Unref, in cq_next on the freed queue: the core's backtrace is
// grpc_cq_internal_unref <- cq_next <- the nexting thread). Seen in
// PsProcess.KilledShardFailsFastAndRestartedShardIsReachedThroughRetries and a ConsistencyTest:
// a PsClient destroyed right after its last call completed, while that call's ClientContext
// still held the channel on the callback thread (a9bb78d reordered PsClient; with that order
// undone the test aborted so in 1 of 307 runs under load). tests/common/rpc/callback_queue_test.cc
// forces the pattern: without this hold it fails every run (the queue is torn down from its own
// thread, and about half the runs abort).
//
// The fix. One lame channel (every call on it fails at once, no connection is ever made) makes
// one callback call and is never destroyed: the queue's count never falls back to zero, whatever
// thread releases the other channels and servers, and in any order. Cost: the queue's nexting
// threads (2 to 16, half the cores) live until the process exits, as they already do while any
// client or server exists; gRPC is then not shut down at exit (the held channel keeps it
// initialized), which is what a process with a static channel gets anyway.
//
// Call it before a callback-API channel or server of the process can be released
// (PsClient::Create and ShardServer::Start do). Thread-safe, idempotent, never blocks (the one
// call's completion frees what it used, on a gRPC thread).
#pragma once

namespace pstrain {

void HoldCallbackQueue();

}  // namespace pstrain
