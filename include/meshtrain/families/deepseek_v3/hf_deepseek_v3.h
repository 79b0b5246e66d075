#pragma once
// Hugging Face DeepseekV3ForCausalLM as meshtrain's deepseek_v3 family: tensor names and
// config.json both ways (the HfFormat, families/model_family.h). Llama's embeddings, norms and
// head (families/llama/hf_llama.h), Qwen3-MoE's router and experts (families/moe/hf_moe.h), and:
//
//   | meshtrain (/model/...)        | Hugging Face model.layers.i.                   |
//   |-------------------------------|------------------------------------------------|
//   | h.i.attn.q_a / q_a_norm       | self_attn.q_a_proj / q_a_layernorm             |
//   | h.i.attn.q_b (q_lora_rank)    | self_attn.q_b_proj (rotary rows interleaved)   |
//   | h.i.attn.q (no q_lora_rank)   | self_attn.q_proj (rotary rows interleaved)     |
//   | h.i.attn.kv_a / kv_a_norm     | self_attn.kv_a_proj_with_mqa (its rotary tail interleaved) / kv_a_layernorm |
//   | h.i.attn.kv_b / proj          | self_attn.kv_b_proj / o_proj                   |
//   | h.i.mlp.shared.{gate,up,down} | mlp.shared_experts.{gate,up,down}_proj         |
//   | h.i.mlp.router.expert_bias    | mlp.gate.e_score_correction_bias (E), F32      |
//
// The last is state, not a parameter (model/expert_bias.h; HfFormat::state_tensors): import reads
// it into the checkpoint's /buffers/ (fp64, exact), export writes it F32 (DeepSeek's dtype; a
// bias trained by meshtrain is rounded once), so that transformers routes as meshtrain does.
// The rotary rows: DeepSeek's checkpoints (rope_interleave true, transformers' default for
// the class) store each rotary part as interleaved pairs; meshtrain's rotate-half kernel reads
// halves (families/hf/hf_name_map.h, HfRopeRows). Export always writes interleaved rows and
// `"rope_interleave": true`, the layout vLLM and SGLang assume; import reads a model saved with
// rope_interleave false (rows in halves already) as it is (HfFormat::stored_tensors).
//
// config.json: DeepSeek-V3's keys; refused by name: scoring_func other than "sigmoid",
// topk_method other than "noaux_tc", moe_layer_freq other than 1, hidden_act other than
// "silu", attention_bias true, num_key_value_heads other than num_attention_heads,
// num_nextn_predict_layers other than 0 (no multi-token prediction yet).

#include <string>
#include <vector>

#include "meshtrain/families/model_family.h"

namespace meshtrain {

// The model a DeepseekV3 config.json describes (transformers' defaults for absent keys);
// `max_positions` receives max_position_embeddings.
ModelSpec hf_deepseek_v3_spec(const HfConfigReader& config, int64_t& max_positions);
// Every parameter of `m` under DeepseekV3ForCausalLM's names, the rotary rows interleaved.
std::vector<HfTensor> hf_deepseek_v3_tensors(const ModelSpec& m);
std::string hf_deepseek_v3_config_json(const ModelSpec& m, const HfExportOptions& options);

const HfFormat& hf_deepseek_v3_format();

}  // namespace meshtrain
