#pragma once
// The CUDA backend: GEMMs through cuBLASLt, causal attention through cuDNN's fused
// scaled-dot-product attention graph (bf16) or this backend's own batched-GEMM + softmax kernels
// (fp32, and the fallback), every other op a hand-written kernel (src/backend/cuda/*.cu). All
// work runs on one stream; host calls return once the work is queued, except copy_from_host,
// copies to the host, reductions returning a double, and synchronize().
//
// Two dtype modes, chosen by the tensors passed in (see backend.h):
//   fp32: every tensor F32 — the verification mode, matching the CPU backend to ~1e-5;
//   bf16: parameters and activations BF16; parameter gradients, LayerNorm mean/rstd,
//         cross-entropy statistics and losses, optimizer state F32.
// F64 is not supported on the GPU (run verification on the CPU backend).

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <string_view>

#include "meshtrain/backend/attention_support.h"
#include "meshtrain/backend/backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

namespace cuda {
struct GroupedProblem;  // src/backend/cuda/grouped_gemm.h
}

// How causal attention is computed. Auto: cuDNN's fused kernel for bf16 where cuDNN builds a plan
// for the shape (head size a multiple of 8, T >= HS + 2 so that probs can hold its scratch), else
// Own, with one warning (which says when cuDNN was required to work there, attention_support.h,
// and is kept for attention_fallback()); Cudnn: cuDNN for bf16 or an error saying why not; Own: batched GEMMs +
// softmax kernels, which store the (B, NH, T, T) softmax like the CPU backend. fp32 always runs
// Own (cuDNN's fused attention is a 16-bit kernel).
enum class AttentionImpl { Auto, Cudnn, Own };
std::string_view attention_impl_name(AttentionImpl a);
// "auto", "cudnn", "own"; throws std::invalid_argument naming the accepted values otherwise.
AttentionImpl parse_attention_impl(std::string_view s);

// fp32 GEMMs on tensor cores (TF32: 10-bit mantissa inputs). Off by default: the fp32 mode is
// the one that must match the CPU backend.
enum class Tf32 { Off, On };

struct CudaBackendOptions {
  // -1: the launcher's node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
  // MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or PMIX_LOCAL_RANK; 0 if none is set) modulo the
  // number of visible devices. Callers that know the local rank better pass it explicitly.
  int device = -1;
  AttentionImpl attention = AttentionImpl::Auto;
  Tf32 tf32 = Tf32::Off;
  size_t gemm_workspace_bytes = size_t{32} << 20;  // cuBLASLt workspace (32 MiB suits Hopper)
  // GELU and the residual add in cuBLASLt's epilogues (matmul_gelu_forward/backward,
  // matmul_forward_add) where cuBLASLt offers them for the call; off: the unfused GEMM, GELU and
  // add kernels (the benchmark's side-by-side comparison).
  bool fused_epilogues = true;
};

// Visible CUDA devices; 0 (and `why`, if given, says why) when there is no driver, no device or
// the runtime cannot start. Never throws: tests use it to skip.
int cuda_device_count(std::string* why = nullptr);
// The UUID of visible device `device` as nvidia-smi prints it ("GPU-8c2f6b1e-..."): the same
// string in every process that sees this GPU, whatever its index under CUDA_VISIBLE_DEVICES.
// "" when the runtime cannot say. Never throws.
std::string cuda_device_uuid(int device);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaBackendOptions options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  std::unique_ptr<Allocator> make_host_allocator() const override;
  int device_index() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // Times every operation into `profile` (null: off). Each timed operation drains the stream
  // before and after, so a profiled step runs slower than a plain one: for breakdowns only.
  void set_profile(KernelProfile* profile) { profile_ = profile; }
  void set_fused_epilogues(bool on) { options_.fused_epilogues = on; }
  // How many matmul_gelu_forward/backward calls ran with GELU in cuBLASLt's epilogue, and how
  // many through the unfused kernels (fusion off, a view cuBLASLt cannot take, or no algorithm).
  struct EpilogueCounts {
    int64_t fused = 0, unfused = 0;
  };
  const EpilogueCounts& gelu_epilogues() const { return gelu_epilogues_; }
  // The same for matmul_forward_add: the residual added in the epilogue (C of the GEMM), or by
  // a separate add.
  const EpilogueCounts& residual_epilogues() const { return residual_epilogues_; }
  // How many grouped_matmul_forward/backward products ran as one cuBLAS grouped GEMM, and how
  // many as one cuBLASLt GEMM per group: bf16 weight gradients (bf16 products into fp32, a type
  // pair the grouped call lacks), addresses off its alignment, types it reports unsupported.
  struct GroupedCounts {
    int64_t grouped = 0, per_group = 0;
  };
  const GroupedCounts& grouped_matmuls() const { return grouped_matmuls_; }
  const CudaBackendOptions& options() const { return options_; }
  // The attention implementation that attention_forward would use for this shape and dtype
  // (resolves Auto; builds and caches the cuDNN plans to find out). When that is not cuDNN and
  // cuDNN was asked for (bf16, attention not "own"), `why` gets the reason. KVH: key/value heads
  // of grouped-query attention (0: NH, multi-head).
  AttentionImpl attention_impl_for(DType dtype, int64_t B, int64_t T, int64_t NH, int64_t HS,
                                   std::string* why = nullptr, int64_t KVH = 0);
  // The same for any AttentionDims: value heads of another size than HS, or an explicit softmax
  // scale, take the own kernels (`why` says so).
  AttentionImpl attention_impl_for(DType dtype, int64_t B, int64_t T, const AttentionDims& dims,
                                   std::string* why = nullptr);
  // This device's compute capability and the cuDNN loaded at run time.
  const CudnnPlatform& cudnn_platform() const;
  // The first fallback from cuDNN to the own attention kernels under Auto (judge_rejected_attention's
  // message: it says whether cuDNN was required to work there), or "" if none happened.
  const std::string& attention_fallback() const;

  // fp32 and bf16 mixed precision: no double-precision kernels.
  bool computes_in(DType activation) const override;
  void order_after_snapshot() override;
  void wait_for_snapshot() override;
  void synchronize() override;

  // Dense bf16 GEMM throughput (TFLOP/s) of cuBLASLt on this device: the best of `iterations`
  // timed runs of an m x n x k product (fp32 accumulate), after warm-up. A ceiling for
  // `meshtrain bench --suite gpu`.
  double measure_bf16_gemm_peak_tflops(int64_t m = 8192, int64_t n = 8192, int64_t k = 8192,
                                       int iterations = 20);

 protected:
  void do_fill(Tensor& t, double value) override;
  void do_copy(Tensor& dst, const Tensor& src) override;
  void do_cast(Tensor& dst, const Tensor& src) override;
  void do_copy_from_host(Tensor& dst, const void* src) override;
  void do_copy_to_host(void* dst, const Tensor& src) override;
  void do_copy_from_host_async(Tensor& dst, Tensor src) override;
  void do_snapshot_to_host(Tensor& dst, const Tensor& src) override;
  void do_add_inplace(Tensor& dst, const Tensor& src) override;
  void do_scale_inplace(Tensor& t, double factor) override;
  void do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) override;
  double do_sum_squares(const Tensor& t) override;
  double do_sum(const Tensor& t) override;
  void do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) override;
  void do_reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                             const std::vector<FlatPiece>& pieces, Reduction what) override;

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
  // RMSNorm, SwiGLU and rotary embeddings (cuda_rmsnorm.cpp, cuda_swiglu.cpp, cuda_rotary.cpp).
  void do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                          double eps) override;
  void do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd,
                           const Tensor* residual) override;
  void do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                          const Tensor& up) override;
  void do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                 const RotaryHeads& where, Rotation rotation) override;
  // Mixture-of-experts row gathers (cuda_expert_rows.cpp).
  void do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                      const Tensor* weights) override;
  void do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                            const Tensor& index) override;
  // The experts' grouped products (cuda_grouped_matmul.cpp).
  void do_grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                 const std::vector<int64_t>& rows) override;
  void do_grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weights,
                                  const std::vector<int64_t>& rows) override;
  void do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                         const Tensor* residual) override;
  void do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight,
                          GradWrite dweight_write) override;
  void do_matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) override;
  void do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                               const Tensor& pre) override;
  void do_bias_forward(Tensor& out, const Tensor& bias) override;
  void do_bias_backward(Tensor& dbias, const Tensor& dout) override;
  void do_gelu_forward(Tensor& out, const Tensor& inp) override;
  void do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void do_attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B, int64_t T,
                            const AttentionDims& dims, const Tensor* document_starts) override;
  // Keeps the default stash (B, NH, T, T) and reads its own copy of out from it (cuDNN) or
  // the softmax (own kernels): backward's `out` goes unused.
  void do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& out, const Tensor& probs, int64_t B, int64_t T,
                             const AttentionDims& dims, const Tensor* document_starts) override;

  void do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) override;
  void do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                              const Tensor& global_max) override;
  void do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_begin) override;
  void do_crossentropy_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                              const Tensor& target_logit) override;
  void do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses, const Tensor& logits,
                                         const Tensor& targets, double dloss) override;
  void do_crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                                const Tensor& row_sumexp, const Tensor& targets,
                                int64_t vocab_begin, double dloss) override;

  void do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                       const std::vector<FlatPiece>& pieces, const std::vector<double>& decays,
                       const AdamWStep& s, Tensor* rounded) override;

 private:
  struct Libraries;  // cuBLASLt and cuDNN state (src/backend/cuda/cuda_backend.cpp)

  void own_attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t B, int64_t T,
                             const AttentionDims& dims);
  void own_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                              const Tensor& probs, int64_t B, int64_t T,
                              const AttentionDims& dims);
  // Queues `problems` as one cuBLAS grouped GEMM, their address table uploaded ahead of it;
  // false, having computed nothing, where the call cannot take them (the caller loops instead).
  bool run_grouped(const char* op, const std::vector<cuda::GroupedProblem>& problems,
                   DType input, DType output, float beta, double flops);
  // Drops the host sources of completed asynchronous copies (all of them after a synchronize).
  void retire_host_copies();
  bool cudnn_attention_usable(const Tensor& qkv, const Tensor& probs, int64_t B, int64_t T,
                              const AttentionDims& dims);

  CudaBackendOptions options_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Libraries> lib_;
  KernelProfile* profile_ = nullptr;
  EpilogueCounts gelu_epilogues_;
  EpilogueCounts residual_epilogues_;
  GroupedCounts grouped_matmuls_;
};

}  // namespace meshtrain
