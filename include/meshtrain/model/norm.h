#pragma once
// The normalisation sub-layer that a ModelSpec's NormSpec picks (model/model_spec.h), wherever a
// block or the head normalises. A new kind is a class with LayerNorm's members (Saved, forward,
// backward, backward_add, add_costs) added to the two variants below and to make_layer: the
// blocks, the head and everything above them are unchanged.

#include <string>
#include <variant>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"
#include "meshtrain/model/layernorm.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/rmsnorm.h"

namespace meshtrain {

class Norm {
 public:
  using Saved = std::variant<LayerNorm::Saved, RmsNorm::Saved>;

  Norm(const LayerContext& ctx, const std::string& name, int64_t C, const NormSpec& spec);

  // out (N_local, C), in `category`.
  Tensor forward(const Tensor& inp, Saved& saved, MemoryCategory category);
  // Returns dinp (N_local, C); accumulates the parameters' gradients.
  Tensor backward(const Tensor& dout, const Saved& saved);
  // backward(dout, saved) + residual, in one pass where the device fuses them.
  Tensor backward_add(const Tensor& dout, const Saved& saved, const Tensor& residual);
  void add_costs(CostSheet& sheet) const;

 private:
  std::variant<LayerNorm, RmsNorm> layer_;
};

}  // namespace meshtrain
