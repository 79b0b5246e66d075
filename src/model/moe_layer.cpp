#include "meshtrain/model/moe_layer.h"

#include <algorithm>
#include <stdexcept>

#include "meshtrain/backend/host_doubles.h"
#include "meshtrain/model/expert_exchange.h"
#include "meshtrain/model/replicated_linear.h"

namespace meshtrain {

namespace {

// An expert weight (E, rows, cols): split over the expert group by expert, and then replicated
// only over the ranks holding the same experts.
Parameter& add_expert_weight(const std::string& name, Shape shape, double init_std,
                             const LayerContext& ctx) {
  ParamSpec s = replicated_weight_spec(name, std::move(shape), init_std, ctx.tp);
  s.role = ParamRole::HiddenMatrix;  // E matrices; the router stays Plain
  if (!ctx.ep.on()) return ctx.store->add(std::move(s), 0, 1);
  s.ep_split_dim = 0;
  s.group = ReplicaGroup::ExpertData;
  return ctx.store->add(std::move(s), ctx.ep.rank(), ctx.ep.size());
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
      router_(ctx.store->add(replicated_weight_spec(name + ".router", {spec.moe.experts, C_}, 0.02, ctx.tp),
                             ctx.tp.rank(), ctx.tp.size())),
      gate_(add_expert_weight(name + ".experts.gate", {spec.moe.experts, F_, C_}, 0.02, ctx)),
      up_(add_expert_weight(name + ".experts.up", {spec.moe.experts, F_, C_}, 0.02, ctx)),
      down_(add_expert_weight(name + ".experts.down", {spec.moe.experts, C_, F_},
                              0.02 * residual_scale, ctx)) {
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

// This rank's experts of an expert tensor (a parameter's value or gradient) as (L, rows, cols):
// the weights of the grouped products, one group per local expert.
Tensor MixtureOfExperts::local_experts(const Tensor& t, const Parameter& p,
                                       const ExpertExchange& x) const {
  return t.view(0, {x.local_experts(), p.shape[1], p.shape[2]});
}

std::shared_ptr<const Routing> MixtureOfExperts::route(const Tensor& x, const TokenShape& shape,
                                                       bool recomputing, Saved& saved) {
  Backend& be = *ctx_.backend;
  const int64_t N = x.dim(0), E = spec_.experts;
  std::shared_ptr<const Routing> r;
  if (be.planning()) {
    if (!planned_routing_ || planned_routing_->tokens != N)
      planned_routing_ = std::make_shared<const Routing>(route_balanced(N, spec_));
    r = planned_routing_;
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
  std::vector<double> sums;
  if (be.planning()) {
    PlannedSums& p = planned_sums_;
    if (p.routing != r.get() || p.begin != begin || p.T != shape.T || p.B != shape.B)
      p = PlannedSums{r.get(), begin, shape.T, shape.B,
                      RouterSums::of(*r, sequence_of, shape.B).to_vector()};
    sums = p.sums;
  } else {
    sums = RouterSums::of(*r, sequence_of, shape.B).to_vector();
  }
  const bool over_tp = ctx_.tp.sequence_parallel() && ctx_.tp.size() > 1;
  if (over_tp || ctx_.cp.on()) {
    Tensor t = be.empty({static_cast<int64_t>(sums.size())}, DType::F64, MemoryCategory::Workspace);
    be.copy_from_host(t, sums.data());
    if (over_tp) ctx_.tp.comm->all_reduce(t).wait();
    if (ctx_.cp.on()) ctx_.cp.comm->all_reduce(t).wait();
    be.copy_to_host(sums.data(), t);
  }
  const RouterSums sequences = RouterSums::from_vector(sums, shape.B, E);
  // The planner's dry run prices memory, not values: no (N, experts) gradient on the host.
  if (!be.planning())
    saved.balance_grad = balancing_logit_gradient(*r, sequences, sequence_of, spec_, shape.loss_weight);
  if (recomputing) return r;
  if (ctx_.tp.rank() == 0 && ctx_.cp.rank() == 0) {
    const BalancingLosses l = balancing_losses(sequences, spec_);
    // The step's loss is the sum of per-token losses times loss_weight.
    if (ctx_.loss) ctx_.loss->add_host(l.per_token);
    if (ctx_.moe_log)
      ctx_.moe_log->add(layer_, sequences.expert_counts(), l.load_balance,
                        static_cast<double>(shape.B), l.z, sequences.token_count(), sequences.dropped);
  }
  return r;
}

Tensor MixtureOfExperts::forward(const Tensor& x, const TokenShape& shape, bool recomputing,
                                 Saved& saved, MemoryCategory category, MemoryCategory out_category,
                                 const TensorParallel* tp, const Tensor* residual) {
  Backend& be = *ctx_.backend;
  const int64_t N = x.dim(0), k = spec_.top_k;
  const DType wide = stats_dtype(x.dtype());
  saved.x = x;
  saved.router_x = x;
  if (stats_dtype(x.dtype()) != x.dtype()) {
    saved.router_x = be.empty(x.shape(), stats_dtype(x.dtype()), category);
    be.cast(saved.router_x, x);
  }
  saved.routing = route(x, shape, recomputing, saved);
  const Routing& r = *saved.routing;
  const int64_t M = static_cast<int64_t>(r.token_of_row.size());
  saved.token_of_row = device_rows(be, r.token_of_row, {M, 1}, category);
  saved.row_of_choice = device_rows(be, r.row_of_choice, {N, k}, category);
  saved.gate_of_row = device_doubles(be, r.gate_of_row, {M, 1}, wide, category);
  saved.gates = device_doubles(be, r.gate, {N, k}, wide, category);
  saved.exchange = std::make_shared<const ExpertExchange>(be, ctx_.ep, r, category);
  const ExpertExchange& ex = *saved.exchange;

  // Dispatch: the rows in expert order, to their experts' ranks; the shared expert runs while
  // they travel. Then each expert on its rows.
  Tensor xs = be.empty({M, C_}, x.dtype(), MemoryCategory::Workspace);
  be.gather_rows(xs, x, saved.token_of_row, nullptr);
  Tensor shared;
  saved.xe = ex.to_experts(xs, category, [&] {
    if (shared_) shared = shared_->forward(x, saved.shared, category, MemoryCategory::Workspace, tp);
  });
  const int64_t R = ex.rows();
  saved.gate = be.empty({R, F_}, x.dtype(), category);
  saved.up = be.empty({R, F_}, x.dtype(), category);
  saved.hidden = be.empty({R, F_}, x.dtype(), category);
  // Every local expert's rows at once (a grouped GEMM); an expert without rows computes nothing.
  const std::vector<int64_t>& rows = ex.expert_row_counts();
  be.grouped_matmul_forward(saved.gate, saved.xe, local_experts(gate_.value, gate_, ex), rows);
  be.grouped_matmul_forward(saved.up, saved.xe, local_experts(up_.value, up_, ex), rows);
  if (R > 0) be.swiglu_forward(saved.hidden, saved.gate, saved.up);
  Tensor ye = be.empty({R, C_}, x.dtype(), MemoryCategory::Workspace);
  be.grouped_matmul_forward(ye, saved.hidden, local_experts(down_.value, down_, ex), rows);

  // Combine: the outputs back to their tokens' ranks, each token's experts added in the order
  // of its choices.
  saved.ys = ex.from_experts(ye, category);
  Tensor out = be.empty({N, C_}, x.dtype(), out_category);
  be.gather_rows(out, saved.ys, saved.row_of_choice, &saved.gates);
  if (shared_) be.add_inplace(out, shared);
  if (residual) be.add_inplace(out, *residual);
  return out;
}

Tensor MixtureOfExperts::backward(const Tensor& dy, const Saved& saved,
                                  DeferredWeightGradients* deferred) {
  Backend& be = *ctx_.backend;
  const Routing& r = *saved.routing;
  const ExpertExchange& ex = *saved.exchange;
  const int64_t N = dy.dim(0), k = spec_.top_k, M = static_cast<int64_t>(r.token_of_row.size());
  const int64_t R = ex.rows();
  const DType wide = stats_dtype(dy.dtype());
  const MemoryCategory ws = MemoryCategory::Workspace;

  // The gates' gradient (to the router), and the experts' output gradient: each sorted row's
  // token's gradient times its gate, sent to its expert's rank; the shared expert's backward
  // runs while it travels.
  Tensor dgates = be.empty({N, k}, wide, ws);
  be.gathered_row_dots(dgates, dy, saved.ys, saved.row_of_choice);
  Tensor dys = be.empty({M, C_}, dy.dtype(), ws);
  be.gather_rows(dys, dy, saved.token_of_row, &saved.gate_of_row);
  Tensor dx_shared;
  const Tensor dye = ex.to_experts(dys, ws, [&] {
    if (shared_) dx_shared = shared_->backward(dy, saved.shared, deferred);
  });

  const std::vector<int64_t>& rows = ex.expert_row_counts();
  Tensor dhidden = be.empty({R, F_}, dy.dtype(), ws);
  be.grouped_matmul_backward(&dhidden, nullptr, dye, saved.hidden,
                             local_experts(down_.value, down_, ex), rows);
  Tensor dgate = be.empty({R, F_}, dy.dtype(), ws), dup = be.empty({R, F_}, dy.dtype(), ws);
  if (R > 0) be.swiglu_backward(dgate, dup, dhidden, saved.gate, saved.up);
  Tensor dxe = be.empty({R, C_}, dy.dtype(), ws), dxe_up = be.empty({R, C_}, dy.dtype(), ws);
  be.grouped_matmul_backward(&dxe, nullptr, dgate, saved.xe, local_experts(gate_.value, gate_, ex),
                             rows);
  be.grouped_matmul_backward(&dxe_up, nullptr, dup, saved.xe, local_experts(up_.value, up_, ex),
                             rows);
  if (R > 0) be.add_inplace(dxe, dxe_up);
  // Back to the tokens' ranks, and each token's rows summed in the order of its choices.
  const Tensor dxs = ex.from_experts(dxe, ws);
  Tensor dx = be.empty({N, C_}, dy.dtype(), ws);
  be.gather_rows(dx, dxs, saved.row_of_choice, nullptr);

  // The router: the gates' gradient through the renormalisation and the softmax, plus the
  // balancing losses', on the host; then its GEMM's backward.
  // (The planner's dry run allocates the same tensor and skips the host's arithmetic.)
  const DType rd = saved.router_x.dtype();
  const Tensor dlogits =
      be.planning() ? be.empty({N, spec_.experts}, rd, ws)
                    : device_doubles(be,
                                     router_logit_gradient(
                                         r, to_host_doubles(be, dgates, "a mixture of experts' router"),
                                         spec_, saved.balance_grad),
                                     {N, spec_.experts}, rd, ws);
  Tensor dx_router = be.empty({N, C_}, rd, ws);
  be.matmul_backward(&dx_router, nullptr, nullptr, dlogits, saved.router_x, router_weight(rd));
  if (rd != dy.dtype()) {
    Tensor narrow = be.empty({N, C_}, dy.dtype(), ws);
    be.cast(narrow, dx_router);
    dx_router = narrow;
  }
  be.add_inplace(dx, dx_router);
  if (shared_) be.add_inplace(dx, dx_shared);

  // The weight gradients, now or when the schedule asks (zero-bubble schedules).
  run_or_defer(deferred, [this, dlogits, x = saved.router_x, dye, dgate, dup, xe = saved.xe,
                          hidden = saved.hidden, exchange = saved.exchange] {
    Backend& b = *ctx_.backend;
    Tensor dw = router_.grad.reshape({spec_.experts, C_});
    b.matmul_backward(nullptr, &dw, nullptr, dlogits, x, Tensor{}, router_.take_grad_write());
    const std::vector<int64_t>& rows = exchange->expert_row_counts();
    // An expert without rows leaves its gradient as it was: the experts' are zeroed first.
    for (Parameter* p : {&gate_, &up_, &down_}) p->zero_grad_if_unwritten(b);
    Tensor dg = local_experts(gate_.grad, gate_, *exchange);
    Tensor du = local_experts(up_.grad, up_, *exchange);
    Tensor dd = local_experts(down_.grad, down_, *exchange);
    b.grouped_matmul_backward(nullptr, &dg, dgate, xe, Tensor{}, rows);
    b.grouped_matmul_backward(nullptr, &du, dup, xe, Tensor{}, rows);
    b.grouped_matmul_backward(nullptr, &dd, dye, hidden, Tensor{}, rows);
  });
  return dx;
}

void MixtureOfExperts::add_costs(CostSheet& sheet) const {
  const double active = static_cast<double>(spec_.top_k) / static_cast<double>(spec_.experts);
  // The router: a linear every token passes.
  sheet.linears.push_back(LinearCost{C_, spec_.experts, TpSplitOf::None});
  ParameterCost router = parameter_cost(router_.spec);
  sheet.parameters.push_back(router);
  // Each token through top_k experts: gate, up and down as grouped GEMMs over the experts'
  // rows (the time model assumes balanced routing), the SwiGLU pass over each of a token's
  // top_k rows, and of the experts' weights the share a token multiplies by.
  const double k = static_cast<double>(spec_.top_k);
  const auto expert_linear = [&](int64_t in, int64_t out) {
    return LinearCost{in, out, TpSplitOf::None, spec_.experts, k};
  };
  sheet.linears.push_back(expert_linear(C_, F_));
  sheet.linears.push_back(expert_linear(C_, F_));
  sheet.add_pass_over_last_outputs(3 * k, 5 * k);
  sheet.linears.push_back(expert_linear(F_, C_));
  for (const Parameter* p : {&gate_, &up_, &down_}) {
    ParameterCost c = parameter_cost(p->spec);
    c.active_share = active;
    c.expert_parallel = true;
    sheet.parameters.push_back(c);
  }
  // Under parallel.ep each token's top_k rows of d_model travel to the experts' ranks and back
  // (model/expert_exchange.h), after the per-expert counts.
  sheet.exchanges.push_back(ExchangeCost{C_, static_cast<double>(spec_.top_k), spec_.experts});
  // Dispatch and combine: each token's row copied k times and back.
  sheet.elementwise.push_back(ElementwiseCost{C_, false, ElementwiseCost::Tokens::Region,
                                              ElementwiseCost::Bytes::Activation,
                                              ElementwiseCost::Bytes::Activation,
                                              2.0 * static_cast<double>(spec_.top_k),
                                              4.0 * static_cast<double>(spec_.top_k)});
  if (shared_) shared_->add_costs(sheet);
}

}  // namespace meshtrain
