#pragma once
// FP8 block-scaled weights in a Hugging Face directory, as DeepSeek-V3/R1 and Kimi K2 publish them
// (transformers' FineGrainedFP8Config): config.json's quantization_config read and checked, and
// each F8_E4M3 weight turned back into numbers with its "<name>_scale_inv". Any family's import
// uses it (app/import_command.cpp); not the safetensors format (io/safetensors.h reads the codes),
// and not export, which never writes FP8 nor a quantization_config.
//
// The rule (DeepSeek's, and transformers' integrations/finegrained_fp8.py
// `_dequantize_fp8_weight`; despite its name the scale is a multiplier):
//   W[i, j] = e4m3(Q[i, j]) * S[i / bm, j / bn],   S of shape (ceil(R / bm), ceil(C / bn)),
// so the last block of a dimension that is not a multiple of the block is partial (DeepSeek-V3's
// kv_a_proj_with_mqa: 576 rows, 4.5 blocks of 128). transformers' CPU loader derives the block
// from the grid instead and refuses such shapes; meshtrain follows the ceil rule.
// An e4m3 value has 4 significant bits and an fp32 scale 24: their product is exact in fp64, and
// is rounded once, to the fp32 a checkpoint holds.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/families/hf/hf_config_reader.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {

// config.json's weight_block_size: the rows and columns one scale covers.
struct HfFp8Blocks {
  int64_t rows = 0, cols = 0;
};

// config.json's quantization_config: nullopt when absent or null; the block size when it is
// quant_method "fp8" with fmt "e4m3" (or no fmt) and a weight_block_size of two integers >= 1.
// Every other method (compressed-tensors, bitsandbytes, gptq, awq, mxfp4, ...), format or block is
// refused, naming the key, its value and what meshtrain imports.
std::optional<HfFp8Blocks> hf_fp8_quantization(const HfConfigReader& config);

// "X.weight" -> "X.weight_scale_inv"; and back, nullopt for a name that is no scale's.
std::string hf_fp8_scale_name(const std::string& weight);
std::optional<std::string> hf_fp8_weight_of_scale(const std::string& name);

// The value of each of the 256 e4m3fn codes (OCP FP8: sign, 4 exponent bits of bias 7, 3
// mantissa bits; no infinity; 0x7F and 0xFF are NaN, 0x7E is 448).
const std::array<double, 256>& e4m3_values();

// W = e4m3(codes) * scale_inv by blocks (the rule above) of a (rows, cols) matrix, in fp64,
// rounded once to fp32. scale_inv: (ceil(rows / bm), ceil(cols / bn)), row-major. Throws
// std::runtime_error naming `where` and the element for a NaN code.
std::vector<float> dequantize_fp8_blocks(const uint8_t* codes, int64_t rows, int64_t cols,
                                         const std::vector<float>& scale_inv, HfFp8Blocks blocks,
                                         const std::string& where);

// A stored F8_E4M3 weight `weight` of `file` as fp32, with its scale `scale` of `scale_file`
// (both null when the directory has none). Refused, naming the file, the tensor and what is
// accepted: no quantization_config in `config_path` (`blocks` nullopt), a weight that is not
// 2-D, no scale, a scale that is not a float tensor of the grid's shape or holds a value that is
// not finite, a NaN code.
std::vector<float> read_hf_fp8_weight(const SafetensorsFile& file, const SafetensorsEntry& weight,
                                      const SafetensorsFile* scale_file, const SafetensorsEntry* scale,
                                      const std::optional<HfFp8Blocks>& blocks, const std::string& config_path);

// Refuses a stored scale `scale` (of `file`) whose weight is absent (`weight` null) or not
// F8_E4M3: a scale is read with its weight, never on its own.
void check_hf_fp8_scale_has_weight(const std::string& file, const SafetensorsEntry& scale,
                                   const SafetensorsEntry* weight);

}  // namespace meshtrain
