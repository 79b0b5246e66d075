#pragma once
// The CpuBackend's dtype dispatch, shared by cpu_backend.cpp (data movement, elementwise,
// embeddings), cpu_layers.cpp (layers, attention, cross-entropy, optimizer) and the ring-attention
// blocks. The Backend front (backend_front.cpp) has checked each call by backend.h's dtype rules:
// an op's activation dtype A (fp32, fp64 or bf16) decides it; parameter gradients and row
// statistics are wide(A), fp32 under bf16. The refusal below is only reached by a dtype the
// front let through that a kernel has no instance for.

#include <stdexcept>
#include <string>

#include "element.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::cpu {

[[noreturn]] inline void unsupported(const char* op, DType t) {
  throw std::invalid_argument(std::string("backend 'cpu' does not support ") + op +
                              " for dtype " + std::string(dtype_name(t)));
}

// The dtype of gradients and statistics for activations of dtype `act`.
inline DType wide(DType act) { return act == DType::BF16 ? DType::F32 : act; }

// Calls f(float{}), f(double{}) or f(bf16{}) for the activation dtype; in planning mode only
// checks it (plans of GPU runs are made with this backend too).
template <class F> void dispatch(bool planning, const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32: if (!planning) f(float{}); return;
    case DType::F64: if (!planning) f(double{}); return;
    case DType::BF16: if (!planning) f(bf16{}); return;
    default: unsupported(op, t);
  }
}

template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw()); }

inline int64_t rows_of(const Tensor& t) {
  return t.shape().rank() == 0 ? 0 : t.numel() / t.dim(t.shape().rank() - 1);
}
inline int64_t cols_of(const Tensor& t) { return t.dim(t.shape().rank() - 1); }

}  // namespace meshtrain::cpu
