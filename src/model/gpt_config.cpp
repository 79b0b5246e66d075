#include "meshtrain/model/gpt_config.h"

namespace meshtrain {

int64_t GptConfig::parameter_count() const {
  const int64_t C = d_model;
  const int64_t block = 2 * 2 * C            // ln_1, ln_2
                        + 3 * C * C + 3 * C  // qkv
                        + C * C + C          // attn proj
                        + 4 * C * C + 4 * C  // fc
                        + 4 * C * C + C;     // mlp proj
  int64_t n = vocab_size * C + seq_len * C + layers * block + 2 * C;
  if (!tie_embeddings) n += vocab_size * C;
  return n;
}

double GptConfig::flops_per_token() const {
  // The position embedding is a lookup, not a multiply: it is left out of N.
  const double n = static_cast<double>(parameter_count() - seq_len * d_model);
  return 6.0 * n + 12.0 * layers * static_cast<double>(d_model) * static_cast<double>(seq_len);
}

}  // namespace meshtrain
