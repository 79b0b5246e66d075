#include "meshtrain/model/moe_layer.h"

#include <algorithm>
#include <stdexcept>

#include "meshtrain/backend/host_doubles.h"

namespace meshtrain {

namespace {

ParamSpec moe_weight(const std::string& name, Shape shape, double init_std, const LayerContext& ctx) {
  ParamSpec s;
  s.name = name + ".weight";
  s.global_shape = std::move(shape);
  s.init = Init::Normal;
  s.init_std = init_std;
  // Whole on every tensor rank; each rank's tokens are its own under sequence parallelism.
  s.tp_grad = ctx.tp.sequence_parallel() ? TpGrad::Partial : TpGrad::Full;
  return s;
}

// A device tensor of `dtype` holding host doubles (backend/host_doubles.h).
Tensor device_doubles(Backend& be, const std::vector<double>& v, Shape shape, DType dtype,
                      MemoryCategory category) {
  Tensor out = be.empty(std::move(shape), dtype, category);
  from_host_doubles(be, out, v, "a mixture of experts' routing");
  return out;
}

Tensor device_rows(Backend& be, const std::vector<int32_t>& v, Shape shape, MemoryCategory category) {
  Tensor out = be.empty(std::move(shape), DType::I32, category);
  be.copy_from_host(out, v.data());  // an empty one copies nothing
  return out;
}

}  // namespace

MixtureOfExperts::MixtureOfExperts(const LayerContext& ctx, const std::string& name,
                                   const ModelSpec& spec, int layer, double residual_scale)
    : ctx_(ctx),
      spec_(spec.moe),
      layer_(layer),
      C_(spec.d_model),
      F_(spec.moe_ffn_hidden()),
      router_(ctx.store->add(moe_weight(name + ".router", {spec.moe.experts, C_}, 0.02, ctx),
                             ctx.tp.rank(), ctx.tp.size())),
      gate_(ctx.store->add(moe_weight(name + ".experts.gate", {spec.moe.experts, F_, C_}, 0.02, ctx),
                           ctx.tp.rank(), ctx.tp.size())),
      up_(ctx.store->add(moe_weight(name + ".experts.up", {spec.moe.experts, F_, C_}, 0.02, ctx),
                         ctx.tp.rank(), ctx.tp.size())),
      down_(ctx.store->add(moe_weight(name + ".experts.down", {spec.moe.experts, C_, F_},
                                      0.02 * residual_scale, ctx),
                           ctx.tp.rank(), ctx.tp.size())) {
  if (spec.moe.shared_ffn_hidden > 0)
    shared_.emplace(ctx, name + ".shared", C_, spec.moe.shared_ffn_hidden, residual_scale, false);
}

Tensor MixtureOfExperts::router_weight(DType dtype) const {
  const Tensor w = router_.value.reshape({spec_.experts, C_});
  if (w.dtype() == dtype) return w;
  Tensor wide = ctx_.backend->empty(w.shape(), dtype, MemoryCategory::Workspace);
  ctx_.backend->cast(wide, w);
  return wide;
}

Tensor MixtureOfExperts::expert_weights(Parameter& p, int64_t e) const {
  const int64_t rows = p.shape[1], cols = p.shape[2];
  return p.value.view(e * rows * cols, {rows, cols});
}

Tensor MixtureOfExperts::expert_grads(Parameter& p, int64_t e) const {
  const int64_t rows = p.shape[1], cols = p.shape[2];
  return p.grad.view(e * rows * cols, {rows, cols});
}

std::shared_ptr<const Routing> MixtureOfExperts::route(const Tensor& x, const TokenShape& shape,
                                                       bool recomputing, Saved& saved) {
  Backend& be = *ctx_.backend;
  const int64_t N = x.dim(0), E = spec_.experts;
  std::shared_ptr<Routing> r;
  if (be.planning()) {
    r = std::make_shared<Routing>(route_balanced(N, spec_));
  } else {
    const Tensor& rx = saved.router_x;
    Tensor logits = be.empty({N, E}, rx.dtype(), MemoryCategory::Workspace);
    be.matmul_forward(logits, rx, router_weight(rx.dtype()), nullptr);
    const std::vector<double> host = to_host_doubles(be, logits, "a mixture of experts' router");
    const double* bias = ctx_.expert_bias ? ctx_.expert_bias->of_layer(layer_) : nullptr;
    r = std::make_shared<Routing>(route_tokens(host.data(), N, spec_, bias));
  }
  saved.balance_grad.clear();
  if (shape.loss_weight == 0) return r;  // evaluation, generation: no losses

  // Each local token's sequence: this rank holds tokens [begin, begin + N) of the micro-batch's
  // B sequences of T (T: this context rank's part of each), flattened.
  const int64_t begin = ctx_.tp.token_begin(shape.N());
  std::vector<int32_t> sequence_of(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) sequence_of[static_cast<size_t>(t)] = static_cast<int32_t>((begin + t) / shape.T);
  // The sequences' sums: over the tensor group where it splits them, and over the context
  // group, which always does.
  std::vector<double> sums = RouterSums::of(*r, sequence_of, shape.B).to_vector();
  const bool over_tp = ctx_.tp.sequence_parallel() && ctx_.tp.size() > 1;
  if (over_tp || ctx_.cp.on()) {
    Tensor t = be.empty({static_cast<int64_t>(sums.size())}, DType::F64, MemoryCategory::Workspace);
    be.copy_from_host(t, sums.data());
    if (over_tp) ctx_.tp.comm->all_reduce(t).wait();
    if (ctx_.cp.on()) ctx_.cp.comm->all_reduce(t).wait();
    be.copy_to_host(sums.data(), t);
  }
  const RouterSums sequences = RouterSums::from_vector(sums, shape.B, E);
  saved.balance_grad = balancing_logit_gradient(*r, sequences, sequence_of, spec_, shape.loss_weight);
  if (recomputing) return r;
  if (ctx_.tp.rank() == 0 && ctx_.cp.rank() == 0) {
    const BalancingLosses l = balancing_losses(sequences, spec_);
    // The step's loss is the sum of per-token losses times loss_weight.
    if (ctx_.loss) ctx_.loss->add_host(l.per_token);
    if (ctx_.moe_log)
      ctx_.moe_log->add(layer_, sequences.expert_counts(), l.load_balance,
                        static_cast<double>(shape.B), l.z, sequences.token_count());
  }
  return r;
}

Tensor MixtureOfExperts::forward(const Tensor& x, const TokenShape& shape, bool recomputing,
                                 Saved& saved, MemoryCategory category, MemoryCategory out_category,
                                 const TensorParallel* tp, const Tensor* residual) {
  Backend& be = *ctx_.backend;
  const int64_t N = x.dim(0), k = spec_.top_k, M = N * k;
  const DType wide = stats_dtype(x.dtype());
  saved.x = x;
  saved.router_x = x;
  if (stats_dtype(x.dtype()) != x.dtype()) {
    saved.router_x = be.empty(x.shape(), stats_dtype(x.dtype()), category);
    be.cast(saved.router_x, x);
  }
  saved.routing = route(x, shape, recomputing, saved);
  const Routing& r = *saved.routing;
  saved.token_of_row = device_rows(be, r.token_of_row, {M, 1}, category);
  saved.row_of_choice = device_rows(be, r.row_of_choice, {N, k}, category);
  saved.gate_of_row = device_doubles(be, r.gate_of_row, {M, 1}, wide, category);
  saved.gates = device_doubles(be, r.gate, {N, k}, wide, category);

  // Dispatch, then each expert on its rows (zero rows: nothing to compute).
  saved.xs = be.empty({M, C_}, x.dtype(), category);
  be.gather_rows(saved.xs, x, saved.token_of_row, nullptr);
  saved.gate = be.empty({M, F_}, x.dtype(), category);
  saved.up = be.empty({M, F_}, x.dtype(), category);
  saved.hidden = be.empty({M, F_}, x.dtype(), category);
  saved.ys = be.empty({M, C_}, x.dtype(), category);
  for (int64_t e = 0; e < spec_.experts; ++e) {
    const int64_t b = r.expert_begin[static_cast<size_t>(e)], n = r.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    Tensor g = saved.gate.rows(b, b + n), u = saved.up.rows(b, b + n);
    be.matmul_forward(g, saved.xs.rows(b, b + n), expert_weights(gate_, e), nullptr);
    be.matmul_forward(u, saved.xs.rows(b, b + n), expert_weights(up_, e), nullptr);
  }
  if (M > 0) be.swiglu_forward(saved.hidden, saved.gate, saved.up);
  for (int64_t e = 0; e < spec_.experts; ++e) {
    const int64_t b = r.expert_begin[static_cast<size_t>(e)], n = r.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    Tensor y = saved.ys.rows(b, b + n);
    be.matmul_forward(y, saved.hidden.rows(b, b + n), expert_weights(down_, e), nullptr);
  }

  // Combine: each token's experts in the order of its choices.
  Tensor out = be.empty({N, C_}, x.dtype(), out_category);
  be.gather_rows(out, saved.ys, saved.row_of_choice, &saved.gates);
  if (shared_) {
    Tensor s = shared_->forward(x, saved.shared, category, MemoryCategory::Workspace, tp);
    be.add_inplace(out, s);
  }
  if (residual) be.add_inplace(out, *residual);
  return out;
}

Tensor MixtureOfExperts::backward(const Tensor& dy, const Saved& saved,
                                  DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const Routing& r = *saved.routing;
  const int64_t N = dy.dim(0), k = spec_.top_k, M = N * k, E = spec_.experts;
  const DType wide = stats_dtype(dy.dtype());
  const MemoryCategory ws = MemoryCategory::Workspace;

  // The gates' gradient (to the router), and the experts' output gradient: each sorted row's
  // token's gradient times its gate.
  Tensor dgates = be.empty({N, k}, wide, ws);
  be.gathered_row_dots(dgates, dy, saved.ys, saved.row_of_choice);
  Tensor dys = be.empty({M, C_}, dy.dtype(), ws);
  be.gather_rows(dys, dy, saved.token_of_row, &saved.gate_of_row);

  Tensor dhidden = be.empty({M, F_}, dy.dtype(), ws);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = r.expert_begin[static_cast<size_t>(e)], n = r.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    Tensor dh = dhidden.rows(b, b + n);
    be.matmul_backward(&dh, nullptr, nullptr, dys.rows(b, b + n), saved.hidden.rows(b, b + n),
                       expert_weights(down_, e));
  }
  Tensor dgate = be.empty({M, F_}, dy.dtype(), ws), dup = be.empty({M, F_}, dy.dtype(), ws);
  if (M > 0) be.swiglu_backward(dgate, dup, dhidden, saved.gate, saved.up);
  Tensor dxs = be.empty({M, C_}, dy.dtype(), ws), dxs_up = be.empty({M, C_}, dy.dtype(), ws);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = r.expert_begin[static_cast<size_t>(e)], n = r.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    Tensor dx_gate = dxs.rows(b, b + n), dx_up = dxs_up.rows(b, b + n);
    be.matmul_backward(&dx_gate, nullptr, nullptr, dgate.rows(b, b + n), saved.xs.rows(b, b + n),
                       expert_weights(gate_, e));
    be.matmul_backward(&dx_up, nullptr, nullptr, dup.rows(b, b + n), saved.xs.rows(b, b + n),
                       expert_weights(up_, e));
  }
  if (M > 0) be.add_inplace(dxs, dxs_up);
  // Each token's rows summed back, in the order of its choices.
  Tensor dx = be.empty({N, C_}, dy.dtype(), ws);
  be.gather_rows(dx, dxs, saved.row_of_choice, nullptr);

  // The router: the gates' gradient through the renormalisation and the softmax, plus the
  // balancing losses', on the host; then its GEMM's backward.
  const std::vector<double> dlogits_host =
      router_logit_gradient(r, to_host_doubles(be, dgates, "a mixture of experts' router"), spec_,
                            saved.balance_grad);
  const DType rd = saved.router_x.dtype();
  const Tensor dlogits = device_doubles(be, dlogits_host, {N, E}, rd, ws);
  Tensor dx_router = be.empty({N, C_}, rd, ws);
  be.matmul_backward(&dx_router, nullptr, nullptr, dlogits, saved.router_x, router_weight(rd));
  if (rd != dy.dtype()) {
    Tensor narrow = be.empty({N, C_}, dy.dtype(), ws);
    be.cast(narrow, dx_router);
    dx_router = narrow;
  }
  be.add_inplace(dx, dx_router);
  if (shared_) be.add_inplace(dx, shared_->backward(dy, saved.shared, deferred));

  // The weight gradients, now or when the schedule asks (zero-bubble schedules).
  run_or_defer(deferred, [this, dlogits, x = saved.router_x, dys, dgate, dup, xs = saved.xs,
                          hidden = saved.hidden, routing = saved.routing] {
    Backend& b = *ctx_.backend;
    Tensor dw = router_.grad.reshape({spec_.experts, C_});
    b.matmul_backward(nullptr, &dw, nullptr, dlogits, x, Tensor{});
    for (int64_t e = 0; e < spec_.experts; ++e) {
      const int64_t r0 = routing->expert_begin[static_cast<size_t>(e)];
      const int64_t n = routing->counts[static_cast<size_t>(e)];
      if (n == 0) continue;
      Tensor dg = expert_grads(gate_, e), du = expert_grads(up_, e), dd = expert_grads(down_, e);
      b.matmul_backward(nullptr, &dg, nullptr, dgate.rows(r0, r0 + n), xs.rows(r0, r0 + n), Tensor{});
      b.matmul_backward(nullptr, &du, nullptr, dup.rows(r0, r0 + n), xs.rows(r0, r0 + n), Tensor{});
      b.matmul_backward(nullptr, &dd, nullptr, dys.rows(r0, r0 + n), hidden.rows(r0, r0 + n), Tensor{});
    }
  });
  return dx;
}

void MixtureOfExperts::add_costs(CostSheet& sheet) const {
  const double active = static_cast<double>(spec_.top_k) / static_cast<double>(spec_.experts);
  // The router: a linear every token passes.
  sheet.linears.push_back(LinearCost{C_, spec_.experts, TpSplitOf::None});
  ParameterCost router = parameter_cost(router_.spec);
  sheet.parameters.push_back(router);
  // Each token through top_k experts: priced as top_k SwiGLU passes of every token (balanced
  // routing), and of the experts' weights the share a token multiplies by.
  for (int64_t j = 0; j < spec_.top_k; ++j) {
    sheet.linears.push_back(LinearCost{C_, F_, TpSplitOf::None});
    sheet.linears.push_back(LinearCost{C_, F_, TpSplitOf::None});
    sheet.add_pass_over_last_outputs(3, 5);
    sheet.linears.push_back(LinearCost{F_, C_, TpSplitOf::None});
  }
  for (const Parameter* p : {&gate_, &up_, &down_}) {
    ParameterCost c = parameter_cost(p->spec);
    c.active_share = active;
    sheet.parameters.push_back(c);
  }
  // Dispatch and combine: each token's row copied k times and back.
  sheet.elementwise.push_back(ElementwiseCost{C_, false, ElementwiseCost::Tokens::Region,
                                              ElementwiseCost::Bytes::Activation,
                                              ElementwiseCost::Bytes::Activation,
                                              2.0 * static_cast<double>(spec_.top_k),
                                              4.0 * static_cast<double>(spec_.top_k)});
  if (shared_) shared_->add_costs(sheet);
}

}  // namespace meshtrain
