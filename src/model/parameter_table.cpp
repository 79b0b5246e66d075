#include "meshtrain/model/parameter_table.h"

#include "meshtrain/model/decoder_model.h"
#include "meshtrain/model/planned_model.h"

namespace meshtrain {

ParamEntry entry_of(const ParamSpec& spec) {
  return {spec.name, spec.global_shape, spec.tp_split_dim, spec.tp_split, spec.group, spec.role};
}

std::vector<ParamEntry> parameter_table(const ModelSpec& cfg) {
  std::vector<ParamEntry> table;
  read_planned_model(cfg, [&](DecoderModel& model) {
    for (const Parameter* p : model.params().params())
      if (!p->tied_copy) table.push_back(entry_of(p->spec));
  });
  return table;
}

int64_t total_numel(const std::vector<ParamEntry>& table) {
  int64_t n = 0;
  for (const ParamEntry& e : table) n += e.numel();
  return n;
}

}  // namespace meshtrain
