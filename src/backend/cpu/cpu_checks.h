#pragma once
// The CpuBackend's argument checks and dtype dispatch, shared by cpu_backend.cpp (data movement,
// elementwise, embeddings) and cpu_layers.cpp (layers, attention, cross-entropy, optimizer).
// The dtype rules are backend.h's, the CUDA backend's too: an op's activation dtype A (fp32,
// fp64 or bf16) decides it; parameter gradients and row statistics are wide(A), fp32 under bf16.
// Anything else is refused by name: "backend 'cpu' does not support <op> for dtype <x>".

#include <stdexcept>
#include <string>

#include "element.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::cpu {

[[noreturn]] inline void unsupported(const char* op, DType t) {
  throw std::invalid_argument(std::string("backend 'cpu' does not support ") + op +
                              " for dtype " + std::string(dtype_name(t)));
}

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("backend 'cpu': ") + op + ": " + what);
}

// The dtype of gradients and statistics for activations of dtype `act`.
inline DType wide(DType act) { return act == DType::BF16 ? DType::F32 : act; }

// `tensor` of an op on activations of dtype `act` must be `want`; the refusal names the rule,
// e.g. "backend 'cpu' does not support matmul_backward for dtype bf16: dweight is bf16,
// expected fp32 (parameter gradients are fp32)".
inline void expect_dtype(const char* op, DType act, const char* tensor, const Tensor& t,
                         DType want, const std::string& rule) {
  if (t.dtype() == want) return;
  throw std::invalid_argument(std::string("backend 'cpu' does not support ") + op +
                              " for dtype " + std::string(dtype_name(act)) + ": " + tensor +
                              " is " + std::string(dtype_name(t.dtype())) + ", expected " +
                              std::string(dtype_name(want)) + " (" + rule + ")");
}
inline void same_dtype(const char* op, DType act, const char* tensor, const Tensor& t) {
  expect_dtype(op, act, tensor, t, act, "same as the activations");
}
inline void wide_grad(const char* op, DType act, const char* tensor, const Tensor& t) {
  expect_dtype(op, act, tensor, t, wide(act),
               "parameter gradients are " + std::string(dtype_name(wide(act))));
}
inline void wide_stat(const char* op, DType act, const char* tensor, const Tensor& t) {
  expect_dtype(op, act, tensor, t, wide(act),
               "statistics are " + std::string(dtype_name(wide(act))));
}

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
