// SlabArena: the memory an EmbeddingStore keeps for its whole life (its row chunks and index
// pages), taken from the kernel in large mmap'd slabs and handed out by bumping a pointer, never
// freed before the arena.
//
// Why not malloc: a store grows a chunk or an index page at a time over the whole run, and a
// trainer allocates and frees megabyte messages every step (common/malloc_tuning.h keeps those
// in glibc's heaps). In the same heaps, each permanent block lands among transient ones and pins
// the holes they leave: a 2-host PS job on 1.75M rows held 895 MB of heap for 738 MB in use
// (malloc_stats), the stores being most of the in-use part; 157 MB, 21% of the stores, was free
// memory the process could not give back, and it grew with the stores (docs/PERFORMANCE.md "A
// model larger than one host"). Slabs keep the permanent memory out of the heaps: what the heaps
// retain is then bounded by the transient peak, not by how far the stores have grown.
//
// Memory: slabs are mapped with MAP_NORESERVE and their pages are touched only when handed out,
// so an arena's resident memory is what it handed out (at most one slab's unused tail of address
// space, which is not resident). Blocks are 64-byte aligned and zero-filled.
//
// Thread-safety: Allocate may be called from any number of threads.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace pstrain {

class SlabArena {
 public:
  // slab_bytes: the size of each mapping (a larger request gets a mapping of its own size).
  explicit SlabArena(size_t slab_bytes = size_t{64} << 20) : slab_bytes_(slab_bytes) {}
  ~SlabArena();
  SlabArena(const SlabArena&) = delete;
  SlabArena& operator=(const SlabArena&) = delete;

  // `bytes` of zeroed memory, 64-byte aligned, valid until the arena is destroyed. Aborts with
  // a message when the kernel refuses the mapping (as the store's malloc did on failure).
  void* Allocate(size_t bytes);
  // Bytes handed out so far.
  size_t allocated() const;

 private:
  struct Slab {
    char* base;
    size_t size;
  };
  const size_t slab_bytes_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;  // guarded by mu_
  char* next_ = nullptr;     // guarded by mu_: the current slab's free part
  size_t left_ = 0;          // guarded by mu_
  size_t allocated_ = 0;     // guarded by mu_
};

}  // namespace pstrain
