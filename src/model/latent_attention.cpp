#include "meshtrain/model/latent_attention.h"

#include <cmath>

namespace meshtrain {

namespace {
double latent_softmax_scale(const RopeSpec& rope, int64_t head_size) {
  const double m2 = yarn_softmax_mscale(rope);
  return m2 == 1.0 ? 0.0 : m2 / std::sqrt(static_cast<double>(head_size));
}
}  // namespace

LatentAttention::LatentAttention(const LayerContext& ctx, const std::string& name,
                                 const ModelSpec& spec, double residual_scale)
    : ctx_(ctx),
      heads_(spec.heads),
      local_heads_(spec.heads / ctx.tp.size()),
      nope_(spec.latent.qk_nope_dim),
      rope_(spec.latent.qk_rope_dim),
      value_(spec.latent.v_head_dim),
      q_rank_(spec.latent.q_lora_rank),
      kv_rank_(spec.latent.kv_lora_rank),
      q_a_(q_rank_ > 0 ? std::optional<ReplicatedLinear>(std::in_place, ctx, name + ".q_a",
                                                          spec.d_model, q_rank_, 0.02)
                       : std::nullopt),
      q_a_norm_(q_rank_ > 0 ? std::optional<RmsNorm>(std::in_place, ctx, name + ".q_a_norm",
                                                     q_rank_, kLatentNormEps)
                            : std::nullopt),
      q_b_(q_rank_ > 0 ? std::optional<ColumnParallelLinear>(
                             std::in_place, ctx, name + ".q_b",
                             Shape{spec.heads * spec.latent.qk_head_dim(), q_rank_}, 0,
                             Shape{spec.heads * spec.latent.qk_head_dim()}, 0.02, false)
                       : std::nullopt),
      q_(q_rank_ == 0 ? std::optional<ColumnParallelLinear>(
                            std::in_place, ctx, name + ".q",
                            Shape{spec.heads * spec.latent.qk_head_dim(), spec.d_model}, 0,
                            Shape{spec.heads * spec.latent.qk_head_dim()}, 0.02, false)
                      : std::nullopt),
      kv_a_(ctx, name + ".kv_a", spec.d_model, kv_rank_ + rope_, 0.02),
      kv_a_norm_(ctx, name + ".kv_a_norm", kv_rank_, kLatentNormEps),
      kv_b_(ctx, name + ".kv_b", Shape{spec.heads * (nope_ + value_), kv_rank_}, 0,
            Shape{spec.heads * (nope_ + value_)}, 0.02, false),
      proj_(ctx, name + ".proj", spec.heads * value_, spec.d_model, 0.02 * residual_scale, false),
      rotary_(ctx, spec, 0, 0),
      // The softmax scale m^2 / sqrt(d_qk) (HF DeepseekV3Attention's): m is YaRN's mscale of
      // mscale_all_dim, 1 without YaRN (then the kernels' default 1/sqrt(HS), the same bits).
      dims_{local_heads_, local_heads_, nope_ + rope_, value_,
            latent_softmax_scale(spec.rope, nope_ + rope_)} {}

Tensor LatentAttention::enter_latents(const Tensor& x, Saved& saved, MemoryCategory category) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t N_local = x.dim(0), q_cols = q_a_ ? q_rank_ : 0;
  const int64_t width = q_cols + kv_rank_ + rope_;
  // The norms keep their inputs: those live as long as the layer's activations.
  Tensor ckv = kv_a_.forward(x, ws);
  Tensor c = be.empty({N_local, kv_rank_}, x.dtype(), category);
  be.copy_columns(c, 0, ckv, 0, kv_rank_);
  Tensor local = be.empty({N_local, width}, x.dtype(), category);
  if (q_a_) {
    const Tensor q_lat = q_a_->forward(x, category);
    be.copy_columns(local, 0, q_a_norm_->forward(q_lat, saved.q_norm, ws), 0, q_rank_);
  }
  be.copy_columns(local, q_cols, kv_a_norm_.forward(c, saved.kv_norm, ws), 0, kv_rank_);
  be.copy_columns(local, q_cols + kv_rank_, ckv, kv_rank_, rope_);
  const Tensor entered = enter_tp_region_forward(be, ctx_.tp, local, category);
  const int64_t N = entered.dim(0);
  if (q_a_) {
    saved.q_in.inp = be.empty({N, q_rank_}, x.dtype(), category);
    be.copy_columns(saved.q_in.inp, 0, entered, 0, q_rank_);
  }
  saved.kv_in.inp = be.empty({N, kv_rank_}, x.dtype(), category);
  be.copy_columns(saved.kv_in.inp, 0, entered, q_cols, kv_rank_);
  Tensor k_pe = be.empty({N, rope_}, x.dtype(), ws);
  be.copy_columns(k_pe, 0, entered, q_cols + kv_rank_, rope_);
  return k_pe;
}

Backend::RotaryHeads LatentAttention::query_tails() const {
  return {nope_, local_heads_, rope_, nope_ + rope_};
}

void LatentAttention::rotate_query_tails(Tensor& q, TokenShape shape, bool forward) {
  if (forward) rotary_.forward(q, shape, query_tails());
  else rotary_.backward(q, shape, query_tails());
}

void LatentAttention::rotate_query_tails_at(Tensor& q, int64_t position) {
  rotary_.forward_at(q, position, query_tails());
}

Tensor LatentAttention::forward(const Tensor& x, TokenShape shape, Saved& saved,
                                MemoryCategory category, Recompute recompute,
                                const Tensor* residual) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  saved.x = x;
  Tensor k_pe = enter_latents(x, saved, category);
  rotary_.forward(k_pe, shape, {0, 1, rope_});
  // (q's entered input is kept for its backward: an activation.)
  Tensor q = q_b_ ? q_b_->forward_entered(saved.q_in, ws) : q_->forward(x, saved.q_in, category);
  rotate_query_tails(q, shape, true);
  const Tensor kv = kv_b_.forward_entered(saved.kv_in, ws);
  saved.qkv = be.empty({q.dim(0), local_heads_ * (2 * (nope_ + rope_) + value_)}, x.dtype(), category);
  be.mla_pack(saved.qkv, q, kv, k_pe, heads());
  Tensor att = be.empty({q.dim(0), local_heads_ * value_}, x.dtype(), category);
  attention_core_forward(ctx_, att, saved.qkv, shape, dims_, saved.core, category, recompute);
  return proj_.forward(att, saved.proj_in, category, nullptr, residual);
}

void LatentAttention::write_cache_row(const Tensor& x, Tensor& cache, int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t width = cache_width();
  const Tensor ckv = kv_a_.forward(x, ws);  // (1, r_kv + d_r)
  Tensor c = be.empty({1, kv_rank_}, x.dtype(), ws);
  be.copy_columns(c, 0, ckv, 0, kv_rank_);
  RmsNorm::Saved norm;
  Tensor row = cache.view(position * width, {1, width});
  be.copy_columns(row, 0, kv_a_norm_.forward(c, norm, ws), 0, kv_rank_);
  be.copy_columns(row, kv_rank_, ckv, kv_rank_, rope_);
  rotary_.forward_at(row, position, {kv_rank_, 1, rope_});
}

Tensor LatentAttention::absorbed_queries(const Tensor& x, int64_t position,
                                         const TensorParallel& tp) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t qk = nope_ + rope_, width = cache_width();
  ColumnParallelLinear::Saved q_in;
  Tensor q;  // (1, h d_qk): this rank's heads
  if (q_b_) {
    RmsNorm::Saved norm;
    q_in.inp = q_a_norm_->forward(q_a_->forward(x, ws), norm, ws);  // whole on every rank
    q = q_b_->forward_entered(q_in, ws);
  } else {
    q = q_->forward(x, q_in, ws, &tp);
  }
  rotate_query_tails_at(q, position);
  const Tensor& w = kv_b_.weight().value;  // (h (d_n + d_v), r_kv): head j's rows [k_nope ; v]
  Tensor queries = be.empty({local_heads_, width}, x.dtype(), ws);
  for (int64_t j = 0; j < local_heads_; ++j) {
    // q_abs (1, r_kv) = q_nope (1, d_n) W_UK (d_n, r_kv): a product matmul_backward's input
    // gradient computes (its `inp` argument only gives the shape when no dweight is asked).
    Tensor q_abs = queries.view(j * width, {1, kv_rank_});
    const Tensor w_uk = w.view(j * (nope_ + value_) * kv_rank_, {nope_, kv_rank_});
    be.matmul_backward(&q_abs, nullptr, nullptr, q.view(j * qk, {1, nope_}), q_abs, w_uk);
    Tensor q_rot = queries.view(j * width + kv_rank_, {1, rope_});
    be.copy(q_rot, q.view(j * qk + nope_, {1, rope_}));
  }
  return queries;
}

Tensor LatentAttention::expand_values(const Tensor& latent_sums) {
  Backend& be = *ctx_.backend;
  const int64_t width = cache_width();
  const Tensor& w = kv_b_.weight().value;
  Tensor out = be.empty({1, local_heads_ * value_}, latent_sums.dtype(), MemoryCategory::Workspace);
  for (int64_t j = 0; j < local_heads_; ++j) {
    // out_j (1, d_v) = o_j (1, r_kv) W_UV_j^T; o_j's last d_r columns (the weighted rotary keys)
    // are not values and go unused.
    Tensor out_j = out.view(j * value_, {1, value_});
    const Tensor w_uv = w.view((j * (nope_ + value_) + nope_) * kv_rank_, {value_, kv_rank_});
    be.matmul_forward(out_j, latent_sums.view(j * width, {1, kv_rank_}), w_uv, nullptr);
  }
  return out;
}

Tensor LatentAttention::decode(const Tensor& x, Tensor& cache, int64_t position) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const TensorParallel tp = ctx_.tp.without_sequence();
  write_cache_row(x, cache, position);
  const Tensor queries = absorbed_queries(x, position, tp);
  // One key/value head, the cache itself as keys and as values: scores [q_abs | q_rot] . [c | k_pe]
  // at the layer's own softmax scale (d_qk^-1/2, times YaRN's m^2), sums of the rows [c | k_pe].
  Tensor latent_sums = be.empty({local_heads_, cache_width()}, x.dtype(), ws);
  be.attention_decode(latent_sums, queries, cache, cache, position + 1, dims_.softmax_scale());
  RowParallelLinear::Saved proj_in;
  return proj_.forward(expand_values(latent_sums), proj_in, ws, &tp);
}

Tensor LatentAttention::backward(const Tensor& dy, TokenShape shape, const Saved& saved,
                                 DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const Tensor datt = proj_.backward(dy, saved.proj_in, deferred);
  const Tensor dqkv =
      attention_core_backward(ctx_, datt, saved.qkv, saved.proj_in.inp, shape, dims_, saved.core);
  const int64_t N = dqkv.dim(0);
  Tensor dq = be.empty({N, local_heads_ * (nope_ + rope_)}, dy.dtype(), ws);
  Tensor dkv = be.empty({N, local_heads_ * (nope_ + value_)}, dy.dtype(), ws);
  Tensor dk_pe = be.empty({N, rope_}, dy.dtype(), ws);
  be.mla_unpack(dq, dkv, dk_pe, dqkv, heads());
  rotate_query_tails(dq, shape, false);
  rotary_.backward(dk_pe, shape, {0, 1, rope_});
  const Tensor dc = kv_b_.backward_in_region(dkv, saved.kv_in, deferred);
  if (q_b_) {
    const Tensor dq_lat = q_b_->backward_in_region(dq, saved.q_in, deferred);
    return leave_latents(dq_lat, dc, dk_pe, Tensor{}, saved, deferred);
  }
  const Tensor dx_q = q_->backward(dq, saved.q_in, deferred);
  return leave_latents(Tensor{}, dc, dk_pe, dx_q, saved, deferred);
}

Tensor LatentAttention::leave_latents(const Tensor& dq_lat, const Tensor& dc, const Tensor& dk_pe,
                                      const Tensor& dx_q, const Saved& saved,
                                      DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t N = dc.dim(0), q_cols = q_a_ ? q_rank_ : 0;
  Tensor dentered = be.empty({N, q_cols + kv_rank_ + rope_}, dc.dtype(), ws);
  if (q_a_) be.copy_columns(dentered, 0, dq_lat, 0, q_rank_);
  be.copy_columns(dentered, q_cols, dc, 0, kv_rank_);
  be.copy_columns(dentered, q_cols + kv_rank_, dk_pe, 0, rope_);
  const Tensor dlocal = enter_tp_region_backward(be, ctx_.tp, dentered, ws);
  const int64_t N_local = dlocal.dim(0);
  Tensor dc_normed = be.empty({N_local, kv_rank_}, dc.dtype(), ws);
  be.copy_columns(dc_normed, 0, dlocal, q_cols, kv_rank_);
  Tensor dckv = be.empty({N_local, kv_rank_ + rope_}, dc.dtype(), ws);
  be.copy_columns(dckv, 0, kv_a_norm_.backward(dc_normed, saved.kv_norm), 0, kv_rank_);
  be.copy_columns(dckv, kv_rank_, dlocal, q_cols + kv_rank_, rope_);
  Tensor dx = kv_a_.backward(dckv, saved.x, deferred);
  if (q_a_) {
    Tensor dq_normed = be.empty({N_local, q_rank_}, dc.dtype(), ws);
    be.copy_columns(dq_normed, 0, dlocal, 0, q_rank_);
    be.add_inplace(dx, q_a_->backward(q_a_norm_->backward(dq_normed, saved.q_norm), saved.x, deferred));
  } else {
    be.add_inplace(dx, dx_q);
  }
  return dx;
}

void LatentAttention::add_costs(CostSheet& sheet) const {
  const int64_t qk = nope_ + rope_, q_cols = q_a_ ? q_rank_ : 0;
  // Down-projections and their norms on the rows where the block input stands.
  if (q_a_) {
    q_a_->add_costs(sheet);
    q_a_norm_->add_costs(sheet);
  }
  kv_a_.add_costs(sheet);
  kv_a_norm_.add_costs(sheet);
  // The latents copied into the tensor region's entry and out of it, forward and backward.
  ElementwiseCost entry;
  entry.width = q_cols + kv_rank_ + rope_;
  entry.tokens = ElementwiseCost::Tokens::All;
  entry.forward_accesses = 4;
  entry.backward_accesses = 4;
  sheet.elementwise.push_back(entry);
  if (q_b_) q_b_->add_costs(sheet);
  else q_->add_costs(sheet);
  kv_b_.add_costs(sheet);
  // Rotary: the query heads' tails and the one shared key, read and written both ways.
  ElementwiseCost rotary;
  rotary.width = heads_ * rope_;
  rotary.width_split = true;
  rotary.tokens = ElementwiseCost::Tokens::All;
  rotary.forward_accesses = 2;
  rotary.backward_accesses = 2;
  sheet.elementwise.push_back(rotary);
  rotary.width = rope_;
  rotary.width_split = false;
  sheet.elementwise.push_back(rotary);
  // The packed row written from q, kv and k_pe (forward) and taken apart again (backward).
  ElementwiseCost packing;
  packing.width = heads_ * (2 * qk + value_);
  packing.width_split = true;
  packing.tokens = ElementwiseCost::Tokens::All;
  packing.forward_accesses = 2;
  packing.backward_accesses = 2;
  sheet.elementwise.push_back(packing);
  sheet.attention.push_back(attention_core_cost(heads_, qk, value_));
  proj_.add_costs(sheet);
  // Generation's latent and rotary key, whole on every tensor rank (decode).
  sheet.decode_cache.push_back({cache_width(), false});
}

}  // namespace meshtrain
