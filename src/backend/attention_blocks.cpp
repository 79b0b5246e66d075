// The Backend defaults of the ring-attention block operations (backend.h): devices without
// these kernels refuse context parallelism by name, and copy_columns copies row by row.

#include <stdexcept>
#include <string>

#include "meshtrain/backend/backend.h"

namespace meshtrain {

namespace {
[[noreturn]] void refuse(const std::string& backend, const char* op) {
  throw std::invalid_argument("backend '" + backend + "' does not support " + op +
                              " (ring attention: context parallelism, parallel.cp > 1)");
}
}  // namespace

void Backend::attention_block_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, int64_t,
                                      int64_t, int64_t, const AttentionBlock&) {
  refuse(name(), "attention_block_forward");
}

void Backend::attention_block_backward(Tensor&, Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const Tensor&, int64_t,
                                       int64_t, int64_t, const AttentionBlock&) {
  refuse(name(), "attention_block_backward");
}

void Backend::copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                           int64_t cols) {
  const bool matrices = dst.shape().rank() == 2 && src.shape().rank() == 2;
  const int64_t rows = dst.dim(0), dst_ld = matrices ? dst.dim(1) : 0, src_ld = matrices ? src.dim(1) : 0;
  if (!matrices || src.dim(0) != rows ||
      dst.dtype() != src.dtype() || dst_col < 0 || src_col < 0 || cols < 0 ||
      dst_col + cols > dst_ld || src_col + cols > src_ld)
    throw std::invalid_argument("backend '" + name() + "': copy_columns: " + std::to_string(cols) +
                                " columns from " + std::to_string(src_col) + " of " +
                                src.shape().to_string() + " to " + std::to_string(dst_col) +
                                " of " + dst.shape().to_string() + " do not fit");
  if (planning()) return;
  for (int64_t r = 0; r < rows; ++r) {
    Tensor to = dst.view(r * dst_ld + dst_col, {cols});
    copy(to, src.view(r * src_ld + src_col, {cols}));
  }
}

}  // namespace meshtrain
