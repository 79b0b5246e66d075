#pragma once
// Allocators hand out Buffers and attribute their bytes to a MemoryCategory. Freed blocks are
// cached by size and reused: training allocates the same shapes every step, and returning large
// blocks to the operating system each time would cost page faults (CPU) or synchronisation (GPU).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "meshtrain/tensor/dtype.h"
#include "meshtrain/tensor/memory.h"

namespace meshtrain {

class Allocator;

// A block of memory on one device. Returned to its allocator's cache when the last Tensor
// viewing it goes away. The allocator must outlive every Buffer it handed out.
class Buffer {
 public:
  Buffer(Allocator* owner, void* ptr, size_t bytes, MemoryCategory category)
      : owner_(owner), ptr_(ptr), bytes_(bytes), category_(category) {}
  ~Buffer();  // gives the block back (none yet: an allocation that failed before it had one)
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  Device device() const;

 private:
  friend class Allocator;  // hands the block over once it has one
  Allocator* owner_;
  void* ptr_;
  size_t bytes_;
  MemoryCategory category_;
};

class Allocator {
 public:
  explicit Allocator(Device device) : device_(device) {}
  virtual ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Device device() const { return device_; }
  std::shared_ptr<Buffer> allocate(size_t bytes, MemoryCategory category);

  MemoryTracker& tracker() { return tracker_; }
  const MemoryTracker& tracker() const { return tracker_; }
  // Bytes held by the allocator (in use + cached).
  size_t reserved() const { return reserved_; }
  // Gives cached blocks back to the system.
  void release_cached();

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_release(void* ptr, size_t bytes) = 0;

 private:
  friend class Buffer;
  void release(void* ptr, size_t bytes, MemoryCategory category);

  Device device_;
  MemoryTracker tracker_;
  std::mutex mutex_;
  // Rounded size -> its free blocks, oldest first: the block freed longest ago is reused first.
  // Hashed rather than ordered, with no node per free block, because allocate and release run
  // for every tensor of every step, and they are all a planner's dry run does.
  std::unordered_map<size_t, std::deque<void*>> cache_;
  size_t reserved_ = 0;
};

// Host memory, 64-byte aligned (a cache line, and an AVX-512 vector).
class HostAllocator final : public Allocator {
 public:
  HostAllocator() : Allocator(Device::Cpu) {}
  ~HostAllocator() override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_release(void* ptr, size_t bytes) override;
};

// Allocates nothing: hands out distinct fake addresses that must never be dereferenced. Backs
// tensors in planning mode, where the real code runs its allocations (and so its memory
// accounting) without kernels, to predict the memory of a run before it is launched.
class MetaAllocator final : public Allocator {
 public:
  explicit MetaAllocator(Device device) : Allocator(device) {}

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_release(void*, size_t) override {}

 private:
  uintptr_t next_ = uintptr_t{1} << 44;  // far from any real mapping
};

}  // namespace meshtrain
