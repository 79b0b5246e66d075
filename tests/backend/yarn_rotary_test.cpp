// YaRN's rotary scaling (backend/rotary_table.h, model/rotary_positions.h): the inverse
// frequencies and the attention factor on cos and sin for DeepSeek-V3's and a Qwen-style
// config against Hugging Face's _compute_yarn_parameters transcribed literally below (its
// variable names and its order of operations, in fp64), DeepSeek's softmax factor m^2, the
// table's amplitude, the deck spec's mapping, and the refusals.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/rotary_table.h"
#include "meshtrain/model/rotary_positions.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using Vec = std::vector<double>;

struct HfYarn {
  Vec inv_freq;
  double low = 0, high = 0, attention_factor = 0;
};

// modeling_rope_utils.py's _compute_yarn_parameters, line by line (mscale and mscale_all_dim 0
// stand for None, attention_factor 0 for None).
HfYarn hf_yarn(int dim, double base, double factor, double original, double beta_fast, double beta_slow,
               double mscale, double mscale_all_dim, double attention_factor, bool truncate) {
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  HfYarn out;
  if (attention_factor == 0)
    attention_factor = mscale != 0 && mscale_all_dim != 0
                           ? get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                           : get_mscale(factor, 1.0);
  out.attention_factor = attention_factor;
  auto find_correction_dim = [&](double num_rotations) {
    return (dim * std::log(original / (num_rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = find_correction_dim(beta_fast), high = find_correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  out.low = low;
  out.high = high;
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freqs = std::pow(base, static_cast<double>(2 * i) / dim);
    const double inv_freq_extrapolation = 1.0 / pos_freqs;
    const double inv_freq_interpolation = 1.0 / (factor * pos_freqs);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double inv_freq_extrapolation_factor = 1 - ramp;
    out.inv_freq.push_back(inv_freq_interpolation * (1 - inv_freq_extrapolation_factor) +
                           inv_freq_extrapolation * inv_freq_extrapolation_factor);
  }
  return out;
}

void expect_same_frequencies(const Vec& got, const Vec& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << what << " pair " << i;
}

RopeSpec deepseek_v3_rope() {
  RopeSpec r;
  r.theta = 10000.0;
  r.scaling = RopeScalingKind::Yarn;
  r.factor = 40.0;
  r.original_max_positions = 4096;
  r.beta_fast = 32.0;
  r.beta_slow = 1.0;
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  return r;
}

// DeepSeek-V3's config.json (qk_rope_head_dim 64): the ramp runs from pair 10 to pair 23, the
// amplitude is mscale / mscale_all_dim = 1, and all the length correction sits in the softmax's
// m^2, m = 0.1 ln 40 + 1.
TEST(YarnRope, DeepSeekV3FrequenciesAmplitudeAndSoftmaxFactor) {
  const RopeSpec rope = deepseek_v3_rope();
  const HfYarn hf = hf_yarn(64, 10000.0, 40.0, 4096.0, 32.0, 1.0, 1.0, 1.0, 0.0, true);
  EXPECT_EQ(hf.low, 10.0);
  EXPECT_EQ(hf.high, 23.0);
  const Vec got = rope_inverse_frequencies(64, rope_frequencies(rope));
  expect_same_frequencies(got, hf.inv_freq, "deepseek-v3");
  // Pairs up to 10 keep theta^(-2i/d); from 23 on they are divided by 40.
  for (int i : {0, 10}) EXPECT_NEAR(got[i], std::pow(10000.0, -2.0 * i / 64), 1e-16) << i;
  for (int i : {23, 31}) EXPECT_NEAR(got[i], std::pow(10000.0, -2.0 * i / 64) / 40, 1e-18) << i;
  EXPECT_EQ(rope_amplitude(rope_frequencies(rope)), 1.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(m, 1.368888, 1e-6);
  EXPECT_DOUBLE_EQ(yarn_softmax_mscale(rope), m * m);
  // 192^-0.5 m^2: DeepseekV3Attention's scaling.
  EXPECT_NEAR(yarn_softmax_mscale(rope) / std::sqrt(192.0), 0.135234, 1e-6);
}

// A Qwen 3 long-context config (factor 4 over 32768, no mscale keys): amplitude 0.1 ln 4 + 1 on
// cos and sin, and no softmax factor.
TEST(YarnRope, QwenStyleConfigScalesCosAndSin) {
  RopeSpec rope;
  rope.theta = 1e6;
  rope.scaling = RopeScalingKind::Yarn;
  rope.factor = 4.0;
  rope.original_max_positions = 32768;
  const HfYarn hf = hf_yarn(128, 1e6, 4.0, 32768.0, 32.0, 1.0, 0.0, 0.0, 0.0, true);
  const Vec got = rope_inverse_frequencies(128, rope_frequencies(rope));
  expect_same_frequencies(got, hf.inv_freq, "qwen");
  EXPECT_GT(hf.high - hf.low, 2.0);  // a ramp of several pairs
  EXPECT_DOUBLE_EQ(rope_amplitude(rope_frequencies(rope)), 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(yarn_softmax_mscale(rope), 1.0);
  // The table holds amplitude x cos and amplitude x sin, each rounded once.
  CpuBackend be(1);
  const double amplitude = rope_amplitude(rope_frequencies(rope));
  const int64_t P = 40000, half = 64;
  for (const DType dt : {DType::F64, DType::F32}) {
    const RotaryTable t = make_rotary_table(be, got, P, dt, MemoryCategory::Workspace, amplitude);
    const Vec cos = testing::to_host(be, t.cos), sin = testing::to_host(be, t.sin);
    for (const int64_t p : {int64_t{0}, int64_t{33000}, P - 1})
      for (const int64_t i : {int64_t{0}, int64_t{40}, half - 1}) {
        const double angle = static_cast<double>(p) * got[static_cast<size_t>(i)];
        const double tol = dt == DType::F64 ? 0.0 : 1.2e-7;
        EXPECT_NEAR(cos[p * half + i], amplitude * std::cos(angle), tol) << p << " " << i;
        EXPECT_NEAR(sin[p * half + i], amplitude * std::sin(angle), tol) << p << " " << i;
      }
  }
}

// The optional keys: truncate false (the ramp's ends not rounded), a given attention_factor,
// and the mscale ratio with unequal mscales.
TEST(YarnRope, OptionalKeysFollowHuggingFace) {
  RopeSpec rope = deepseek_v3_rope();
  rope.truncate = false;
  rope.mscale = 0.707;
  const HfYarn hf = hf_yarn(64, 10000.0, 40.0, 4096.0, 32.0, 1.0, 0.707, 1.0, 0.0, false);
  EXPECT_NE(hf.low, std::floor(hf.low));
  expect_same_frequencies(rope_inverse_frequencies(64, rope_frequencies(rope)), hf.inv_freq, "untruncated");
  EXPECT_DOUBLE_EQ(rope_amplitude(rope_frequencies(rope)), hf.attention_factor);
  EXPECT_LT(hf.attention_factor, 1.0);
  rope.attention_factor = 1.25;
  EXPECT_EQ(rope_amplitude(rope_frequencies(rope)), 1.25);
  // Without mscale_all_dim there is no softmax factor; without YaRN neither.
  rope.mscale_all_dim = 0;
  EXPECT_EQ(yarn_softmax_mscale(rope), 1.0);
  RopeSpec llama3 = deepseek_v3_rope();
  llama3.scaling = RopeScalingKind::Llama3;
  EXPECT_EQ(yarn_softmax_mscale(llama3), 1.0);
  EXPECT_EQ(rope_amplitude(rope_frequencies(llama3)), 1.0);
}

TEST(YarnRope, RefusesSettingsWithWhatWouldBeAccepted) {
  const auto refused = [](void (*change)(RopeSpec&), const char* words) {
    RopeSpec rope = deepseek_v3_rope();
    change(rope);
    try {
      rope_inverse_frequencies(64, rope_frequencies(rope));
      ADD_FAILURE() << "not refused: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](RopeSpec& r) { r.factor = 0.5; }, "rope_scaling.factor = 0.5 is not accepted (YaRN stretches");
  refused([](RopeSpec& r) { r.beta_fast = 1.0; },
          "rope_scaling.beta_fast = 1 is not accepted (a number of turns above beta_slow 1");
  refused([](RopeSpec& r) { r.beta_slow = 0.0; }, "rope_scaling.beta_slow = 0 is not accepted");
  refused([](RopeSpec& r) { r.mscale = -1.0; }, "rope_scaling.mscale = -1 is not accepted");
  refused([](RopeSpec& r) { r.attention_factor = -2.0; }, "rope_scaling.attention_factor = -2");
  refused([](RopeSpec& r) { r.original_max_positions = 0; },
          "rope_scaling.original_max_position_embeddings = 0");
}

}  // namespace
}  // namespace meshtrain
