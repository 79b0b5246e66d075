// CpuBackend: the Llama-family layers (RMSNorm, SwiGLU, rotary embeddings), the dtype dispatch
// (cpu_checks.h) onto rmsnorm.cpp, swiglu.cpp and rotary.cpp. The Backend front has checked each
// call (llama_layer_front.cpp); the planner's dry run (Execution::Plan) makes the same
// allocations and skips the arithmetic.

#include <stdexcept>
#include <string>

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

using cpu::Acc;
using cpu::cols_of;
using cpu::dispatch;
using cpu::ptr;
using cpu::rows_of;

void CpuBackend::do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, double eps) {
  const char* op = "rmsnorm_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(ptr<T>(out), ptr<Acc<T>>(rstd), ptr<T>(inp), ptr<T>(weight), eps, N,
                            C);
  });
}

void CpuBackend::do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_adding(dinp, dweight, dout, inp, weight, rstd, nullptr);
}

// The residual added to each row of dinp as the kernel writes it, not by a pass of its own.
void CpuBackend::do_rmsnorm_backward_add(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                         const Tensor& inp, const Tensor& weight,
                                         const Tensor& rstd, const Tensor& residual) {
  rmsnorm_backward_adding(dinp, dweight, dout, inp, weight, rstd, &residual);
}

void CpuBackend::rmsnorm_backward_adding(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                         const Tensor& inp, const Tensor& weight,
                                         const Tensor& rstd, const Tensor* residual) {
  const char* op = residual ? "rmsnorm_backward_add" : "rmsnorm_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  const DType a = inp.dtype();
  Tensor scratch = empty({int64_t{threads()} * C}, cpu::wide(a), MemoryCategory::Workspace);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(ptr<T>(dinp), ptr<Acc<T>>(dweight), ptr<T>(dout), ptr<T>(inp),
                             ptr<T>(weight), ptr<Acc<T>>(rstd), N, C, ptr<Acc<T>>(scratch),
                             residual ? ptr<T>(*residual) : nullptr);
  });
}

void CpuBackend::do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = cols_of(gate);
    cpu::swiglu_forward<T>(ptr<T>(out), ptr<T>(gate), ptr<T>(up), rows_of(gate), F, F);
  });
}

void CpuBackend::do_swiglu_forward_packed(Tensor& out, const Tensor& gate_up) {
  const char* op = "swiglu_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = cols_of(out);
    const T* gu = ptr<T>(gate_up);
    cpu::swiglu_forward<T>(ptr<T>(out), gu, gu + F, rows_of(out), F, 2 * F);
  });
}

void CpuBackend::do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout,
                                    const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = cols_of(gate);
    cpu::swiglu_backward<T>(ptr<T>(dgate), ptr<T>(dup), ptr<T>(dout), ptr<T>(gate), ptr<T>(up),
                            rows_of(gate), F, F, F);
  });
}

void CpuBackend::do_swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout,
                                           const Tensor& gate_up) {
  const char* op = "swiglu_backward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = cols_of(dout);
    const T* gu = ptr<T>(gate_up);
    T* dgu = ptr<T>(dgate_up);
    cpu::swiglu_backward<T>(dgu, dgu + F, ptr<T>(dout), gu, gu + F, rows_of(dout), F, 2 * F, 2 * F);
  });
}

void CpuBackend::do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos,
                           const Tensor& sin, const RotaryHeads& where, Rotation rotation) {
  const bool backward = rotation == Rotation::ByMinusAngle;
  const char* op = backward ? "rotary_backward" : "rotary_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = positions.numel(), P = cos.dim(0);
  if (N == 0) return;
  dispatch(planning_, op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // The positions are host memory here: a position past the table is refused rather than read
    // out of bounds (a GPU cannot check without waiting; backend.h).
    const int32_t* pos = ptr<int32_t>(positions);
    if (const int64_t n = cpu::rotary_row_outside(pos, N, P); n >= 0)
      throw std::invalid_argument(
          std::string("backend 'cpu': ") + op + ": position " + std::to_string(pos[n]) +
          " of row " + std::to_string(n) + " is outside the rotary table's " + std::to_string(P) +
          " positions (build the table for the longest sequence the model runs)");
    cpu::rotary<T>(ptr<T>(x), pos, ptr<Acc<T>>(cos), ptr<Acc<T>>(sin), N, x.numel() / N,
                   where.column, where.heads, where.head_dim, backward);
  });
}

}  // namespace meshtrain
