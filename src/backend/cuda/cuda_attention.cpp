// Causal attention: routing between cuDNN's fused kernels and the backend's own implementation,
// and the own implementation's GEMMs.
//
// Own implementation, per batch entry b (batched over heads: a head's Q and K are the columns
// h*HS..h*HS+HS-1 of their part of qkv's rows, its V h*HV..h*HV+HV-1, so the batch strides are
// HS and HV; with grouped-query heads one call per member of a group, OwnLayout below),
// column-major views of row-major matrices as in cuda_matmul.cpp, scale = dims.softmax_scale()
// (1/sqrt(HS) by default), value heads of HV (HS by default; multi-head latent attention: HS 192,
// HV 128):
//   S^T (T x T) = K Q^T * scale        (into probs in fp32, into an fp32 scratch in bf16)
//   P = causal softmax of S            (attention.cu; probs keeps it, zeros above the diagonal)
//   O^T (HV x T) = V^T P^T
// backward:
//   dP^T = V dO^T;   dV^T = dO^T P;   dS = P (dP - rowsum(P dP)) scale;
//   dQ^T = K^T dS^T; dK^T = Q^T dS
// (dK and dV of a key/value head summed over its group's query heads, in order).
// The GEMMs run over full T x T tiles (the zeros above the diagonal make that exact); half of
// that work is wasted, which the cuDNN path avoids.
//
// cuDNN path (bf16): probs is only scratch; its bytes hold the row log-sum-exp (B, NH, T) fp32
// at offset 0 and, 256 bytes aligned after it, a copy of out (B, T, NH, HS) bf16, which the
// fused backward needs and the Backend interface does not pass back. cuDNN takes grouped-query
// heads natively (K and V of KVH heads; cudnn_attention.h). Its graph here is built for value
// heads of HS and the default scale: other dims take the own kernels (cudnn_refusal says why).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "backend_util.h"
#include "cuda_check.h"

namespace meshtrain {

using cuda::bf16;

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t cudnn_scratch_bytes(int64_t B, int64_t T, int64_t NH, int64_t HS) {  // stats, out copy
  return align_up(static_cast<size_t>(B * NH * T) * sizeof(float)) +
         static_cast<size_t>(B * T * NH * HS) * sizeof(bf16);
}

// cuDNN's tensors are declared 16-byte aligned. Views from the caching allocator are, unless a
// caller slices at an odd offset; the decision between cuDNN and the own kernels must not depend
// on that (the backward pass reads what the forward pass stored), so misalignment is an error.
void require_aligned(const char* op, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      cuda::fail(op, "cuDNN attention needs 16-byte aligned tensors, got a view at " +
                         std::to_string(reinterpret_cast<uintptr_t>(p)) +
                         " (hint: attention = \"own\" accepts any view)");
}

}  // namespace

namespace {
// Why cuDNN cannot run this shape ("" if it can): the backend's own preconditions, then cuDNN's
// plans (built and cached on first use).
std::string cudnn_refusal(cuda::CudnnAttention* cudnn, const std::string& init_error, size_t probs_bytes,
                          int64_t B, int64_t T, const AttentionDims& dims) {
  const int64_t NH = dims.NH, KVH = dims.KVH, HS = dims.HS;
  if (!cudnn) return "cuDNN did not initialise: " + init_error;
  if (dims.value_size() != HS)
    return "the value heads (" + std::to_string(dims.value_size()) +
           ") differ in size from the query/key heads (" + std::to_string(HS) +
           "): meshtrain's cuDNN graph is built for equal sizes";
  if (dims.scale != 0.0)
    return "the softmax scale is not 1/sqrt(head size): meshtrain's cuDNN graph is built for "
           "the default scale";
  if (HS % 8 != 0) return "the head size is not a multiple of 8";
  if (probs_bytes < cudnn_scratch_bytes(B, T, NH, HS))
    return "the probs scratch is too small for the statistics and a copy of out (T < HS + 2)";
  std::string why;
  return cudnn->prepare({B, T, NH, KVH, HS}, &why) ? "" : why;
}
}  // namespace

bool CudaBackend::cudnn_attention_usable(const Tensor& qkv, const Tensor& probs, int64_t B,
                                         int64_t T, const AttentionDims& dims) {
  if (options_.attention == AttentionImpl::Own || qkv.dtype() != DType::BF16) return false;
  const int64_t NH = dims.NH, HS = dims.HS;
  const std::string why =
      cudnn_refusal(lib_->cudnn.get(), lib_->cudnn_error, probs.nbytes(), B, T, dims);
  if (why.empty()) return true;
  if (options_.attention == AttentionImpl::Cudnn)
    cuda::fail("attention_forward", "attention = \"cudnn\" but " + why);
  // Auto falls back, but never silently: where cuDNN must work (sm_80/sm_90, cuDNN 9) the
  // message says so, and it stays readable (attention_fallback) for benchmarks and tests.
  if (lib_->attention_fallback.empty()) {
    const RejectedAttention r =
        judge_rejected_attention(lib_->platform, qkv.dtype(), B, T, NH, HS, why,
                                 dims.value_size(), dims.scale);
    lib_->attention_fallback = r.message;
    std::fprintf(stderr, "meshtrain: warning: backend 'cuda': %s; using the backend's own "
                 "attention kernels%s\n", r.message.c_str(),
                 r.is_error ? " (slower; a bug in meshtrain's cuDNN graph or a broken cuDNN "
                              "install: run.attention = \"cudnn\" stops on it)" : "");
  }
  return false;
}

AttentionImpl CudaBackend::attention_impl_for(DType dtype, int64_t B, int64_t T, int64_t NH,
                                              int64_t HS, std::string* why, int64_t KVH) {
  return attention_impl_for(dtype, B, T, AttentionDims{NH, KVH > 0 ? KVH : NH, HS}, why);
}

AttentionImpl CudaBackend::attention_impl_for(DType dtype, int64_t B, int64_t T,
                                              const AttentionDims& dims, std::string* why) {
  if (options_.attention == AttentionImpl::Own || dtype != DType::BF16) return AttentionImpl::Own;
  const std::string refusal = cudnn_refusal(
      lib_->cudnn.get(), lib_->cudnn_error,
      static_cast<size_t>(B * dims.NH * T * T) * sizeof(bf16), B, T, dims);
  if (why) *why = refusal;
  return refusal.empty() ? AttentionImpl::Cudnn : AttentionImpl::Own;
}

// Document masking (data.document_mask) has no CUDA kernel yet: cuDNN's fused attention
// takes padding, causal and sliding-window masks, none of which is block-causal over documents
// (that needs its score-modifier graphs or per-document ragged offsets), and the own kernels'
// softmax would need the starts too. The run refuses the key on this backend at startup
// (config/device_check.cpp); this refusal is what a direct caller meets.
namespace {
[[noreturn]] void refuse_document_mask(const char* op) {
  throw std::invalid_argument(std::string("backend 'cuda' does not support ") + op +
                              " with document_starts (data.document_mask = true): run it on "
                              "backend 'cpu', or set data.document_mask = false");
}
// Neither meshtrain's cuDNN graph nor the own kernels mask a sliding window (the deck refuses
// model.attention_window on CUDA: config/device_check.cpp; this stops any other caller).
void refuse_window(const char* op, const AttentionDims& dims) {
  if (dims.window == 0) return;
  throw std::invalid_argument(std::string("backend 'cuda' does not support ") + op +
                              " with a sliding window of " + std::to_string(dims.window) +
                              " keys (model.attention_window): run it on backend 'cpu', or set "
                              "model.attention_window = 0");
}
}  // namespace

void CudaBackend::do_attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B,
                                       int64_t T, const AttentionDims& dims,
                                       const Tensor* document_starts) {
  if (document_starts) refuse_document_mask("attention_forward");
  refuse_window("attention_forward", dims);
  const int64_t NH = dims.NH, KVH = dims.KVH, HS = dims.HS;
  // Causal work counted full, as PaLM does: QK^T and PV, 2 T^2 HS and 2 T^2 HV per head.
  cuda::TimedOp timed(profile_, stream_, "attention_forward",
                      2.0 * double(B) * double(NH) * double(T) * double(T) *
                          double(HS + dims.value_size()));
  const char* op = "attention_forward";
  if (!cudnn_attention_usable(qkv, probs, B, T, dims))
    return own_attention_forward(out, probs, qkv, B, T, dims);
  const cuda::AttentionShape shape{B, T, NH, KVH, HS};
  const size_t ws_bytes = lib_->cudnn->forward_workspace(shape);
  Tensor ws = empty({static_cast<int64_t>((ws_bytes + 3) / 4 + 1)}, DType::F32, MemoryCategory::Workspace);
  auto* scratch = static_cast<char*>(probs.raw());
  auto* stats = reinterpret_cast<float*>(scratch);
  require_aligned(op, {qkv.raw(), out.raw(), scratch});
  lib_->cudnn->forward(out.raw(), stats, qkv.raw(), shape, ws.raw(), stream_);
  void* out_copy = scratch + align_up(static_cast<size_t>(B * NH * T) * sizeof(float));
  MESHTRAIN_CUDA_CHECK(op, cudaMemcpyAsync(out_copy, out.raw(), out.nbytes(),
                                           cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                        const Tensor& /*out*/, const Tensor& probs, int64_t B,
                                        int64_t T, const AttentionDims& dims,
                                        const Tensor* document_starts) {
  if (document_starts) refuse_document_mask("attention_backward");
  refuse_window("attention_backward", dims);
  const int64_t NH = dims.NH, KVH = dims.KVH, HS = dims.HS;
  cuda::TimedOp timed(profile_, stream_, "attention_backward",
                      4.0 * double(B) * double(NH) * double(T) * double(T) *
                          double(HS + dims.value_size()));
  const char* op = "attention_backward";
  if (!cudnn_attention_usable(qkv, probs, B, T, dims))
    return own_attention_backward(dqkv, dout, qkv, probs, B, T, dims);
  const cuda::AttentionShape shape{B, T, NH, KVH, HS};
  const size_t ws_bytes = lib_->cudnn->backward_workspace(shape);
  Tensor ws = empty({static_cast<int64_t>((ws_bytes + 3) / 4 + 1)}, DType::F32, MemoryCategory::Workspace);
  const auto* scratch = static_cast<const char*>(probs.raw());
  const auto* stats = reinterpret_cast<const float*>(scratch);
  require_aligned(op, {qkv.raw(), dout.raw(), dqkv.raw(), scratch});
  const void* out_copy = scratch + align_up(static_cast<size_t>(B * NH * T) * sizeof(float));
  lib_->cudnn->backward(dqkv.raw(), dout.raw(), qkv.raw(), out_copy, stats, shape, ws.raw(),
                        stream_);
}

namespace {
// The strides of the own path's GEMMs, in elements. A qkv row holds W = (NH + KVH) HS + KVH HV:
// query heads, then key heads (HS each), then value heads (HV each). Each GEMM runs batched over
// the KVH key/value heads, once per member j of a group of G = NH / KVH query heads: query-side
// operands (Q, O, dO, P, dS) start j heads in and step G heads per batch entry, key-side ones
// (K, V) step one head. G == 1 is one call batched over the NH heads.
struct OwnLayout {
  int64_t T, NH, KVH, HS, HV;
  int64_t G() const { return NH / KVH; }
  int64_t C() const { return NH * HV; }  // an out row
  int64_t W() const { return (NH + KVH) * HS + KVH * HV; }
  int64_t head_step() const { return G() * HS; }   // batch stride of Q
  int64_t value_step() const { return G() * HV; }  // of O, dO
  int64_t probs_step() const { return G() * T * T; }  // of P, S, dP, dS
};
OwnLayout own_layout(int64_t T, const AttentionDims& d) {
  return {T, d.NH, d.KVH, d.HS, d.value_size()};
}
}  // namespace

void CudaBackend::own_attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B,
                                        int64_t T, const AttentionDims& dims) {
  const char* op = "attention_forward";
  const OwnLayout L = own_layout(T, dims);
  const int64_t NH = L.NH, KVH = L.KVH, HS = L.HS, HV = L.HV, C = L.C(), W = L.W();
  const DType a = qkv.dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(a));
  const float scale = static_cast<float>(dims.softmax_scale());
  // fp32: the scores go straight into probs and the softmax runs in place.
  Tensor scores;
  if (a != DType::F32) scores = empty({NH, T, T}, DType::F32, MemoryCategory::Workspace);
  auto* qkv_bytes = static_cast<const char*>(qkv.raw());
  auto* probs_bytes = static_cast<char*>(probs.raw());
  auto* out_bytes = static_cast<char*>(out.raw());
  for (int64_t b = 0; b < B; ++b) {
    const char* q = qkv_bytes + b * T * W * es;
    const char* k = q + NH * HS * es;
    const char* v = k + KVH * HS * es;
    char* p = probs_bytes + b * NH * T * T * es;
    float* s = a == DType::F32 ? reinterpret_cast<float*>(p) : static_cast<float*>(scores.raw());

    for (int64_t j = 0; j < L.G(); ++j) {
      cuda::GemmCall g1;  // S^T = K Q^T * scale
      g1.op = op;
      g1.m = T; g1.n = T; g1.k = HS;
      g1.a = {k, W, HS, true};
      g1.b = {q + j * HS * es, W, L.head_step(), false};
      g1.d = s + j * T * T; g1.ldd = T; g1.stride_d = L.probs_step();
      g1.batch = KVH;
      g1.input = a; g1.output = DType::F32;
      g1.alpha = scale;
      lib_->gemm->run(g1, stream_);
    }

    if (a == DType::F32)
      cuda::causal_softmax_forward(reinterpret_cast<float*>(p), s, NH * T, T, stream_);
    else
      cuda::causal_softmax_forward(reinterpret_cast<bf16*>(p), s, NH * T, T, stream_);

    for (int64_t j = 0; j < L.G(); ++j) {
      cuda::GemmCall g2;  // O^T = V^T P^T
      g2.op = op;
      g2.m = HV; g2.n = T; g2.k = T;
      g2.a = {v, W, HV, false};
      g2.b = {p + j * T * T * es, T, L.probs_step(), false};
      g2.d = out_bytes + (b * T * C + j * HV) * es; g2.ldd = C; g2.stride_d = L.value_step();
      g2.batch = KVH;
      g2.input = g2.output = a;
      lib_->gemm->run(g2, stream_);
    }
  }
}

void CudaBackend::own_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                         const Tensor& probs, int64_t B, int64_t T,
                                         const AttentionDims& dims) {
  const char* op = "attention_backward";
  const OwnLayout L = own_layout(T, dims);
  const int64_t NH = L.NH, KVH = L.KVH, HS = L.HS, HV = L.HV;
  const int64_t C = L.C(), W = L.W(), KC = KVH * HS;
  const DType a = qkv.dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(a));
  const float scale = static_cast<float>(dims.softmax_scale());
  Tensor dp = empty({NH, T, T}, DType::F32, MemoryCategory::Workspace);
  // bf16: dS must be bf16 to meet K and Q in a bf16 GEMM; fp32: dS overwrites dP in place.
  Tensor ds_bf16;
  if (a != DType::F32) ds_bf16 = empty({NH, T, T}, DType::BF16, MemoryCategory::Workspace);
  const char* ds = static_cast<const char*>(a == DType::F32 ? dp.raw() : ds_bf16.raw());
  // Groups under bf16: dK (dV) of a key/value head sums G products in fp32 here, (T, KVH * HS)
  // ((T, KVH * HV)), rounded once into dqkv (fp32 adds the products straight into dqkv).
  const bool widen_sums = L.G() > 1 && a != DType::F32;
  Tensor sums;
  if (widen_sums) sums = empty({T, KVH * std::max(HS, HV)}, DType::F32, MemoryCategory::Workspace);
  auto* qkv_bytes = static_cast<const char*>(qkv.raw());
  auto* dqkv_bytes = static_cast<char*>(dqkv.raw());
  auto* probs_bytes = static_cast<const char*>(probs.raw());
  auto* dout_bytes = static_cast<const char*>(dout.raw());
  // dX^T (D x T per key/value head, X = K of D = HS or V of D = HV, inside dqkv) = sum over j of
  // the products that `member` describes, in order j = 0, 1, ...: deterministic.
  auto group_sum = [&](char* dx, int64_t D, auto member) {
    for (int64_t j = 0; j < L.G(); ++j) {
      cuda::GemmCall g = member(j);
      g.op = op;
      g.m = D; g.n = T; g.k = T;
      g.batch = KVH;
      g.input = a;
      g.beta = j == 0 ? 0.f : 1.f;
      if (widen_sums) {
        g.d = sums.raw(); g.ldd = KVH * D; g.stride_d = D; g.output = DType::F32;
      } else {
        g.d = dx; g.ldd = W; g.stride_d = D; g.output = a;
      }
      lib_->gemm->run(g, stream_);
    }
    if (widen_sums)
      cuda::narrow_rows(reinterpret_cast<bf16*>(dx), W, static_cast<const float*>(sums.raw()), T,
                        KVH * D, stream_);
  };
  for (int64_t b = 0; b < B; ++b) {
    const char* q = qkv_bytes + b * T * W * es;
    const char* k = q + NH * HS * es;
    const char* v = k + KC * es;
    char* dq = dqkv_bytes + b * T * W * es;
    char* dk = dq + NH * HS * es;
    char* dv = dk + KC * es;
    const char* p = probs_bytes + b * NH * T * T * es;
    const char* d_o = dout_bytes + b * T * C * es;

    for (int64_t j = 0; j < L.G(); ++j) {
      cuda::GemmCall g;  // dP^T = V dO^T
      g.op = op;
      g.m = T; g.n = T; g.k = HV;
      g.a = {v, W, HV, true};
      g.b = {d_o + j * HV * es, C, L.value_step(), false};
      g.d = static_cast<float*>(dp.raw()) + j * T * T; g.ldd = T; g.stride_d = L.probs_step();
      g.batch = KVH;
      g.input = a; g.output = DType::F32;
      lib_->gemm->run(g, stream_);
    }

    group_sum(dv, HV, [&](int64_t j) {  // dV^T = sum_j dO_j^T P_j
      cuda::GemmCall g;
      g.a = {d_o + j * HV * es, C, L.value_step(), false};
      g.b = {p + j * T * T * es, T, L.probs_step(), true};
      return g;
    });

    if (a == DType::F32)
      cuda::causal_softmax_backward(static_cast<float*>(dp.raw()),
                                    reinterpret_cast<const float*>(p),
                                    static_cast<const float*>(dp.raw()), NH * T, T, scale, stream_);
    else
      cuda::causal_softmax_backward(static_cast<bf16*>(ds_bf16.raw()),
                                    reinterpret_cast<const bf16*>(p),
                                    static_cast<const float*>(dp.raw()), NH * T, T, scale, stream_);

    for (int64_t j = 0; j < L.G(); ++j) {
      cuda::GemmCall g;  // dQ^T = K^T dS^T
      g.op = op;
      g.m = HS; g.n = T; g.k = T;
      g.a = {k, W, HS, false};
      g.b = {ds + j * T * T * es, T, L.probs_step(), false};
      g.d = dq + j * HS * es; g.ldd = W; g.stride_d = L.head_step();
      g.batch = KVH;
      g.input = g.output = a;
      lib_->gemm->run(g, stream_);
    }

    group_sum(dk, HS, [&](int64_t j) {  // dK^T = sum_j Q_j^T dS_j
      cuda::GemmCall g;
      g.a = {q + j * HS * es, W, L.head_step(), false};
      g.b = {ds + j * T * T * es, T, L.probs_step(), true};
      return g;
    });
  }
}

}  // namespace meshtrain
