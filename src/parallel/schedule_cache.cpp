#include "meshtrain/parallel/schedule_cache.h"

#include <map>
#include <mutex>
#include <tuple>

namespace meshtrain {

std::shared_ptr<const PipelineSchedules> pipeline_schedules(ScheduleKind kind, int stages, int microbatches,
                                                            int virtual_stages) {
  using Key = std::tuple<ScheduleKind, int, int, int>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const PipelineSchedules>> cache;
  const Key key{kind, stages, microbatches, virtual_stages};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const ChunkPlacement placement = schedule_placement(kind);
  auto built = std::make_shared<PipelineSchedules>();
  built->train = insert_communication(make_schedule(kind, stages, microbatches, virtual_stages), stages,
                                      virtual_stages, placement);
  built->eval = make_forward_only(stages, microbatches, virtual_stages, placement);
  size_t actions = 0;
  for (const Schedule* s : {&built->train, &built->eval})
    for (const std::vector<Action>& rank : *s) actions += rank.size();
  std::lock_guard<std::mutex> lock(mutex);
  // Bounded by actions (12 bytes each), not shapes: the advisor meets hundreds of shapes of a 1T
  // model, the largest with over a million actions, in the order of their layouts' bounds, not
  // shape by shape. 24 million (about 300 MB) hold every shape of Megatron's 1T deck on 3072
  // ranks (271 shapes, each built once; at 8 million they were built 710 times).
  static size_t held = 0;
  if (held + actions > (size_t{24} << 20)) {
    cache.clear();
    held = 0;
  }
  const auto [it, added] = cache.emplace(key, std::move(built));
  if (added) held += actions;
  return it->second;
}

}  // namespace meshtrain
