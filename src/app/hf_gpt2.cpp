#include "meshtrain/app/hf_gpt2.h"

#include <iterator>

#include <nlohmann/json.hpp>

namespace meshtrain {

namespace {

// GPT2LMHeadModel's tensors, in the order HF writes them: the rules with "{}" are applied block
// by block. A tied model has no lm_head.weight parameter, and HF then omits the tensor too.
constexpr HfNameRule kGpt2Names[] = {
    {"wte", "transformer.wte.weight", HfTransform::Same},
    {"wpe", "transformer.wpe.weight", HfTransform::Same},
    {"h.{}.ln_1.weight", "transformer.h.{}.ln_1.weight", HfTransform::Same},
    {"h.{}.ln_1.bias", "transformer.h.{}.ln_1.bias", HfTransform::Same},
    {"h.{}.attn.qkv.weight", "transformer.h.{}.attn.c_attn.weight", HfTransform::TransposedLinear},
    {"h.{}.attn.qkv.bias", "transformer.h.{}.attn.c_attn.bias", HfTransform::Flattened},
    {"h.{}.attn.proj.weight", "transformer.h.{}.attn.c_proj.weight", HfTransform::TransposedLinear},
    {"h.{}.attn.proj.bias", "transformer.h.{}.attn.c_proj.bias", HfTransform::Same},
    {"h.{}.ln_2.weight", "transformer.h.{}.ln_2.weight", HfTransform::Same},
    {"h.{}.ln_2.bias", "transformer.h.{}.ln_2.bias", HfTransform::Same},
    {"h.{}.mlp.fc.weight", "transformer.h.{}.mlp.c_fc.weight", HfTransform::TransposedLinear},
    {"h.{}.mlp.fc.bias", "transformer.h.{}.mlp.c_fc.bias", HfTransform::Same},
    {"h.{}.mlp.proj.weight", "transformer.h.{}.mlp.c_proj.weight", HfTransform::TransposedLinear},
    {"h.{}.mlp.proj.bias", "transformer.h.{}.mlp.c_proj.bias", HfTransform::Same},
    {"ln_f.weight", "transformer.ln_f.weight", HfTransform::Same},
    {"ln_f.bias", "transformer.ln_f.bias", HfTransform::Same},
    {"lm_head.weight", "lm_head.weight", HfTransform::Same},
};

}  // namespace

std::vector<HfTensor> hf_gpt2_tensors(const ModelSpec& m) {
  return hf_tensors(m, kGpt2Names, std::size(kGpt2Names), "GPT-2");
}

std::string hf_gpt2_config_json(const ModelSpec& m, const std::string& torch_dtype,
                                const std::string& tokenizer) {
  nlohmann::ordered_json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["vocab_size"] = m.vocab_size;
  j["n_positions"] = m.seq_len;
  j["n_ctx"] = m.seq_len;
  j["n_embd"] = m.d_model;
  j["n_layer"] = m.layers;
  j["n_head"] = m.heads;
  j["n_inner"] = m.ffn_hidden();
  // meshtrain's GELU is GPT-2's tanh approximation (backend/*/gelu), which HF calls gelu_new.
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  // meshtrain trains without dropout; a fine-tune in HF may set these again.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = m.tie_embeddings;
  // The byte tokenizer has no begin/end-of-text token; null keeps HF from assuming GPT-2's
  // 50256, which would lie outside a 256-token vocabulary. GPT-2's BPE has <|endoftext|>.
  const bool gpt2_bpe = tokenizer.find("gpt2") != std::string::npos && m.vocab_size > 50256;
  j["bos_token_id"] = gpt2_bpe ? nlohmann::ordered_json(50256) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = j["bos_token_id"];
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace meshtrain
