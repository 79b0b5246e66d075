#pragma once
// Launchers of the CUDA backend's own kernels (the kernels themselves are private to their .cu
// files). Raw device pointers and sizes, one stream; each launcher checks its launch. Templates
// take the activation type T: float (fp32 mode) or bf16 (mixed precision). Parameter
// gradients, LayerNorm statistics, cross-entropy statistics and optimizer state are always
// float, so one signature serves both modes. Contracts as in backend.h: activation gradients
// are assigned, parameter gradients accumulated; every reduction has a fixed order (results
// are bitwise repeatable for equal inputs and sizes).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace meshtrain::cuda {

using bf16 = __nv_bfloat16;

// ---- elementwise.cu -----------------------------------------------------------------------
// T: double, float, bf16, int32_t
template <class T> void fill(T* out, double value, int64_t n, cudaStream_t s);
// dst += src; (float, float), (bf16, bf16) and (float, bf16).
template <class D, class S> void add_inplace(D* dst, const S* src, int64_t n, cudaStream_t s);
template <class T> void scale_inplace(T* t, float factor, int64_t n, cudaStream_t s);
template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t s);
// out = in converted, rounding to nearest even: (bf16, float) and (float, bf16).
template <class D, class S> void convert(D* out, const S* in, int64_t n, cudaStream_t s);
// out (N, C) += bias (C) on every row.
template <class T> void bias_forward(T* out, const T* bias, int64_t N, int64_t C, cudaStream_t s);

// ---- reduce.cu ----------------------------------------------------------------------------
// Doubles of scratch that sum() needs for n elements.
int64_t sum_scratch(int64_t n);
// *result (device) = sum of x (or of x^2), accumulated in double in a fixed tree order.
template <class T>
void sum(double* result, const T* x, int64_t n, bool squares, double* scratch, cudaStream_t s);
// Doubles of scratch that sum_pieces() needs for pieces of these sizes.
int64_t sum_pieces_scratch(const int64_t* counts, int64_t pieces);
// results[k] (device) = sum (or sum of squares) of x[offsets[k], offsets[k] + counts[k]), each
// with the bits sum() gives that piece, in two launches per 96 pieces.
template <class T>
void sum_pieces(double* results, const T* x, const int64_t* offsets, const int64_t* counts,
                int64_t pieces, bool squares, double* scratch, cudaStream_t s);
// Floats of scratch that column_sums() needs.
int64_t column_sums_scratch(int64_t N, int64_t C);
// out (C) += column sums of in (N, C), fixed order (bias gradients).
template <class T>
void column_sums(float* out, const T* in, int64_t N, int64_t C, float* scratch, cudaStream_t s);

// ---- embedding.cu -------------------------------------------------------------------------
// out (N, C) = table[tokens - vocab_begin] (table: V rows of this rank's slice), 0 outside it.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, int64_t vocab_begin,
                       int64_t V, int64_t N, int64_t C, cudaStream_t s);
// Bytes of workspace embedding_backward needs for N tokens of C channels.
size_t embedding_backward_workspace(int64_t N, int64_t C);
// dtable (V, C) += dout rows by token. Tokens are sorted stably (radix sort of (token, row)), then
// each distinct token's rows are summed in row order: deterministic, no atomics.
template <class T>
void embedding_backward(float* dtable, const T* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t V, int64_t N, int64_t C, void* workspace, size_t workspace_bytes,
                        cudaStream_t s);
// out (N, C) += table[(token_begin + i) % T_]; dtable (T_, C) += the matching dout rows.
template <class T>
void position_forward(T* out, const T* table, int64_t token_begin, int64_t T_, int64_t N,
                      int64_t C, cudaStream_t s);
template <class T>
void position_backward(float* dtable, const T* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C, cudaStream_t s);

// ---- layernorm.cu -------------------------------------------------------------------------
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, cudaStream_t s);
int64_t layernorm_backward_scratch(int64_t N, int64_t C);  // floats
// residual, where not null (N, C): added to dinp as add_inplace would after it is stored.
template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const T* residual, const float* mean, const float* rstd,
                        int64_t N, int64_t C, float* scratch, cudaStream_t s);

// ---- gelu.cu ------------------------------------------------------------------------------
template <class T> void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t s);
template <class T> void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t s);

// ---- rmsnorm.cu ---------------------------------------------------------------------------
// rstd (N) float; eps as the caller's configuration gives it.
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, double eps, int64_t N,
                     int64_t C, cudaStream_t s);
int64_t rmsnorm_backward_scratch(int64_t N, int64_t C);  // floats
// residual, where not null (N, C): added to dinp as add_inplace would after it is stored.
template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const T* residual, const float* rstd, int64_t N, int64_t C, float* scratch,
                      cudaStream_t s);

// ---- swiglu.cu ----------------------------------------------------------------------------
template <class T> void swiglu_forward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t s);
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n,
                     cudaStream_t s);

// ---- rotary.cu ----------------------------------------------------------------------------
// In place on `heads` heads of head_dim channels, `stride` columns apart, from `column` of each
// of the N rows of W elements, by the angles of positions[n] in the (P, head_dim / 2) cos/sin
// table (by minus them for the backward pass); a row whose position is outside [0, P) gets NaN in
// those heads.
template <class T>
void rotary(T* x, const int32_t* positions, const float* cos, const float* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, int64_t stride, int64_t P,
            bool by_minus_angle, cudaStream_t s);

// ---- expert_rows.cu: token rows to their experts and back (backend.h, gather_rows) ----------
// out (R, C) row r = the sum over j < K, in order, of weights[r, j] (1 where weights is null) *
// src[index[r, j]] for src (M, C), from the first kept term, a term whose index is outside
// [0, M) left out, a row without terms zero. gathered_row_dots: out (R, K) = dot(a[r],
// b[index[r, j]]) for b (M, C), 0 where the index is outside [0, M).
template <class T>
void gather_rows(T* out, const T* src, const int32_t* index, const float* weights, int64_t R,
                 int64_t C, int64_t K, int64_t M, cudaStream_t s);
template <class T>
void gathered_row_dots(float* out, const T* a, const T* b, const int32_t* index, int64_t R,
                       int64_t C, int64_t K, int64_t M, cudaStream_t s);

// ---- attention.cu (the backend's own attention; cuDNN's lives in cudnn_attention.cpp) ------
// rows = (heads) x T rows of T scores, row r holding query i = r % T. probs = softmax over keys
// j <= i, zero above the diagonal. probs may alias scores when T is float.
template <class T>
void causal_softmax_forward(T* probs, const float* scores, int64_t rows, int64_t T_, cudaStream_t s);
// dscores = probs * (dprobs - rowsum(probs * dprobs)) * scale, zero above the diagonal;
// dscores may alias dprobs when T is float.
template <class T>
void causal_softmax_backward(T* dscores, const T* probs, const float* dprobs, int64_t rows,
                             int64_t T_, float scale, cudaStream_t s);

// dst (rows, cols of a row-major matrix with row stride ld_dst) = src (rows, cols, dense), each
// fp32 value rounded once to bf16: grouped-query attention's fp32 sums of dK and dV into dqkv.
void narrow_rows(bf16* dst, int64_t ld_dst, const float* src, int64_t rows, int64_t cols,
                 cudaStream_t s);

// ---- cross_entropy.cu ---------------------------------------------------------------------
template <class T>
void crossentropy_stats(float* row_max, float* row_sumexp, const T* logits, int64_t N, int64_t V,
                        cudaStream_t s);
void crossentropy_rebase(float* row_sumexp, const float* local_max, const float* global_max,
                         int64_t N, cudaStream_t s);
template <class T>
void crossentropy_target_logit(float* target_logit, const T* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V, cudaStream_t s);
void crossentropy_losses(float* losses, const float* row_max, const float* row_sumexp,
                         const float* target_logit, int64_t N, cudaStream_t s);
// dlogits may alias logits.
template <class T>
void crossentropy_backward(T* dlogits, const T* logits, const float* row_max,
                           const float* row_sumexp, const int32_t* targets, int64_t vocab_begin,
                           float dloss, int64_t N, int64_t V, cudaStream_t s);

// losses and dlogits of the whole vocabulary (vocab_begin 0) in one kernel, each row read once
// from memory (again from cache for the gradient), with the bits of the four launchers above.
template <class T>
void crossentropy_loss_and_backward(T* dlogits, float* losses, const T* logits,
                                    const int32_t* targets, float dloss, int64_t N, int64_t V,
                                    cudaStream_t s);

// ---- adamw.cu -----------------------------------------------------------------------------
struct AdamWParams {
  float lr, beta1, beta2, eps;
  float bias_correction1, bias_correction2;  // 1 / (1 - beta^step), computed in double
  float grad_scale;
};
// AdamW on pieces [offsets[k], offsets[k] + counts[k]) of the four flat buffers, piece k with
// weight decay decays[k], in one launch per 96 pieces.
void adamw_update_pieces(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         const int64_t* offsets, const int64_t* counts, const float* decays,
                         int64_t pieces, const AdamWParams& p, cudaStream_t s);

}  // namespace meshtrain::cuda
