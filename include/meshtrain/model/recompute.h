#pragma once
// Activation recomputation, the choice alone: the deck (config/config.h) names it without
// pulling in the layers that carry it out (model/layer.h).

namespace meshtrain {

// Activation recomputation (Korthikanti et al., arXiv 2205.05198): keep everything, recompute
// the attention core (softmax probabilities) in backward, or keep only each block's input and
// recompute the whole block.
enum class Recompute { None, Selective, Full };

}  // namespace meshtrain
