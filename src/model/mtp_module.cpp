#include "meshtrain/model/mtp_module.h"

#include <string>

#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/vocab_cross_entropy.h"

namespace meshtrain {

namespace {
constexpr double kInitStd = 0.02;  // eh_proj's, as every other linear layer's (GPT-2's init)

std::string depth_name(int k, const char* part) { return "mtp." + std::to_string(k) + "." + part; }
}  // namespace

// One depth's layers and, between its forward and backward, its activations.
struct MultiTokenPrediction::Depth {
  Depth(const LayerContext& ctx, const ModelSpec& spec, int k)
      : enorm(ctx, depth_name(k, "enorm"), spec.d_model, spec.norm),
        hnorm(ctx, depth_name(k, "hnorm"), spec.d_model, spec.norm),
        eh_proj(ctx, depth_name(k, "eh_proj"), 2 * spec.d_model, spec.d_model, kInitStd),
        block(ctx, depth_name(k, "block"), spec.layers + k, spec),
        norm(ctx, depth_name(k, "norm"), spec.d_model, spec.norm),
        losses(*ctx.backend) {}

  Norm enorm, hnorm;
  ReplicatedLinear eh_proj;
  Block block;
  Norm norm;
  LossAccumulator losses;  // the cross-entropy sums, for the log
  double rows_seen = 0;

  Norm::Saved enorm_saved, hnorm_saved, norm_saved;
  Block::Saved block_saved;
  Tensor joined;  // (N_local, 2C): [enorm(e) | hnorm(h_{k-1})], eh_proj's input
  Tensor out;     // (N_local, C): h_k
};

// Depth k's view of a micro-batch, from its targets (on the host), uploaded as int32:
// tokens (N): token_{t+k} = target_{t+k-1} (0 past the sequence's end: those positions predict
// nothing, and causal attention keeps them from the others); rows (R, 1): the positions
// t < T - k that have a label; labels (R): target_{t+k}; inverse (N, 1): each position's row
// among them, or -1 (gather_rows' "no term": the gradient of a position without a label is 0).
struct MultiTokenPrediction::Rows {
  Tensor tokens, rows, labels, inverse;
  int64_t count = 0;
};

MultiTokenPrediction::MultiTokenPrediction(const LayerContext& ctx, const ModelSpec& spec,
                                           Parameter& wte, Parameter& head_weight)
    : ctx_(ctx), wte_(wte), head_weight_(head_weight),
      loss_weight_(spec.mtp_loss_weight / spec.mtp_layers) {
  for (int k = 0; k < spec.mtp_layers; ++k) depths_.push_back(std::make_unique<Depth>(ctx, spec, k));
}

MultiTokenPrediction::~MultiTokenPrediction() = default;

// Every sequence's targets, whole: (B, T_global) on the host. Under context parallelism each
// rank holds two chunks of each sequence (model/ring_attention.h), and depth k reads the target
// k positions on, which may lie in another rank's chunk: the cp group all-gathers them (B T
// int32s per micro-batch, small beside the activations) and each rank's rows go back to their
// true positions.
std::vector<int32_t> MultiTokenPrediction::sequence_targets(const Tensor& targets,
                                                            const TokenShape& shape) const {
  Backend& be = *ctx_.backend;
  const ContextParallel& cp = ctx_.cp;
  const int64_t N = shape.N();
  std::vector<int32_t> local(static_cast<size_t>(N));
  if (!cp.on()) {
    be.copy_to_host(local.data(), targets);
    return local;
  }
  const int ranks = cp.size();
  Tensor gathered = be.empty({ranks * N}, DType::I32, MemoryCategory::Workspace);
  cp.comm->all_gather(gathered, targets.reshape({N})).wait();
  std::vector<int32_t> all(static_cast<size_t>(ranks * N));
  be.copy_to_host(all.data(), gathered);
  const int64_t T = shape.T, L = T / 2, Tg = T * ranks;
  std::vector<int32_t> whole(static_cast<size_t>(shape.B * Tg));
  for (int r = 0; r < ranks; ++r)
    for (int64_t b = 0; b < shape.B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = cp.chunk_of(r, t < L ? 0 : 1) * L + t % L;
        whole[static_cast<size_t>(b * Tg + p)] = all[static_cast<size_t>(r * N + b * T + t)];
      }
  return whole;
}

// whole: every sequence's targets (B, T_global); the rows are this rank's N = B T tokens.
MultiTokenPrediction::Rows MultiTokenPrediction::rows_of(const std::vector<int32_t>& whole,
                                                         TokenShape shape, int k) const {
  const int64_t B = shape.B, T = shape.T, N = shape.N(), Tg = T * ctx_.cp.size();
  std::vector<int32_t> tokens(static_cast<size_t>(N), 0), inverse(static_cast<size_t>(N), -1);
  std::vector<int32_t> rows, labels;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t, p = ctx_.cp.position(t, T), g = b * Tg + p;
      if (p + k - 1 < Tg) tokens[static_cast<size_t>(n)] = whole[static_cast<size_t>(g + k - 1)];
      if (p + k >= Tg) continue;
      inverse[static_cast<size_t>(n)] = static_cast<int32_t>(rows.size());
      rows.push_back(static_cast<int32_t>(n));
      labels.push_back(whole[static_cast<size_t>(g + k)]);
    }
  Backend& be = *ctx_.backend;
  const auto upload = [&](const std::vector<int32_t>& v, Shape s) {
    Tensor t = be.empty(s, DType::I32, MemoryCategory::Workspace);
    be.copy_from_host(t, v.data());
    return t;
  };
  Rows r;
  r.count = static_cast<int64_t>(rows.size());
  r.tokens = upload(tokens, {N});
  r.rows = upload(rows, {r.count, 1});
  r.labels = upload(labels, {r.count});
  r.inverse = upload(inverse, {N, 1});
  return r;
}

Tensor MultiTokenPrediction::forward_backward(const Tensor& h0, const Tensor& targets,
                                              TokenShape shape, double dloss) {
  Backend& be = *ctx_.backend;
  const MemoryCategory ws = MemoryCategory::Workspace;
  const int64_t N = shape.N(), C = h0.dim(1), local = h0.dim(0);
  // The positions' labels decide which rows each depth's loss reads: one host read of the
  // targets per micro-batch (the data feed holds them on the device only).
  const std::vector<int32_t> host_targets = sequence_targets(targets, shape);
  const int D = depths();
  // A mixture's balancing losses in the blocks weigh as the main blocks' (model/moe_layer.h).
  shape.loss_weight = dloss;
  std::vector<Rows> rows;
  Tensor h = h0;
  for (int k = 0; k < D; ++k) {
    Depth& d = *depths_[static_cast<size_t>(k)];
    rows.push_back(rows_of(host_targets, shape, k + 1));
    Tensor partial = be.empty({N, C}, wte_.value.dtype(), ws);
    be.embedding_forward(partial, rows.back().tokens, wte_.value, wte_.split_begin);
    const Tensor e = exit_tp_region_forward(be, ctx_.tp, partial, ws);
    d.joined = be.empty({local, 2 * C}, h0.dtype(), ws);
    be.copy_columns(d.joined, 0, d.enorm.forward(e, d.enorm_saved, ws), 0, C);
    be.copy_columns(d.joined, C, d.hnorm.forward(h, d.hnorm_saved, ws), 0, C);
    const Tensor u = d.eh_proj.forward(d.joined, ws);
    d.out = d.norm.forward(d.block.forward(u, shape, d.block_saved, Recompute::None), d.norm_saved, ws);
    h = d.out;
  }
  Tensor dh_next;  // d(objective)/d(h_k) from depth k + 1
  for (int k = D; k-- > 0;) {
    Depth& d = *depths_[static_cast<size_t>(k)];
    const Rows& r = rows[static_cast<size_t>(k)];
    const Tensor hin = enter_tp_region_forward(be, ctx_.tp, d.out, ws);  // (N, C)
    Tensor labelled = be.empty({r.count, C}, hin.dtype(), ws);
    be.gather_rows(labelled, hin, r.rows, nullptr);
    // Each depth's mean over its labelled rows of the step: the head's 1 / (B T) becomes
    // 1 / (B (T - k)), times lambda / D.
    const double T = static_cast<double>(shape.T * ctx_.cp.size());  // the whole sequence's
    const double dloss_k = loss_weight_ * dloss * T / (T - static_cast<double>(k + 1));
    const Tensor dlabelled = vocab_cross_entropy(ctx_, head_weight_, labelled, r.labels, dloss_k,
                                                 true, d.losses);
    if (ctx_.tp.rank() == 0) d.rows_seen += static_cast<double>(r.count);
    Tensor dfull = be.empty({N, C}, hin.dtype(), ws);
    be.gather_rows(dfull, dlabelled, r.inverse, nullptr);
    Tensor dh = enter_tp_region_backward(be, ctx_.tp, dfull, ws);
    if (dh_next.defined()) be.add_inplace(dh, dh_next);
    const Tensor du = d.block.backward(d.norm.backward(dh, d.norm_saved), shape, d.block_saved,
                                       Recompute::None);
    const Tensor djoined = d.eh_proj.backward(du, d.joined, nullptr);
    Tensor de = be.empty({local, C}, h0.dtype(), ws), dprev = be.empty({local, C}, h0.dtype(), ws);
    be.copy_columns(de, 0, djoined, 0, C);
    be.copy_columns(dprev, 0, djoined, C, C);
    dh_next = d.hnorm.backward(dprev, d.hnorm_saved);
    const Tensor de_full = exit_tp_region_backward(be, ctx_.tp, d.enorm.backward(de, d.enorm_saved), ws);
    wte_.zero_grad_if_unwritten(be);
    be.embedding_backward(wte_.grad, de_full, r.tokens, wte_.split_begin);
    d.enorm_saved = d.hnorm_saved = d.norm_saved = Norm::Saved{};
    d.block_saved = Block::Saved{};
    d.joined = d.out = Tensor{};
  }
  return dh_next;
}

std::vector<double> MultiTokenPrediction::take_sums() {
  std::vector<double> out;
  for (auto& d : depths_) {
    const double sum = d->losses.take();
    out.push_back(ctx_.tp.rank() == 0 ? sum : 0.0);
    out.push_back(d->rows_seen);
    d->rows_seen = 0;
  }
  return out;
}

void MultiTokenPrediction::add_costs(CostSheet& sheet) const {
  for (const auto& d : depths_) {
    d->enorm.add_costs(sheet);
    d->hnorm.add_costs(sheet);
    d->eh_proj.add_costs(sheet);
    sheet.add(d->block.cost_sheet());
    d->norm.add_costs(sheet);
    const Shape& w = head_weight_.spec.global_shape;  // the head's GEMM once more
    sheet.linears.push_back({w[1], w[0], TpSplitOf::Outputs});
  }
}

}  // namespace meshtrain
