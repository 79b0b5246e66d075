// Muon on one matrix: momentum, the Newton-Schulz orthogonalisation and the update.
#include "meshtrain/optim/muon.h"

#include <algorithm>
#include <cmath>

namespace meshtrain {

void muon_momentum(Backend& be, Tensor& momentum, const Tensor& grad, double grad_scale,
                   const MuonHyper& hyper, Tensor& update) {
  // `update` first holds the scaled gradient, which both the momentum and Nesterov add.
  be.copy(update, grad);
  if (grad_scale != 1.0) be.scale_inplace(update, grad_scale);
  be.scale_inplace(momentum, hyper.momentum);
  be.add_inplace(momentum, update);
  if (!hyper.nesterov) {
    be.copy(update, momentum);
    return;
  }
  Tensor look_ahead = be.empty(momentum.shape(), momentum.dtype(), MemoryCategory::Workspace);
  be.copy(look_ahead, momentum);
  be.scale_inplace(look_ahead, hyper.momentum);
  be.add_inplace(update, look_ahead);
}

void newton_schulz(Backend& be, Tensor& x, const MuonHyper& hyper) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const double norm = std::sqrt(be.sum_squares(x));
  be.scale_inplace(x, 1.0 / (norm + 1e-7));
  // The Gram matrix of the shorter side: (rows, rows) for a wide x, (cols, cols) for a tall one.
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows;
  const DType dt = x.dtype();
  Tensor gram = be.empty({n, n}, dt, MemoryCategory::Workspace);
  Tensor gram2 = be.empty({n, n}, dt, MemoryCategory::Workspace);
  Tensor poly = be.empty({n, n}, dt, MemoryCategory::Workspace);
  Tensor product = be.empty({rows, cols}, dt, MemoryCategory::Workspace);
  for (int i = 0; i < hyper.ns_steps; ++i) {
    if (tall)  // X^T X: a weight gradient's product, dout = inp = X (the weight is not read)
      be.matmul_backward(nullptr, &gram, nullptr, x, x, gram2, GradWrite::Assign);
    else  // X X^T
      be.matmul_forward(gram, x, x, nullptr);
    be.matmul_forward(gram2, gram, gram, nullptr);  // A A^T = A A: A is symmetric
    // B = b A + c A A
    be.copy(poly, gram);
    be.scale_inplace(poly, hyper.ns_b);
    be.scale_inplace(gram2, hyper.ns_c);
    be.add_inplace(poly, gram2);
    if (tall)  // X B (= X B^T, B symmetric)
      be.matmul_forward(product, x, poly, nullptr);
    else  // B X: an input gradient's product, dout = B, weight = X
      be.matmul_backward(&product, nullptr, nullptr, poly, x, x);
    // X = a X + (B X or X B)
    be.scale_inplace(x, hyper.ns_a);
    be.add_inplace(x, product);
  }
}

double muon_update_scale(double lr, int64_t rows, int64_t cols, const MuonHyper& hyper) {
  return lr * hyper.rms_scale * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

void muon_apply(Backend& be, Tensor& value, Tensor& orthogonal, double lr, const MuonHyper& hyper) {
  muon_apply(be, value, orthogonal, lr, orthogonal.shape()[0], orthogonal.shape()[1], hyper);
}

void muon_apply(Backend& be, Tensor& value, Tensor& orthogonal, double lr, int64_t rows,
                int64_t cols, const MuonHyper& hyper) {
  const double decay = 1.0 - lr * hyper.weight_decay;
  if (decay != 1.0) be.scale_inplace(value, decay);
  be.scale_inplace(orthogonal, -muon_update_scale(lr, rows, cols, hyper));
  be.add_inplace(value, orthogonal);
}

}  // namespace meshtrain
