// ModelState: its parts, and the unit hooks that drive ZeroGather and the GradientReducer.
#include "meshtrain/parallel/model_state.h"

namespace meshtrain {

ModelState::ModelState(PipelineStage& stage, const StateGroups& groups,
                       const ModelStateOptions& options)
    : layout_(stage, groups, options),
      gather_(layout_),
      reducer_(layout_, gather_),
      optimizer_(layout_, gather_),
      integrity_(layout_, optimizer_),
      flat_(layout_, optimizer_) {}

void ModelState::before_forward(int unit) {
  reducer_.progress();
  gather_.pin(unit, unit + 1);  // prefetch the next unit
}

void ModelState::after_forward(int unit) {
  gather_.unpin(unit);
  reducer_.progress();
}

void ModelState::before_backward(int unit) {
  reducer_.progress();
  gather_.pin(unit, unit - 1);  // backward runs units in reverse: prefetch the previous one
  reducer_.stage_gradients(unit);
}

void ModelState::after_backward(int unit) {
  reducer_.gradients_final(unit);
  gather_.unpin(unit);
  reducer_.progress();
}

// A split backward (zero-bubble schedules): the input-gradient part no longer needs the
// parameters; the weight-gradient part needs only gradient buffers, and ends the unit's
// backward for its micro-batch.
void ModelState::after_input_backward(int unit) {
  gather_.unpin(unit);
  reducer_.progress();
}

void ModelState::before_weight_backward(int unit) {
  reducer_.progress();
  reducer_.stage_gradients(unit);
}

void ModelState::after_weight_backward(int unit) {
  reducer_.gradients_final(unit);
  reducer_.progress();
}

}  // namespace meshtrain
