// FP8 block-scaled import (families/hf/hf_fp8.h): the e4m3fn table against the format's
// definition, the block rule on synthetic blocks (partial last blocks in both dimensions, against
// a naive loop), config.json's quantization_config and every refusal, each naming what it found
// and what is accepted.

#include "meshtrain/families/hf/hf_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "meshtrain/app/hf_directory.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;
using nlohmann::json;

std::string quantization_error(const json& q) {
  const json config = {{"quantization_config", q}};
  try {
    hf_fp8_quantization(HfConfigReader(config, "config.json", deck_key_range));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

std::vector<char> floats(const std::vector<float>& v) {
  std::vector<char> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(HfFp8, E4m3TableFollowsTheFormat) {
  const std::array<double, 256>& v = e4m3_values();
  EXPECT_EQ(v[0x00], 0.0);
  EXPECT_TRUE(std::signbit(v[0x80]) && v[0x80] == 0.0);
  EXPECT_EQ(v[0x38], 1.0);                  // exponent 7 = bias
  EXPECT_EQ(v[0xB8], -1.0);
  EXPECT_EQ(v[0x7E], 448.0);                // the largest: 1.75 * 2^8
  EXPECT_EQ(v[0x08], std::ldexp(1.0, -6));  // the smallest normal
  EXPECT_EQ(v[0x01], std::ldexp(1.0, -9));  // the smallest subnormal
  EXPECT_EQ(v[0x07], std::ldexp(7.0, -9));  // the largest subnormal
  EXPECT_EQ(v[0x3D], 1.625);
  EXPECT_TRUE(std::isnan(v[0x7F]) && std::isnan(v[0xFF]));
  // No other code is NaN or infinite, and the positive codes increase.
  for (int c = 0; c < 0x7F; ++c) {
    EXPECT_TRUE(std::isfinite(v[c]) && std::isfinite(v[c | 0x80])) << c;
    EXPECT_EQ(v[c | 0x80], -v[c]) << c;
    if (c > 0) {
      EXPECT_LT(v[c - 1], v[c]) << c;
    }
  }
}

TEST(HfFp8, DequantizesByCeilBlocksWithPartialLastBlocks) {
  // (7, 5) in blocks of (3, 2): a grid of (3, 3), the last block row 1 row high, the last block
  // column 1 column wide.
  const int64_t rows = 7, cols = 5;
  const HfFp8Blocks blocks{3, 2};
  std::vector<uint8_t> codes(rows * cols);
  for (size_t k = 0; k < codes.size(); ++k) codes[k] = static_cast<uint8_t>((k * 37 + 11) % 0x7F) | ((k % 3) ? 0 : 0x80);
  const std::vector<float> scales = {0.5f, 3.0f, 1e-3f, 7.25f, 0.1f, 2.0f, 1.0f / 3.0f, 6.0f, 0.0078125f};
  const std::vector<float> got = dequantize_fp8_blocks(codes.data(), rows, cols, scales, blocks, "w");
  ASSERT_EQ(got.size(), codes.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double want = e4m3_values()[codes[i * cols + j]] * double(scales[(i / 3) * 3 + j / 2]);
      EXPECT_EQ(got[i * cols + j], static_cast<float>(want)) << i << ", " << j;
    }
  // The last row and column read the partial blocks' scales.
  EXPECT_EQ(got[6 * cols + 4], static_cast<float>(e4m3_values()[codes[6 * cols + 4]] * double(scales[8])));
}

TEST(HfFp8, RefusesNanCodesByName) {
  const std::vector<uint8_t> codes = {0x38, 0x38, 0x7F, 0x38};
  try {
    dequantize_fp8_blocks(codes.data(), 2, 2, {1.0f}, {2, 2}, "d/model.safetensors: tensor w");
    FAIL() << "a NaN code was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("d/model.safetensors: tensor w holds the NaN code 0x7F at element 2 "
                                         "(index [1, 0])"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfFp8, ReadsQuantizationConfig) {
  const json none = json::object();
  EXPECT_FALSE(hf_fp8_quantization(HfConfigReader(none, "config.json", deck_key_range)));
  const json deepseek = {{"quantization_config",
                          {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                           {"weight_block_size", {128, 64}}}}};
  const auto b = hf_fp8_quantization(HfConfigReader(deepseek, "config.json", deck_key_range));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->rows, 128);
  EXPECT_EQ(b->cols, 64);
  // fmt absent: e4m3.
  const json no_fmt = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {2, 3}}}}};
  EXPECT_TRUE(hf_fp8_quantization(HfConfigReader(no_fmt, "config.json", deck_key_range)));
}

TEST(HfFp8, RefusesOtherQuantizations) {
  for (const char* method : {"compressed-tensors", "bitsandbytes", "gptq", "awq", "mxfp4"}) {
    const std::string e = quantization_error({{"quant_method", method}, {"weight_block_size", {128, 128}}});
    EXPECT_NE(e.find(std::string("config.json: quantization_config.quant_method = \"") + method +
                     "\" (meshtrain imports bf16, fp16 or fp32 weights, or fp8 e4m3 block-scaled ones"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find(std::string("; ") + method + " is not supported)"), std::string::npos) << e;
  }
  EXPECT_NE(quantization_error({{"weight_block_size", {128, 128}}})
                .find("quantization_config.quant_method = \"(absent)\""),
            std::string::npos);
  EXPECT_NE(quantization_error({{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}})
                .find("config.json: quantization_config.fmt = \"e5m2\" (meshtrain dequantizes fp8 e4m3"),
            std::string::npos);
  for (const json& block : {json(), json::array({128}), json::array({0, 128}), json::array({128, -1}),
                            json::array({128, 1.5}), json::array({128, 128, 1}), json("128")}) {
    const std::string e = quantization_error({{"quant_method", "fp8"}, {"weight_block_size", block}});
    EXPECT_NE(e.find("config.json: quantization_config.weight_block_size = " + block.dump() +
                     " (expected two integers >= 1"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(quantization_error("fp8").find("config.json: quantization_config = \"fp8\" (expected an object"),
            std::string::npos);
}

TEST(HfFp8, ScaleNames) {
  EXPECT_EQ(hf_fp8_scale_name("model.layers.0.mlp.up_proj.weight"), "model.layers.0.mlp.up_proj.weight_scale_inv");
  EXPECT_EQ(hf_fp8_weight_of_scale("a.weight_scale_inv"), "a.weight");
  EXPECT_FALSE(hf_fp8_weight_of_scale("a.weight"));
  EXPECT_FALSE(hf_fp8_weight_of_scale("_scale_inv"));
}

// A file with an F8_E4M3 weight "w" (5, 3) and the scales given, for read_hf_fp8_weight.
struct Fp8File {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  SafetensorsFile file;
  static SafetensorsFile write(const std::string& path, std::vector<int64_t> weight_shape, SafeDType scale_dtype,
                               std::vector<int64_t> scale_shape, std::vector<float> scales) {
    SafetensorsWriter w;
    int64_t n = 1;
    for (int64_t d : weight_shape) n *= d;
    std::vector<char> codes(static_cast<size_t>(n));
    for (size_t k = 0; k < codes.size(); ++k) codes[k] = static_cast<char>(0x30 + k % 16);
    w.add("w", SafeDType::F8_E4M3, weight_shape, codes);
    if (!scale_shape.empty()) w.add("w_scale_inv", scale_dtype, scale_shape, floats(scales));
    w.write(path);
    return SafetensorsFile::open(path);
  }
  Fp8File(std::vector<int64_t> weight_shape, std::vector<int64_t> scale_shape, std::vector<float> scales,
          SafeDType scale_dtype = SafeDType::F32)
      : file(write(path, weight_shape, scale_dtype, scale_shape, scales)) {}
  std::string error(std::optional<HfFp8Blocks> blocks) const {
    try {
      read_hf_fp8_weight(file, *file.find("w"), &file, file.find("w_scale_inv"), blocks, "d/config.json");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(HfFp8, ReadsAWeightWithItsScale) {
  Fp8File f({5, 3}, {3, 2}, {1, 2, 3, 4, 5, 6});
  const std::vector<float> got = read_hf_fp8_weight(f.file, *f.file.find("w"), &f.file, f.file.find("w_scale_inv"),
                                                   HfFp8Blocks{2, 2}, "d/config.json");
  ASSERT_EQ(got.size(), 15u);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j)
      EXPECT_EQ(got[i * 3 + j], float(e4m3_values()[0x30 + (i * 3 + j) % 16] * ((i / 2) * 2 + j / 2 + 1)));
  // F8 is no plain float tensor.
  EXPECT_THROW(f.file.read_f32(*f.file.find("w")), SafetensorsError);
}

TEST(HfFp8, RefusesAWeightWithoutItsScaleOrQuantization) {
  const std::string p = "model.safetensors: tensor w ";
  EXPECT_NE(Fp8File({5, 3}, {3, 2}, {1, 2, 3, 4, 5, 6}).error(std::nullopt).find(
                p + "is F8_E4M3, but d/config.json has no quantization_config"),
            std::string::npos);
  const std::string missing = Fp8File({5, 3}, {}, {}).error(HfFp8Blocks{2, 2});
  EXPECT_NE(missing.find(p + "is F8_E4M3, but its scale w_scale_inv is missing (expected F32 of shape (3, 2): one "
                             "per block of d/config.json's weight_block_size [2, 2])"),
            std::string::npos)
      << missing;
  // The floor grid (2, 1) is not the ceil grid (3, 2).
  const std::string floor = Fp8File({5, 3}, {2, 1}, {1, 2}).error(HfFp8Blocks{2, 2});
  EXPECT_NE(floor.find("model.safetensors: tensor w_scale_inv is F32 of shape (2, 1), but w (5, 3) with "
                       "weight_block_size [2, 2] needs F32, BF16 or F16 of shape (3, 2) (ceil(rows / 2), "
                       "ceil(cols / 2))"),
            std::string::npos)
      << floor;
  EXPECT_NE(Fp8File({15}, {8}, std::vector<float>(8, 1)).error(HfFp8Blocks{2, 2}).find(
                p + "is F8_E4M3 of shape (15,) (meshtrain dequantizes 2-D fp8 weights"),
            std::string::npos);
  const std::string nan = Fp8File({2, 2}, {1, 1}, {NAN}).error(HfFp8Blocks{2, 2});
  EXPECT_NE(nan.find("tensor w_scale_inv holds NaN at element 0 (a block scale must be a finite number"),
            std::string::npos)
      << nan;
}

TEST(HfFp8, RefusesAScaleWithoutItsWeight) {
  SafetensorsEntry scale, weight;
  scale.name = "x.weight_scale_inv";
  try {
    check_hf_fp8_scale_has_weight("f", scale, nullptr);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("f: tensor x.weight_scale_inv is a block scale, but its weight x.weight is "
                                         "not in the directory"),
              std::string::npos)
        << e.what();
  }
  weight.dtype = SafeDType::BF16;
  try {
    check_hf_fp8_scale_has_weight("f", scale, &weight);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("its weight x.weight is BF16, not F8_E4M3"), std::string::npos) << e.what();
  }
  weight.dtype = SafeDType::F8_E4M3;
  EXPECT_NO_THROW(check_hf_fp8_scale_has_weight("f", scale, &weight));
}

}  // namespace
}  // namespace meshtrain
