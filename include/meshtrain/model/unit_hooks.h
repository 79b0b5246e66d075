#pragma once
// The points around each unit (embedding, block, head) of a model's forward and backward where
// the training state acts: data-parallel gradient reduction and ZeRO parameter gathering happen
// exactly when a unit's parameters are needed or its gradients are final. Any model family
// calls them the same way, so parallel/ needs no model of its own to drive them.
//
// A whole backward of a unit runs between before_backward and after_backward. A split one
// (zero-bubble schedules) runs its input-gradient part between before_backward and
// after_input_backward, and later its weight-gradient part between before_weight_backward and
// after_weight_backward; the unit's gradients for the micro-batch are final only then.

namespace meshtrain {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int /*unit*/) {}
  virtual void after_forward(int /*unit*/) {}
  virtual void before_backward(int /*unit*/) {}
  virtual void after_backward(int /*unit*/) {}
  virtual void after_input_backward(int /*unit*/) {}
  virtual void before_weight_backward(int /*unit*/) {}
  virtual void after_weight_backward(int /*unit*/) {}
};

}  // namespace meshtrain
