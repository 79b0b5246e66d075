#include "meshtrain/families/gpt2/gpt2_family.h"

#include "meshtrain/families/gpt2/hf_gpt2.h"

namespace meshtrain {

namespace {

// GPT-2 (Radford et al. 2019): pre-LN blocks of LayerNorm (eps 1e-5, with bias), learned
// positions, a 4x MLP with tanh-approximated GELU, biases on every linear layer, tied
// embeddings: ModelSpec's own defaults.
void gpt2_defaults(ModelSpec&) {}

}  // namespace

const ModelFamily& gpt2_family() {
  static const ModelFamily family = {
      "gpt2",
      "\"gpt2\" (LayerNorm, learned positions, GELU MLP, biases, tied embeddings)",
      gpt2_defaults,
      {{"GPT2LMHeadModel", "gpt2", FeedForwardKind::Dense}},
      &hf_gpt2_format(),
  };
  return family;
}

}  // namespace meshtrain
