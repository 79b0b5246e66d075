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
  std::lock_guard<std::mutex> lock(mutex);
  // A few shapes' worth: a 1T layout's schedules hold tens of MB.
  if (cache.size() >= 16) cache.clear();
  return cache.emplace(key, std::move(built)).first->second;
}

}  // namespace meshtrain
