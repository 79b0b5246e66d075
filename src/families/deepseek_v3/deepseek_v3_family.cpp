#include "meshtrain/families/deepseek_v3/deepseek_v3_family.h"

#include "meshtrain/families/deepseek_v3/hf_deepseek_v3.h"
#include "meshtrain/families/llama/llama_family.h"

namespace meshtrain {

// DeepSeek-V3 (arXiv 2412.19437, section 4.2; HF DeepseekV3Config): RMSNorm eps 1e-6, rotary
// base 10000, latent attention with q_lora_rank 1536, kv_lora_rank 512, 128 + 64 query/key and
// 128 value channels a head; 256 routed experts of width 2048, 8 chosen from the 4 best of 8
// groups by sigmoid scores, gates normalised and scaled by 2.5, one shared expert, the first 3
// blocks dense; the sequence-wise balance loss alpha 0.0001; untied.
void deepseek_v3_defaults(ModelSpec& spec) {
  llama_defaults(spec);
  spec.norm.eps = 1e-6;
  spec.rope.theta = 1e4;
  spec.attention = AttentionKind::Latent;
  spec.latent = {.q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64, .v_head_dim = 128};
  spec.feed_forward = FeedForwardKind::Moe;
  spec.moe.experts = 256;
  spec.moe.top_k = 8;
  spec.moe.ffn_hidden_set = 2048;
  spec.moe.shared_ffn_hidden = 2048;
  spec.moe.normalize_top_k = true;
  spec.moe.aux_loss = 1e-4;
  spec.moe.first_dense_layers = 3;
  spec.moe.router = RouterKind::Sigmoid;
  spec.moe.route_scale = 2.5;
  spec.moe.groups = 8;
  spec.moe.top_groups = 4;
}

const ModelFamily& deepseek_v3_family() {
  static const ModelFamily family = {
      "deepseek_v3",
      "\"deepseek_v3\" (DeepSeek-V3: latent attention, RMSNorm eps 1e-6, rotary base 10000, SwiGLU, 256 "
      "sigmoid-routed experts top 8 of 4 in 8 groups, scale 2.5, a shared expert, 3 dense blocks, untied)",
      deepseek_v3_defaults,
      {{"DeepseekV3ForCausalLM", "deepseek_v3", FeedForwardKind::Moe}},
      &hf_deepseek_v3_format(),
  };
  return family;
}

}  // namespace meshtrain
