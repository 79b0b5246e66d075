#include "meshtrain/model/gpt_config.h"

#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

int64_t GptConfig::parameter_count() const { return total_numel(parameter_table(*this)); }

double GptConfig::flops_per_token() const {
  // The position embedding is a lookup, not a multiply: it is left out of N.
  const double n = static_cast<double>(parameter_count() - seq_len * d_model);
  return 6.0 * n + 12.0 * layers * static_cast<double>(d_model) * static_cast<double>(seq_len);
}

}  // namespace meshtrain
