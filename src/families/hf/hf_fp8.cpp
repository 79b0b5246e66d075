#include "meshtrain/families/hf/hf_fp8.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace meshtrain {

using nlohmann::json;

namespace {

constexpr const char* kScaleSuffix = "_scale_inv";
constexpr const char* kImports =
    "meshtrain imports bf16, fp16 or fp32 weights, or fp8 e4m3 block-scaled ones: quant_method \"fp8\", fmt "
    "\"e4m3\", weight_block_size [rows, cols]";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string shape_text(const std::vector<int64_t>& shape) {
  SafetensorsEntry e;
  e.shape = shape;
  return e.shape_string();
}

}  // namespace

std::optional<HfFp8Blocks> hf_fp8_quantization(const HfConfigReader& config) {
  const json q = json_value_or(config.config(), "quantization_config", json());
  if (q.is_null()) return std::nullopt;
  if (!q.is_object()) config.refuse("quantization_config", q, std::string("expected an object; ") + kImports);
  const json method = json_value_or(q, "quant_method", json("(absent)"));
  if (method != "fp8")
    config.refuse("quantization_config.quant_method", method,
                  std::string(kImports) + "; " + (method.is_string() ? method.get<std::string>() : method.dump()) +
                      " is not supported");
  const json fmt = json_value_or(q, "fmt", json("e4m3"));
  if (fmt != "e4m3")
    config.refuse("quantization_config.fmt", fmt,
                  "meshtrain dequantizes fp8 e4m3 (OCP e4m3fn) weights only; " + std::string(kImports));
  const json block = json_value_or(q, "weight_block_size", json());
  const std::string want = "expected two integers >= 1, the rows and columns one scale covers, e.g. [128, 128] "
                           "(meshtrain imports block-scaled fp8, not per-tensor scales)";
  if (!block.is_array() || block.size() != 2) config.refuse("quantization_config.weight_block_size", block, want);
  HfFp8Blocks b;
  const std::optional<int64_t> rows = json_int64(block[0]), cols = json_int64(block[1]);
  if (!rows || !cols || *rows < 1 || *cols < 1) config.refuse("quantization_config.weight_block_size", block, want);
  b.rows = *rows;
  b.cols = *cols;
  return b;
}

std::string hf_fp8_scale_name(const std::string& weight) { return weight + kScaleSuffix; }

std::optional<std::string> hf_fp8_weight_of_scale(const std::string& name) {
  const std::string suffix = kScaleSuffix;
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  return name.substr(0, name.size() - suffix.size());
}

const std::array<double, 256>& e4m3_values() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
      double v;
      if (exponent == 0xF && mantissa == 0x7)
        v = std::numeric_limits<double>::quiet_NaN();  // e4m3fn has no infinity: S.1111.111 is NaN
      else if (exponent == 0)
        v = std::ldexp(mantissa / 8.0, -6);  // subnormal
      else
        v = std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
      t[static_cast<size_t>(code)] = (code & 0x80) ? -v : v;
    }
    return t;
  }();
  return table;
}

std::vector<float> dequantize_fp8_blocks(const uint8_t* codes, int64_t rows, int64_t cols,
                                         const std::vector<float>& scale_inv, HfFp8Blocks blocks,
                                         const std::string& where) {
  const std::array<double, 256>& value = e4m3_values();
  const int64_t grid_cols = ceil_div(cols, blocks.cols);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float* scale_row = scale_inv.data() + (i / blocks.rows) * grid_cols;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t at = i * cols + j;
      const double v = value[codes[at]];
      if (std::isnan(v))
        hf_refuse(where + " holds the NaN code 0x" + "0123456789ABCDEF"[codes[at] >> 4] +
                  "0123456789ABCDEF"[codes[at] & 0xF] + " at element " + std::to_string(at) + " (index [" +
                  std::to_string(i) + ", " + std::to_string(j) +
                  "]); meshtrain imports finite weights only (a damaged download?)");
      out[static_cast<size_t>(at)] = static_cast<float>(v * static_cast<double>(scale_row[j / blocks.cols]));
    }
  }
  return out;
}

std::vector<float> read_hf_fp8_weight(const SafetensorsFile& file, const SafetensorsEntry& weight,
                                      const SafetensorsFile* scale_file, const SafetensorsEntry* scale,
                                      const std::optional<HfFp8Blocks>& blocks, const std::string& config_path) {
  const std::string where = file.path() + ": tensor " + weight.name;
  if (!blocks)
    hf_refuse(where + " is F8_E4M3, but " + config_path +
              " has no quantization_config (an fp8 weight is numbers only with the block scales quant_method "
              "\"fp8\" describes; " + kImports + ")");
  if (weight.shape.size() != 2)
    hf_refuse(where + " is F8_E4M3 of shape " + weight.shape_string() +
              " (meshtrain dequantizes 2-D fp8 weights, a linear layer's (out, in))");
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const std::vector<int64_t> grid = {ceil_div(rows, blocks->rows), ceil_div(cols, blocks->cols)};
  const std::string scale_name = hf_fp8_scale_name(weight.name);
  const std::string block_text =
      "weight_block_size [" + std::to_string(blocks->rows) + ", " + std::to_string(blocks->cols) + "]";
  if (!scale)
    hf_refuse(where + " is F8_E4M3, but its scale " + scale_name + " is missing (expected F32 of shape " +
              shape_text(grid) + ": one per block of " + config_path + "'s " + block_text + ")");
  const std::string scale_where = scale_file->path() + ": tensor " + scale->name;
  if (scale->dtype == SafeDType::F8_E4M3 || scale->shape != grid)
    hf_refuse(scale_where + " is " + std::string(safetensors_dtype_name(scale->dtype)) + " of shape " +
              scale->shape_string() + ", but " + weight.name + " " + weight.shape_string() + " with " + block_text +
              " needs F32, BF16 or F16 of shape " + shape_text(grid) + " (ceil(rows / " +
              std::to_string(blocks->rows) + "), ceil(cols / " + std::to_string(blocks->cols) + "))");
  const std::vector<float> scale_inv = scale_file->read_f32(*scale);
  for (size_t k = 0; k < scale_inv.size(); ++k)
    if (!std::isfinite(scale_inv[k]))
      hf_refuse(scale_where + " holds " + (std::isnan(scale_inv[k]) ? "NaN" : "inf") + " at element " +
                std::to_string(k) + " (a block scale must be a finite number; a damaged download?)");
  const std::vector<char> raw = file.read_raw(weight);
  return dequantize_fp8_blocks(reinterpret_cast<const uint8_t*>(raw.data()), rows, cols, scale_inv, *blocks, where);
}

void check_hf_fp8_scale_has_weight(const std::string& file, const SafetensorsEntry& scale,
                                   const SafetensorsEntry* weight) {
  const std::string weight_name = hf_fp8_weight_of_scale(scale.name).value_or(scale.name);
  if (!weight)
    hf_refuse(file + ": tensor " + scale.name + " is a block scale, but its weight " + weight_name +
              " is not in the directory (a scale is read with its F8_E4M3 weight, never on its own)");
  if (weight->dtype != SafeDType::F8_E4M3)
    hf_refuse(file + ": tensor " + scale.name + " is a block scale, but its weight " + weight_name + " is " +
              std::string(safetensors_dtype_name(weight->dtype)) +
              ", not F8_E4M3 (only fp8 weights have scales: a mixed-up or damaged download?)");
}

}  // namespace meshtrain
