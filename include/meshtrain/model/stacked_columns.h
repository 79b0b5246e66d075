#pragma once
// Column-parallel layers that read one input and whose outputs each row packs side by side
// (grouped-query attention's q, k and v projections; SwiGLU's gate and up), run as ONE matrix
// product where their parameters lie back to back in memory: the input is read once, the
// product is wider (more efficient), the output is the packed rows with no copy into them, and
// the input gradient is one product over every layer instead of one each and their sum.
// Megatron-Core's linear_qkv and linear_fc1 hold one concatenated weight for this; meshtrain
// keeps Hugging Face's separate parameters (names, checkpoints, tensor-parallel slices), which
// the parameter store lays out in registration order, and joins their storage instead
// (adjacent_view). Where it is not adjacent (layers with biases between their weights, a
// store whose alignment leaves gaps) the layers run one by one and their outputs are copied
// into the packed rows: the same values, within rounding.

#include <vector>

#include "meshtrain/model/linear.h"

namespace meshtrain {

class StackedColumns {
 public:
  // The layers, in the order of their columns in the packed rows; each reads (N, C) with one C.
  explicit StackedColumns(std::vector<ColumnParallelLinear*> layers);
  // It points at its owner's layers: neither copied nor moved with them.
  StackedColumns(const StackedColumns&) = delete;
  StackedColumns& operator=(const StackedColumns&) = delete;

  // x (N_local, C) -> (N, sum of the layers' local outputs); `tp` as for
  // ColumnParallelLinear::forward. `saved` is the input entered into the tensor region.
  Tensor forward(const Tensor& x, ColumnParallelLinear::Saved& saved, MemoryCategory category,
                 const TensorParallel* tp = nullptr);
  // The packed rows' gradient (N, width) -> dx (N_local, C); the weight and bias gradients now
  // or in `deferred`.
  Tensor backward(const Tensor& dy, const ColumnParallelLinear::Saved& saved,
                  DeferredWeightGradients* deferred = nullptr);

 private:
  struct Joined {
    Tensor weight;  // (width, C); undefined: not adjacent
    Tensor bias;    // (width); undefined without biases
    bool usable() const { return weight.defined(); }
  };
  // The layers' values (or gradients) as one weight and bias, where they are adjacent.
  Joined joined(bool gradients) const;
  Tensor backward_one_by_one(const Tensor& dy, const ColumnParallelLinear::Saved& saved,
                             DeferredWeightGradients* deferred);

  std::vector<ColumnParallelLinear*> layers_;
  bool biased_;
  int64_t width_ = 0, in_ = 0;
};

}  // namespace meshtrain
