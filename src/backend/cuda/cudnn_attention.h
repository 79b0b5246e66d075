#pragma once
// Causal scaled-dot-product attention through cuDNN's fused flash-attention engines, driven by
// the cuDNN 9 backend (graph) API directly. bf16 Q, K, V read in place from qkv rows of NH query,
// KVH key and KVH value heads (grouped-query attention when KVH < NH; backend.h) by strides; fp32 softmax statistics (row log-sum-exp, (B, NH, T)) saved for the backward pass,
// which recomputes the probabilities (FlashAttention, Dao et al., arXiv 2205.14135).
//
// The operation graphs are the composite form cuDNN's engines recognise: matmul -> scale ->
// causal mask (generated row/column indices, >=, select) -> softmax with stats -> matmul, and
// for the backward pass the matching recomputation (see cudnn_attention.cpp). Plans are built
// once per shape and cached; a shape cuDNN has no engine for is remembered as unsupported, and
// the backend then uses its own attention kernels.

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace meshtrain::cuda {

struct AttentionShape {
  int64_t B, T, NH, KVH, HS;
  auto operator<=>(const AttentionShape&) const = default;
};

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds (once) the forward and backward plans for `shape`; false, with the reason in `why`,
  // when cuDNN offers no engine for either.
  bool prepare(const AttentionShape& shape, std::string* why = nullptr);
  // Device workspace bytes each pass needs (prepare() first).
  size_t forward_workspace(const AttentionShape& shape);
  size_t backward_workspace(const AttentionShape& shape);

  // out (B, T, NH, HS), stats (B, NH, T) from qkv; all but stats bf16.
  void forward(void* out, float* stats, const void* qkv, const AttentionShape& shape,
               void* workspace, cudaStream_t stream);
  // dqkv (qkv's layout) from dout, qkv, the forward's out and stats.
  void backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                const float* stats, const AttentionShape& shape, void* workspace,
                cudaStream_t stream);

  struct Plan;  // one finalised cuDNN execution plan and what it keeps alive (opaque)

 private:
  struct Entry {
    std::unique_ptr<Plan> forward, backward;
    std::string error;  // empty when both plans exist
  };
  Entry& entry(const AttentionShape& shape);
  Plan& plan(const AttentionShape& shape, bool backward, const char* op);

  cudnnHandle_t handle_ = nullptr;
  std::map<AttentionShape, Entry> cache_;
};

}  // namespace meshtrain::cuda
