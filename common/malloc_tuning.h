// glibc malloc settings for a process that moves megabyte messages every few milliseconds.
#pragma once

#include <malloc.h>

namespace pstrain {

// By default glibc serves an allocation above its mmap threshold (128 KB at first, raised up to
// 32 MB as such blocks are freed) with a fresh mmap, and returns freed memory at the top of a
// heap to the kernel once more than the trim threshold is free. A PS worker and shard allocate
// and free their megabyte pull/push messages (protobuf strings, gRPC slices) at every step, so
// each step faulted in fresh zeroed pages: 2.1M minor page faults and 16 s of system time in a
// 53 s `pstrain local --hosts 2` run (docs/PERFORMANCE.md). Raising both thresholds keeps the
// blocks in the heap for reuse; a process then holds on to up to ~128 MB it freed.
// Call at the start of main, before other threads exist.
inline void KeepLargeBuffersInTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's upper limit on 64-bit
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

}  // namespace pstrain
