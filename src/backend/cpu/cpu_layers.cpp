// CpuBackend: the layers, attention, cross-entropy and AdamW — dtype and shape checks
// (cpu_checks.h: which tensors follow the activations and which stay wide under bf16), then the
// kernels of kernels.h.

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
using cpu::require;
using cpu::rows_of;
using cpu::same_dtype;
using cpu::wide_grad;
using cpu::wide_stat;

namespace {
std::string gemm_dims(int64_t M, int64_t N, int64_t K) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}
}  // namespace

void CpuBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                   const Tensor& weight, const Tensor& bias) {
  const char* op = "layernorm_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  require(out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
              bias.numel() == C,
          op, "shape mismatch for inp " + inp.shape().to_string());
  const DType a = inp.dtype();
  same_dtype(op, a, "out", out);
  same_dtype(op, a, "weight", weight);
  same_dtype(op, a, "bias", bias);
  wide_stat(op, a, "mean", mean);
  wide_stat(op, a, "rstd", rstd);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_forward<T>(ptr<T>(out), ptr<Acc<T>>(mean), ptr<Acc<T>>(rstd), ptr<T>(inp),
                              ptr<T>(weight), ptr<T>(bias), N, C);
  });
}

void CpuBackend::layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(inp), C = cols_of(inp);
  require(dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C &&
              dbias.numel() == C && mean.numel() == N && rstd.numel() == N,
          op, "shape mismatch for inp " + inp.shape().to_string());
  const DType a = inp.dtype();
  same_dtype(op, a, "dinp", dinp);
  same_dtype(op, a, "dout", dout);
  same_dtype(op, a, "weight", weight);
  wide_grad(op, a, "dweight", dweight);
  wide_grad(op, a, "dbias", dbias);
  wide_stat(op, a, "mean", mean);
  wide_stat(op, a, "rstd", rstd);
  Tensor scratch = empty({int64_t{threads()} * 2 * C}, cpu::wide(a), MemoryCategory::Workspace);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(ptr<T>(dinp), ptr<Acc<T>>(dweight), ptr<Acc<T>>(dbias),
                               ptr<T>(dout), ptr<T>(inp), ptr<T>(weight), ptr<Acc<T>>(mean),
                               ptr<Acc<T>>(rstd), N, C, ptr<Acc<T>>(scratch));
  });
}

void CpuBackend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor* bias) {
  const char* op = "matmul_forward";
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  const std::string name = profile_ ? "matmul_forward " + gemm_dims(N, OC, C) : std::string();
  KernelProfile::Scope timed(profile_, name, 2.0 * N * C * OC);
  require(cols_of(weight) == C && out.numel() == N * OC && (!bias || bias->numel() == OC), op,
          "inp " + inp.shape().to_string() + " weight " + weight.shape().to_string() + " out " +
              out.shape().to_string());
  const DType a = inp.dtype();
  same_dtype(op, a, "weight", weight);
  same_dtype(op, a, "out", out);
  if (bias) same_dtype(op, a, "bias", *bias);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_forward<T>(*gemm_, ptr<T>(out), ptr<T>(inp), ptr<T>(weight),
                           bias ? ptr<T>(*bias) : nullptr, N, C, OC);
  });
}

void CpuBackend::matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight) {
  const char* op = "matmul_backward";
  // OC from dout: a weight-gradient-only call (zero-bubble schedules) may run after ZeRO-3 has
  // released the weight, which only the input gradient reads.
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = cols_of(dout);
  // Named by the input-gradient GEMM dinp (N, C) = dout (N, OC) @ W; dW is OC x C x N.
  const std::string name = profile_ ? "matmul_backward " + gemm_dims(N, C, OC) : std::string();
  KernelProfile::Scope timed(profile_, name, ((dinp ? 2.0 : 0.0) + (dweight ? 2.0 : 0.0)) * N * C * OC);
  require(rows_of(dout) == N && (!dweight || dweight->numel() == OC * C) &&
              (!dinp || (dinp->numel() == N * C && weight.numel() == OC * C)) &&
              (!dbias || dbias->numel() == OC),
          op, "inp " + inp.shape().to_string() + " weight " + weight.shape().to_string() +
                  " dout " + dout.shape().to_string());
  const DType a = inp.dtype();
  same_dtype(op, a, "dout", dout);
  if (dinp) {
    same_dtype(op, a, "weight", weight);
    same_dtype(op, a, "dinp", *dinp);
  }
  if (dweight) wide_grad(op, a, "dweight", *dweight);
  if (dbias) wide_grad(op, a, "dbias", *dbias);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_backward<T>(*gemm_, dinp ? ptr<T>(*dinp) : nullptr,
                            dweight ? ptr<Acc<T>>(*dweight) : nullptr,
                            dbias ? ptr<Acc<T>>(*dbias) : nullptr, ptr<T>(dout), ptr<T>(inp),
                            dinp ? ptr<T>(weight) : nullptr, N, C, OC);
  });
}

void CpuBackend::bias_forward(Tensor& out, const Tensor& bias) {
  const char* op = "bias_forward";
  KernelProfile::Scope timed(profile_, op);
  require(cols_of(out) == bias.numel(), op,
          "bias of " + bias.shape().to_string() + " for out " + out.shape().to_string());
  same_dtype(op, out.dtype(), "bias", bias);
  dispatch(planning_, op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_forward<T>(ptr<T>(out), ptr<T>(bias), rows_of(out), cols_of(out));
  });
}

void CpuBackend::bias_backward(Tensor& dbias, const Tensor& dout) {
  const char* op = "bias_backward";
  KernelProfile::Scope timed(profile_, op);
  require(cols_of(dout) == dbias.numel(), op,
          "dbias of " + dbias.shape().to_string() + " for dout " + dout.shape().to_string());
  wide_grad(op, dout.dtype(), "dbias", dbias);
  dispatch(planning_, op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_backward<T>(ptr<Acc<T>>(dbias), ptr<T>(dout), rows_of(dout), cols_of(dout));
  });
}

void CpuBackend::gelu_forward(Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  KernelProfile::Scope timed(profile_, op);
  require(out.shape() == inp.shape(), op,
          "out " + out.shape().to_string() + " for inp " + inp.shape().to_string());
  same_dtype(op, inp.dtype(), "out", out);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(inp), inp.numel());
  });
}

void CpuBackend::gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const char* op = "gelu_backward";
  KernelProfile::Scope timed(profile_, op);
  require(dinp.shape() == inp.shape() && dout.shape() == inp.shape(), op,
          "dinp " + dinp.shape().to_string() + ", dout " + dout.shape().to_string() +
              " for inp " + inp.shape().to_string());
  same_dtype(op, inp.dtype(), "dinp", dinp);
  same_dtype(op, inp.dtype(), "dout", dout);
  dispatch(planning_, op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(ptr<T>(dinp), ptr<T>(inp), ptr<T>(dout), inp.numel());
  });
}

// Scratch (Workspace, counted by the planner): bf16 forward keeps its fp32 scores there;
// backward its dS (and under bf16 the fp32 dP), kernels.h says how much.
void CpuBackend::attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B,
                                   int64_t T, int64_t NH, int64_t HS) {
  const char* op = "attention_forward";
  KernelProfile::Scope timed(profile_, op, 4.0 * B * NH * T * T * HS);
  require(qkv.numel() == B * T * 3 * NH * HS && out.numel() == B * T * NH * HS &&
              probs.numel() == B * NH * T * T,
          op, "shape mismatch");
  const DType a = qkv.dtype();
  same_dtype(op, a, "out", out);
  same_dtype(op, a, "probs", probs);
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    const int64_t elements = cpu::attention_forward_scratch<E>(*gemm_, B, T, NH);
    Tensor scratch;
    if (elements > 0) scratch = empty({elements}, cpu::wide(a), MemoryCategory::Workspace);
    if (planning_) return;
    cpu::attention_forward<E>(*gemm_, ptr<E>(out), ptr<E>(probs), ptr<E>(qkv), B, T, NH, HS,
                              elements > 0 ? ptr<Acc<E>>(scratch) : nullptr);
  });
}

void CpuBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                    const Tensor& probs, int64_t B, int64_t T, int64_t NH,
                                    int64_t HS) {
  const char* op = "attention_backward";
  KernelProfile::Scope timed(profile_, op, 8.0 * B * NH * T * T * HS);
  require(dqkv.shape() == qkv.shape() && dout.numel() == B * T * NH * HS &&
              probs.numel() == B * NH * T * T,
          op, "shape mismatch");
  const DType a = qkv.dtype();
  same_dtype(op, a, "dqkv", dqkv);
  same_dtype(op, a, "dout", dout);
  same_dtype(op, a, "probs", probs);
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    Tensor scratch = empty({cpu::attention_backward_scratch<E>(*gemm_, B, T, NH, threads())},
                           cpu::wide(a), MemoryCategory::Workspace);
    if (planning_) return;
    cpu::attention_backward<E>(*gemm_, ptr<E>(dqkv), ptr<E>(dout), ptr<E>(qkv), ptr<E>(probs), B,
                               T, NH, HS, ptr<Acc<E>>(scratch));
  });
}

void CpuBackend::crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  const char* op = "crossentropy_stats";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(row_max.numel() == N && row_sumexp.numel() == N, op, "shape mismatch");
  wide_stat(op, logits.dtype(), "row_max", row_max);
  wide_stat(op, logits.dtype(), "row_sumexp", row_sumexp);
  dispatch(planning_, op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_stats<T>(ptr<Acc<T>>(row_max), ptr<Acc<T>>(row_sumexp), ptr<T>(logits), N,
                               V);
  });
}

// Statistics only: fp32 or fp64 (the statistics of bf16 logits are fp32).
void CpuBackend::crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                     const Tensor& global_max) {
  const char* op = "crossentropy_rebase";
  KernelProfile::Scope timed(profile_, op);
  require(local_max.numel() == row_sumexp.numel() && global_max.numel() == row_sumexp.numel(), op,
          "size mismatch");
  const DType s = row_sumexp.dtype();
  if (s == DType::BF16) cpu::unsupported(op, s);
  wide_stat(op, s, "local_max", local_max);
  wide_stat(op, s, "global_max", global_max);
  dispatch(planning_, op, s, [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::crossentropy_rebase<T>(ptr<T>(row_sumexp), ptr<T>(local_max), ptr<T>(global_max),
                                row_sumexp.numel());
  });
}

void CpuBackend::crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                           const Tensor& targets, int64_t vocab_begin) {
  const char* op = "crossentropy_target_logit";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(target_logit.numel() == N && targets.numel() == N, op, "shape mismatch");
  wide_stat(op, logits.dtype(), "target_logit", target_logit);
  dispatch(planning_, op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_target_logit<T>(ptr<Acc<T>>(target_logit), ptr<T>(logits),
                                      ptr<int32_t>(targets), vocab_begin, N, V);
  });
}

void CpuBackend::crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                     const Tensor& row_sumexp, const Tensor& target_logit) {
  const char* op = "crossentropy_losses";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = losses.numel();
  require(row_max.numel() == N && row_sumexp.numel() == N && target_logit.numel() == N, op,
          "size mismatch");
  const DType s = losses.dtype();
  if (s == DType::BF16) cpu::unsupported(op, s);
  wide_stat(op, s, "row_max", row_max);
  wide_stat(op, s, "row_sumexp", row_sumexp);
  wide_stat(op, s, "target_logit", target_logit);
  dispatch(planning_, op, s, [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::crossentropy_losses<T>(ptr<T>(losses), ptr<T>(row_max), ptr<T>(row_sumexp),
                                ptr<T>(target_logit), N);
  });
}

void CpuBackend::crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                       const Tensor& row_max, const Tensor& row_sumexp,
                                       const Tensor& targets, int64_t vocab_begin, double dloss) {
  const char* op = "crossentropy_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(dlogits.shape() == logits.shape() && row_max.numel() == N && row_sumexp.numel() == N &&
              targets.numel() == N,
          op, "shape mismatch");
  const DType a = logits.dtype();
  same_dtype(op, a, "dlogits", dlogits);
  wide_stat(op, a, "row_max", row_max);
  wide_stat(op, a, "row_sumexp", row_sumexp);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_backward<T>(ptr<T>(dlogits), ptr<T>(logits), ptr<Acc<T>>(row_max),
                                  ptr<Acc<T>>(row_sumexp), ptr<int32_t>(targets), vocab_begin,
                                  static_cast<Acc<T>>(dloss), N, V);
  });
}

// Master weights, gradients and moments: all fp32 or all fp64. A bf16 model's optimizer updates
// its fp32 master weights; the bf16 parameters are a cast of them (ModelState).
void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                              Tensor& exp_avg_sq, const AdamWStep& s) {
  const char* op = "adamw_update";
  KernelProfile::Scope timed(profile_, op);
  require(param.numel() == grad.numel() && param.numel() == exp_avg.numel() &&
              param.numel() == exp_avg_sq.numel(),
          op, "size mismatch");
  const DType p = param.dtype();
  const std::string rule = "master parameters, gradients and moments are fp32 (or all fp64)";
  if (p == DType::BF16) cpu::expect_dtype(op, p, "param", param, DType::F32, rule);
  cpu::expect_dtype(op, p, "grad", grad, p, rule);
  cpu::expect_dtype(op, p, "exp_avg", exp_avg, p, rule);
  cpu::expect_dtype(op, p, "exp_avg_sq", exp_avg_sq, p, rule);
  dispatch(planning_, op, p, [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::adamw_update<T>(ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq),
                         param.numel(), s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step,
                         s.grad_scale);
  });
}

}  // namespace meshtrain
