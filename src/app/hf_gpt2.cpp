#include "meshtrain/app/hf_gpt2.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace meshtrain {

std::vector<HfTensor> hf_gpt2_tensors(const GptConfig& m) {
  const int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len;
  std::vector<HfTensor> out;
  auto same = [&](const std::string& mt, const std::string& hf, std::vector<int64_t> shape) {
    out.push_back({mt, shape, hf, shape, false});
  };
  // A linear weight (out, in) in meshtrain, (in, out) in HF; `mt_shape` may be blocked (qkv).
  auto linear = [&](const std::string& mt, const std::string& hf, std::vector<int64_t> mt_shape, int64_t in,
                    int64_t out_features) {
    out.push_back({mt, std::move(mt_shape), hf, {in, out_features}, true});
  };
  same("wte", "transformer.wte.weight", {V, C});
  same("wpe", "transformer.wpe.weight", {T, C});
  for (int i = 0; i < m.layers; ++i) {
    const std::string mt = "h." + std::to_string(i) + ".", hf = "transformer.h." + std::to_string(i) + ".";
    same(mt + "ln_1.weight", hf + "ln_1.weight", {C});
    same(mt + "ln_1.bias", hf + "ln_1.bias", {C});
    linear(mt + "attn.qkv.weight", hf + "attn.c_attn.weight", {3, C, C}, C, 3 * C);
    out.push_back({mt + "attn.qkv.bias", {3, C}, hf + "attn.c_attn.bias", {3 * C}, false});
    linear(mt + "attn.proj.weight", hf + "attn.c_proj.weight", {C, C}, C, C);
    same(mt + "attn.proj.bias", hf + "attn.c_proj.bias", {C});
    same(mt + "ln_2.weight", hf + "ln_2.weight", {C});
    same(mt + "ln_2.bias", hf + "ln_2.bias", {C});
    linear(mt + "mlp.fc.weight", hf + "mlp.c_fc.weight", {4 * C, C}, C, 4 * C);
    same(mt + "mlp.fc.bias", hf + "mlp.c_fc.bias", {4 * C});
    linear(mt + "mlp.proj.weight", hf + "mlp.c_proj.weight", {C, 4 * C}, 4 * C, C);
    same(mt + "mlp.proj.bias", hf + "mlp.c_proj.bias", {C});
  }
  same("ln_f.weight", "transformer.ln_f.weight", {C});
  same("ln_f.bias", "transformer.ln_f.bias", {C});
  // Tied: HF omits lm_head.weight and ties it to wte itself (tie_word_embeddings).
  if (!m.tie_embeddings) same("lm_head.weight", "lm_head.weight", {V, C});
  return out;
}

void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols) {
  // Blocked, so that neither side is walked with a stride of a whole row per element.
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(rows, r0 + kB); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kB); ++c) out[c * rows + r] = in[r * cols + c];
}

std::string hf_gpt2_config_json(const GptConfig& m, const std::string& torch_dtype,
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
  j["n_inner"] = 4 * m.d_model;
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
