#include "ps/store/slab_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace pstrain {

SlabArena::~SlabArena() {
  for (const Slab& s : slabs_) munmap(s.base, s.size);
}

void* SlabArena::Allocate(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > left_) {
    const size_t size = bytes > slab_bytes_ ? bytes : slab_bytes_;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    PSTRAIN_CHECK(p != MAP_FAILED) << "out of memory: mmap of a " << size
                                   << "-byte slab for an embedding store failed: "
                                   << std::strerror(errno);
    slabs_.push_back(Slab{static_cast<char*>(p), size});
    next_ = static_cast<char*>(p);  // page-aligned
    left_ = size;
  }
  void* out = next_;
  next_ += bytes;
  left_ -= bytes;
  allocated_ += bytes;
  return out;
}

size_t SlabArena::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace pstrain
