#include "meshtrain/backend/attention_support.h"

namespace meshtrain {

namespace {
// cudnnGetVersion(): major * 10000 + minor * 100 + patch since cuDNN 9, major * 1000 + minor *
// 100 + patch before (8907 is 8.9.7).
int64_t cudnn_major(int64_t v) { return v >= 10000 ? v / 10000 : v / 1000; }
}  // namespace

std::string describe(const CudnnPlatform& p) {
  std::string s = "sm_" + std::to_string(p.sm_major) + std::to_string(p.sm_minor) + ", ";
  const int64_t v = p.cudnn_version;
  if (v <= 0) return s + "no cuDNN";
  return s + "cuDNN " + std::to_string(cudnn_major(v)) + "." +
         std::to_string(v >= 10000 ? v / 100 % 100 : v / 100 % 10) + "." + std::to_string(v % 100);
}

CudnnAttentionExpectation cudnn_attention_expected(const CudnnPlatform& p, DType dtype, int64_t T,
                                                   int64_t HS, int64_t HV, double scale) {
  CudnnAttentionExpectation e;
  const bool arch = (p.sm_major == 8 || p.sm_major == 9) && p.sm_minor == 0;
  if (!arch) e.why_not = "sm_" + std::to_string(p.sm_major) + std::to_string(p.sm_minor) +
                         " is neither sm_80 nor sm_90";
  else if (cudnn_major(p.cudnn_version) != 9) e.why_not = describe(p) + " is not cuDNN 9";
  else if (dtype != DType::BF16) e.why_not = "fused attention is a bf16 kernel, not " +
                                             std::string(dtype_name(dtype));
  else if (HS % 8 != 0 || HS < 8 || HS > 128)
    e.why_not = "head size " + std::to_string(HS) + " is not a multiple of 8 from 8 to 128";
  else if (HV != 0 && HV != HS)
    e.why_not = "value head size " + std::to_string(HV) + " differs from the head size " +
                std::to_string(HS) + " (meshtrain's cuDNN graph is built for equal sizes)";
  else if (scale != 0.0)
    e.why_not = "an explicit softmax scale (meshtrain's cuDNN graph is built for 1/sqrt(HS))";
  else if (T < HS + 2)
    e.why_not = "T = " + std::to_string(T) + " < HS + 2 = " + std::to_string(HS + 2) +
                " (probs cannot hold cuDNN's scratch)";
  e.required = e.why_not.empty();
  return e;
}

RejectedAttention judge_rejected_attention(const CudnnPlatform& p, DType dtype, int64_t B,
                                           int64_t T, int64_t NH, int64_t HS,
                                           const std::string& cudnn_reason, int64_t HV,
                                           double scale) {
  const CudnnAttentionExpectation e = cudnn_attention_expected(p, dtype, T, HS, HV, scale);
  RejectedAttention r;
  r.is_error = e.required;
  r.message = "cuDNN rejected fused attention for B=" + std::to_string(B) + " T=" +
              std::to_string(T) + " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS) +
              " on " + describe(p) +
              (e.required ? ", where it must work: " : " (not required here: " + e.why_not + "): ") +
              cudnn_reason;
  return r;
}

}  // namespace meshtrain
