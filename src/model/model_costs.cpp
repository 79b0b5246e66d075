#include "meshtrain/model/model_costs.h"

#include <map>
#include <mutex>

#include "meshtrain/model/decoder_model.h"
#include "meshtrain/model/planned_model.h"

namespace meshtrain {

namespace {

ModelCostSheet read_sheets(const ModelSpec& cfg) {
  ModelCostSheet sheets;
  read_planned_model(cfg, [&](DecoderModel& model) {
    ModelChunk& chunk = model.chunk(0);
    sheets.embedding = chunk.embedding()->cost_sheet();
    for (int i = 0; i < chunk.block_count(); ++i) sheets.blocks.push_back(chunk.block(i).cost_sheet());
    sheets.head = chunk.head()->cost_sheet();
  });
  return sheets;
}

}  // namespace

const ModelCostSheet& model_cost_sheet(const ModelSpec& cfg) {
  static std::mutex mutex;
  static std::map<ModelSpec, ModelCostSheet> read;
  const ModelSpec& key = cfg;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = read.find(key); it != read.end()) return it->second;
  }
  ModelCostSheet sheets = read_sheets(cfg);
  std::lock_guard<std::mutex> lock(mutex);
  // std::map never moves its values: the reference stays good as other entries are added.
  return read.emplace(key, std::move(sheets)).first->second;
}

}  // namespace meshtrain
