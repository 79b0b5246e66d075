#pragma once
// The mixture of experts as a feature of a family (model.feed_forward = "moe", not a family of
// its own): Hugging Face MixtralForCausalLM and Qwen3MoeForCausalLM as meshtrain's llama and
// qwen3 families with a mixture, what they add to the Llama / Qwen 3 mapping
// (families/llama/hf_llama.h), which does everything else: the router's and experts' tensor names and the
// mixture's config.json keys, both ways.
//
// HF's names below follow model.layers.i.block_sparse_moe. (Mixtral) or model.layers.i.mlp.
// (Qwen3-MoE); e is the expert:
//
//   | meshtrain (/model/...)                | Mixtral             | Qwen3-MoE                   |
//   |---------------------------------------|---------------------|-----------------------------|
//   | h.i.mlp.router.weight (E, C)          | gate.weight         | gate.weight                 |
//   | h.i.mlp.experts.gate.weight (E, F, C) | experts.e.w1.weight | experts.e.gate_proj.weight  |
//   | h.i.mlp.experts.up.weight (E, F, C)   | experts.e.w3.weight | experts.e.up_proj.weight    |
//   | h.i.mlp.experts.down.weight (E, C, F) | experts.e.w2.weight | experts.e.down_proj.weight  |
//   | h.i.mlp.gate/up/down.weight (dense)   | —                   | {gate,up,down}_proj.weight  |
//
// Expert e of a stacked meshtrain tensor is slice e along its first dimension, HF's (out, in)
// as it is (HfTransform::PerExpert). Both route as meshtrain does: softmax over the router's
// logits, the top k, renormalised over the chosen (Mixtral always, Qwen3-MoE by norm_topk_prob).
//
// | config.json (Mixtral / Qwen3-MoE)                 | meshtrain [model]                 |
// |---------------------------------------------------|-----------------------------------|
// | num_local_experts / num_experts                   | moe_experts                       |
// | num_experts_per_tok                               | moe_top_k                         |
// | intermediate_size / moe_intermediate_size         | moe_ffn_hidden                    |
// | — (always) / norm_topk_prob                       | moe_normalize_top_k               |
// | — / mlp_only_layers [0, ..., k-1]                 | moe_first_dense_layers = k        |
// | router_aux_loss_coef x top_k / MoE layers         | moe_aux_loss (see hf_moe_aux_loss)|
//
// Refused, naming the key: Qwen3-MoE's decoder_sparse_step other than 1, mlp_only_layers that
// are not the first k layers, a shared expert (Qwen2-MoE's shared_expert_intermediate_size);
// Mixtral's sliding_window below the deck's seq_len (hf_check_sliding_window).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/families/hf/hf_config_reader.h"
#include "meshtrain/families/hf/hf_name_map.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// Whether config.json's model_type is one of the mixtures ("mixtral", "qwen3_moe").
bool hf_moe_model_type(const std::string& model_type);

// The block rules of `m`'s mixture blocks (Mixtral's names, or Qwen3-MoE's where m.qk_norm),
// to go among the Llama / Qwen 3 block rules; none for a dense model.
std::vector<HfNameRule> hf_moe_name_rules(const ModelSpec& m);

// Qwen3-MoE's router and expert rules (mlp.gate, mlp.experts.{e}.{gate,up,down}_proj), which
// DeepSeek-V3 shares.
std::vector<HfNameRule> hf_qwen3_moe_name_rules();
// The sigmoid router's expert bias of each mixture block of `m` (model/expert_bias.h, one
// HfTensor::state tensor of E values a block) under `hf_pattern`, "{}" the block
// ("model.layers.{}.mlp.gate.e_score_correction_bias"); none for a model without one.
std::vector<HfTensor> hf_expert_bias_tensors(const ModelSpec& m, const char* hf_pattern);
// Sets `m`'s feed_forward and moe fields from config.json (`model_type` "mixtral" or
// "qwen3_moe"; m holds everything else already, and, for Qwen3-MoE, ffn_hidden from
// intermediate_size), refusing by name what meshtrain cannot compute.
void hf_moe_read_config(const HfConfigReader& config, const std::string& model_type, ModelSpec& m);

// Refuses a Mixtral sliding_window (null: none) shorter than `seq_len` (where meshtrain's full
// causal attention would see more than Mixtral's); `deck` names where seq_len comes from.
void hf_check_sliding_window(const HfConfigReader& config, int64_t seq_len,
                             const std::string& deck);

// moe_aux_loss for a config's router_aux_loss_coef, and back. HF adds one Switch loss over the
// router logits of all MoE layers at once that counts each of a token's k choices (balanced
// routing costs coef x k); meshtrain adds one per MoE layer over the routed slots (balanced:
// moe_aux_loss each). The same pull towards balance: moe_aux_loss = coef x k / MoE layers.
double hf_moe_aux_loss(double router_aux_loss_coef, const ModelSpec& m);
double hf_router_aux_loss_coef(const ModelSpec& m);

// "MixtralForCausalLM" or "Qwen3MoeForCausalLM" for a mixture `m`; throws naming `where`, the
// field and its value where neither computes what `m` does (a shared expert; Mixtral: gates
// left unnormalised, dense first blocks).
std::string hf_moe_architecture(const ModelSpec& m, const std::string& where);

// The mixture's keys of config.json, added to `j` (families/llama/hf_llama.h: hf_llama_config_json).
void hf_moe_write_config(const ModelSpec& m, nlohmann::ordered_json& j);

// The config.json key a moe field ("moe_experts") comes from in `m`'s architecture, or "" for
// a field the mixtures do not have.
std::string hf_moe_config_key(const std::string& field, const ModelSpec& m);

}  // namespace meshtrain
