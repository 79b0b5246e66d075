#include "meshtrain/model/norm_parts.h"

namespace meshtrain {

ParamSpec norm_parameter_spec(const std::string& name, int64_t C, Init init,
                              const TensorParallel& tp) {
  ParamSpec s;
  s.name = name;
  s.global_shape = Shape{C};
  s.init = init;
  s.decay = WeightDecay::Skip;
  s.tp_grad = tp.sequence_parallel() ? TpGrad::Partial : TpGrad::Full;
  return s;
}

void add_norm_pass(CostSheet& sheet, int64_t C) {
  ElementwiseCost pass;
  pass.width = C;
  pass.tokens = ElementwiseCost::Tokens::Region;
  pass.forward_accesses = 2;
  pass.backward_accesses = 4;
  sheet.elementwise.push_back(pass);
}

}  // namespace meshtrain
