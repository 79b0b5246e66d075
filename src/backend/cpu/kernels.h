#pragma once
// CPU kernels, templated on the stored element type A: float (training), double (verification)
// or bf16 (mixed precision; element.h). Each computes in Acc<A>, and the tensors that stay wide
// under bf16 (parameter gradients, row statistics) are Acc<A>* in the signatures below. Internal
// to the CPU backend: everything above calls them through Backend. Contracts as in backend.h:
// activation gradients are assigned, parameter gradients accumulated.

#include <cstdint>

#include "element.h"
#include "meshtrain/backend/backend.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

// Threads used by the kernels (the OpenMP team size). Fixed-size chunking makes reductions
// independent of it: results are bitwise the same with 1 or 16 threads.
int kernel_threads();

template <class T> void fill(T* out, T value, int64_t n);
// dst += src: (T, T), or bf16 into an fp32 accumulator (D float, S bf16).
template <class D, class S> void add_inplace(D* dst, const S* src, int64_t n);
template <class T> void scale_inplace(T* t, Acc<T> factor, int64_t n);
template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n);
template <class T> double sum_squares(const T* x, int64_t n);
template <class T> double sum(const T* x, int64_t n);
// Elementwise conversions for Backend::cast; bfloat16 travels as its uint16_t bit pattern and
// narrowing rounds to nearest even.
void convert(double* out, const float* in, int64_t n);
void convert(float* out, const double* in, int64_t n);
void float_to_bf16(uint16_t* out, const float* in, int64_t n);
void bf16_to_float(float* out, const uint16_t* in, int64_t n);

template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* table, int64_t vocab_begin,
                       int64_t vocab_size, int64_t N, int64_t C);
template <class A>
void embedding_backward(Acc<A>* dtable, const A* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t vocab_size, int64_t N, int64_t C);
template <class A>
void position_forward(A* out, const A* table, int64_t token_begin, int64_t T_, int64_t N, int64_t C);
template <class A>
void position_backward(Acc<A>* dtable, const A* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C);

template <class A>
void layernorm_forward(A* out, Acc<A>* mean, Acc<A>* rstd, const A* inp, const A* weight,
                       const A* bias, int64_t N, int64_t C);
// scratch: kernel_threads() * 2 * C elements for per-thread dweight/dbias partials. residual
// (N, C), when given, is added to dinp row by row (layernorm_backward_add, the bits of the two
// calls); it must not overlap dinp.
template <class A>
void layernorm_backward(A* dinp, Acc<A>* dweight, Acc<A>* dbias, const A* dout, const A* inp,
                        const A* weight, const Acc<A>* mean, const Acc<A>* rstd, int64_t N,
                        int64_t C, Acc<A>* scratch, const A* residual = nullptr);

// RMSNorm (rmsnorm.cpp); scratch: kernel_threads() * C elements for per-thread dweight partials.
template <class A>
void rmsnorm_forward(A* out, Acc<A>* rstd, const A* inp, const A* weight, double eps, int64_t N,
                     int64_t C);
template <class A>
void rmsnorm_backward(A* dinp, Acc<A>* dweight, const A* dout, const A* inp, const A* weight,
                      const Acc<A>* rstd, int64_t N, int64_t C, Acc<A>* scratch,
                      const A* residual = nullptr);  // as layernorm_backward's

// SwiGLU (swiglu.cpp): out = silu(gate) * up over rows of F channels, and its two input
// gradients; gate and up rows ld_in apart, dgate and dup rows ld_grad apart, out and dout F.
template <class A>
void swiglu_forward(A* out, const A* gate, const A* up, int64_t rows, int64_t F, int64_t ld_in);
template <class A>
void swiglu_backward(A* dgate, A* dup, const A* dout, const A* gate, const A* up, int64_t rows,
                     int64_t F, int64_t ld_in, int64_t ld_grad);

// Rotary embedding (rotary.cpp), in place on `heads` heads of head_dim channels, `stride` apart,
// from `column` of each of the N rows of W elements, at row n's position positions[n] of the (P, head_dim / 2)
// cos/sin table; by_minus_angle: the backward rotation. Every position must be in [0, P):
// rotary_row_outside gives the first row whose position is not (-1: none).
int64_t rotary_row_outside(const int32_t* positions, int64_t N, int64_t P);
template <class A>
void rotary(A* x, const int32_t* positions, const Acc<A>* cos, const Acc<A>* sin, int64_t N,
            int64_t W, int64_t column, int64_t heads, int64_t head_dim, int64_t stride,
            bool by_minus_angle);

// Mixture of experts (expert_rows.cpp): out (R, C) row r = the sum over j < K, in order, of
// weights[r, j] (1 where weights is null) * src[index[r, j]], terms of index -1 left out, a row
// without terms zero; gathered_row_dots: out (R, K) = dot(a[r], b[index[r, j]]), 0 for -1.
// Every index must be in [-1, M) for src (M, C): gather_index_outside gives the first of the n
// entries that is not (-1: none).
int64_t gather_index_outside(const int32_t* index, int64_t n, int64_t M);
template <class A>
void gather_rows(A* out, const A* src, const int32_t* index, const Acc<A>* weights, int64_t R,
                 int64_t C, int64_t K);
template <class A>
void gathered_row_dots(Acc<A>* out, const A* a, const A* b, const int32_t* index, int64_t R,
                       int64_t C, int64_t K);

// GEMMs through `gemm` (oneDNN or OpenBLAS, gemm.h); bf16 only through oneDNN.
// matmul_forward: residual (N, OC), when given, is added inside the GEMM (after the bias).
// matmul_backward: dinp, dweight and dbias may each be null (not wanted); weight is read only
// for dinp; dweight is added to, or assigned (dweight_acc).
template <class A>
void matmul_forward(Gemm& gemm, A* out, const A* inp, const A* weight, const A* bias, int64_t N,
                    int64_t C, int64_t OC, const A* residual = nullptr);
template <class A>
void matmul_backward(Gemm& gemm, A* dinp, Acc<A>* dweight, Acc<A>* dbias, const A* dout,
                     const A* inp, const A* weight, int64_t N, int64_t C, int64_t OC,
                     Accumulate dweight_acc = Accumulate::Add);

template <class A> void bias_forward(A* out, const A* bias, int64_t N, int64_t C);
template <class A> void bias_backward(Acc<A>* dbias, const A* dout, int64_t N, int64_t C);

template <class A> void gelu_forward(A* out, const A* inp, int64_t n);
template <class A> void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n);

// Causal attention (flash_attention.cpp) with KVH key/value heads shared by groups of NH / KVH
// query heads, on qkv rows of NH HS + KVH HS + KVH HV (backend.h, AttentionDims), as a blocked
// flash-style kernel: forward writes out (B, T, NH, HV) and the row log-sum-exp lse (B, NH, T)
// in Acc<A>, all backward needs besides out itself. `starts` (B * T), when not null, are the
// document starts of document masking (backend.h): row i of sequence b sees keys
// [starts[b T + i], i]. `threads` is the team size; the bits do not depend on it. Products:
// oneDNN for fp32 and bf16 (OpenBLAS for fp32 when `gemm` forces it; bf16 is then refused),
// OpenBLAS for fp64.
// Acc<A> elements of scratch: per thread a block of scores and its partners (backward also the
// head's dK and dV, and dense copies of its keys and values); forward also every key/value
// head's keys and values, dense; backward under grouped-query heads every head's dK and dV.
template <class A>
int64_t attention_forward_scratch(int64_t B, int64_t T_, const AttentionDims& dims, int threads);
template <class A>
int64_t attention_backward_scratch(int64_t B, int64_t T_, const AttentionDims& dims,
                                   int threads);
// row_max, when given (B, NH, T): each row's largest scaled score over the keys it sees, the
// running max's last value (QK-clip reads it: model/qk_clip.h); the other outputs are the same.
template <class A>
void attention_forward(Gemm& gemm, A* out, Acc<A>* lse, const A* qkv, int64_t B, int64_t T_,
                       const AttentionDims& dims, Acc<A>* scratch, const int32_t* starts,
                       int threads, Acc<A>* row_max = nullptr);
template <class A>
void attention_backward(Gemm& gemm, A* dqkv, const A* dout, const A* qkv, const A* out,
                        const Acc<A>* lse, int64_t B, int64_t T_, const AttentionDims& dims,
                        Acc<A>* scratch, const int32_t* starts, int threads);
// Refuses (std::invalid_argument naming `op`) a document start outside [0, i] for row i of its
// sequence: a start after the row would leave it no key to attend to.
void check_document_starts(const char* op, const int32_t* starts, int64_t B, int64_t T_);

template <class A>
void crossentropy_stats(Acc<A>* row_max, Acc<A>* row_sumexp, const A* logits, int64_t N,
                        int64_t V);
template <class S>
void crossentropy_rebase(S* row_sumexp, const S* local_max, const S* global_max, int64_t N);
template <class A>
void crossentropy_target_logit(Acc<A>* target_logit, const A* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V);
template <class S>
void crossentropy_losses(S* losses, const S* row_max, const S* row_sumexp, const S* target_logit,
                         int64_t N);
template <class A>
void crossentropy_backward(A* dlogits, const A* logits, const Acc<A>* row_max,
                           const Acc<A>* row_sumexp, const int32_t* targets, int64_t vocab_begin,
                           Acc<A> dloss, int64_t N, int64_t V);
// All of the above for the whole vocabulary (vocab_begin 0) with each row read from memory once;
// scratch: a row of V per OpenMP thread. dlogits may alias logits.
template <class A>
void crossentropy_loss_and_backward(A* dlogits, Acc<A>* losses, const A* logits,
                                    const int32_t* targets, Acc<A> dloss, int64_t N, int64_t V,
                                    Acc<A>* scratch);

// One piece of a flat buffer and its weight decay.
struct AdamWPiece {
  int64_t offset = 0, count = 0;
  double weight_decay = 0;
};
// AdamW on every piece of the four flat buffers in one parallel pass; elements outside the
// pieces are left as they are. Master weights, gradients and moments alike: float or double
// (bf16 models keep fp32 masters). With `rounded` (fp32 only), each updated parameter is also
// written there as bf16 bits, the same bits as float_to_bf16 of the result.
template <class T>
void adamw_update_pieces(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, uint16_t* rounded,
                         const AdamWPiece* pieces, int64_t piece_count, double lr, double beta1,
                         double beta2, double eps, int64_t step, double grad_scale);

}  // namespace meshtrain::cpu
