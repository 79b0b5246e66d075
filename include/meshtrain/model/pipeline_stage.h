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
//
// Beside the parameters a stage may hold state that training changes but does not train (the
// sigmoid router's expert bias today), and layers that need numbers of the whole job after each
// optimizer step (that bias moves by the step's expert loads over every rank). checkpoint/ and
// train/ reach both only through this interface, by name, without knowing what they are:
// buffers() are saved and restored whole; the step's statistics are summed over the world by
// train/, then handed back to after_optimizer_step() and to the log (progress_text(),
// metrics_records()).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/io/metrics_writer.h"
#include "meshtrain/model/loss_accumulator.h"
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

// One piece of a stage's persistent state beside its parameters (PyTorch's "buffer"): the same
// on every rank whatever the layout (each rank computes it from job-wide numbers), kept in fp64,
// stored whole in a checkpoint as /buffers/<name> (checkpoint/checkpointer.h).
struct StageBuffer {
  std::string name;                      // "h.1.mlp.router.expert_bias"
  Shape shape;                           // global, and every rank's: the buffer is whole everywhere
  std::vector<double>* values = nullptr;  // shape.numel() values, the stage's own
  std::string what;                      // in messages: "the router's expert bias"
};

// One line of metrics.jsonl (io/metrics_writer.h).
using MetricsRecord = std::vector<std::pair<const char*, MetricsWriter::Value>>;

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
  // The loss sums of the head's forwards not yet read (the executor's per-step read-out).
  virtual LossAccumulator& loss() = 0;
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

  // The stage's buffers (the same list on every rank of a model); none by default.
  virtual std::vector<StageBuffer> buffers() { return {}; }
  // The deck key that decides whether the model has the tensor `name` (a parameter's or a
  // buffer's, as a checkpoint stores it), as a hint when a checkpoint has it and the deck's
  // model not, or the reverse.
  virtual std::string setting_deciding(const std::string& /*name*/) const { return "the [model] section"; }

  // This rank's part of the statistics its layers asked for since the last call (every rank of
  // a model returns the same count of numbers, each a sum over what the rank saw; none: empty,
  // and train/ then sums nothing). train/ calls it once per attempt at a step, after the
  // backward, and sums the numbers over the world.
  virtual std::vector<double> take_step_statistics() { return {}; }
  // After the optimizer step: the statistics of the step's gradients summed over the world, the
  // same on every rank (a layer moves its buffers by them).
  virtual void after_optimizer_step(const std::vector<double>& /*job_statistics*/) {}
  // For the log: the progress line's text for those statistics (" | experts max/mean 1.02"), and
  // the metrics.jsonl records of step `step` (each with its "step" field).
  virtual std::string progress_text(const std::vector<double>& /*job_statistics*/) const { return {}; }
  virtual std::vector<MetricsRecord> metrics_records(int /*step*/, const std::vector<double>& /*job_statistics*/) const {
    return {};
  }

  // QK-clip (model/qk_clip.h): from the call on, the attention layers record their heads'
  // largest logits; take_step_maxima() returns this rank's since the last call (every rank the
  // same count of numbers, -inf where it holds nothing; train/ takes their maximum over the
  // world, once per attempt at a step as take_step_statistics); qk_clip_scales() turns the
  // job's maxima into the rows of this rank's parameters to scale after the optimizer step.
  virtual void record_attention_logits() {}
  virtual std::vector<double> take_step_maxima() { return {}; }
  virtual std::vector<RowScale> qk_clip_scales(const std::vector<double>& /*job_maxima*/,
                                               double /*tau*/) {
    return {};
  }
};

}  // namespace meshtrain
