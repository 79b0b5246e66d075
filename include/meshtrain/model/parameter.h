#pragma once
// Parameters and where they live. A parameter has a global name and shape; under tensor
// parallelism each rank holds an even slice of one dimension (or a replica). Values and
// gradients are views that the owner of the storage (ParameterStore, or the ZeRO machinery)
// points at flat buffers; layers read `value` and `grad` at call time and never keep copies.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/grad_write.h"
#include "meshtrain/optim/weight_decay.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

class Backend;

enum class Init { Normal, Zeros, Ones };
// How the gradients of a tp-replicated parameter relate across the tp group: identical (each
// rank computed the full gradient) or partial (sequence parallelism: each rank saw N/tp tokens,
// so the group must sum them).
enum class TpGrad { Full, Partial };
// How the tp group splits a parameter (tp_split_dim says along which dimension): not at all,
// along a linear layer's output features (column parallel) or input features (row parallel),
// or along the vocabulary (the token embedding and the head).
enum class TpSplit { None, OutputFeatures, InputFeatures, Vocab };
// The group a parameter is replicated over: its ranks sum its gradients and, under ZeRO, shard
// it; its buckets hold no other group's parameters (parallel/bucket_plan.h). Every parameter of
// a dense model is replicated over the data group. ExpertData: a mixture of experts' expert
// weights, replicated only over the data ranks that hold the same experts; no model registers
// it yet, and training then needs that group's communicator (parallel/model_state.h). Bucketing
// follows this tag, never a name.
enum class ReplicaGroup { Data, ExpertData };
// What code beyond the layer that registers a parameter must know of it: a tag, so that no code
// recognises a parameter by its name. TokenEmbedding: the embedding table the head reads when
// embeddings are tied; the last pipeline stage then holds a copy of it, and each gets a bucket
// of its own so that the two are summed over the embedding group shard for shard.
// HiddenMatrix: a weight matrix inside a block (attention's and the feed-forward's linear
// layers; a stacked tensor (E, rows, cols) is E of them: a mixture's experts, or the fused
// query/key/value projection (3, NH HS, C)), which Muon steps (optim/muon.h); every
// other parameter (embeddings, the head, norms, biases, routers) is Plain or TokenEmbedding.
enum class ParamRole { Plain, TokenEmbedding, HiddenMatrix };

struct ParamSpec {
  std::string name;        // "h.3.attn.qkv.weight"
  Shape global_shape;      // as stored in checkpoints
  int tp_split_dim = -1;   // dimension split evenly over the tp group; -1: replicated
  TpSplit tp_split = TpSplit::None;  // what that dimension is (None exactly when it is -1)
  // Dimension split evenly over the expert group instead (a mixture of experts' expert
  // weights under expert parallelism, dimension 0: the experts); -1: not. At most one of the
  // two splits a parameter: the experts are whole on every tensor rank.
  int ep_split_dim = -1;
  ReplicaGroup group = ReplicaGroup::Data;
  ParamRole role = ParamRole::Plain;
  Init init = Init::Normal;
  double init_std = 0.02;
  WeightDecay decay = WeightDecay::Apply;
  TpGrad tp_grad = TpGrad::Full;
};

struct Parameter {
  ParamSpec spec;
  Shape shape;              // this rank's slice
  int64_t split_begin = 0;  // first index of the slice along split_dim()
  int unit = 0;             // the unit (embedding, block i, head) that owns it
  // Parameters of one stack (ParameterStore::stack; model/stacked_columns.h) lie back to back,
  // in registration order, in every flat buffer; -1: none.
  int stack = -1;
  // True for a second copy of a parameter held elsewhere (the last stage's tied embedding):
  // its gradient joins the owner's, and checkpoints store it once.
  bool tied_copy = false;
  Tensor value;
  Tensor grad;
  // Set by the training state (parallel/model_state.h) where a step starts without filling
  // `grad` with zeros: a full pass over every gradient that the first write can make
  // unnecessary. Whatever writes `grad` first calls one of the two below, never neither.
  bool grad_unwritten = false;

  // For a kernel that can assign its output (a GEMM's beta): Assign for the step's first write,
  // then Add.
  GradWrite take_grad_write();
  // For a kernel that only adds (column sums, norms, scatters): fills `grad` with zeros first
  // if this is the step's first write.
  void zero_grad_if_unwritten(Backend& be);

  int64_t numel() const { return shape.numel(); }
  // The dimension this rank holds a slice of (over the tensor or the expert group); -1: whole.
  int split_dim() const { return spec.tp_split_dim >= 0 ? spec.tp_split_dim : spec.ep_split_dim; }
  // Global flat index of this slice's element at local flat index i (row-major).
  int64_t global_index(int64_t local) const;
};

// Rows of a parameter to scale in place (QK-clip's, model/qk_clip.h; parallel/row_scaling.h
// applies them): this rank's local element e of `param` by factors[e / row_elements].
struct RowScale {
  Parameter* param = nullptr;
  int64_t row_elements = 1;
  std::vector<double> factors;
};

// Shape of a tp slice: dimension `dim` of `global` divided by `parts`.
Shape split_shape(const Shape& global, int dim, int parts);

}  // namespace meshtrain
