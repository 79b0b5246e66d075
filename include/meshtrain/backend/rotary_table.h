#pragma once
// The angles of rotary position embeddings (Backend::rotary_forward): the inverse frequencies of
// a head's channel pairs, from the base `rope_theta` and optionally Llama 3's frequency scaling,
// and the cos/sin table the kernels read by token position.
//
// Hugging Face computes the inverse frequencies and the angles in fp32 on every forward; here
// they are computed once in fp64 and rounded once into the table (fp32, or fp64 for verification
// runs), so an fp64 model matches a reference to round-off at any position, and an fp32 one
// differs from Hugging Face's by its fp32 angle error (about 1e-7 * position radians), not ours.

#include <cstdint>
#include <optional>
#include <vector>

#include "meshtrain/backend/backend.h"

namespace meshtrain {

// rope_scaling with rope_type "llama3" (Llama 3.1: factor 8, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192; Llama 3.2: factor 32). Wavelengths
// longer than original / low_freq_factor are stretched by `factor`, those shorter than
// original / high_freq_factor are kept, and those between blend the two linearly in
// original / wavelength.
struct Llama3RopeScaling {
  double factor = 0, low_freq_factor = 0, high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
};

struct RopeFrequencies {
  double theta = 10000.0;                   // rope_theta (Llama 3: 500000, Qwen 3: 1000000)
  std::optional<Llama3RopeScaling> llama3;  // absent: rope_type "default"
};

// inv_freq_i = theta^(-2i / head_dim) for i < head_dim / 2, then Llama 3's scaling where asked,
// in fp64. Throws std::invalid_argument naming the setting and what would be accepted (an odd or
// non-positive head_dim, theta <= 0, a scaling with factor <= 0, low_freq_factor <= 0,
// high_freq_factor <= low_freq_factor or original_max_position_embeddings <= 0).
std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeFrequencies& rope);

// cos and sin of the angles p * inv_freq_i for positions p in [0, positions): two (positions,
// inv_freq.size()) tensors of wide(activation) (fp32 for fp32 and bf16 models, fp64 for fp64),
// computed in fp64 and rounded once. On a planning backend only allocated.
struct RotaryTable {
  Tensor cos, sin;
};
RotaryTable make_rotary_table(Backend& backend, const std::vector<double>& inv_freq,
                              int64_t positions, DType activation, MemoryCategory category);

}  // namespace meshtrain
