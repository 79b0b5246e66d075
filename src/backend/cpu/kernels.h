#pragma once
// CPU kernels, templated on the element type (float for training, double for verification).
// Internal to the CPU backend: everything above calls them through Backend. Contracts as in
// backend.h: activation gradients are assigned, parameter gradients accumulated.

#include <cstdint>

namespace meshtrain::cpu {

class Gemm;

// Threads used by the kernels (the OpenMP team size). Fixed-size chunking makes reductions
// independent of it: results are bitwise the same with 1 or 16 threads.
int kernel_threads();

template <class T> void fill(T* out, T value, int64_t n);
template <class T> void add_inplace(T* dst, const T* src, int64_t n);
template <class T> void scale_inplace(T* t, T factor, int64_t n);
template <class T> void residual_forward(T* out, const T* a, const T* b, int64_t n);
template <class T> double sum_squares(const T* x, int64_t n);
template <class T> double sum(const T* x, int64_t n);
// Elementwise conversions for Backend::cast; bfloat16 travels as its uint16_t bit pattern and
// narrowing rounds to nearest even.
void convert(double* out, const float* in, int64_t n);
void convert(float* out, const double* in, int64_t n);
void float_to_bf16(uint16_t* out, const float* in, int64_t n);
void bf16_to_float(float* out, const uint16_t* in, int64_t n);

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t vocab_begin,
                       int64_t vocab_size, int64_t N, int64_t C);
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t vocab_begin,
                        int64_t vocab_size, int64_t N, int64_t C);
template <class T>
void position_forward(T* out, const T* wpe, int64_t token_begin, int64_t T_, int64_t N, int64_t C);
template <class T>
void position_backward(T* dwpe, const T* dout, int64_t token_begin, int64_t T_, int64_t N,
                       int64_t C);

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C);
// scratch: kernel_threads() * 2 * C elements for per-thread dweight/dbias partials.
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C,
                        T* scratch);

// GEMMs through `gemm` (oneDNN or OpenBLAS, gemm.h).
template <class T>
void matmul_forward(Gemm& gemm, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                    int64_t C, int64_t OC);
template <class T>
void matmul_backward(Gemm& gemm, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int64_t N, int64_t C, int64_t OC);

template <class T> void bias_forward(T* out, const T* bias, int64_t N, int64_t C);
template <class T> void bias_backward(T* dbias, const T* dout, int64_t N, int64_t C);

template <class T> void gelu_forward(T* out, const T* inp, int64_t n);
template <class T> void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// Causal attention (attention.cpp). fp32 runs batched oneDNN matmuls over all (batch, head)
// pairs unless `gemm` forces OpenBLAS; then, and for fp64, one pair per OpenMP task.
bool attention_batched(const Gemm& gemm, bool fp32);
// Elements of backward's scratch: B * NH * T * T batched (dS of every pair), else threads * T * T.
int64_t attention_backward_scratch(const Gemm& gemm, bool fp32, int64_t B, int64_t T_,
                                   int64_t NH, int threads);
template <class T>
void attention_forward(Gemm& gemm, T* out, T* probs, const T* qkv, int64_t B, int64_t T_,
                       int64_t NH, int64_t HS);
template <class T>
void attention_backward(Gemm& gemm, T* dqkv, const T* dout, const T* qkv, const T* probs,
                        int64_t B, int64_t T_, int64_t NH, int64_t HS, T* scratch);
void attention_forward_batched(Gemm& gemm, float* out, float* probs, const float* qkv, int64_t B,
                               int64_t T_, int64_t NH, int64_t HS);
void attention_backward_batched(Gemm& gemm, float* dqkv, const float* dout, const float* qkv,
                                const float* probs, int64_t B, int64_t T_, int64_t NH, int64_t HS,
                                float* dS);

template <class T> void crossentropy_stats(T* row_max, T* row_sumexp, const T* logits, int64_t N, int64_t V);
template <class T> void crossentropy_rebase(T* row_sumexp, const T* local_max, const T* global_max, int64_t N);
template <class T>
void crossentropy_target_logit(T* target_logit, const T* logits, const int32_t* targets,
                               int64_t vocab_begin, int64_t N, int64_t V);
template <class T>
void crossentropy_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit,
                         int64_t N);
template <class T>
void crossentropy_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                           const int32_t* targets, int64_t vocab_begin, T dloss, int64_t N,
                           int64_t V);

template <class T>
void adamw_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, double lr,
                  double beta1, double beta2, double eps, double weight_decay, int64_t step,
                  double grad_scale);

}  // namespace meshtrain::cpu
