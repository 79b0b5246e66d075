#include "meshtrain/model/rotary_positions.h"

#include <vector>

namespace meshtrain {

RopeFrequencies rope_frequencies(const RopeSpec& rope) {
  RopeFrequencies f;
  f.theta = rope.theta;
  if (rope.scaling == RopeScalingKind::Llama3)
    f.llama3 = Llama3RopeScaling{rope.factor, rope.low_freq_factor, rope.high_freq_factor,
                                 rope.original_max_positions};
  if (rope.scaling == RopeScalingKind::Yarn)
    f.yarn = YarnRopeScaling{.factor = rope.factor,
                             .original_max_position_embeddings = rope.original_max_positions,
                             .beta_fast = rope.beta_fast,
                             .beta_slow = rope.beta_slow,
                             .mscale = rope.mscale,
                             .mscale_all_dim = rope.mscale_all_dim,
                             .attention_factor = rope.attention_factor,
                             .truncate = rope.truncate};
  return f;
}

double yarn_softmax_mscale(const RopeSpec& rope) {
  if (rope.scaling != RopeScalingKind::Yarn || rope.mscale_all_dim == 0) return 1.0;
  const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
  return m * m;
}

RotaryPositions::RotaryPositions(const LayerContext& ctx, const ModelSpec& spec,
                                 int64_t local_heads, int64_t local_kv_heads)
    : ctx_(ctx),
      inv_freq_(rope_inverse_frequencies(spec.rotary_dim(), rope_frequencies(spec.rope))),
      amplitude_(rope_amplitude(rope_frequencies(spec.rope))),
      seq_len_(spec.seq_len),
      heads_(spec.heads),
      kv_heads_(spec.kv_heads()),
      local_rotated_heads_(local_heads + local_kv_heads),
      head_dim_(spec.rotary_dim()) {}

const RotaryTable& RotaryPositions::table(DType activations) {
  if (!table_ || table_->first != activations)
    table_.emplace(activations, make_rotary_table(*ctx_.backend, inv_freq_, seq_len_, activations,
                                                  MemoryCategory::Workspace, amplitude_));
  return table_->second;
}

const Tensor& RotaryPositions::positions(TokenShape shape) {
  const auto key = std::make_pair(shape.B, shape.T);
  if (const auto it = positions_.find(key); it != positions_.end()) return it->second;
  std::vector<int32_t> host(static_cast<size_t>(shape.N()));
  for (int64_t r = 0; r < shape.N(); ++r)
    host[static_cast<size_t>(r)] = static_cast<int32_t>(ctx_.cp.position(r % shape.T, shape.T));
  Tensor t = ctx_.backend->empty({shape.N()}, DType::I32, MemoryCategory::Workspace);
  ctx_.backend->copy_from_host(t, host.data());
  return positions_.emplace(key, t).first->second;
}

void RotaryPositions::forward(Tensor& qkv, TokenShape shape) {
  forward(qkv, shape, {0, local_rotated_heads_, head_dim_});
}

void RotaryPositions::backward(Tensor& dqkv, TokenShape shape) {
  backward(dqkv, shape, {0, local_rotated_heads_, head_dim_});
}

void RotaryPositions::forward(Tensor& x, TokenShape shape, const Backend::RotaryHeads& where) {
  const RotaryTable& t = table(x.dtype());
  ctx_.backend->rotary_forward(x, positions(shape), t.cos, t.sin, where);
}

void RotaryPositions::backward(Tensor& dx, TokenShape shape, const Backend::RotaryHeads& where) {
  const RotaryTable& t = table(dx.dtype());
  ctx_.backend->rotary_backward(dx, positions(shape), t.cos, t.sin, where);
}

void RotaryPositions::forward_at(Tensor& qkv, int64_t position) {
  forward_at(qkv, position, {0, local_rotated_heads_, head_dim_});
}

void RotaryPositions::forward_at(Tensor& x, int64_t position, const Backend::RotaryHeads& where) {
  const RotaryTable& t = table(x.dtype());
  const int32_t p = static_cast<int32_t>(position);
  Tensor at = ctx_.backend->empty({1}, DType::I32, MemoryCategory::Workspace);
  ctx_.backend->copy_from_host(at, &p);
  ctx_.backend->rotary_forward(x, at, t.cos, t.sin, where);
}

void RotaryPositions::add_costs(CostSheet& sheet) const {
  // Reads and writes the query and key heads of every row, forward and backward.
  ElementwiseCost pass;
  pass.width = (heads_ + kv_heads_) * head_dim_;
  pass.width_split = true;
  pass.tokens = ElementwiseCost::Tokens::All;
  pass.forward_accesses = 2;
  pass.backward_accesses = 2;
  sheet.elementwise.push_back(pass);
}

}  // namespace meshtrain
