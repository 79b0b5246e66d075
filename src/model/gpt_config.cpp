#include "meshtrain/model/gpt_config.h"

#include <map>
#include <mutex>

#include "meshtrain/model/model_costs.h"
#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

int64_t GptConfig::parameter_count() const {
  // The strategy advisor asks once per layout (tens of thousands at scale, from several threads),
  // and the table names every tensor of every layer: the count is remembered per architecture.
  static std::mutex mutex;
  static std::map<ArchitectureKey, int64_t> counted;
  const ArchitectureKey key = architecture_key(*this);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = counted.find(key); it != counted.end()) return it->second;
  }
  const int64_t n = total_numel(parameter_table(*this));
  std::lock_guard<std::mutex> lock(mutex);
  counted.emplace(key, n);
  return n;
}

double GptConfig::flops_per_token() const {
  return model_cost_sheet(*this).flops_per_token(static_cast<double>(seq_len));
}

}  // namespace meshtrain
