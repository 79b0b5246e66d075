#include "meshtrain/backend/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "cuda_check.h"

namespace meshtrain {

CudaAllocator::CudaAllocator(int device) : Allocator(Device::Cuda), device_(device) {}

CudaAllocator::~CudaAllocator() {
  cudaSetDevice(device_);
  release_cached();
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  MESHTRAIN_CUDA_CHECK("allocate", cudaSetDevice(device_));
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error before retrying
    release_cached();
    status = cudaMalloc(&p, bytes);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw std::runtime_error(
        "backend 'cuda': out of device memory allocating " + format_bytes(double(bytes)) +
        " on device " + std::to_string(device_) + " (" + format_bytes(double(free_bytes)) +
        " free of " + format_bytes(double(total_bytes)) + "; in use: " + tracker().in_use() +
        "): " + cudaGetErrorString(status) +
        "; hint: lower the micro-batch size, enable recomputation or shard with ZeRO/tp/pp");
  }
  return p;
}

void CudaAllocator::raw_release(void* ptr, size_t) {
  cudaSetDevice(device_);
  cudaFree(ptr);  // implicit device synchronisation: a freed block is no longer in use
}

PinnedHostAllocator::~PinnedHostAllocator() { release_cached(); }

void* PinnedHostAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  MESHTRAIN_CUDA_CHECK("allocate pinned host memory", cudaMallocHost(&p, bytes));
  return p;
}

void PinnedHostAllocator::raw_release(void* ptr, size_t) { cudaFreeHost(ptr); }

}  // namespace meshtrain
