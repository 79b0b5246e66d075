// SwiGLU (Shazeer, arXiv 2002.05202), the feed-forward activation of Llama and Qwen:
//   out = silu(g) * u,  silu(g) = g * s,  s = sigmoid(g) = 1 / (1 + e^-g)
//   dg  = dout * u * s * (1 + g * (1 - s)),  du = dout * silu(g)
// The sigmoid comes from e = exp(-|g|), which never overflows: s = 1 / (1 + e) for g >= 0 and
// e / (1 + e) below, each to a few ulp at any gate (1 - 1 / (1 + e^g) would cancel for negative
// gates). Written as this select, GCC compiles the loop as tightly as GELU's; the direct
// 1 / (1 + exp(-g)) came out several times slower on AVX-512.

#include <cmath>

#include "cpu_checks.h"
#include "kernels.h"
#include "vector_math.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {
namespace cpu {

namespace {
template <class T> inline T sigmoid(T g) {
  const T e = vexp<T>(-std::abs(g));
  const T r = T(1) / (T(1) + e);
  return g >= T(0) ? r : e * r;
}
}  // namespace

// Rows of F channels: gate and up `ld_in` apart from one row to the next, out and dout F apart,
// dgate and dup `ld_grad` apart (F for separate tensors; 2F for the packed rows of one product of
// gate and up side by side, with up at gate + F).
template <class A>
void swiglu_forward(A* out, const A* gate, const A* up, int64_t rows, int64_t F, int64_t ld_in) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const A* g_row = gate + r * ld_in;
    const A* u_row = up + r * ld_in;
    A* o_row = out + r * F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const T g = widen(g_row[i]);
      o_row[i] = narrow<A>(g * sigmoid(g) * widen(u_row[i]));
    }
  }
}

template <class A>
void swiglu_backward(A* dgate, A* dup, const A* dout, const A* gate, const A* up, int64_t rows,
                     int64_t F, int64_t ld_in, int64_t ld_grad) {
  using T = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const A* g_row = gate + r * ld_in;
    const A* u_row = up + r * ld_in;
    const A* dy_row = dout + r * F;
    A* dg_row = dgate + r * ld_grad;
    A* du_row = dup + r * ld_grad;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const T g = widen(g_row[i]), u = widen(u_row[i]), dy = widen(dy_row[i]);
      const T s = sigmoid(g);
      dg_row[i] = narrow<A>(dy * u * (s * (T(1) + g * (T(1) - s))));
      du_row[i] = narrow<A>(dy * (g * s));
    }
  }
}

#define INSTANTIATE(A)                                                                   \
  template void swiglu_forward<A>(A*, const A*, const A*, int64_t, int64_t, int64_t);    \
  template void swiglu_backward<A>(A*, A*, const A*, const A*, const A*, int64_t, int64_t, \
                                   int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace cpu

// The CpuBackend's hooks for SwiGLU on separate or packed halves: the dtype dispatch
// (cpu_checks.h) onto the kernels above, for calls the Backend front has checked
// (swiglu_front.cpp).

void CpuBackend::do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  KernelProfile::Scope timed(profile_, op);
  cpu::dispatch(planning_, op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = cpu::rows_of(gate), F = cpu::cols_of(gate);
    cpu::swiglu_forward<T>(cpu::ptr<T>(out), cpu::ptr<T>(gate), cpu::ptr<T>(up), N, F, F);
  });
}

void CpuBackend::do_swiglu_forward_packed(Tensor& out, const Tensor& gate_up) {
  const char* op = "swiglu_forward";
  KernelProfile::Scope timed(profile_, op);
  cpu::dispatch(planning_, op, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = cpu::cols_of(out);
    const T* gu = cpu::ptr<T>(gate_up);
    cpu::swiglu_forward<T>(cpu::ptr<T>(out), gu, gu + F, cpu::rows_of(out), F, 2 * F);
  });
}

void CpuBackend::do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout,
                                    const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  KernelProfile::Scope timed(profile_, op);
  cpu::dispatch(planning_, op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = cpu::rows_of(gate), F = cpu::cols_of(gate);
    cpu::swiglu_backward<T>(cpu::ptr<T>(dgate), cpu::ptr<T>(dup), cpu::ptr<T>(dout),
                            cpu::ptr<T>(gate), cpu::ptr<T>(up), N, F, F, F);
  });
}

void CpuBackend::do_swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout,
                                           const Tensor& gate_up) {
  const char* op = "swiglu_backward";
  KernelProfile::Scope timed(profile_, op);
  cpu::dispatch(planning_, op, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = cpu::rows_of(dout), F = cpu::cols_of(dout);
    const T* gu = cpu::ptr<T>(gate_up);
    T* dgu = cpu::ptr<T>(dgate_up);
    cpu::swiglu_backward<T>(dgu, dgu + F, cpu::ptr<T>(dout), gu, gu + F, N, F, 2 * F, 2 * F);
  });
}

}  // namespace meshtrain
