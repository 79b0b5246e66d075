// Where cuDNN's fused attention must work (backend/attention_support.h): the decision that turns
// a rejected cuDNN graph into a test failure and a benchmark error on sm_80/sm_90 with cuDNN 9,
// and into a fallback elsewhere. Pure logic: runs without a GPU.

#include <gtest/gtest.h>

#include "meshtrain/backend/attention_support.h"

namespace meshtrain {
namespace {

constexpr CudnnPlatform kH100{9, 0, 91900};
constexpr CudnnPlatform kA100{8, 0, 90100};

TEST(CudnnAttentionExpected, RequiredOnAmpereAndHopperWithCudnn9) {
  for (const CudnnPlatform& p : {kH100, kA100})
    for (int64_t hs : {8, 32, 64, 128}) {
      const CudnnAttentionExpectation e = cudnn_attention_expected(p, DType::BF16, 1024, hs);
      EXPECT_TRUE(e.required) << describe(p) << " HS " << hs << ": " << e.why_not;
    }
  // The shapes the CUDA kernel tests force onto cuDNN: none may skip there.
  EXPECT_TRUE(cudnn_attention_expected(kH100, DType::BF16, 128, 64).required);
  EXPECT_TRUE(cudnn_attention_expected(kH100, DType::BF16, 150, 32).required);
}

TEST(CudnnAttentionExpected, NotRequiredElsewhereAndSaysWhy) {
  EXPECT_EQ(cudnn_attention_expected({8, 6, 91900}, DType::BF16, 1024, 64).why_not,
            "sm_86 is neither sm_80 nor sm_90");
  EXPECT_EQ(cudnn_attention_expected({7, 5, 91900}, DType::BF16, 1024, 64).why_not,
            "sm_75 is neither sm_80 nor sm_90");
  EXPECT_EQ(cudnn_attention_expected({9, 0, 8907}, DType::BF16, 1024, 64).why_not,
            "sm_90, cuDNN 8.9.7 is not cuDNN 9");
  EXPECT_EQ(cudnn_attention_expected({9, 0, 0}, DType::BF16, 1024, 64).why_not,
            "sm_90, no cuDNN is not cuDNN 9");
  EXPECT_EQ(cudnn_attention_expected(kH100, DType::F32, 1024, 64).why_not,
            "fused attention is a bf16 kernel, not fp32");
  EXPECT_EQ(cudnn_attention_expected(kH100, DType::BF16, 1024, 36).why_not,
            "head size 36 is not a multiple of 8 from 8 to 128");
  EXPECT_FALSE(cudnn_attention_expected(kH100, DType::BF16, 1024, 256).required);
  EXPECT_EQ(cudnn_attention_expected(kH100, DType::BF16, 65, 64).why_not,
            "T = 65 < HS + 2 = 66 (probs cannot hold cuDNN's scratch)");
}

// Value heads of another size than HS, or an explicit softmax scale (multi-head latent
// attention), are outside meshtrain's cuDNN graph: a fallback, never an error.
TEST(CudnnAttentionExpected, NotForValueHeadsOfTheirOwnSizeOrAnExplicitScale) {
  EXPECT_TRUE(cudnn_attention_expected(kH100, DType::BF16, 1024, 64, 64, 0.0).required);
  EXPECT_EQ(cudnn_attention_expected(kH100, DType::BF16, 1024, 64, 32).why_not,
            "value head size 32 differs from the head size 64 (meshtrain's cuDNN graph is built "
            "for equal sizes)");
  EXPECT_EQ(cudnn_attention_expected(kH100, DType::BF16, 1024, 64, 0, 0.1).why_not,
            "an explicit softmax scale (meshtrain's cuDNN graph is built for 1/sqrt(HS))");
  EXPECT_FALSE(
      judge_rejected_attention(kH100, DType::BF16, 2, 128, 4, 64, "declined", 32).is_error);
}

TEST(JudgeRejectedAttention, AnErrorWhereRequiredAFallbackElsewhere) {
  const RejectedAttention h100 =
      judge_rejected_attention(kH100, DType::BF16, 2, 128, 4, 64, "operation graph rejected: X");
  EXPECT_TRUE(h100.is_error);
  EXPECT_EQ(h100.message,
            "cuDNN rejected fused attention for B=2 T=128 NH=4 HS=64 on sm_90, cuDNN 9.19.0, "
            "where it must work: operation graph rejected: X");
  const RejectedAttention ada =
      judge_rejected_attention({8, 9, 91900}, DType::BF16, 2, 128, 4, 64, "no engine");
  EXPECT_FALSE(ada.is_error);
  EXPECT_EQ(ada.message,
            "cuDNN rejected fused attention for B=2 T=128 NH=4 HS=64 on sm_89, cuDNN 9.19.0 (not "
            "required here: sm_89 is neither sm_80 nor sm_90): no engine");
}

}  // namespace
}  // namespace meshtrain
