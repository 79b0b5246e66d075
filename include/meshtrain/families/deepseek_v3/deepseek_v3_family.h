#pragma once
// The DeepSeek-V3 family as one record (families/model_family.h): Llama's blocks with
// multi-head latent attention (model/latent_attention.h) and a mixture of experts routed by
// DeepSeek-V3's noaux_tc (sigmoid scores plus the balancing bias, group-limited choice, a shared
// expert, dense first blocks); Hugging Face's DeepseekV3ForCausalLM
// (families/deepseek_v3/hf_deepseek_v3.h).

#include "meshtrain/families/model_family.h"

namespace meshtrain {

// DeepSeek-V3's published architecture (arXiv 2412.19437; HF DeepseekV3Config) over `spec`,
// but for the sizes a deck gives.
void deepseek_v3_defaults(ModelSpec& spec);

const ModelFamily& deepseek_v3_family();

}  // namespace meshtrain
