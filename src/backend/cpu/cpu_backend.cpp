#include "meshtrain/backend/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

namespace {

[[noreturn]] void unsupported(const char* op, DType t) {
  throw std::invalid_argument(std::string("backend 'cpu' does not support ") + op +
                              " for dtype " + std::string(dtype_name(t)));
}

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("backend 'cpu': ") + op + ": " + what);
}

void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  require(a.shape() == b.shape() && a.dtype() == b.dtype(), op,
          "tensors differ: " + a.shape().to_string() + " " + std::string(dtype_name(a.dtype())) +
              " vs " + b.shape().to_string() + " " + std::string(dtype_name(b.dtype())));
}

// Calls f(float{}) or f(double{}) for the tensor's dtype; in planning mode only checks it.
template <class F> void dispatch(bool planning, const char* op, DType t, F&& f) {
  if (planning) {  // plans of GPU runs (bf16) are made with this backend too
    if (t != DType::F32 && t != DType::F64 && t != DType::BF16) unsupported(op, t);
    return;
  }
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default: unsupported(op, t);
  }
}

int64_t rows_of(const Tensor& t) { return t.shape().rank() == 0 ? 0 : t.numel() / t.dim(t.shape().rank() - 1); }
int64_t cols_of(const Tensor& t) { return t.dim(t.shape().rank() - 1); }

std::string gemm_dims(int64_t M, int64_t N, int64_t K) {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}

}  // namespace

namespace {
std::unique_ptr<Allocator> make_allocator(Execution e) {
  if (e == Execution::Plan) return std::make_unique<MetaAllocator>(Device::Cpu);
  return std::make_unique<HostAllocator>();
}
}  // namespace

CpuBackend::CpuBackend(int threads, Execution execution)
    : Backend(make_allocator(execution)),
      planning_(execution == Execution::Plan),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      gemm_(std::make_unique<cpu::Gemm>()) {
  if (!planning_ && threads > 0) omp_set_num_threads(threads);
}

CpuBackend::CpuBackend(int threads, std::unique_ptr<Allocator> allocator)
    : Backend(std::move(allocator)),
      planning_(false),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      gemm_(std::make_unique<cpu::Gemm>()) {
  if (threads > 0) omp_set_num_threads(threads);
}

int CpuBackend::threads() const { return planning_ ? threads_ : omp_get_max_threads(); }

std::string CpuBackend::describe() const {
  return "cpu (" + cpu::Gemm::onednn_version() + " + OpenBLAS, OpenMP), " +
         std::to_string(threads()) + " thread(s) per rank";
}

void CpuBackend::fill(Tensor& t, double value) {
  KernelProfile::Scope timed(profile_, "fill");
  if (planning_) return;
  if (t.dtype() == DType::I32) {
    int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(value);
    return;
  }
  dispatch(planning_, "fill", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::fill<T>(t.data<T>(), static_cast<T>(value), t.numel());
  });
}

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "copy");
  same_shape("copy", dst, src);
  if (!planning_) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::cast(Tensor& dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "cast");
  require(dst.numel() == src.numel(), "cast",
          "element counts differ: " + dst.shape().to_string() + " vs " + src.shape().to_string());
  const DType to = dst.dtype(), from = src.dtype();
  const int64_t n = src.numel();
  if (planning_) return;
  if (to == from) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
  } else if (to == DType::F64 && from == DType::F32) {
    cpu::convert(dst.data<double>(), src.data<float>(), n);
  } else if (to == DType::F32 && from == DType::F64) {
    cpu::convert(dst.data<float>(), src.data<double>(), n);
  } else if (to == DType::BF16 && from == DType::F32) {
    cpu::float_to_bf16(static_cast<uint16_t*>(dst.raw()), src.data<float>(), n);
  } else if (to == DType::F32 && from == DType::BF16) {
    cpu::bf16_to_float(dst.data<float>(), static_cast<const uint16_t*>(src.raw()), n);
  } else {
    throw std::invalid_argument("backend 'cpu' does not support cast for dtype " +
                                std::string(dtype_name(from)) + " -> " +
                                std::string(dtype_name(to)) +
                                " (supported: fp32 <-> fp64, fp32 <-> bf16)");
  }
}

void CpuBackend::copy_from_host(Tensor& dst, const void* src) {
  KernelProfile::Scope timed(profile_, "copy_from_host");
  if (!planning_) std::memcpy(dst.raw(), src, dst.nbytes());
}

// In planning mode `dst` may itself be planned (a fake address): nothing is written.
void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "copy_to_host");
  if (!planning_) std::memcpy(dst, src.raw(), src.nbytes());
}

void CpuBackend::add_inplace(Tensor& dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "add_inplace");
  require(dst.numel() == src.numel() && dst.dtype() == src.dtype(), "add_inplace", "size mismatch");
  dispatch(planning_, "add_inplace", dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::add_inplace<T>(dst.data<T>(), src.data<T>(), dst.numel());
  });
}

void CpuBackend::scale_inplace(Tensor& t, double factor) {
  KernelProfile::Scope timed(profile_, "scale_inplace");
  dispatch(planning_, "scale_inplace", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::scale_inplace<T>(t.data<T>(), static_cast<T>(factor), t.numel());
  });
}

void CpuBackend::residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  KernelProfile::Scope timed(profile_, "residual_forward");
  require(out.numel() == a.numel() && a.numel() == b.numel(), "residual_forward", "size mismatch");
  dispatch(planning_, "residual_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::residual_forward<T>(out.data<T>(), a.data<T>(), b.data<T>(), out.numel());
  });
}

double CpuBackend::sum_squares(const Tensor& t) {
  KernelProfile::Scope timed(profile_, "sum_squares");
  double r = 0;
  dispatch(planning_, "sum_squares", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    r = cpu::sum_squares<T>(t.data<T>(), t.numel());
  });
  return r;
}

double CpuBackend::sum(const Tensor& t) {
  KernelProfile::Scope timed(profile_, "sum");
  double r = 0;
  dispatch(planning_, "sum", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    r = cpu::sum<T>(t.data<T>(), t.numel());
  });
  return r;
}

void CpuBackend::reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) {
  KernelProfile::Scope timed(profile_, "reduce_into");
  require(out.dtype() == DType::F64 && slot >= 0 && slot < out.numel(), "reduce_into",
          "out must be fp64 with slot " + std::to_string(slot) + " in range, got " +
              out.shape().to_string() + " " + std::string(dtype_name(out.dtype())));
  const double r = what == Reduction::Sum ? sum(t) : sum_squares(t);
  if (!planning_) out.data<double>()[slot] = r;
}

void CpuBackend::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                                   int64_t vocab_begin) {
  KernelProfile::Scope timed(profile_, "embedding_forward");
  const int64_t N = tokens.numel(), C = cols_of(wte);
  require(rows_of(out) == N && cols_of(out) == C, "embedding_forward", "out must be (N, C)");
  dispatch(planning_, "embedding_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(out.data<T>(), tokens.data<int32_t>(), wte.data<T>(), vocab_begin,
                              rows_of(wte), N, C);
  });
}

void CpuBackend::embedding_backward(Tensor& dwte, const Tensor& dout, const Tensor& tokens,
                                    int64_t vocab_begin) {
  KernelProfile::Scope timed(profile_, "embedding_backward");
  const int64_t N = tokens.numel(), C = cols_of(dwte);
  require(rows_of(dout) == N && cols_of(dout) == C, "embedding_backward", "dout must be (N, C)");
  dispatch(planning_, "embedding_backward", dwte.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(dwte.data<T>(), dout.data<T>(), tokens.data<int32_t>(), vocab_begin,
                               rows_of(dwte), N, C);
  });
}

void CpuBackend::position_forward(Tensor& out, const Tensor& wpe, int64_t token_begin) {
  KernelProfile::Scope timed(profile_, "position_forward");
  require(cols_of(out) == cols_of(wpe), "position_forward", "channel mismatch");
  dispatch(planning_, "position_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::position_forward<T>(out.data<T>(), wpe.data<T>(), token_begin, rows_of(wpe), rows_of(out),
                             cols_of(out));
  });
}

void CpuBackend::position_backward(Tensor& dwpe, const Tensor& dout, int64_t token_begin) {
  KernelProfile::Scope timed(profile_, "position_backward");
  require(cols_of(dout) == cols_of(dwpe), "position_backward", "channel mismatch");
  dispatch(planning_, "position_backward", dwpe.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::position_backward<T>(dwpe.data<T>(), dout.data<T>(), token_begin, rows_of(dwpe),
                              rows_of(dout), cols_of(dout));
  });
}

void CpuBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                   const Tensor& weight, const Tensor& bias) {
  KernelProfile::Scope timed(profile_, "layernorm_forward");
  const int64_t N = rows_of(inp), C = cols_of(inp);
  require(out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
              bias.numel() == C,
          "layernorm_forward", "shape mismatch for inp " + inp.shape().to_string());
  dispatch(planning_, "layernorm_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_forward<T>(out.data<T>(), mean.data<T>(), rstd.data<T>(), inp.data<T>(),
                              weight.data<T>(), bias.data<T>(), N, C);
  });
}

void CpuBackend::layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  KernelProfile::Scope timed(profile_, "layernorm_backward");
  const int64_t N = rows_of(inp), C = cols_of(inp);
  require(dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C &&
              dbias.numel() == C,
          "layernorm_backward", "shape mismatch for inp " + inp.shape().to_string());
  Tensor scratch = empty({int64_t{threads()} * 2 * C}, inp.dtype(), MemoryCategory::Workspace);
  dispatch(planning_, "layernorm_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(dinp.data<T>(), dweight.data<T>(), dbias.data<T>(), dout.data<T>(),
                               inp.data<T>(), weight.data<T>(), mean.data<T>(), rstd.data<T>(), N,
                               C, scratch.data<T>());
  });
}

void CpuBackend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor* bias) {
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  const std::string op = profile_ ? "matmul_forward " + gemm_dims(N, OC, C) : std::string();
  KernelProfile::Scope timed(profile_, op, 2.0 * N * C * OC);
  require(cols_of(weight) == C && out.numel() == N * OC && (!bias || bias->numel() == OC),
          "matmul_forward",
          "inp " + inp.shape().to_string() + " weight " + weight.shape().to_string() + " out " +
              out.shape().to_string());
  dispatch(planning_, "matmul_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_forward<T>(*gemm_, out.data<T>(), inp.data<T>(), weight.data<T>(),
                           bias ? bias->data<T>() : nullptr, N, C, OC);
  });
}

void CpuBackend::matmul_backward(Tensor* dinp, Tensor& dweight, Tensor* dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight) {
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  // Named by the input-gradient GEMM dinp (N, C) = dout (N, OC) @ W; dW is OC x C x N.
  const std::string op = profile_ ? "matmul_backward " + gemm_dims(N, C, OC) : std::string();
  KernelProfile::Scope timed(profile_, op, (dinp ? 4.0 : 2.0) * N * C * OC);
  require(dout.numel() == N * OC && dweight.numel() == OC * C && (!dinp || dinp->numel() == N * C) &&
              (!dbias || dbias->numel() == OC),
          "matmul_backward",
          "inp " + inp.shape().to_string() + " weight " + weight.shape().to_string() + " dout " +
              dout.shape().to_string());
  dispatch(planning_, "matmul_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::matmul_backward<T>(*gemm_, dinp ? dinp->data<T>() : nullptr, dweight.data<T>(),
                            dbias ? dbias->data<T>() : nullptr, dout.data<T>(), inp.data<T>(),
                            weight.data<T>(), N, C, OC);
  });
}

void CpuBackend::bias_forward(Tensor& out, const Tensor& bias) {
  KernelProfile::Scope timed(profile_, "bias_forward");
  require(cols_of(out) == bias.numel(), "bias_forward", "bias of " + bias.shape().to_string() +
                                                            " for out " + out.shape().to_string());
  dispatch(planning_, "bias_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_forward<T>(out.data<T>(), bias.data<T>(), rows_of(out), cols_of(out));
  });
}

void CpuBackend::bias_backward(Tensor& dbias, const Tensor& dout) {
  KernelProfile::Scope timed(profile_, "bias_backward");
  require(cols_of(dout) == dbias.numel(), "bias_backward", "dbias of " + dbias.shape().to_string() +
                                                               " for dout " + dout.shape().to_string());
  dispatch(planning_, "bias_backward", dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_backward<T>(dbias.data<T>(), dout.data<T>(), rows_of(dout), cols_of(dout));
  });
}

void CpuBackend::gelu_forward(Tensor& out, const Tensor& inp) {
  KernelProfile::Scope timed(profile_, "gelu_forward");
  same_shape("gelu_forward", out, inp);
  dispatch(planning_, "gelu_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(out.data<T>(), inp.data<T>(), inp.numel());
  });
}

void CpuBackend::gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  KernelProfile::Scope timed(profile_, "gelu_backward");
  same_shape("gelu_backward", dinp, inp);
  same_shape("gelu_backward", dout, inp);
  dispatch(planning_, "gelu_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(dinp.data<T>(), inp.data<T>(), dout.data<T>(), inp.numel());
  });
}

void CpuBackend::attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B,
                                   int64_t T, int64_t NH, int64_t HS) {
  KernelProfile::Scope timed(profile_, "attention_forward", 4.0 * B * NH * T * T * HS);
  require(qkv.numel() == B * T * 3 * NH * HS && out.numel() == B * T * NH * HS &&
              probs.numel() == B * NH * T * T,
          "attention_forward", "shape mismatch");
  dispatch(planning_, "attention_forward", qkv.dtype(), [&](auto tag) {
    using E = decltype(tag);
    cpu::attention_forward<E>(*gemm_, out.data<E>(), probs.data<E>(), qkv.data<E>(), B, T, NH, HS);
  });
}

void CpuBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                    const Tensor& probs, int64_t B, int64_t T, int64_t NH,
                                    int64_t HS) {
  KernelProfile::Scope timed(profile_, "attention_backward", 8.0 * B * NH * T * T * HS);
  same_shape("attention_backward", dqkv, qkv);
  require(dout.numel() == B * T * NH * HS && probs.numel() == B * NH * T * T, "attention_backward",
          "shape mismatch");
  const int64_t scratch_elements = cpu::attention_backward_scratch(
      *gemm_, qkv.dtype() == DType::F32, B, T, NH, threads());
  Tensor scratch = empty({scratch_elements}, qkv.dtype(), MemoryCategory::Workspace);
  dispatch(planning_, "attention_backward", qkv.dtype(), [&](auto tag) {
    using E = decltype(tag);
    cpu::attention_backward<E>(*gemm_, dqkv.data<E>(), dout.data<E>(), qkv.data<E>(), probs.data<E>(), B, T,
                               NH, HS, scratch.data<E>());
  });
}

void CpuBackend::crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  KernelProfile::Scope timed(profile_, "crossentropy_stats");
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(row_max.numel() == N && row_sumexp.numel() == N, "crossentropy_stats", "shape mismatch");
  dispatch(planning_, "crossentropy_stats", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_stats<T>(row_max.data<T>(), row_sumexp.data<T>(), logits.data<T>(), N, V);
  });
}

void CpuBackend::crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                     const Tensor& global_max) {
  KernelProfile::Scope timed(profile_, "crossentropy_rebase");
  dispatch(planning_, "crossentropy_rebase", row_sumexp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_rebase<T>(row_sumexp.data<T>(), local_max.data<T>(), global_max.data<T>(),
                                row_sumexp.numel());
  });
}

void CpuBackend::crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                           const Tensor& targets, int64_t vocab_begin) {
  KernelProfile::Scope timed(profile_, "crossentropy_target_logit");
  const int64_t N = rows_of(logits), V = cols_of(logits);
  require(target_logit.numel() == N && targets.numel() == N, "crossentropy_target_logit",
          "shape mismatch");
  dispatch(planning_, "crossentropy_target_logit", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_target_logit<T>(target_logit.data<T>(), logits.data<T>(),
                                      targets.data<int32_t>(), vocab_begin, N, V);
  });
}

void CpuBackend::crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                     const Tensor& row_sumexp, const Tensor& target_logit) {
  KernelProfile::Scope timed(profile_, "crossentropy_losses");
  dispatch(planning_, "crossentropy_losses", losses.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_losses<T>(losses.data<T>(), row_max.data<T>(), row_sumexp.data<T>(),
                                target_logit.data<T>(), losses.numel());
  });
}

void CpuBackend::crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                       const Tensor& row_max, const Tensor& row_sumexp,
                                       const Tensor& targets, int64_t vocab_begin, double dloss) {
  KernelProfile::Scope timed(profile_, "crossentropy_backward");
  same_shape("crossentropy_backward", dlogits, logits);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  dispatch(planning_, "crossentropy_backward", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_backward<T>(dlogits.data<T>(), logits.data<T>(), row_max.data<T>(),
                                  row_sumexp.data<T>(), targets.data<int32_t>(), vocab_begin,
                                  static_cast<T>(dloss), N, V);
  });
}

void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                              Tensor& exp_avg_sq, const AdamWStep& s) {
  KernelProfile::Scope timed(profile_, "adamw_update");
  require(param.numel() == grad.numel() && param.numel() == exp_avg.numel() &&
              param.numel() == exp_avg_sq.numel(),
          "adamw_update", "size mismatch");
  dispatch(planning_, "adamw_update", param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw_update<T>(param.data<T>(), grad.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(),
                         param.numel(), s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step,
                         s.grad_scale);
  });
}

}  // namespace meshtrain
