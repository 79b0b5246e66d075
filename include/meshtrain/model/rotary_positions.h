#pragma once
// Rotary positions in an attention layer (model.positions = "rotary"): the query and key heads
// of each token's packed qkv row (model/qkv_projection.h) rotated by the token's position in its
// whole sequence (under context parallelism a rank's two chunks sit at their true places:
// ContextParallel::position), after the projection; the gradient rotated back before it. The
// angle table is computed once per layer, in fp64, for positions [0, seq_len)
// (backend/rotary_table.h).

#include <map>
#include <optional>
#include <utility>

#include "meshtrain/backend/rotary_table.h"
#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

RopeFrequencies rope_frequencies(const RopeSpec& rope);

// DeepSeek's softmax correction for YaRN, m^2 with m = yarn_mscale(factor, mscale_all_dim) when
// the scaling is YaRN's and mscale_all_dim is non-zero, else 1: a multi-head latent attention
// scales its scores by m^2 / sqrt(head size) (Hugging Face's DeepseekV3Attention). Llama's and
// Qwen 3's attention apply no such factor (their YaRN is the rotary amplitude alone).
double yarn_softmax_mscale(const RopeSpec& rope);

class RotaryPositions {
 public:
  RotaryPositions(const LayerContext& ctx, const ModelSpec& spec, int64_t local_heads,
                  int64_t local_kv_heads);

  // qkv (N, (NH + 2 KVH) HS / tp) of a micro-batch of `shape`, in place.
  void forward(Tensor& qkv, TokenShape shape);
  void backward(Tensor& dqkv, TokenShape shape);
  // Generation: the one row of the token at `position`; with `where`, the heads it names (as
  // forward's below).
  void forward_at(Tensor& qkv, int64_t position);
  void forward_at(Tensor& x, int64_t position, const Backend::RotaryHeads& where);
  // Other layouts (latent attention's rotary parts, model/latent_attention.h): the heads
  // `where` names of each of the N rows of x, of rotary_dim() channels each.
  void forward(Tensor& x, TokenShape shape, const Backend::RotaryHeads& where);
  void backward(Tensor& dx, TokenShape shape, const Backend::RotaryHeads& where);
  void add_costs(CostSheet& sheet) const;

 private:
  const RotaryTable& table(DType activations);
  // Each qkv row's position: (B, T) micro-batches repeat, so each shape's is built once.
  const Tensor& positions(TokenShape shape);

  LayerContext ctx_;
  std::vector<double> inv_freq_;
  double amplitude_;  // the factor on cos and sin (rope_amplitude)
  int64_t seq_len_, heads_, kv_heads_, local_rotated_heads_, head_dim_;
  std::optional<std::pair<DType, RotaryTable>> table_;
  std::map<std::pair<int64_t, int64_t>, Tensor> positions_;
};

}  // namespace meshtrain
