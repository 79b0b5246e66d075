#pragma once
// The Llama 3 family as one record (families/model_family.h): RMSNorm, rotary positions,
// SwiGLU, no biases, untied; Hugging Face's LlamaForCausalLM and, with a mixture of experts
// (families/moe/), MixtralForCausalLM (families/llama/hf_llama.h).

#include "meshtrain/families/model_family.h"

namespace meshtrain {

const ModelFamily& llama_family();

// Llama's defaults over ModelSpec's own, which Qwen 3's start from (families/qwen3/).
void llama_defaults(ModelSpec& spec);

}  // namespace meshtrain
