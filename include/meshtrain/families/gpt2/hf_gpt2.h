#pragma once
// Hugging Face GPT-2 (transformers' GPT2LMHeadModel) as meshtrain's model: which HF tensor each
// meshtrain parameter is, with shapes on both sides, and the config.json that describes it.
// The GPT-2 family's HfFormat (families/model_family.h), which `meshtrain import` and `export`
// call; the file format itself is io/safetensors.h.
//
// The map is a table of name templates (hf_gpt2.cpp) applied by families/hf/hf_name_map.h. The two layouts
// (C = d_model, V = vocab_size, T = seq_len):
//
//   | meshtrain (checkpoint /model/...)    | Hugging Face                          | how             |
//   |--------------------------------------|---------------------------------------|-----------------|
//   | wte (V, C), wpe (T, C)               | transformer.wte.weight, .wpe.weight   | as is           |
//   | h.i.ln_1.weight / .bias (C)          | transformer.h.i.ln_1.weight / .bias   | as is           |
//   | h.i.attn.qkv.weight (3, C, C)        | transformer.h.i.attn.c_attn.weight (C, 3C) | transposed |
//   | h.i.attn.qkv.bias (3, C)             | transformer.h.i.attn.c_attn.bias (3C) | flattened       |
//   | h.i.attn.proj.weight (C, C)          | ...attn.c_proj.weight (C, C)          | transposed      |
//   | h.i.mlp.fc.weight (4C, C)            | ...mlp.c_fc.weight (C, 4C)            | transposed      |
//   | h.i.mlp.proj.weight (C, 4C)          | ...mlp.c_proj.weight (4C, C)          | transposed      |
//   | ln_f.weight / .bias (C)              | transformer.ln_f.weight / .bias       | as is           |
//   | lm_head.weight (V, C), untied only   | lm_head.weight (V, C)                 | as is           |
//
// meshtrain's linear weights are (out, in) like torch.nn.Linear; HF GPT-2's Conv1D stores
// (in, out). The QKV weight (3, C, C) is (which, out, in): read as (3C, C) its rows are the
// output features [q | k | v], each C wide and split into heads of C / heads contiguously — the
// column order of c_attn — so one transpose of that (3C, C) matrix is the whole mapping.

#include <string>
#include <vector>

#include "meshtrain/families/model_family.h"

namespace meshtrain {

// Every parameter of `m`'s parameter table, in Hugging Face's order (embeddings, blocks, final
// norm, head). Throws std::logic_error for a parameter the name templates do not cover.
std::vector<HfTensor> hf_gpt2_tensors(const ModelSpec& m);

// config.json of GPT2LMHeadModel for `m` (indented JSON text, a trailing newline). torch_dtype:
// "float32" or "bfloat16". `tokenizer` as the checkpoint records it ("byte"): GPT-2's BPE has
// <|endoftext|> = 50256 as bos and eos; the byte tokenizer has neither (null).
std::string hf_gpt2_config_json(const ModelSpec& m, const std::string& torch_dtype,
                                const std::string& tokenizer = "byte");

// GPT2LMHeadModel both ways: config.json read and checked against a deck, the tensors, a
// checkpoint's model refused where GPT2LMHeadModel cannot express it.
const HfFormat& hf_gpt2_format();

}  // namespace meshtrain
