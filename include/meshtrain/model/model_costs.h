#pragma once
// The cost sheets of a whole model (model/cost_sheet.h), read off its layers as built on the
// planning backend with a one-rank tensor group, as the parameter table is: nothing is
// allocated, and each layer describes itself.

#include <tuple>

#include "meshtrain/model/cost_sheet.h"
#include "meshtrain/model/gpt_config.h"

namespace meshtrain {

// Every field of the architecture: the key of what is computed once per model.
using ArchitectureKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool>;
ArchitectureKey architecture_key(const GptConfig& cfg);

// Remembered per architecture: the strategy advisor prices tens of thousands of layouts of one
// model, from several threads.
const ModelCostSheet& model_cost_sheet(const GptConfig& cfg);

}  // namespace meshtrain
