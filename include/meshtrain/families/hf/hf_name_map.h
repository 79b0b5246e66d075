#pragma once
// What Hugging Face's model classes and meshtrain's parameter table have in common: a table of
// name templates ("h.{}.ln_1.weight" <-> "transformer.h.{}.ln_1.weight", as is / transposed /
// flattened / one slice of a fused tensor) applied to the model's parameter table
// (model/parameter_table.h). Each family's table lives beside its config mapping
// (families/gpt2/hf_gpt2.cpp, families/llama/hf_llama.cpp, families/moe/hf_moe.cpp); this file
// applies a table and moves the values.
//
// No parameter is listed by hand: one the templates do not cover is an error, not a tensor
// silently left out of an export.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// Rows HF stores in another order than meshtrain: in each group of `block` rows of a tensor (one
// query head of DeepSeek-V3's q_b_proj, or kv_a_proj_with_mqa's whole output), the `width` rows
// from `offset` (the rotary part) are interleaved pairs on HF's side, (x0, x1), (x2, x3), ...
// (rope_interleave: transformers' apply_rotary_pos_emb_interleave rotates pair i by angle i and
// writes its output de-interleaved), and halves on meshtrain's, x0, x2, ..., x1, x3, ..., which its
// rotate-half kernel reads and which gives HF's output bit for bit in HF's own output order:
//   meshtrain row offset + j = HF row offset + 2j,  row offset + width/2 + j = HF row offset + 2j + 1.
// width 0: none.
struct HfRopeRows {
  int64_t block = 0, offset = 0, width = 0;
};

struct HfTensor {
  std::string meshtrain;               // "h.0.attn.qkv.weight"
  std::vector<int64_t> meshtrain_shape;
  std::string hf;                      // "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> hf_shape;
  // HF holds the transpose of meshtrain's tensor read as (numel / last, last).
  bool transpose = false;
  // HF holds slice `part` of `parts` equal slices of meshtrain's tensor along its first
  // dimension: the fused (3, NH*HS, C) qkv weight is HF Llama's q_proj, k_proj and v_proj; the
  // stacked (E, F, C) experts are E tensors of HF's, one per expert.
  int64_t part = 0, parts = 1;
  // The rotary rows HF interleaves (of HF's tensor, after the part is taken); not with transpose.
  HfRopeRows rope_rows;
  // Model state, not a parameter: one of the stage's buffers (the sigmoid router's expert bias,
  // model/expert_bias.h), which a checkpoint holds under /buffers/ in fp64 and HF as a module's
  // buffer. Written F32 whatever the weights' dtype, as DeepSeek's checkpoints hold it and as
  // transformers keeps it (_keep_in_fp32_modules_strict).
  bool state = false;
};

// How a meshtrain parameter becomes its HF tensor.
enum class HfTransform {
  Same,              // as is
  TransposedLinear,  // meshtrain (out, in) read as (numel / in, in), HF Conv1D's (in, out)
  Flattened,         // the same values as one dimension (the blocked qkv bias (3, C) -> (3C))
  ThirdQ,            // the first of three slices along dimension 0 (fused q, k, v), flattened
  ThirdK,            //   after the first dimension: (3, W, C) -> (W, C); (3, W) -> (W)
  ThirdV,
  // One tensor per expert: meshtrain stacks a mixture's experts along dimension 0 ((E, F, C),
  // one GEMM operand for all), HF keeps a module per expert. The HF name's "{e}" is the expert.
  PerExpert,
};

struct HfNameRule {
  const char* meshtrain;  // "{}" stands for the block index
  const char* hf;         // "{}": the block index; "{e}": the expert (PerExpert only)
  HfTransform how;
};

// A name template with its first `placeholder` ("{}": the block index; "{e}": the expert) filled
// by `index`; the template itself where it has none.
std::string hf_fill_name(const char* pattern, const std::string& index, const char* placeholder = "{}");

// Every parameter of `m`'s parameter table under `rules`, in the rules' order (the rules with
// "{}" applied block by block, as a group; a PerExpert rule gives its experts in a row). A rule whose parameter the model lacks is skipped (a
// tied model has no lm_head.weight). Throws std::logic_error naming `model_class` for a
// parameter no rule covers.
std::vector<HfTensor> hf_tensors(const ModelSpec& m, const HfNameRule* rules, size_t count,
                                 const std::string& model_class);

// Gives every tensor of `tensors` whose HF name ends in `hf_suffix` ("self_attn.q_b_proj.weight")
// the rotary rows `rows`: a family sets them from its spec after hf_tensors. Throws
// std::logic_error for a geometry its tensor cannot have (an odd width, rows beyond the block, a
// tensor whose rows are not whole blocks, a transposed tensor).
void set_hf_rope_rows(std::vector<HfTensor>& tensors, const std::string& hf_suffix, HfRopeRows rows);

// meshtrain's (rows, cols) row-major -> HF's (cols, rows), or back (the same operation with the
// roles swapped): out[c * rows + r] = in[r * cols + c].
void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols);

// HF's values of `t` from meshtrain's whole parameter `values` (meshtrain_shape, row-major).
std::vector<float> to_hf_layout(const HfTensor& t, const std::vector<float>& values);
// Writes HF's values `hf` of `t` into meshtrain's parameter `values` (resized to the
// parameter's numel on first use): the inverse of to_hf_layout, part by part.
void from_hf_layout(const HfTensor& t, const std::vector<float>& hf, std::vector<float>& values);

}  // namespace meshtrain
