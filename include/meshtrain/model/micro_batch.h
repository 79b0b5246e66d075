#pragma once
// One micro-batch's data as a model sees it, and which pass runs over it: the currency between
// the data feed, the pipeline executor and any model family's stage.

#include "meshtrain/model/token_shape.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

// tokens and targets are int32 (N) on the device.
struct MicroBatchData {
  Tensor tokens;
  Tensor targets;
  TokenShape shape;
};

enum class Pass { Train, Eval };

}  // namespace meshtrain
