#pragma once
// The architecture of a GPT-2 style model, as the model layer needs it.

#include <cstdint>

namespace meshtrain {

struct GptConfig {
  int layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t seq_len = 128;
  int64_t vocab_size = 256;
  bool tie_embeddings = true;

  int64_t head_size() const { return d_model / heads; }
  // Parameters of the whole model (global, unsharded).
  int64_t parameter_count() const;
  // Training FLOPs per token, summed from the layers' cost sheets (model/model_costs.h): 6 x
  // (parameters that multiply) + attention, the PaLM convention (arXiv 2204.02311, appendix B).
  double flops_per_token() const;
};

}  // namespace meshtrain
