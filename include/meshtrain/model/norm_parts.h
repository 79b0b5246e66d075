#pragma once
// What every normalisation layer shares (model/layernorm.h, model/rmsnorm.h): its per-channel
// parameters' spec, and the cost of its pass over the residual stream.

#include <string>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/layer.h"

namespace meshtrain {

// A (C) parameter replicated over the tensor group, without weight decay. Under sequence
// parallelism each rank normalises only its own tokens, so its gradient is partial there and
// summed over the group.
ParamSpec norm_parameter_spec(const std::string& name, int64_t C, Init init,
                              const TensorParallel& tp);

// Reads the input, writes the output; backward reads both again and writes the input gradient
// (counted as twice forward's traffic).
void add_norm_pass(CostSheet& sheet, int64_t C);

}  // namespace meshtrain
