#pragma once
// Where cuDNN's fused attention must work, as plain data and logic that any build (and a
// machine without a GPU) can test. The CUDA backend asks cuDNN for a plan per shape and, under
// run.attention = "auto", falls back to its own kernels when cuDNN builds none. On a platform
// where cuDNN's flash-attention engines exist for the shape, a rejected graph is a bug in the
// graph meshtrain builds (or a broken install), not a limitation: the fallback must not pass for
// success. This header says where that is: sm_80 (A100) and sm_90 (H100, H200) with cuDNN 9,
// bf16, head size a multiple of 8 up to 128 (cuDNN's fused SDPA limits on both architectures),
// and T >= HS + 2 (the backend's own requirement: probs must hold the statistics and a copy of
// out, see cuda_attention.cpp), value heads of HS (HV 0 or HS) and the default softmax scale
// (scale 0): meshtrain's graph is built for those; multi-head latent attention's HS 192 / HV 128
// and its explicit scale take the own kernels, as a limitation, not an error. It is not a model of everything cuDNN supports (sm_86, sm_89,
// sm_100 and head sizes up to 256 on Hopper may work too); there a rejection stays a fallback.

#include <cstdint>
#include <string>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain {

struct CudnnPlatform {
  int sm_major = 0, sm_minor = 0;  // compute capability of the device
  int64_t cudnn_version = 0;       // cudnnGetVersion() at run time: 90100 is 9.1.0; 0 if none
};
// "sm_90, cuDNN 9.19.0"
std::string describe(const CudnnPlatform& p);

struct CudnnAttentionExpectation {
  bool required = false;  // cuDNN must build forward and backward plans for this shape
  std::string why_not;    // when not required: which condition fails
};
CudnnAttentionExpectation cudnn_attention_expected(const CudnnPlatform& p, DType dtype, int64_t T,
                                                   int64_t HS, int64_t HV = 0, double scale = 0.0);

// What a rejected plan means: an error where cuDNN is required to work, else a fallback (or a
// skipped cuDNN test). One line for logs, benchmark headers and test messages, e.g.
// "cuDNN rejected fused attention for B=2 T=128 NH=4 HS=64 on sm_90, cuDNN 9.19.0, where it
//  must work: <cuDNN's reason>".
struct RejectedAttention {
  bool is_error = false;
  std::string message;
};
RejectedAttention judge_rejected_attention(const CudnnPlatform& p, DType dtype, int64_t B,
                                           int64_t T, int64_t NH, int64_t HS,
                                           const std::string& cudnn_reason, int64_t HV = 0,
                                           double scale = 0.0);

}  // namespace meshtrain
