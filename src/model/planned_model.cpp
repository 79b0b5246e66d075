#include "meshtrain/model/planned_model.h"

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/model/decoder_model.h"

namespace meshtrain {

void read_planned_model(const ModelSpec& cfg, const std::function<void(DecoderModel&)>& read) {
  CpuBackend planning(0, Execution::Plan);
  MetaCommunicator one_rank("tp", 0, 1);
  const ChunkRange whole{0, cfg.layers, true, true};
  DecoderModel model(planning, TensorParallel{&one_rank, SequenceParallel::Off}, cfg, {whole},
                 DType::F32);
  read(model);
}

}  // namespace meshtrain
