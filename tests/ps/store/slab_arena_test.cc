#include "ps/store/slab_arena.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "ps/store/embedding_store.h"

namespace pstrain {
namespace {

TEST(SlabArena, BlocksAreAlignedZeroedAndDisjoint) {
  SlabArena arena(1 << 20);
  std::vector<std::pair<char*, size_t>> blocks;
  for (size_t bytes : {1, 63, 64, 65, 4096, 300000, 700000, 3 << 20, 10}) {  // one above a slab
    char* p = static_cast<char*>(arena.Allocate(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    EXPECT_TRUE(std::all_of(p, p + bytes, [](char c) { return c == 0; })) << bytes;
    std::fill(p, p + bytes, static_cast<char>(0x5a));  // writable, and caught below if shared
    blocks.emplace_back(p, bytes);
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first);
  }
  // Each request rounded up to 64 bytes.
  EXPECT_EQ(arena.allocated(),
            size_t{64 + 64 + 64 + 128 + 4096 + 300032 + 700032 + (3 << 20) + 64});
}

TEST(SlabArena, ConcurrentAllocationsNeverOverlap) {
  SlabArena arena(1 << 16);
  std::vector<std::vector<char*>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        char* p = static_cast<char*>(arena.Allocate(192));
        std::fill(p, p + 192, static_cast<char>(t + 1));
        got[t].push_back(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    for (char* p : got[t]) {
      ASSERT_TRUE(std::all_of(p, p + 192, [t](char c) { return c == t + 1; }));
    }
  }
}

// The point of the slabs: an embedding store's rows and index pages are not in malloc's heaps,
// where each would pin the holes that freed per-step messages leave around it.
TEST(SlabArena, AStoresRowsAreNotInMallocsHeap) {
  OptimizerConfig c;
  c.set_type(ADAGRAD);
  c.set_learning_rate(0.1f);
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 10000000;
  o.dim = 16;
  o.optimizer = std::shared_ptr<const Optimizer>(Optimizer::Create(c).value());
  auto store = EmbeddingStore::Create(std::move(o)).value();
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < 10000000; r += 50) ids.push_back(r);  // 200k rows, every index page
  const std::vector<float> grads(ids.size() * 16, 0.5f);
  const struct mallinfo2 before = mallinfo2();
  ASSERT_TRUE(store->Apply(ids, grads.data(), 1).ok());
  const struct mallinfo2 after = mallinfo2();
  const int64_t heap_growth = static_cast<int64_t>(after.uordblks + after.hblkhd) -
                              static_cast<int64_t>(before.uordblks + before.hblkhd);
  const int64_t store_bytes = store->stats().bytes;
  EXPECT_GT(store_bytes, 200000 * 33 * 4);  // the rows and slots (and the index pages) are held
  EXPECT_LT(heap_growth, store_bytes / 20) << "malloc's in-use bytes grew by " << heap_growth
                                           << " for a store of " << store_bytes;
}

}  // namespace
}  // namespace pstrain
