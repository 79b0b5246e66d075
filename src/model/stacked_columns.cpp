#include "meshtrain/model/stacked_columns.h"

#include <algorithm>
#include <stdexcept>

#include "meshtrain/model/tp_regions.h"

namespace meshtrain {

StackedColumns::StackedColumns(std::vector<ColumnParallelLinear*> layers)
    : layers_(std::move(layers)) {
  if (layers_.empty()) throw std::logic_error("StackedColumns: no layers");
  in_ = layers_.front()->in();
  biased_ = layers_.front()->bias() != nullptr;
  for (ColumnParallelLinear* l : layers_) {
    if (l->in() != in_ || (l->bias() != nullptr) != biased_)
      throw std::logic_error("StackedColumns: layers of one input width, all with or all without biases");
    width_ += l->local_out();
  }
  // Their weights back to back in every flat buffer, where they were registered so; biases
  // between them (registered with each layer) leave them one by one.
  std::vector<Parameter*> weights;
  for (ColumnParallelLinear* l : layers_) weights.push_back(&l->weight());
  if (!biased_) layers_.front()->context().store->stack(weights);
}

StackedColumns::Joined StackedColumns::joined(bool gradients) const {
  std::vector<Tensor> weights, biases;
  for (ColumnParallelLinear* l : layers_) {
    weights.push_back(gradients ? l->weight().grad : l->weight().value);
    if (biased_) biases.push_back(gradients ? l->bias()->grad : l->bias()->value);
  }
  Joined j;
  j.weight = adjacent_view(weights, {width_, in_});
  if (biased_) {
    j.bias = adjacent_view(biases, {width_});
    if (!j.bias.defined()) j.weight = Tensor{};
  }
  return j;
}

Tensor StackedColumns::forward(const Tensor& x, ColumnParallelLinear::Saved& saved,
                               MemoryCategory category, const TensorParallel* tp) {
  Backend& be = *layers_.front()->context().backend;
  const Joined w = joined(false);
  if (w.usable()) {
    saved.inp = enter_tp_region_forward(be, tp ? *tp : layers_.front()->context().tp, x, category);
    Tensor out = be.empty({saved.inp.dim(0), width_}, x.dtype(), category);
    be.matmul_forward(out, saved.inp, w.weight, biased_ ? &w.bias : nullptr);
    return out;
  }
  const MemoryCategory ws = MemoryCategory::Workspace;
  std::vector<Tensor> outs{layers_.front()->forward(x, saved, ws, tp)};
  for (size_t i = 1; i < layers_.size(); ++i) outs.push_back(layers_[i]->forward_entered(saved, ws));
  Tensor packed = be.empty({saved.inp.dim(0), width_}, x.dtype(), category);
  int64_t col = 0;
  for (const Tensor& o : outs) {
    be.copy_columns(packed, col, o, 0, o.dim(1));
    col += o.dim(1);
  }
  return packed;
}

Tensor StackedColumns::backward(const Tensor& dy, const ColumnParallelLinear::Saved& saved,
                                DeferredWeightGradients* deferred) {
  const Joined w = joined(false);
  if (!w.usable()) return backward_one_by_one(dy, saved, deferred);
  ColumnParallelLinear& first = *layers_.front();
  Backend& be = *first.context().backend;
  Tensor dinp = be.empty(saved.inp.shape(), saved.inp.dtype(), MemoryCategory::Workspace);
  be.matmul_backward(&dinp, nullptr, nullptr, dy, saved.inp, w.weight);
  run_or_defer(deferred, [this, dy, inp = saved.inp] {
    Backend& b = *layers_.front()->context().backend;
    Joined g = joined(true);
    if (g.usable()) {
      // One GEMM writes every layer's weight gradient: it assigns them only where it is the
      // step's first write of each (the stack is written together, so it is of all or none).
      const bool first = std::all_of(layers_.begin(), layers_.end(), [](ColumnParallelLinear* l) {
        return l->weight().grad_unwritten;
      });
      for (ColumnParallelLinear* l : layers_) {
        if (biased_) l->bias()->zero_grad_if_unwritten(b);
        if (first) l->weight().take_grad_write();
        else l->weight().zero_grad_if_unwritten(b);
      }
      b.matmul_backward(nullptr, &g.weight, biased_ ? &g.bias : nullptr, dy, inp, Tensor{},
                        first ? GradWrite::Assign : GradWrite::Add);
      return;
    }
    // Adjacent values but gradients apart (a sharded gradient store): each layer its columns.
    int64_t col = 0;
    for (ColumnParallelLinear* l : layers_) {
      const int64_t n = l->local_out();
      Tensor dy_l = b.empty({dy.dim(0), n}, dy.dtype(), MemoryCategory::Workspace);
      b.copy_columns(dy_l, 0, dy, col, n);
      Tensor dw = l->weight().grad.reshape({n, in_});
      Tensor db = biased_ ? l->bias()->grad.reshape({n}) : Tensor{};
      if (biased_) l->bias()->zero_grad_if_unwritten(b);
      b.matmul_backward(nullptr, &dw, biased_ ? &db : nullptr, dy_l, inp, Tensor{},
                        l->weight().take_grad_write());
      col += n;
    }
  });
  return first.leave_region_backward(dinp);
}

Tensor StackedColumns::backward_one_by_one(const Tensor& dy, const ColumnParallelLinear::Saved& saved,
                                           DeferredWeightGradients* deferred) {
  Backend& be = *layers_.front()->context().backend;
  Tensor dx;
  int64_t col = 0;
  for (ColumnParallelLinear* l : layers_) {
    const int64_t n = l->local_out();
    Tensor dy_l = be.empty({dy.dim(0), n}, dy.dtype(), MemoryCategory::Workspace);
    be.copy_columns(dy_l, 0, dy, col, n);
    col += n;
    Tensor dx_l = l->backward_in_region(dy_l, saved, deferred);
    if (dx.defined())
      be.add_inplace(dx, dx_l);
    else
      dx = dx_l;
  }
  return layers_.front()->leave_region_backward(dx);
}

}  // namespace meshtrain
