#include "meshtrain/tensor/allocator.h"

#include <cstdlib>
#include <new>

namespace meshtrain {

namespace {
// Rounding keeps the cache hit rate high for sizes that differ by a few bytes (e.g. the last
// micro-batch's buffers) without wasting more than a page per block.
size_t round_size(size_t bytes) {
  const size_t granule = bytes < (1u << 20) ? 512 : 4096;
  return (bytes + granule - 1) / granule * granule;
}
}  // namespace

Buffer::~Buffer() {
  if (ptr_) owner_->release(ptr_, bytes_, category_);
}

Device Buffer::device() const { return owner_->device(); }

Allocator::~Allocator() = default;

// Bytes are counted only once the block is in hand: a raw allocation that fails (out of memory)
// must leave the counters and peaks as they were, or every later report (and the planner's
// comparison with a real run) would include memory that was never allocated. The Buffer comes
// first, still without a block, so that a cached block is taken and counted under one lock.
std::shared_ptr<Buffer> Allocator::allocate(size_t bytes, MemoryCategory category) {
  const size_t rounded = round_size(bytes == 0 ? 1 : bytes);
  auto buffer = std::make_shared<Buffer>(this, nullptr, rounded, category);  // may throw: nothing taken
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      buffer->ptr_ = it->second.front();
      it->second.pop_front();
      // Past a limit this throws with the bytes counted: the Buffer gives them back as it goes.
      tracker_.on_allocate(category, rounded);
      return buffer;
    }
  }
  void* ptr = raw_allocate(rounded);  // may throw: nothing counted yet
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ += rounded;
  buffer->ptr_ = ptr;
  tracker_.on_allocate(category, rounded);
  return buffer;
}

void Allocator::release(void* ptr, size_t bytes, MemoryCategory category) {
  std::lock_guard<std::mutex> lock(mutex_);
  tracker_.on_release(category, bytes);
  cache_[bytes].push_back(ptr);
}

void Allocator::release_cached() {
  std::unordered_map<size_t, std::deque<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(cache_);
    for (auto& [bytes, free] : blocks) reserved_ -= bytes * free.size();
  }
  for (auto& [bytes, free] : blocks)
    for (void* ptr : free) raw_release(ptr, bytes);
}

HostAllocator::~HostAllocator() { release_cached(); }

void* HostAllocator::raw_allocate(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}

void HostAllocator::raw_release(void* ptr, size_t) { std::free(ptr); }

void* MetaAllocator::raw_allocate(size_t bytes) {
  void* p = reinterpret_cast<void*>(next_);
  next_ += (bytes + 4095) / 4096 * 4096;
  return p;
}

}  // namespace meshtrain
