#pragma once
// The sigmoid router's per-expert bias (DeepSeek-V3's auxiliary-loss-free balancing, arXiv
// 2412.19437, section 2.1.2): added to each expert's score only to choose the top k
// (model/moe_routing.h), it moves after every optimizer step by gamma toward balance:
//   b_e += gamma * sign(mean load - load_e)
// with the loads of that step summed over the whole job (model/expert_load.h), as Megatron-Core's
// moe_router_enable_expert_bias does. It is not a trained parameter: no gradient reaches it and
// the optimizer has no state for it.
//
// One table of every mixture-of-experts layer of the model, on every rank whatever the layout
// (E numbers a layer): each rank updates it from the same world-summed loads, so every copy
// stays equal without a collective of its own, and a checkpoint stores it whole, as the global
// tensors h.{i}.mlp.router.expert_bias: the stage's buffers (model/pipeline_stage.h), which
// checkpoint/checkpointer.h saves by name. Kept and stored in fp64,
// like the routing it enters, so that a resumed run reads back exactly the values it held.

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/pipeline_stage.h"

namespace meshtrain {

class ExpertBias {
 public:
  ExpertBias() = default;
  // E zeros for each mixture-of-experts layer of a sigmoid-routed model; none otherwise.
  explicit ExpertBias(const ModelSpec& spec);

  bool empty() const { return layers_.empty(); }
  int64_t experts() const { return experts_; }
  // The layers that have a bias, in order.
  const std::vector<int>& layers() const { return layers_; }
  // Layer `layer`'s E values, or null where it has none (a dense layer, a softmax router).
  const double* of_layer(int layer) const;
  std::vector<double>& values_of(int layer);
  // The name it has in checkpoints: "h.<layer>.mlp.router.expert_bias".
  static std::string name(int layer);
  // The same for any layer of this model: past its blocks, the multi-token prediction depths'
  // ("mtp.<k>.block.mlp.router.expert_bias", model/mtp_module.h).
  std::string name_in_model(int layer) const;
  // Whether `tensor` is one of those names (of any layer).
  static bool is_name(const std::string& tensor);
  // The table as the stage's buffers, one per layer, pointing into it.
  std::vector<StageBuffer> buffers();

  // One optimizer step's update from that step's tokens per expert over the whole job:
  // `tokens` (layers.size(), E) for `layers` (model/expert_load.h's report). Every layer of the
  // table must be among them.
  void update(const std::vector<int>& layers, const std::vector<double>& tokens, double rate);

 private:
  int64_t experts_ = 0;
  std::vector<int> layers_;
  int blocks_ = 0;  // the model's blocks: the layers from here on are multi-token depths'
  std::vector<std::vector<double>> values_;  // by position in layers_
};

}  // namespace meshtrain
