#include "meshtrain/model/embedding.h"

#include <algorithm>

namespace meshtrain {

namespace {
ParamSpec wte_spec(int64_t V, int64_t C) {
  ParamSpec s;
  s.name = "wte";
  s.global_shape = Shape{V, C};
  s.tp_split_dim = 0;
  s.tp_split = TpSplit::Vocab;
  s.role = ParamRole::TokenEmbedding;
  return s;
}
ParamSpec wpe_spec(int64_t T, int64_t C, const TensorParallel& tp) {
  ParamSpec s;
  s.name = "wpe";
  s.global_shape = Shape{T, C};
  s.tp_grad = tp.sequence_parallel() ? TpGrad::Partial : TpGrad::Full;
  return s;
}
// Calls add(first row, rows, position) for the runs of consecutive positions among the `rows`
// rows from flat token `begin` of the micro-batch: one run without context parallelism
// (position_forward wraps at T itself), else one per chunk of a sequence.
template <class Add>
void for_position_runs(const ContextParallel& cp, TokenShape shape, int64_t begin, int64_t rows,
                       Add add) {
  if (!cp.on()) {
    add(0, rows, begin);
    return;
  }
  const int64_t chunk = shape.T / 2;
  for (int64_t f = begin; f < begin + rows;) {
    const int64_t t = f % shape.T, run = std::min(begin + rows - f, chunk - t % chunk);
    add(f - begin, run, cp.position(t, shape.T));
    f += run;
  }
}
}  // namespace

Embedding::Embedding(const LayerContext& ctx, int64_t vocab_size, int64_t seq_len, int64_t C,
                     bool learned_positions, bool tied)
    : ctx_(ctx),
      wte_(ctx.store->add(wte_spec(vocab_size, C), ctx.tp.rank(), ctx.tp.size())),
      wpe_(learned_positions
               ? &ctx.store->add(wpe_spec(seq_len, C, ctx.tp), ctx.tp.rank(), ctx.tp.size())
               : nullptr),
      tied_(tied) {}

Tensor Embedding::forward(const Tensor& tokens, TokenShape shape) {
  Backend& be = *ctx_.backend;
  const int64_t C = wte_.shape[1];
  const bool scatter = ctx_.tp.sequence_parallel() && ctx_.tp.size() > 1;
  Tensor partial = be.empty({shape.N(), C}, wte_.value.dtype(),
                            scatter ? MemoryCategory::Workspace : MemoryCategory::Activations);
  be.embedding_forward(partial, tokens, wte_.value, wte_.split_begin);
  Tensor x = exit_tp_region_forward(be, ctx_.tp, partial, MemoryCategory::Activations);
  const int64_t rows = x.dim(0);
  if (!wpe_) return x;
  for_position_runs(ctx_.cp, shape, ctx_.tp.token_begin(shape.N()), rows,
                    [&](int64_t row, int64_t n, int64_t position) {
                      Tensor part = n == rows ? x : x.view(row * C, {n, C});
                      be.position_forward(part, wpe_->value, position);
                    });
  return x;
}

Tensor Embedding::forward_at(const Tensor& tokens, int64_t position) {
  Backend& be = *ctx_.backend;
  Tensor x = be.empty({tokens.numel(), wte_.shape[1]}, wte_.value.dtype(), MemoryCategory::Workspace);
  be.embedding_forward(x, tokens, wte_.value, wte_.split_begin);
  x = exit_tp_region_forward(be, ctx_.tp.without_sequence(), x, MemoryCategory::Workspace);
  if (wpe_) be.position_forward(x, wpe_->value, position);
  return x;
}

void Embedding::backward(const Tensor& dx, const Tensor& tokens, TokenShape shape,
                         DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  Tensor dfull = exit_tp_region_backward(be, ctx_.tp, dx, MemoryCategory::Workspace);
  run_or_defer(deferred, [this, dx, dfull, tokens, shape, token_begin = ctx_.tp.token_begin(shape.N())] {
    const int64_t rows = dx.dim(0), C = dx.dim(1);
    if (wpe_) {
      wpe_->zero_grad_if_unwritten(*ctx_.backend);
      for_position_runs(ctx_.cp, shape, token_begin, rows, [&](int64_t row, int64_t n, int64_t position) {
        ctx_.backend->position_backward(wpe_->grad, n == rows ? dx : dx.view(row * C, {n, C}), position);
      });
    }
    wte_.zero_grad_if_unwritten(*ctx_.backend);
    ctx_.backend->embedding_backward(wte_.grad, dfull, tokens, wte_.split_begin);
  });
}


CostSheet Embedding::cost_sheet() const {
  CostSheet sheet;
  ParameterCost table = parameter_cost(wte_.spec);
  table.lookup_only = !tied_;
  sheet.parameters.push_back(table);
  if (wpe_) {
    ParameterCost positions = parameter_cost(wpe_->spec);
    positions.lookup_only = true;  // added to the stream, never multiplied (the head reads wte)
    sheet.parameters.push_back(positions);
  }
  // Forward reads a token row and a position row and writes their sum, for every token of the
  // rank (before sequence parallelism splits them); backward scatter-adds into fp32 gradients.
  ElementwiseCost lookup;
  lookup.width = wte_.spec.global_shape[1];
  lookup.tokens = ElementwiseCost::Tokens::All;
  lookup.backward_bytes = ElementwiseCost::Bytes::Fp32;
  lookup.forward_accesses = wpe_ ? 3 : 2;
  lookup.backward_accesses = wpe_ ? 3 : 2;
  sheet.elementwise.push_back(lookup);
  return sheet;
}
}  // namespace meshtrain
