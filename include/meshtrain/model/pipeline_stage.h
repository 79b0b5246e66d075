#pragma once
// What parallel/ sees of a model: this rank's pipeline stage, a list of model chunks (one per
// virtual stage) that each turn a micro-batch's activations in into activations out, and back.
// The pipeline executor runs a schedule's actions through it, and the training state lays out
// the parameters it registered (params()) without knowing which model family built them, so a
// new family is a new implementation of this interface, not a change to parallel/ (Megatron-Core
// keeps the same split between its model spec and its pipeline schedules).
//
// Chunks are numbered 0 .. chunks() - 1 in this rank's virtual-stage order. What a forward saves
// for its backward is the stage's own business: the executor only keeps it, per chunk and
// micro-batch, in a ChunkActivations the stage made.

#include <memory>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/micro_batch.h"
#include "meshtrain/model/parameter_store.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/model/unit_hooks.h"
#include "meshtrain/model/weight_gradients.h"

namespace meshtrain {

// What one chunk's forward of one micro-batch kept for its backward (recomputation decides how
// much: model/recompute.h).
class ChunkActivations {
 public:
  virtual ~ChunkActivations() = default;
};

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  virtual int chunks() const = 0;
  virtual Backend& backend() = 0;
  // The activations' element type (and the parameters' values').
  virtual DType dtype() const = 0;
  // The parameters this rank's chunks registered, with their units: what the training state
  // lays out, buckets and shards.
  virtual ParameterStore& params() = 0;
  // Whether the first and last pipeline stage share the token embedding (each holds a copy,
  // ParamRole::TokenEmbedding, whose gradients must be summed between them).
  virtual bool ties_embeddings() const = 0;
  // The shape of what a chunk hands the next one (and gets the gradient of) for a micro-batch of
  // `tokens`: the same on every chunk boundary, so that a receive can be posted before the
  // sending chunk has run.
  virtual Shape boundary_shape(const TokenShape& tokens) const = 0;
  virtual std::unique_ptr<ChunkActivations> new_activations(int chunk) = 0;

  // input: the previous chunk's output; ignored by the chunk that embeds the tokens. Returns
  // this chunk's output, or an empty tensor from the chunk with the loss head, which adds the
  // micro-batch's loss sum to the model's loss and, when the model reads it per micro-batch,
  // adds it to *loss_sum (dloss: the loss gradient's scale).
  virtual Tensor forward(int chunk, const MicroBatchData& mb, const Tensor& input,
                         ChunkActivations& saved, Pass pass, Recompute recompute, double dloss,
                         double* loss_sum, UnitHooks& hooks) = 0;
  // dout: the gradient of the chunk's output (ignored by the head's chunk). Returns the gradient
  // of its input (empty from the embedding's chunk). With `deferred`, the weight gradients wait
  // there for backward_weights (zero-bubble schedules).
  virtual Tensor backward(int chunk, const MicroBatchData& mb, const Tensor& dout,
                          ChunkActivations& saved, Recompute recompute, UnitHooks& hooks,
                          DeferredWeightGradients* deferred) = 0;
  virtual void backward_weights(int chunk, DeferredWeightGradients& deferred, UnitHooks& hooks) = 0;
};

}  // namespace meshtrain
