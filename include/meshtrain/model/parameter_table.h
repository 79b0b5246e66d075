#pragma once
// The parameters of a model, read off the model itself: the one list that checkpoint import,
// the Hugging Face name map, the parameter count and `inspect` use, so that a layer that
// registers a parameter is the only place that describes it (llm.c keeps a single table of
// parameter sizes for the same reason).
//
// The model is built on the planning backend with a one-rank tensor-parallel group and one
// chunk: its layers register their ParamSpecs and nothing is allocated.

#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/parameter.h"

namespace meshtrain {

struct ParamEntry {
  std::string name;   // as checkpoints store it: "h.3.attn.qkv.weight"
  Shape shape;        // global, unsplit
  int tp_split_dim = -1;
  TpSplit tp_split = TpSplit::None;
  ReplicaGroup group = ReplicaGroup::Data;
  ParamRole role = ParamRole::Plain;

  int64_t numel() const { return shape.numel(); }
};

// Every parameter of the model `cfg` describes, once each (a tied head is the embedding, not a
// second entry), in the order the model registers them: embedding, blocks, head.
std::vector<ParamEntry> parameter_table(const ModelSpec& cfg);

// The entry of a parameter as registered (its spec), for comparing a built model with the table.
ParamEntry entry_of(const ParamSpec& spec);

int64_t total_numel(const std::vector<ParamEntry>& table);

}  // namespace meshtrain
