#include "meshtrain/families/llama/llama_family.h"

#include "meshtrain/families/llama/hf_llama.h"

namespace meshtrain {

// Llama 3 (Grattafiori et al., arXiv 2407.21783) as HF's LlamaForCausalLM: RMSNorm, rotary
// positions (base 500000, no scaling: 3.1 and 3.2 add "llama3" scaling in their decks), SwiGLU,
// no biases, untied (3.2 1B and 3B tie in their decks). The feed-forward width and kv_heads are
// the decks' to give: the family does not derive them from d_model.
void llama_defaults(ModelSpec& spec) {
  spec.norm = {NormKind::Rms, 1e-5};
  spec.positions = PositionKind::Rotary;
  spec.rope.theta = 5e5;
  spec.activation = ActivationKind::SwiGlu;
  spec.linear_bias = false;
  spec.tie_embeddings = false;
  spec.qk_norm = false;
}

const ModelFamily& llama_family() {
  static const ModelFamily family = {
      "llama",
      "\"llama\" (Llama 3: RMSNorm eps 1e-5, rotary positions base 500000, SwiGLU, no biases, untied)",
      llama_defaults,
      {{"LlamaForCausalLM", "llama", FeedForwardKind::Dense},
       {"MistralForCausalLM", "mistral", FeedForwardKind::Dense},
       {"MixtralForCausalLM", "mixtral", FeedForwardKind::Moe}},
      &hf_llama_format(),
  };
  return family;
}

}  // namespace meshtrain
