#pragma once
// The whole model (every layer in one chunk, one tensor rank) built on the planning backend, for
// what is read off the layers rather than restated: the parameter table, the cost sheets.
// Building it calls no kernel and allocates on a meta allocator: the layers' bookkeeping only.

#include <functional>

#include "meshtrain/model/model_spec.h"

namespace meshtrain {

class DecoderModel;

// Builds the model of `cfg` and hands it to `read`; it lives for that call.
void read_planned_model(const ModelSpec& cfg, const std::function<void(DecoderModel&)>& read);

}  // namespace meshtrain
