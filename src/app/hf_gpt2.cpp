#include "meshtrain/app/hf_gpt2.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

namespace {

// How a meshtrain parameter becomes its HF tensor.
enum class HfTransform {
  Same,              // as is
  TransposedLinear,  // meshtrain (out, in) read as (numel / in, in), HF Conv1D's (in, out)
  Flattened,         // the same values as one dimension (the blocked qkv bias (3, C) -> (3C))
};

struct HfNameRule {
  const char* meshtrain;  // "{}" stands for the block index
  const char* hf;
  HfTransform how;
};

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

bool per_block(const HfNameRule& r) { return std::string(r.meshtrain).find("{}") != std::string::npos; }

std::string fill(const char* pattern, const std::string& index) {
  std::string s = pattern;
  const size_t at = s.find("{}");
  if (at != std::string::npos) s.replace(at, 2, index);
  return s;
}

HfTensor apply(const HfNameRule& rule, const ParamEntry& e, const std::string& index) {
  HfTensor t;
  t.meshtrain = e.name;
  for (int k = 0; k < e.shape.rank(); ++k) t.meshtrain_shape.push_back(e.shape[k]);
  t.hf = fill(rule.hf, index);
  const int64_t n = e.numel(), last = t.meshtrain_shape.back();
  switch (rule.how) {
    case HfTransform::Same: t.hf_shape = t.meshtrain_shape; break;
    case HfTransform::TransposedLinear:
      t.hf_shape = {last, n / last};
      t.transpose = true;
      break;
    case HfTransform::Flattened: t.hf_shape = {n}; break;
  }
  return t;
}

}  // namespace

std::vector<HfTensor> hf_gpt2_tensors(const ModelSpec& m) {
  std::map<std::string, ParamEntry> unmapped;
  for (ParamEntry& e : parameter_table(m)) unmapped.emplace(e.name, std::move(e));
  std::vector<HfTensor> out;
  // Adds the tensor of `rule` for block `index` if the model has that parameter.
  auto add = [&](const HfNameRule& rule, const std::string& index) {
    const auto it = unmapped.find(fill(rule.meshtrain, index));
    if (it == unmapped.end()) return false;
    out.push_back(apply(rule, it->second, index));
    unmapped.erase(it);
    return true;
  };
  const size_t rules = std::size(kGpt2Names);
  for (size_t i = 0; i < rules;) {
    if (!per_block(kGpt2Names[i])) {
      add(kGpt2Names[i++], "");
      continue;
    }
    size_t end = i;
    while (end < rules && per_block(kGpt2Names[end])) ++end;
    for (int block = 0;; ++block) {
      bool any = false;
      for (size_t r = i; r < end; ++r) any = add(kGpt2Names[r], std::to_string(block)) || any;
      if (!any) break;
    }
    i = end;
  }
  // A parameter the table has no rule for would silently be left out of every export.
  if (!unmapped.empty())
    throw std::logic_error("Hugging Face GPT-2 has no tensor for meshtrain's parameter " +
                           unmapped.begin()->first + " (app/hf_gpt2.cpp's name table lacks a rule)");
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
