#pragma once
// The cost sheets of a whole model (model/cost_sheet.h), read off its layers as built on the
// planning backend with a one-rank tensor group, as the parameter table is: nothing is
// allocated, and each layer describes itself.

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// Remembered per architecture: the strategy advisor prices tens of thousands of layouts of one
// model, from several threads.
const ModelCostSheet& model_cost_sheet(const ModelSpec& cfg);

}  // namespace meshtrain
