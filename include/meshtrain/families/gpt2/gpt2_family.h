#pragma once
// The GPT-2 family (Radford et al. 2019) as one record (families/model_family.h): pre-LN blocks
// of LayerNorm, learned positions, a 4x GELU MLP, biases everywhere, tied embeddings; Hugging
// Face's GPT2LMHeadModel (families/gpt2/hf_gpt2.h).

#include "meshtrain/families/model_family.h"

namespace meshtrain {

const ModelFamily& gpt2_family();

}  // namespace meshtrain
