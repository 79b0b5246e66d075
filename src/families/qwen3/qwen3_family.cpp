#include "meshtrain/families/qwen3/qwen3_family.h"

#include "meshtrain/families/llama/hf_llama.h"
#include "meshtrain/families/llama/llama_family.h"

namespace meshtrain {

namespace {

// Qwen 3 (arXiv 2505.09388, Qwen3ForCausalLM): Llama 3's blocks with the per-head q/k norm,
// rotary base 1000000 and eps 1e-6.
void qwen3_defaults(ModelSpec& spec) {
  llama_defaults(spec);
  spec.norm.eps = 1e-6;
  spec.rope.theta = 1e6;
  spec.qk_norm = true;
}

}  // namespace

const ModelFamily& qwen3_family() {
  static const ModelFamily family = {
      "qwen3",
      "\"qwen3\" (Llama's, with rope_theta 1e6, norm_eps 1e-6 and qk_norm)",
      qwen3_defaults,
      {{"Qwen3ForCausalLM", "qwen3", FeedForwardKind::Dense},
       {"Qwen3MoeForCausalLM", "qwen3_moe", FeedForwardKind::Moe}},
      &hf_llama_format(),
  };
  return family;
}

}  // namespace meshtrain
