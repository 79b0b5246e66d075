#pragma once
// Hugging Face LlamaForCausalLM and Qwen3ForCausalLM as meshtrain's llama and qwen3 families
// (and, with families/moe/hf_moe.h's mixture on top, MixtralForCausalLM and Qwen3MoeForCausalLM):
// the tensor names (applied by families/hf/hf_name_map.h) and config.json both ways: the HfFormat
// (families/model_family.h) `meshtrain import --format hf` and `export` call.
//
//   | meshtrain (checkpoint /model/...)  | Hugging Face                                      |
//   |------------------------------------|---------------------------------------------------|
//   | wte (V, C)                         | model.embed_tokens.weight                         |
//   | h.i.ln_1.weight (C)                | model.layers.i.input_layernorm.weight             |
//   | h.i.attn.q/k/v.weight (W, C)       | model.layers.i.self_attn.{q,k,v}_proj.weight      |
//   | h.i.attn.qkv.weight (3, W, C)      | the same three, stacked (kv_heads = heads, no qk_norm) |
//   | h.i.attn.q_norm/k_norm.weight (HS) | model.layers.i.self_attn.{q,k}_norm.weight (Qwen 3) |
//   | h.i.attn.proj.weight (C, W)        | model.layers.i.self_attn.o_proj.weight            |
//   | h.i.ln_2.weight (C)                | model.layers.i.post_attention_layernorm.weight    |
//   | h.i.mlp.gate/up/down.weight        | model.layers.i.mlp.{gate,up,down}_proj.weight     |
//   | ln_f.weight (C)                    | model.norm.weight                                 |
//   | lm_head.weight (V, C), untied only | lm_head.weight                                    |
//
// Both sides store linear weights as torch.nn.Linear does, (out, in): no transpose. HF's
// q_proj/k_proj rows are already in the rotate-half order meshtrain's rotary uses (HF's
// conversion script permuted Meta's interleaved layout once): no permutation either.
// model.bias = true is HF Llama's attention_bias = mlp_bias = true (a bias on every linear).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/families/model_family.h"

namespace meshtrain {

// Every parameter of `m`'s parameter table under HF's Llama / Qwen 3 names, in the order
// save_pretrained writes them. Throws std::logic_error for a parameter the table lacks.
std::vector<HfTensor> hf_llama_tensors(const ModelSpec& m);

// The model a Llama, Qwen 3, Mixtral or Qwen3-MoE config.json describes (model_type "llama",
// "qwen3", "mixtral" or "qwen3_moe"), with
// transformers' defaults for absent keys; `max_positions` receives max_position_embeddings
// (spec.seq_len is left as `seq_len`). Throws naming `path`, the key, its value and what
// meshtrain accepts for anything it cannot compute: another hidden_act, rope_type, sliding
// windows, a bias on some linear layers only.
ModelSpec hf_llama_spec(const HfConfigReader& config, int64_t seq_len, int64_t& max_positions);

// The config.json key a spec field ("kv_heads", "rope_factor", "moe_experts") comes from in
// the architecture of `hf` (the spec read from it), for messages.
std::string hf_llama_config_key(const std::string& field, const ModelSpec& hf);

// "LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM" or "Qwen3MoeForCausalLM" for
// `m`; throws naming `where` and the field when none computes what `m` does (LayerNorm, learned
// positions, GELU, a Qwen 3 with biases, a mixture with a shared expert).
std::string hf_llama_architecture(const ModelSpec& m, const std::string& where);

// config.json for `m` (indented, a trailing newline); torch_dtype "float32" or "bfloat16";
// bos/eos: token ids, or < 0 for none (null).
std::string hf_llama_config_json(const ModelSpec& m, const std::string& torch_dtype, int64_t bos,
                                 int64_t eos);

// The rotary keys of config.json into `rope` (rope_theta and rope_scaling, or rope_parameters:
// none, "llama3" or "yarn"), refusing another rope_type by name; `default_theta` is the
// model_type's default. Other families' formats read their rotary keys with it.
void hf_read_rope(const HfConfigReader& config, double default_theta, int64_t max_positions, RopeSpec& rope);
// config.json's rope_scaling for `rope`: null, Llama 3's keys, or YaRN's.
nlohmann::ordered_json hf_rope_scaling_json(const RopeSpec& rope);
// Refuses a deck model (`m`, from `deck_path`) that is not the one config.json describes
// (`hf`), naming config.json's key (HfFormat::check_deck; Mixtral's sliding window too).
void hf_check_llama_deck(const HfConfigReader& config, const ModelSpec& hf, int64_t max_positions,
                         const ModelSpec& m, const std::string& deck_path);
// Llama's, Qwen 3's, Mixtral's and Qwen3-MoE's format both ways (families/model_family.h), the
// llama and qwen3 families'.
const HfFormat& hf_llama_format();

}  // namespace meshtrain
