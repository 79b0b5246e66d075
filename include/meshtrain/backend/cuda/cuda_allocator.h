#pragma once
// Allocators for the CUDA backend: device memory (cudaMalloc) and pinned host memory
// (cudaMallocHost, for staging transfers). Both reuse the base Allocator's size-keyed cache and
// MemoryTracker, so device bytes are attributed to the same categories as host bytes. Not a
// stream-ordered allocator: the backend runs all its kernels on one stream, so a block freed and
// reused is ordered after every kernel that used it; communication streams keep the tensors they
// use alive (inside their Work) until they are done.

#include <cstddef>

#include "meshtrain/tensor/allocator.h"

namespace meshtrain {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device);
  ~CudaAllocator() override;
  int device_index() const { return device_; }

 protected:
  // On out-of-memory the cache is returned to the driver and the allocation retried once; a
  // second failure throws std::runtime_error naming the size and the current use by category.
  void* raw_allocate(size_t bytes) override;
  void raw_release(void* ptr, size_t bytes) override;

 private:
  int device_;
};

// Page-locked host memory: tensors on Device::Cpu that cudaMemcpyAsync can move without an
// intermediate copy (host staging of device tensors for MPI).
class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator() : Allocator(Device::Cpu) {}
  ~PinnedHostAllocator() override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_release(void* ptr, size_t bytes) override;
};

}  // namespace meshtrain
