#pragma once
// Builds this rank's pipeline stage (model/pipeline_stage.h) of the deck's model, whatever its
// family (every family is assembled by model/decoder_model.h today): what train/ and the commands call, so
// that they include no family's or layer's header (tests/parallel/stage_boundary_test.py).

#include <memory>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/model/ring_attention.h"
#include "meshtrain/model/tp_regions.h"

namespace meshtrain {

// chunks: this rank's chunks, in its virtual-stage order. cp: the context-parallel group (off:
// parallel.cp = 1). expert_group: the group over which the mixture-of-experts layers split their
// experts (parallel.ep > 1), null: every rank holds every expert.
std::unique_ptr<PipelineStage> build_stage(Backend& backend, const ModelSpec& spec,
                                           const std::vector<ChunkRange>& chunks, DType dtype,
                                           const TensorParallel& tp, const ContextParallel& cp,
                                           Communicator* expert_group);

}  // namespace meshtrain
