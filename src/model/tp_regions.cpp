#include "meshtrain/model/tp_regions.h"

namespace meshtrain {

namespace {
Tensor with_rows(Backend& be, const Tensor& like, int64_t rows, MemoryCategory category) {
  return be.empty({rows, like.dim(like.shape().rank() - 1)}, like.dtype(), category);
}

Tensor all_gather_rows(Backend& be, const TensorParallel& tp, const Tensor& x, MemoryCategory c) {
  Tensor full = with_rows(be, x, x.numel() / x.dim(x.shape().rank() - 1) * tp.size(), c);
  tp.comm->all_gather(full, x).wait();
  return full;
}

Tensor reduce_scatter_rows(Backend& be, const TensorParallel& tp, const Tensor& x, MemoryCategory c) {
  Tensor part = with_rows(be, x, x.numel() / x.dim(x.shape().rank() - 1) / tp.size(), c);
  tp.comm->reduce_scatter(part, x).wait();
  return part;
}

// The partial sums are temporaries nobody else holds: reduce them in place.
Tensor all_reduce_in_place(const TensorParallel& tp, const Tensor& x) {
  Tensor t = x;
  tp.comm->all_reduce(t).wait();
  return t;
}
}  // namespace

Tensor enter_tp_region_forward(Backend& be, const TensorParallel& tp, const Tensor& x,
                               MemoryCategory category) {
  if (tp.size() == 1) return x;
  return tp.sequence_parallel() ? all_gather_rows(be, tp, x, category) : x;
}

Tensor enter_tp_region_backward(Backend& be, const TensorParallel& tp, const Tensor& dx,
                                MemoryCategory category) {
  if (tp.size() == 1) return dx;
  return tp.sequence_parallel() ? reduce_scatter_rows(be, tp, dx, category)
                                : all_reduce_in_place(tp, dx);
}

Tensor exit_tp_region_forward(Backend& be, const TensorParallel& tp, const Tensor& partial,
                              MemoryCategory category) {
  if (tp.size() == 1) return partial;
  return tp.sequence_parallel() ? reduce_scatter_rows(be, tp, partial, category)
                                : all_reduce_in_place(tp, partial);
}

Tensor exit_tp_region_backward(Backend& be, const TensorParallel& tp, const Tensor& dy,
                               MemoryCategory category) {
  if (tp.size() == 1) return dy;
  return tp.sequence_parallel() ? all_gather_rows(be, tp, dy, category) : dy;
}

}  // namespace meshtrain
