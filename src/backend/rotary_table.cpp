// Rotary inverse frequencies and the cos/sin table (rotary_table.h). Llama 3's scaling follows
// the published rule (Meta's reference implementation and Hugging Face's rope_type "llama3"):
// with wavelength w = 2 pi / f of an inverse frequency f and the original context L,
//   w < L / high_freq_factor:  f kept (short wavelengths already fit in the original context);
//   w > L / low_freq_factor:   f / factor;
//   otherwise:                 (1 - s) f / factor + s f,  s = (L / w - low) / (high - low).

#include "meshtrain/backend/rotary_table.h"

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
  std::vector<double> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double f =
        1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    inv_freq[static_cast<size_t>(i)] = rope.llama3 ? llama3_scaled(f, *rope.llama3) : f;
  }
  return inv_freq;
}

RotaryTable make_rotary_table(Backend& backend, const std::vector<double>& inv_freq,
                              int64_t positions, DType activation, MemoryCategory category) {
  if (positions < 0) refuse("positions", static_cast<double>(positions), "a count >= 0");
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
      cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
      sin[static_cast<size_t>(p * half + i)] = std::sin(angle);
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
