#pragma once
// Whether weight decay applies to a parameter, the choice alone: the optimizer (optim/adamw.h)
// and the parameters that declare it (model/parameter.h) share it without depending on each
// other's headers.

namespace meshtrain {

enum class WeightDecay { Apply, Skip };

}  // namespace meshtrain
