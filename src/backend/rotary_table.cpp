// Rotary inverse frequencies and the cos/sin table (rotary_table.h). Llama 3's scaling follows
// the published rule (Meta's reference implementation and Hugging Face's rope_type "llama3"):
// with wavelength w = 2 pi / f of an inverse frequency f and the original context L,
//   w < L / high_freq_factor:  f kept (short wavelengths already fit in the original context);
//   w > L / low_freq_factor:   f / factor;
//   otherwise:                 (1 - s) f / factor + s f,  s = (L / w - low) / (high - low).
// YaRN's follows Hugging Face's _compute_yarn_parameters (modeling_rope_utils.py) term by term,
// in fp64 where Hugging Face computes in fp32 (rotary_table.h says what it computes).

#include "meshtrain/backend/rotary_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>
#include <string>

namespace meshtrain {

namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

[[noreturn]] void refuse(const std::string& setting, double value, const std::string& accepted) {
  throw std::invalid_argument("rotary embedding: " + setting + " = " + number(value) +
                              " is not accepted (" + accepted + ")");
}

void check(const Llama3RopeScaling& s) {
  if (!(s.factor > 0)) refuse("rope_scaling.factor", s.factor, "a number > 0, e.g. 8");
  if (!(s.low_freq_factor > 0))
    refuse("rope_scaling.low_freq_factor", s.low_freq_factor, "a number > 0, e.g. 1");
  if (!(s.high_freq_factor > s.low_freq_factor))
    refuse("rope_scaling.high_freq_factor", s.high_freq_factor,
           "a number above low_freq_factor " + number(s.low_freq_factor) + ", e.g. 4");
  if (s.original_max_position_embeddings <= 0)
    refuse("rope_scaling.original_max_position_embeddings",
           static_cast<double>(s.original_max_position_embeddings), "a length > 0, e.g. 8192");
}

void check(const YarnRopeScaling& s) {
  if (!(s.factor >= 1))
    refuse("rope_scaling.factor", s.factor,
           "YaRN stretches the context by a number >= 1, e.g. 4 (Hugging Face requires >= 1)");
  if (!(s.beta_slow > 0))
    refuse("rope_scaling.beta_slow", s.beta_slow, "a number of turns > 0, e.g. 1");
  if (!(s.beta_fast > s.beta_slow))
    refuse("rope_scaling.beta_fast", s.beta_fast,
           "a number of turns above beta_slow " + number(s.beta_slow) + ", e.g. 32");
  if (!(s.mscale >= 0)) refuse("rope_scaling.mscale", s.mscale, "a number >= 0, e.g. 1; 0: absent");
  if (!(s.mscale_all_dim >= 0))
    refuse("rope_scaling.mscale_all_dim", s.mscale_all_dim, "a number >= 0, e.g. 1; 0: absent");
  if (!(s.attention_factor >= 0))
    refuse("rope_scaling.attention_factor", s.attention_factor,
           "a number > 0, or 0 for the one derived from factor and the mscales");
  if (s.original_max_position_embeddings <= 0)
    refuse("rope_scaling.original_max_position_embeddings",
           static_cast<double>(s.original_max_position_embeddings), "a length > 0, e.g. 4096");
}

// YaRN's blend of each pair's frequency f_i (kept) and f_i / factor (interpolated).
void yarn_scale(std::vector<double>& inv_freq, int64_t head_dim, double theta, const YarnRopeScaling& s) {
  const double dim = static_cast<double>(head_dim);
  const double context = static_cast<double>(s.original_max_position_embeddings);
  // The pair index at which a pair makes `turns` rotations over the original context.
  const auto pair_of_turns = [&](double turns) {
    return dim * std::log(context / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = pair_of_turns(s.beta_fast), high = pair_of_turns(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // Hugging Face's guard against a zero-width ramp
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv_freq[i] = inv_freq[i] / s.factor * ramp + inv_freq[i] * (1.0 - ramp);
  }
}

double llama3_scaled(double f, const Llama3RopeScaling& s) {
  const double context = static_cast<double>(s.original_max_position_embeddings);
  const double wavelength = 2.0 * std::numbers::pi / f;
  if (wavelength < context / s.high_freq_factor) return f;
  if (wavelength > context / s.low_freq_factor) return f / s.factor;
  const double smooth =
      (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

}  // namespace

std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeFrequencies& rope) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    refuse("head_dim", static_cast<double>(head_dim),
           "an even number > 0: rotate-half pairs channel i with i + head_dim/2");
  if (!(rope.theta > 0)) refuse("rope_theta", rope.theta, "a number > 0, e.g. 500000");
  if (rope.llama3) check(*rope.llama3);
  if (rope.yarn) check(*rope.yarn);
  std::vector<double> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double f =
        1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    inv_freq[static_cast<size_t>(i)] = rope.llama3 ? llama3_scaled(f, *rope.llama3) : f;
  }
  if (rope.yarn) yarn_scale(inv_freq, head_dim, rope.theta, *rope.yarn);
  return inv_freq;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double rope_amplitude(const RopeFrequencies& rope) {
  if (!rope.yarn) return 1.0;
  const YarnRopeScaling& s = *rope.yarn;
  check(s);
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

RotaryTable make_rotary_table(Backend& backend, const std::vector<double>& inv_freq,
                              int64_t positions, DType activation, MemoryCategory category,
                              double amplitude) {
  if (positions < 0) refuse("positions", static_cast<double>(positions), "a count >= 0");
  if (!(amplitude > 0)) refuse("amplitude", amplitude, "a factor > 0 on cos and sin");
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const DType wide = activation == DType::F64 ? DType::F64 : DType::F32;
  RotaryTable table{backend.empty({positions, half}, wide, category),
                    backend.empty({positions, half}, wide, category)};
  if (backend.planning()) return table;
  std::vector<double> cos(static_cast<size_t>(positions * half)), sin(cos.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // The product in fp64: at position 100000 an fp32 angle would be off by ~0.004 rad.
      const double angle = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      // Multiplied in fp64 before the one rounding (exact, and a no-op, for amplitude 1).
      cos[static_cast<size_t>(p * half + i)] = amplitude * std::cos(angle);
      sin[static_cast<size_t>(p * half + i)] = amplitude * std::sin(angle);
    }
  if (wide == DType::F64) {
    backend.copy_from_host(table.cos, cos.data());
    backend.copy_from_host(table.sin, sin.data());
  } else {
    const std::vector<float> cos32(cos.begin(), cos.end()), sin32(sin.begin(), sin.end());
    backend.copy_from_host(table.cos, cos32.data());
    backend.copy_from_host(table.sin, sin32.data());
  }
  return table;
}

}  // namespace meshtrain
