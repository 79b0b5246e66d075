#include "meshtrain/model/parameter_table.h"

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/model/gpt.h"

namespace meshtrain {

ParamEntry entry_of(const ParamSpec& spec) {
  return {spec.name, spec.global_shape, spec.tp_split_dim, spec.tp_split, spec.group, spec.role};
}

std::vector<ParamEntry> parameter_table(const GptConfig& cfg) {
  // Building a model calls no kernel and the planning backend allocates on a meta allocator:
  // this costs the layers' bookkeeping only.
  CpuBackend planning(0, Execution::Plan);
  MetaCommunicator one_rank("tp", 0, 1);
  const ChunkRange whole{0, cfg.layers, true, true};
  GptModel model(planning, TensorParallel{&one_rank, SequenceParallel::Off}, cfg, {whole},
                 DType::F32);
  std::vector<ParamEntry> table;
  for (const Parameter* p : model.params().params())
    if (!p->tied_copy) table.push_back(entry_of(p->spec));
  return table;
}

int64_t total_numel(const std::vector<ParamEntry>& table) {
  int64_t n = 0;
  for (const ParamEntry& e : table) n += e.numel();
  return n;
}

}  // namespace meshtrain
