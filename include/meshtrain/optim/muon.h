#pragma once
// Muon's arithmetic on one matrix (optim/muon_hyper.h has the update and its sources). Which
// matrices are Muon's, where their momentum lives and which rank orthogonalises each is the
// training state's business (parallel/muon_matrices.h); these take views of one matrix each.
// Every product is the backend's GEMM (matmul_forward / matmul_backward), in the tensors' own
// element type: the optimizer's (fp32 under fp32 and bf16 runs, fp64 under fp64).

#include <cstdint>

#include "meshtrain/backend/backend.h"
#include "meshtrain/optim/muon_hyper.h"

namespace meshtrain {

// momentum (rows, cols) <- momentum_coef x momentum + grad_scale x grad, and `update` (rows,
// cols) <- grad_scale x grad + momentum_coef x momentum (Nesterov) or momentum.
void muon_momentum(Backend& be, Tensor& momentum, const Tensor& grad, double grad_scale,
                   const MuonHyper& hyper, Tensor& update);

// x (rows, cols) <- its orthogonalisation: x / (||x||_F + 1e-7), then hyper.ns_steps quintic
// Newton-Schulz iterations, on X X^T (rows <= cols) or X^T X (taller than wide: the same as
// iterating on the transpose and transposing back, without a transpose).
void newton_schulz(Backend& be, Tensor& x, const MuonHyper& hyper);

// The step's factor of an orthogonalised update of a rows x cols matrix:
// lr x rms_scale x sqrt(max(rows, cols)).
double muon_update_scale(double lr, int64_t rows, int64_t cols, const MuonHyper& hyper);

// value <- (1 - lr x weight_decay) value - muon_update_scale x orthogonal; `orthogonal` is
// overwritten.
void muon_apply(Backend& be, Tensor& value, Tensor& orthogonal, double lr, const MuonHyper& hyper);
// The same on a piece of a rows x cols matrix (a tensor-parallel shard, a ZeRO shard's part):
// element-wise, with the whole matrix's scale.
void muon_apply(Backend& be, Tensor& value, Tensor& orthogonal, double lr, int64_t rows,
                int64_t cols, const MuonHyper& hyper);

}  // namespace meshtrain
