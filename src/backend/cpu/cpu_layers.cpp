// CpuBackend: the layers, attention and cross-entropy — the dtype dispatch (cpu_checks.h)
// onto the kernels of kernels.h. The Backend front has checked each call's shapes and dtypes
// (backend_front.cpp): which tensors follow the activations and which stay wide under bf16.

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

namespace {
std::string gemm_dims(int64_t M, int64_t N, int64_t K) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}
}  // namespace

void CpuBackend::do_layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                      const Tensor& weight, const Tensor& bias) {
  const char* op = "layernorm_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  const DType a = inp.dtype();
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_forward<T>(ptr<T>(out), ptr<Acc<T>>(mean), ptr<Acc<T>>(rstd), ptr<T>(inp),
                              ptr<T>(weight), ptr<T>(bias), N, C);
  });
}

// The residual, if any, added to each row of dinp as the kernel writes it, not by a pass of its
// own.
void CpuBackend::do_layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                       const Tensor& mean, const Tensor& rstd,
                                       const Tensor* residual) {
  const char* op = residual ? "layernorm_backward_add" : "layernorm_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  const DType a = inp.dtype();
  Tensor scratch = empty({int64_t{threads()} * 2 * C}, cpu::wide(a), MemoryCategory::Workspace);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(ptr<T>(dinp), ptr<Acc<T>>(dweight), ptr<Acc<T>>(dbias),
                               ptr<T>(dout), ptr<T>(inp), ptr<T>(weight), ptr<Acc<T>>(mean),
                               ptr<Acc<T>>(rstd), N, C, ptr<Acc<T>>(scratch),
                               residual ? ptr<T>(*residual) : nullptr);
  });
}

// The residual, if any, as the GEMM's binary-add post-op: read inside the product instead of by
// a pass over out and residual after it; under bf16 the sum is rounded once, not twice.
void CpuBackend::do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                   const Tensor* bias, const Tensor* residual) {
  const char* op = residual ? "matmul_forward_add" : "matmul_forward";
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  const std::string name = profile_ ? std::string(op) + " " + gemm_dims(N, OC, C) : std::string();
  KernelProfile::Scope timed(profile_, name, 2.0 * N * C * OC);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_forward<T>(*gemm_, ptr<T>(out), ptr<T>(inp), ptr<T>(weight),
                           bias ? ptr<T>(*bias) : nullptr, N, C, OC,
                           residual ? ptr<T>(*residual) : nullptr);
  });
}

void CpuBackend::do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    GradWrite dweight_write) {
  const char* op = "matmul_backward";
  // OC from dout: a weight-gradient-only call (zero-bubble schedules) may run after ZeRO-3 has
  // released the weight, which only the input gradient reads.
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = cols_of(dout);
  // Named by the input-gradient GEMM dinp (N, C) = dout (N, OC) @ W; dW is OC x C x N.
  const std::string name = profile_ ? "matmul_backward " + gemm_dims(N, C, OC) : std::string();
  KernelProfile::Scope timed(profile_, name,
                             ((dinp ? 2.0 : 0.0) + (dweight ? 2.0 : 0.0)) * N * C * OC);
  const DType a = inp.dtype();
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_backward<T>(*gemm_, dinp ? ptr<T>(*dinp) : nullptr,
                            dweight ? ptr<Acc<T>>(*dweight) : nullptr,
                            dbias ? ptr<Acc<T>>(*dbias) : nullptr, ptr<T>(dout), ptr<T>(inp),
                            dinp ? ptr<T>(weight) : nullptr, N, C, OC,
                            dweight_write == GradWrite::Assign ? cpu::Accumulate::Assign
                                                               : cpu::Accumulate::Add);
  });
}

void CpuBackend::do_bias_forward(Tensor& out, const Tensor& bias) {
  const char* op = "bias_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_forward<T>(ptr<T>(out), ptr<T>(bias), rows_of(out), cols_of(out));
  });
}

void CpuBackend::do_bias_backward(Tensor& dbias, const Tensor& dout) {
  const char* op = "bias_backward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_backward<T>(ptr<Acc<T>>(dbias), ptr<T>(dout), rows_of(dout), cols_of(dout));
  });
}

void CpuBackend::do_gelu_forward(Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(inp), inp.numel());
  });
}

void CpuBackend::do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const char* op = "gelu_backward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(ptr<T>(dinp), ptr<T>(inp), ptr<T>(dout), inp.numel());
  });
}

// oneDNN's matmul writes one tensor, and the backward needs the pre-activation as well as GELU
// of it, so the forward stays matmul_forward then gelu_forward (the backend.h default). The
// backward needs no workspace: the product lands in dpre and GELU's derivative scales it in
// place (gelu_backward reads each element before writing it), with the default's bits.
void CpuBackend::do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                         const Tensor& pre) {
  matmul_backward(&dpre, nullptr, nullptr, dout, pre, weight);  // `pre`: only its shape
  gelu_backward(dpre, pre, dpre);
}

Backend::AttentionStash CpuBackend::attention_stash(int64_t B, int64_t T, int64_t NH,
                                                    DType activations) const {
  if (planning_ && planned_attention_ != Device::Cpu)
    return Backend::attention_stash(B, T, NH, activations);
  return {{B, NH, T}, cpu::wide(activations)};
}

// Scratch (Workspace, counted by the planner): per thread a block of scores and its partners,
// kernels.h says how much.
void CpuBackend::do_attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B,
                                      int64_t T, const AttentionDims& dims,
                                      const Tensor* document_starts) {
  run_attention_forward(out, stash, nullptr, qkv, B, T, dims, document_starts);
}

void CpuBackend::attention_forward_recording_max(Tensor& out, Tensor& stash, Tensor& row_max,
                                                 const Tensor& qkv, int64_t B, int64_t T,
                                                 const AttentionDims& dims,
                                                 const Tensor* document_starts) {
  if (row_max.shape() != stash.shape() || row_max.dtype() != stash.dtype())
    throw std::invalid_argument("attention_forward_recording_max: row_max must have the stash's "
                                "shape and dtype (B, NH, T)");
  run_attention_forward(out, stash, &row_max, qkv, B, T, dims, document_starts);
}

void CpuBackend::run_attention_forward(Tensor& out, Tensor& stash, Tensor* row_max,
                                       const Tensor& qkv, int64_t B, int64_t T,
                                       const AttentionDims& dims, const Tensor* document_starts) {
  const char* op = "attention_forward";
  // The time model and this profile count the whole causal triangle, masked or not: QK^T on
  // HS columns, PV on HV.
  const double HS = double(dims.HS), HV = double(dims.value_size());
  KernelProfile::Scope timed(profile_, op, 2.0 * B * dims.NH * T * T * (HS + HV));
  const DType a = qkv.dtype();
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    Tensor scratch = empty({cpu::attention_forward_scratch<E>(B, T, dims, threads())},
                           cpu::wide(a), MemoryCategory::Workspace);
    if (planning_) return;
    const int32_t* starts = document_starts ? ptr<int32_t>(*document_starts) : nullptr;
    cpu::check_document_starts(op, starts, B, T);
    cpu::attention_forward<E>(*gemm_, ptr<E>(out), ptr<Acc<E>>(stash), ptr<E>(qkv), B, T, dims,
                              ptr<Acc<E>>(scratch), starts, threads(),
                              row_max ? ptr<Acc<E>>(*row_max) : nullptr);
  });
}

void CpuBackend::do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& stash, int64_t B,
                                       int64_t T, const AttentionDims& dims,
                                       const Tensor* document_starts) {
  const char* op = "attention_backward";
  // dQ and dK on HS columns, dP and dV on HV (the recomputed scores not counted).
  const double HS = double(dims.HS), HV = double(dims.value_size());
  KernelProfile::Scope timed(profile_, op, 4.0 * B * dims.NH * T * T * (HS + HV));
  const DType a = qkv.dtype();
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    Tensor scratch = empty({cpu::attention_backward_scratch<E>(B, T, dims, threads())},
                           cpu::wide(a), MemoryCategory::Workspace);
    if (planning_) return;
    const int32_t* starts = document_starts ? ptr<int32_t>(*document_starts) : nullptr;
    cpu::check_document_starts(op, starts, B, T);
    cpu::attention_backward<E>(*gemm_, ptr<E>(dqkv), ptr<E>(dout), ptr<E>(qkv), ptr<E>(out),
                               ptr<Acc<E>>(stash), B, T, dims, ptr<Acc<E>>(scratch), starts,
                               threads());
  });
}

void CpuBackend::do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  const char* op = "crossentropy_stats";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  dispatch(planning_, op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_stats<T>(ptr<Acc<T>>(row_max), ptr<Acc<T>>(row_sumexp), ptr<T>(logits), N,
                               V);
  });
}

// Statistics only: fp32 or fp64 (the statistics of bf16 logits are fp32).
void CpuBackend::do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                        const Tensor& global_max) {
  const char* op = "crossentropy_rebase";
  KernelProfile::Scope timed(profile_, op);
  const DType s = row_sumexp.dtype();
  dispatch(planning_, op, s, [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::crossentropy_rebase<T>(ptr<T>(row_sumexp), ptr<T>(local_max), ptr<T>(global_max),
                                row_sumexp.numel());
  });
}

void CpuBackend::do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                              const Tensor& targets, int64_t vocab_begin) {
  const char* op = "crossentropy_target_logit";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  dispatch(planning_, op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_target_logit<T>(ptr<Acc<T>>(target_logit), ptr<T>(logits),
                                      ptr<int32_t>(targets), vocab_begin, N, V);
  });
}

void CpuBackend::do_crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                        const Tensor& row_sumexp, const Tensor& target_logit) {
  const char* op = "crossentropy_losses";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = losses.numel();
  const DType s = losses.dtype();
  dispatch(planning_, op, s, [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::crossentropy_losses<T>(ptr<T>(losses), ptr<T>(row_max), ptr<T>(row_sumexp),
                                ptr<T>(target_logit), N);
  });
}

void CpuBackend::do_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                          const Tensor& row_max, const Tensor& row_sumexp,
                                          const Tensor& targets, int64_t vocab_begin,
                                          double dloss) {
  const char* op = "crossentropy_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  const DType a = logits.dtype();
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_backward<T>(ptr<T>(dlogits), ptr<T>(logits), ptr<Acc<T>>(row_max),
                                  ptr<Acc<T>>(row_sumexp), ptr<int32_t>(targets), vocab_begin,
                                  static_cast<Acc<T>>(dloss), N, V);
  });
}

}  // namespace meshtrain
