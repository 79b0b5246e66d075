#include "meshtrain/backend/backend.h"

namespace meshtrain {

Backend::~Backend() = default;

std::unique_ptr<Allocator> Backend::make_host_allocator() const {
  return std::make_unique<HostAllocator>();
}

Tensor Backend::empty(Shape shape, DType dtype, MemoryCategory category) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(allocator_->allocate(bytes, category), 0, shape, dtype);
}

Tensor Backend::empty_host(Shape shape, DType dtype, MemoryCategory category) {
  if (!host_allocator_) host_allocator_ = make_host_allocator();
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(host_allocator_->allocate(bytes, category), 0, shape, dtype);
}

void Backend::do_copy_from_host_async(Tensor& dst, Tensor src) { copy_from_host(dst, src.raw()); }

void Backend::do_matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp,
                                     const Tensor& weight, const Tensor& bias) {
  matmul_forward(pre, inp, weight, &bias);
  gelu_forward(out, pre);
}

void Backend::do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                      const Tensor& pre) {
  Tensor product = empty(pre.shape(), pre.dtype(), MemoryCategory::Workspace);
  matmul_backward(&product, nullptr, nullptr, dout, pre, weight);  // `pre`: only its shape
  gelu_backward(dpre, pre, product);
}

void Backend::do_snapshot_to_host(Tensor& dst, const Tensor& src) { copy_to_host(dst.raw(), src); }

void Backend::do_swiglu_forward_packed(Tensor& out, const Tensor& gate_up) {
  const int64_t N = gate_up.dim(0), F = out.dim(1);
  Tensor gate = empty({N, F}, gate_up.dtype(), MemoryCategory::Workspace);
  Tensor up = empty({N, F}, gate_up.dtype(), MemoryCategory::Workspace);
  copy_columns(gate, 0, gate_up, 0, F);
  copy_columns(up, 0, gate_up, F, F);
  swiglu_forward(out, gate, up);
}

void Backend::do_swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout,
                                        const Tensor& gate_up) {
  const int64_t N = gate_up.dim(0), F = dout.dim(1);
  const MemoryCategory ws = MemoryCategory::Workspace;
  Tensor gate = empty({N, F}, gate_up.dtype(), ws), up = empty({N, F}, gate_up.dtype(), ws);
  Tensor dgate = empty({N, F}, gate_up.dtype(), ws), dup = empty({N, F}, gate_up.dtype(), ws);
  copy_columns(gate, 0, gate_up, 0, F);
  copy_columns(up, 0, gate_up, F, F);
  swiglu_backward(dgate, dup, dout, gate, up);
  copy_columns(dgate_up, 0, dgate, 0, F);
  copy_columns(dgate_up, F, dup, 0, F);
}

void Backend::do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses,
                                                const Tensor& logits, const Tensor& targets,
                                                double dloss) {
  const Shape rows{losses.numel()};
  Tensor row_max = empty(rows, losses.dtype(), MemoryCategory::Workspace);
  Tensor row_sumexp = empty(rows, losses.dtype(), MemoryCategory::Workspace);
  Tensor target_logit = empty(rows, losses.dtype(), MemoryCategory::Workspace);
  crossentropy_stats(row_max, row_sumexp, logits);
  crossentropy_target_logit(target_logit, logits, targets, 0);
  crossentropy_losses(losses, row_max, row_sumexp, target_logit);
  crossentropy_backward(dlogits, logits, row_max, row_sumexp, targets, 0, dloss);
}

void Backend::do_reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                                    const std::vector<FlatPiece>& pieces, Reduction what) {
  for (size_t k = 0; k < pieces.size(); ++k)
    reduce_into(out, first_slot + static_cast<int64_t>(k), t.view(pieces[k].offset, {pieces[k].count}),
                what);
}

Tensor Backend::zeros(Shape shape, DType dtype, MemoryCategory category) {
  Tensor t = empty(shape, dtype, category);
  fill(t, 0.0);
  return t;
}

}  // namespace meshtrain
