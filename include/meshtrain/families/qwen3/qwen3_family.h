#pragma once
// The Qwen 3 family as one record (families/model_family.h): Llama's, with the per-head q/k
// norm; Hugging Face's Qwen3ForCausalLM and, with a mixture of experts (families/moe/),
// Qwen3MoeForCausalLM, in Llama's format (families/llama/hf_llama.h).

#include "meshtrain/families/model_family.h"

namespace meshtrain {

const ModelFamily& qwen3_family();

}  // namespace meshtrain
