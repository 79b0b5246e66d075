#pragma once
// GPT-2 assembled from layers: this rank's model chunks (one per virtual pipeline stage), each
// a contiguous range of blocks, the first with the embeddings and the last with the head.
//
// Forward and backward go unit by unit (embedding, each block, head), calling UnitHooks
// around each so that data-parallel gradient reduction and ZeRO parameter gathering can act
// exactly when a unit's parameters are needed or its gradients are final.

#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/model/block.h"
#include "meshtrain/model/embedding.h"
#include "meshtrain/model/gpt_config.h"
#include "meshtrain/model/lm_head.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/partition.h"

namespace meshtrain {

// A whole backward of a unit runs between before_backward and after_backward. A split one
// (zero-bubble schedules) runs its input-gradient part between before_backward and
// after_input_backward, and later its weight-gradient part between before_weight_backward and
// after_weight_backward; the unit's gradients for the micro-batch are final only then.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int /*unit*/) {}
  virtual void after_forward(int /*unit*/) {}
  virtual void before_backward(int /*unit*/) {}
  virtual void after_backward(int /*unit*/) {}
  virtual void after_input_backward(int /*unit*/) {}
  virtual void before_weight_backward(int /*unit*/) {}
  virtual void after_weight_backward(int /*unit*/) {}
};

// One micro-batch's data as the model sees it; tokens and targets are int32 (N) on the device.
struct MicroBatchData {
  Tensor tokens;
  Tensor targets;
  TokenShape shape;
};

enum class Pass { Train, Eval };

class ModelChunk {
 public:
  struct Saved {
    std::vector<Block::Saved> blocks;
    LanguageModelHead::Saved head;
  };

  // tied_wte: on a chunk with the head and tied embeddings, the wte to use (null: make one).
  // loss: where the head adds its loss sums (the model's).
  ModelChunk(const LayerContext& ctx, const GptConfig& cfg, const ChunkRange& range,
             Parameter* tied_wte, LossAccumulator& loss);

  // input: the previous chunk's output (N_local, C); ignored when this chunk has the embedding.
  // Returns this chunk's output, or an empty tensor on the head chunk, which adds the loss sum
  // of the micro-batch to the model's LossAccumulator and, under LossReadout::PerMicroBatch,
  // reads it to *loss_sum at once (a host round trip; under PerStep *loss_sum is left alone and
  // the caller reads GptModel::loss() once per step).
  Tensor forward(const MicroBatchData& mb, const Tensor& input, Saved& saved, Pass pass,
                 Recompute recompute, double dloss, double* loss_sum, UnitHooks& hooks);
  // dout: gradient of this chunk's output (ignored on the head chunk). Returns the gradient of
  // its input, or an empty tensor on the embedding chunk. With `deferred`, only the input
  // gradient (and the small layer-norm gradients) are computed; the weight gradients wait in
  // `deferred` for backward_weights.
  Tensor backward(const MicroBatchData& mb, const Tensor& dout, Saved& saved, Recompute recompute,
                  UnitHooks& hooks, DeferredWeightGradients* deferred = nullptr);
  // The weight gradients a backward with `deferred` kept, unit by unit.
  void backward_weights(DeferredWeightGradients& deferred, UnitHooks& hooks);

  const ChunkRange& range() const { return range_; }
  Embedding* embedding() { return embedding_ ? &*embedding_ : nullptr; }
  // For generation (model/generator.h), which runs the layers one token at a time.
  int block_count() const { return static_cast<int>(blocks_.size()); }
  Block& block(int i) { return *blocks_[static_cast<size_t>(i)]; }
  LanguageModelHead* head() { return head_.get(); }

 private:
  LayerContext ctx_;
  ChunkRange range_;
  std::optional<Embedding> embedding_;
  int embedding_unit_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<int> block_units_;
  std::unique_ptr<LanguageModelHead> head_;
  int head_unit_ = -1;
  LossAccumulator* loss_;
};

// Parameters are registered but not allocated: the owner of their storage (ModelState, with
// its ZeRO stage, or ParameterStore::materialize in tests) lays them out.
class GptModel {
 public:
  // ranges: this rank's chunks, in its virtual-stage order. cp: the context-parallel group,
  // whose ranks each hold part of every sequence.
  GptModel(Backend& backend, const TensorParallel& tp, const GptConfig& cfg,
           const std::vector<ChunkRange>& ranges, DType dtype, ContextParallel cp = {});

  ParameterStore& params() { return store_; }
  ModelChunk& chunk(int v) { return *chunks_[v]; }
  int chunks() const { return static_cast<int>(chunks_.size()); }
  const GptConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  Backend& backend() { return *backend_; }
  const TensorParallel& tp() const { return tp_; }
  const ContextParallel& cp() const { return cp_; }
  // The loss sums of head forwards not yet read (see ModelChunk::forward).
  LossAccumulator& loss() { return loss_; }

 private:
  Backend* backend_;
  TensorParallel tp_;
  ContextParallel cp_;
  GptConfig cfg_;
  DType dtype_;
  ParameterStore store_;
  LossAccumulator loss_;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
};

}  // namespace meshtrain
