#pragma once
// Host-side helpers shared by the CUDA backend's .cpp files: the private library state, typed
// device pointers, and the error texts of the few refusals that are the device's own.

#include <cuda_bf16.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cudnn_attention.h"
#include "gemm.h"
#include "grouped_gemm.h"
#include "kernels.h"
#include "meshtrain/backend/cuda/cuda_backend.h"

namespace meshtrain {

struct CudaBackend::Libraries {
  Tensor gemm_workspace;
  std::unique_ptr<cuda::LtGemm> gemm;
  std::unique_ptr<cuda::GroupedGemm> grouped;  // the experts' grouped GEMMs; made on first use
  std::unique_ptr<cuda::CudnnAttention> cudnn;  // null when cuDNN failed to initialise
  std::string cudnn_error;
  CudnnPlatform platform;
  std::string attention_fallback;  // the first fallback's message; "" until one happens
  // Host sources of copy_from_host_async still being read by the device, each with the event
  // recorded after its copy, oldest first: the tensor is dropped once its event has completed.
  std::vector<std::pair<cudaEvent_t, Tensor>> host_copies;
  // Snapshot copies (snapshot_to_host) run on a stream of their own, after `snapshot_start`
  // (recorded on the compute stream: the state as of the call); `snapshot_done` follows the
  // last of them. Created on first use.
  cudaStream_t snapshot_stream = nullptr;
  cudaEvent_t snapshot_start = nullptr, snapshot_done = nullptr;
};

namespace cuda {

// Times one backend operation into a profile, when there is one: the stream is drained before
// and after, so the time is the operation's own device time plus its launch cost.
class TimedOp {
 public:
  // `op` is copied only when profiling: the name costs nothing on the path that is not timed.
  TimedOp(KernelProfile* profile, cudaStream_t stream, std::string_view op, double flops = 0)
      : stream_(stream) {
    if (profile == nullptr) return;
    op_.assign(op);
    cudaStreamSynchronize(stream_);
    scope_.emplace(profile, op_, flops);
  }
  ~TimedOp() {
    if (!scope_) return;
    cudaStreamSynchronize(stream_);
    scope_.reset();
  }
  TimedOp(const TimedOp&) = delete;
  TimedOp& operator=(const TimedOp&) = delete;

 private:
  cudaStream_t stream_;
  std::string op_;  // outlives scope_, which records it
  std::optional<KernelProfile::Scope> scope_;
};

template <class T> constexpr DType dtype_for();
template <> constexpr DType dtype_for<float>() { return DType::F32; }
template <> constexpr DType dtype_for<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_for<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_for<double>() { return DType::F64; }

// "backend 'cuda' does not support <op> for dtype <x>": a dtype the Backend front let through
// (backend_front.cpp checks every call's contract) that a kernel has no instance for.
[[noreturn]] void unsupported(const char* op, DType t);
// Typed device pointer of a tensor. The front has checked the call's dtypes and devices; the
// dtype test guards the kernel choice against a pointer of the wrong type.
template <class T> T* ptr(const char* op, const Tensor& t) {
  if (t.dtype() != dtype_for<T>()) unsupported(op, t.dtype());
  return static_cast<T*>(t.raw());
}

inline int64_t rows_of(const Tensor& t) {
  return t.shape().rank() == 0 ? 0 : t.numel() / t.dim(t.shape().rank() - 1);
}
inline int64_t cols_of(const Tensor& t) { return t.dim(t.shape().rank() - 1); }

// Calls f(float{}) or f(bf16{}) for the activation dtype; refuses anything else.
template <class F> void dispatch(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    default: unsupported(op, t);
  }
}

}  // namespace cuda
}  // namespace meshtrain
