#pragma once
// The CPU backend: GEMMs through oneDNN matmul primitives (OpenBLAS for fp64 and tiny products,
// gemm.h), every other kernel OpenMP-parallel and written for the compiler to vectorise. Runs
// every feature of meshtrain on machines without GPUs, in fp32 or bf16 mixed precision for
// training and fp64 for verification.
//
// Three dtype modes, chosen by the tensors passed in (backend.h):
//   fp64: every tensor F64 — verification, every layout matching the single rank to round-off;
//   fp32: every tensor F32;
//   bf16: parameters and activations BF16; parameter gradients, LayerNorm mean/rstd,
//         cross-entropy statistics and losses, optimizer state F32 — as on the CUDA backend.
//         GEMMs take bf16 operands and accumulate in fp32 (oneDNN; fast with AVX512-BF16 or
//         AMX, emulated below), other kernels widen to fp32, compute, and round once to
//         nearest even.

#include <memory>
#include <string>

#include "meshtrain/backend/backend.h"
#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain {

class KernelProfile;

// The bf16 instructions oneDNN dispatches to on this CPU: "AMX", "AVX512-BF16", or "" (none,
// or ONEDNN_MAX_CPU_ISA keeps oneDNN below them).
std::string cpu_bf16_instructions();
// Whether oneDNN can run bf16 GEMMs here at all (natively or emulated from AVX512_CORE up; not
// on AVX2, or under ONEDNN_MAX_CPU_ISA=AVX2): bf16 training is refused where it cannot.
bool cpu_runs_bf16();

// Compute runs the kernels; Plan makes every allocation a step would make (scratch included,
// for `threads` threads) on a MetaAllocator and skips the arithmetic — the planner's dry run.
enum class Execution { Compute, Plan };

class CpuBackend final : public Backend {
 public:
  // threads: the OpenMP team size for kernels and OpenBLAS (0: leave the OpenMP default).
  explicit CpuBackend(int threads = 0, Execution execution = Execution::Compute);
  // Computes on memory from `allocator` (e.g. pinned host memory of a GPU's offloaded state).
  CpuBackend(int threads, std::unique_ptr<Allocator> allocator);
  bool planning() const override { return planning_; }
  // Planning a GPU run (the planner's dry runs are made on this backend): its attention keeps
  // the default stash (B, NH, T, T) rather than this backend's row log-sum-exp.
  void plan_attention_of(Device device) { planned_attention_ = device; }
  // Flash-style attention (flash_attention.cpp): the stash is the row log-sum-exp (B, NH, T)
  // in fp32 (fp64 under fp64 activations).
  AttentionStash attention_stash(int64_t B, int64_t T, int64_t NH,
                                 DType activations) const override;
  using Backend::attention_stash;  // the AttentionDims form
  // attention_forward's kernel, also writing row_max (B, NH, T) in the stash's dtype: each row's
  // largest scaled score, which the kernel's running max ends on (QK-clip, model/qk_clip.h).
  // Of this backend only: the CUDA backend's kernels do not expose it (config refuses the
  // combination), so it is no hook of Backend's.
  void attention_forward_recording_max(Tensor& out, Tensor& stash, Tensor& row_max,
                                       const Tensor& qkv, int64_t B, int64_t T,
                                       const AttentionDims& dims, const Tensor* document_starts);

  std::string name() const override { return "cpu"; }
  std::string describe() const override;
  int threads() const;
  // The GEMM behind matmul_forward/backward: its library rule can be forced (benchmarks, tests).
  cpu::Gemm& gemm() { return *gemm_; }
  // Times every operation into `profile` until set back to null (bench --suite step).
  void set_profile(KernelProfile* profile) { profile_ = profile; }
  // fp32, fp64 (verification) and bf16 mixed precision.
  bool computes_in(DType activation) const override;

 protected:
  void do_fill(Tensor& t, double value) override;
  void do_copy(Tensor& dst, const Tensor& src) override;
  void do_cast(Tensor& dst, const Tensor& src) override;
  void do_copy_from_host(Tensor& dst, const void* src) override;
  void do_copy_to_host(void* dst, const Tensor& src) override;
  void do_add_inplace(Tensor& dst, const Tensor& src) override;
  void do_scale_inplace(Tensor& t, double factor) override;
  void do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) override;
  double do_sum_squares(const Tensor& t) override;
  double do_sum(const Tensor& t) override;
  void do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) override;

  void do_embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                            int64_t vocab_begin) override;
  void do_embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                             int64_t vocab_begin) override;
  void do_position_forward(Tensor& out, const Tensor& table, int64_t token_begin) override;
  void do_position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin) override;

  void do_layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                            const Tensor& weight, const Tensor& bias) override;
  void do_layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, const Tensor* residual) override;
  // RMSNorm, SwiGLU and rotary embeddings (rmsnorm.cpp, swiglu.cpp, rotary.cpp).
  void do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                          double eps) override;
  void do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd,
                           const Tensor* residual) override;
  void do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void do_swiglu_forward_packed(Tensor& out, const Tensor& gate_up) override;
  void do_swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout,
                                 const Tensor& gate_up) override;
  void do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                          const Tensor& up) override;
  void do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                 const RotaryHeads& where, Rotation rotation) override;
  void do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                         const Tensor* residual) override;
  void do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight,
                          GradWrite dweight_write) override;
  void do_bias_forward(Tensor& out, const Tensor& bias) override;
  void do_bias_backward(Tensor& dbias, const Tensor& dout) override;
  void do_gelu_forward(Tensor& out, const Tensor& inp) override;
  void do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                               const Tensor& pre) override;
  void do_attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B, int64_t T,
                            const AttentionDims& dims, const Tensor* document_starts) override;
  void do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& stash, int64_t B, int64_t T,
                             const AttentionDims& dims, const Tensor* document_starts) override;
  // Ring-attention blocks (ring_attention_blocks.cpp): fp32, fp64 and bf16, lse in wide(A).
  void do_attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                  int64_t B, const AttentionDims& dims, const AttentionBlock& block,
                                  const Tensor* document_starts) override;
  void do_attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor& out,
                                   const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                   int64_t B, const AttentionDims& dims,
                                   const AttentionBlock& block,
                                   const Tensor* document_starts) override;
  void do_copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                       int64_t cols) override;
  // Multi-head latent attention's packed row in one pass over the rows (mla_pack.cpp).
  void do_mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                   const MlaHeads& m) override;
  void do_mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                     const MlaHeads& m) override;
  // Mixture-of-experts row gathers (cpu_expert_rows.cpp): fp32, fp64 and bf16.
  void do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                      const Tensor* weights) override;
  void do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                            const Tensor& index) override;
  // grouped_matmul_forward/backward: the Backend's default, one oneDNN GEMM per expert's rows
  // (matmul.cpp), which is what the CPU would batch anyway: a grouped call gains no launches here.

  void do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) override;
  void do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                              const Tensor& global_max) override;
  void do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_begin) override;
  void do_crossentropy_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                              const Tensor& target_logit) override;
  void do_crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                                const Tensor& row_sumexp, const Tensor& targets,
                                int64_t vocab_begin, double dloss) override;
  // One read of the logits (cpu_loss.cpp).
  void do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses, const Tensor& logits,
                                         const Tensor& targets, double dloss) override;

  // AdamW (cpu_optimizer.cpp): every piece of a flat buffer in one pass, bf16 copy included.
  void do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                       const std::vector<FlatPiece>& pieces, const std::vector<double>& decays,
                       const AdamWStep& s, Tensor* rounded) override;

 private:
  void run_attention_forward(Tensor& out, Tensor& stash, Tensor* row_max, const Tensor& qkv,
                             int64_t B, int64_t T, const AttentionDims& dims,
                             const Tensor* document_starts);
  bool planning_;
  Device planned_attention_ = Device::Cpu;
  int threads_;
  std::unique_ptr<cpu::Gemm> gemm_;
  KernelProfile* profile_ = nullptr;
};

}  // namespace meshtrain
