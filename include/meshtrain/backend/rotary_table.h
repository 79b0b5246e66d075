#pragma once
// The angles of rotary position embeddings (Backend::rotary_forward): the inverse frequencies of
// a head's channel pairs, from the base `rope_theta` and optionally Llama 3's or YaRN's frequency
// scaling, and the cos/sin table the kernels read by token position.
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

// rope_scaling with rope_type "yarn" (Peng et al., arXiv 2309.00071; Hugging Face's
// _compute_yarn_parameters; Qwen 3's long-context configs, DeepSeek-V3): channel pairs that turn
// more than beta_fast times over the original context keep their frequency, those that turn
// fewer than beta_slow times are divided by `factor`, and a linear ramp in the pair index blends
// the two between. The ramp's ends are the pair index i at which a pair makes r turns in the
// original context L, head_dim ln(L / (2 pi r)) / (2 ln theta), floored and ceiled when
// `truncate`, within [0, head_dim - 1]. cos and sin are multiplied by the attention factor
// (rope_amplitude): given, or mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
// are non-zero, else mscale(factor, 1), with mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1).
struct YarnRopeScaling {
  double factor = 0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;  // 0: absent (Hugging Face tests them for truth)
  double attention_factor = 0;            // 0: derived from factor and the mscales
  bool truncate = true;
};

struct RopeFrequencies {
  double theta = 10000.0;                   // rope_theta (Llama 3: 500000, Qwen 3: 1000000)
  // Both absent: rope_type "default". (Initialised here so that RopeFrequencies{theta, llama3}
  // leaves yarn out without a missing-initializer warning.)
  std::optional<Llama3RopeScaling> llama3 = std::nullopt;
  std::optional<YarnRopeScaling> yarn = std::nullopt;
};

// inv_freq_i = theta^(-2i / head_dim) for i < head_dim / 2, then Llama 3's or YaRN's scaling
// where asked, in fp64. Throws std::invalid_argument naming the setting and what would be
// accepted (an odd or non-positive head_dim, theta <= 0, a Llama 3 scaling with factor <= 0,
// low_freq_factor <= 0, high_freq_factor <= low_freq_factor or original_max_position_embeddings
// <= 0; a YaRN scaling with factor < 1, beta_slow <= 0, beta_fast <= beta_slow, a negative
// mscale, mscale_all_dim or attention_factor, or original_max_position_embeddings <= 0).
std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeFrequencies& rope);

// The factor on cos and sin: YaRN's attention factor, 1 otherwise (checked as above).
double rope_amplitude(const RopeFrequencies& rope);

// YaRN's mscale(s, m) = 0.1 m ln(s) + 1, 1 for s <= 1 (Hugging Face's get_mscale).
double yarn_mscale(double factor, double mscale);

// amplitude x cos and amplitude x sin of the angles p * inv_freq_i for positions p in
// [0, positions): two (positions, inv_freq.size()) tensors of wide(activation) (fp32 for fp32 and
// bf16 models, fp64 for fp64), computed in fp64 and rounded once. On a planning backend only
// allocated. The amplitude is rope_amplitude (YaRN's attention factor; Hugging Face multiplies
// its cos and sin by it too), so the kernels need not know it.
struct RotaryTable {
  Tensor cos, sin;
};
RotaryTable make_rotary_table(Backend& backend, const std::vector<double>& inv_freq,
                              int64_t positions, DType activation, MemoryCategory category,
                              double amplitude = 1.0);

}  // namespace meshtrain
