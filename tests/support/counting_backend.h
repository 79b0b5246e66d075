#pragma once
// A Backend that computes with a CpuBackend and counts the calls that would make a GPU wait:
// host round trips (copy_from_host, copy_to_host, sum, sum_squares, synchronize — on the CUDA
// backend each drains the stream) and asynchronous uploads (copy_from_host_async, which do
// not wait). Tests assert that a training step's round trips do not grow with the number of
// micro-batches or parameter segments. Its tensors are host memory from its own allocator, which
// the CPU kernels accept.

#include <cstdint>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"

namespace meshtrain::testing {

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(int threads = 1)
      : Backend(std::make_unique<HostAllocator>()), cpu_(threads) {}

  struct Counts {
    int64_t round_trips = 0;    // calls that return only once the device is done
    int64_t async_uploads = 0;  // copy_from_host_async
  };
  const Counts& counts() const { return counts_; }
  void reset_counts() { counts_ = {}; }

  std::string name() const override { return "counting-cpu"; }
  bool computes_in(DType activation) const override { return cpu_.computes_in(activation); }
  void synchronize() override { ++counts_.round_trips; }

 protected:
  void do_copy_from_host(Tensor& dst, const void* src) override {
    ++counts_.round_trips;
    cpu_.copy_from_host(dst, src);
  }
  void do_copy_to_host(void* dst, const Tensor& src) override {
    ++counts_.round_trips;
    cpu_.copy_to_host(dst, src);
  }
  void do_copy_from_host_async(Tensor& dst, Tensor src) override {
    ++counts_.async_uploads;
    cpu_.copy_from_host(dst, src.raw());
  }
  double do_sum_squares(const Tensor& t) override {
    ++counts_.round_trips;
    return cpu_.sum_squares(t);
  }
  double do_sum(const Tensor& t) override {
    ++counts_.round_trips;
    return cpu_.sum(t);
  }
  void do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) override {
    cpu_.reduce_into(out, slot, t, what);
  }

  // ---- everything else is queued work: forwarded uncounted ----
  void do_fill(Tensor& t, double value) override { cpu_.fill(t, value); }
  void do_copy(Tensor& dst, const Tensor& src) override { cpu_.copy(dst, src); }
  void do_cast(Tensor& dst, const Tensor& src) override { cpu_.cast(dst, src); }
  void do_add_inplace(Tensor& dst, const Tensor& src) override { cpu_.add_inplace(dst, src); }
  void do_scale_inplace(Tensor& t, double factor) override { cpu_.scale_inplace(t, factor); }
  void do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) override {
    cpu_.residual_forward(out, a, b);
  }
  void do_embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte,
                            int64_t vocab_begin) override {
    cpu_.embedding_forward(out, tokens, wte, vocab_begin);
  }
  void do_embedding_backward(Tensor& dwte, const Tensor& dout, const Tensor& tokens,
                             int64_t vocab_begin) override {
    cpu_.embedding_backward(dwte, dout, tokens, vocab_begin);
  }
  void do_position_forward(Tensor& out, const Tensor& wpe, int64_t token_begin) override {
    cpu_.position_forward(out, wpe, token_begin);
  }
  void do_position_backward(Tensor& dwpe, const Tensor& dout, int64_t token_begin) override {
    cpu_.position_backward(dwpe, dout, token_begin);
  }
  void do_layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                            const Tensor& weight, const Tensor& bias) override {
    cpu_.layernorm_forward(out, mean, rstd, inp, weight, bias);
  }
  void do_layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, const Tensor* residual) override {
    if (residual)
      cpu_.layernorm_backward_add(dinp, dweight, dbias, dout, inp, weight, mean, rstd, *residual);
    else
      cpu_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  }
  void do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                         const Tensor* residual) override {
    if (residual)
      cpu_.matmul_forward_add(out, inp, weight, bias, *residual);
    else
      cpu_.matmul_forward(out, inp, weight, bias);
  }
  void do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, GradWrite write) override {
    cpu_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, write);
  }
  void do_bias_forward(Tensor& out, const Tensor& bias) override { cpu_.bias_forward(out, bias); }
  void do_bias_backward(Tensor& dbias, const Tensor& dout) override {
    cpu_.bias_backward(dbias, dout);
  }
  void do_gelu_forward(Tensor& out, const Tensor& inp) override { cpu_.gelu_forward(out, inp); }
  void do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) override {
    cpu_.gelu_backward(dinp, inp, dout);
  }
  void do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                          double eps) override {
    cpu_.rmsnorm_forward(out, rstd, inp, weight, eps);
  }
  void do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd,
                           const Tensor* residual) override {
    if (residual)
      cpu_.rmsnorm_backward_add(dinp, dweight, dout, inp, weight, rstd, *residual);
    else
      cpu_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  }
  void do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override {
    cpu_.swiglu_forward(out, gate, up);
  }
  void do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                          const Tensor& up) override {
    cpu_.swiglu_backward(dgate, dup, dout, gate, up);
  }
  void do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                 const RotaryHeads& where, Rotation rotation) override {
    if (rotation == Rotation::ByAngle)
      cpu_.rotary_forward(x, positions, cos, sin, where);
    else
      cpu_.rotary_backward(x, positions, cos, sin, where);
  }
  void do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                      const Tensor* weights) override {
    cpu_.gather_rows(out, src, index, weights);
  }
  void do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                            const Tensor& index) override {
    cpu_.gathered_row_dots(out, a, b, index);
  }
  AttentionStash attention_stash(int64_t B, int64_t T, int64_t NH,
                                 DType activations) const override {
    return cpu_.attention_stash(B, T, NH, activations);
  }
  using Backend::attention_stash;
  void do_attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B, int64_t T,
                            const AttentionDims& dims, const Tensor* document_starts) override {
    cpu_.attention_forward(out, stash, qkv, B, T, dims, document_starts);
  }
  void do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& stash, int64_t B, int64_t T,
                             const AttentionDims& dims, const Tensor* document_starts) override {
    cpu_.attention_backward(dqkv, dout, qkv, out, stash, B, T, dims, document_starts);
  }
  void do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) override {
    cpu_.crossentropy_stats(row_max, row_sumexp, logits);
  }
  void do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                              const Tensor& global_max) override {
    cpu_.crossentropy_rebase(row_sumexp, local_max, global_max);
  }
  void do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_begin) override {
    cpu_.crossentropy_target_logit(target_logit, logits, targets, vocab_begin);
  }
  void do_crossentropy_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                              const Tensor& target_logit) override {
    cpu_.crossentropy_losses(losses, row_max, row_sumexp, target_logit);
  }
  void do_crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                                const Tensor& row_sumexp, const Tensor& targets,
                                int64_t vocab_begin, double dloss) override {
    cpu_.crossentropy_backward(dlogits, logits, row_max, row_sumexp, targets, vocab_begin, dloss);
  }
  void do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                       const std::vector<FlatPiece>& pieces, const std::vector<double>& decays,
                       const AdamWStep& s, Tensor* rounded) override {
    cpu_.adamw_update_pieces(param, grad, exp_avg, exp_avg_sq, pieces, decays, s, rounded);
  }

 private:
  CpuBackend cpu_;
  Counts counts_;
};

}  // namespace meshtrain::testing
