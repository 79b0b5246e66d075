#include "meshtrain/model/gpt_config.h"

#include <map>
#include <mutex>
#include <tuple>

#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

int64_t GptConfig::parameter_count() const {
  // The strategy advisor asks once per layout (tens of thousands at scale, from several threads),
  // and the table names every tensor of every layer: the count is remembered per architecture.
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool>;
  static std::mutex mutex;
  static std::map<Key, int64_t> counted;
  const Key key{layers, d_model, heads, seq_len, vocab_size, tie_embeddings};
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
  // The position embedding is a lookup, not a multiply: it is left out of N.
  const double n = static_cast<double>(parameter_count() - seq_len * d_model);
  return 6.0 * n + 12.0 * layers * static_cast<double>(d_model) * static_cast<double>(seq_len);
}

}  // namespace meshtrain
