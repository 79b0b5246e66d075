#pragma once
// The CPU kernels' element types: float (training), double (verification) and bf16 (mixed
// precision), and the arithmetic type each computes in. Kernels are templates on the stored
// activation type A and compute in Acc<A> (double for double, float otherwise): a bf16 value
// widens exactly on load and rounds to nearest even on store (tensor/bf16.h), as the CUDA
// backend's kernels do, so both produce the same bits for the same fp32 result. Parameter
// gradients, row statistics and optimizer state of a bf16 model are Acc<A>: fp32.
// Internal to the CPU backend.

#include <cstdint>
#include <type_traits>

#include "meshtrain/tensor/bf16.h"

namespace meshtrain::cpu {

// A bfloat16 as stored: its bits. Not a number type; widen() and narrow<bf16>() cross over.
struct bf16 {
  uint16_t bits;
};

template <class A> using Acc = std::conditional_t<std::is_same_v<A, double>, double, float>;

inline float widen(bf16 x) { return bf16_bits_to_float(x.bits); }
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }

template <class A> inline A narrow(Acc<A> x) { return x; }
template <> inline bf16 narrow<bf16>(float x) { return bf16{float_to_bf16_bits(x)}; }

// dst += src over one row, with add_inplace's bits: for a kernel that adds a residual to a row
// it has just written, while the row is in cache, instead of a pass of its own.
template <class A> inline void add_row(A* dst, const A* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = narrow<A>(widen(dst[i]) + widen(src[i]));
}

}  // namespace meshtrain::cpu
