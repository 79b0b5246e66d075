#pragma once
// A decoder-only transformer of any family (its ModelSpec says which sub-layer variants) assembled
// from layers: this rank's model chunks (one per virtual pipeline stage), each a contiguous range
// of blocks, the first with the embeddings and the last with the head.
//
// Forward and backward go unit by unit (embedding, each block, head), calling UnitHooks
// (model/unit_hooks.h) around each. DecoderModel is the pipeline stage (model/pipeline_stage.h)
// that parallel/ runs and lays out.

#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/model/block.h"
#include "meshtrain/model/embedding.h"
#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/lm_head.h"
#include "meshtrain/model/loss_accumulator.h"
#include "meshtrain/model/micro_batch.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/model/unit_hooks.h"

namespace meshtrain {


class ModelChunk {
 public:
  struct Saved : ChunkActivations {
    std::vector<Block::Saved> blocks;
    LanguageModelHead::Saved head;
    double loss_weight = 0;  // the forward's TokenShape::loss_weight, for backward's recompute
  };

  // tied_wte: the token embedding of an earlier chunk of this rank (zb-v's first), which a head
  // chunk uses where it needs it (tied, multi-token depths); null: it makes a copy.
  // loss: where the head adds its loss sums (the model's).
  ModelChunk(const LayerContext& ctx, const ModelSpec& cfg, const ChunkRange& range,
             Parameter* tied_wte, LossAccumulator& loss);

  // input: the previous chunk's output (N_local, C); ignored when this chunk has the embedding.
  // Returns this chunk's output, or an empty tensor on the head chunk, which adds the loss sum
  // of the micro-batch to the model's LossAccumulator and, under LossReadout::PerMicroBatch,
  // reads it to *loss_sum at once (a host round trip; under PerStep *loss_sum is left alone and
  // the caller reads DecoderModel::loss() once per step).
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
  // The multi-token prediction depths (on the head's chunk; null elsewhere or without them).
  MultiTokenPrediction* mtp() { return mtp_.get(); }

 private:
  Parameter& mtp_embedding(const ModelSpec& cfg, Parameter* rank_wte, Parameter* head_weight);

  LayerContext ctx_;
  ChunkRange range_;
  std::optional<Embedding> embedding_;
  int embedding_unit_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<int> block_units_;
  std::unique_ptr<MultiTokenPrediction> mtp_;  // before head_, which points to it
  std::unique_ptr<LanguageModelHead> head_;
  int head_unit_ = -1;
  LossAccumulator* loss_;
};

// Parameters are registered but not allocated: the owner of their storage (ModelState, with
// its ZeRO stage, or ParameterStore::materialize in tests) lays them out.
class DecoderModel final : public PipelineStage {
 public:
  // ranges: this rank's chunks, in its virtual-stage order. cp: the context-parallel group,
  // whose ranks each hold part of every sequence; ep: the expert group, whose ranks each hold
  // part of every mixture of experts' experts.
  DecoderModel(Backend& backend, const TensorParallel& tp, const ModelSpec& cfg,
           const std::vector<ChunkRange>& ranges, DType dtype, ContextParallel cp = {},
           ExpertParallel ep = {});

  ParameterStore& params() override { return store_; }
  ModelChunk& chunk(int v) { return *chunks_[v]; }
  int chunks() const override { return static_cast<int>(chunks_.size()); }
  const ModelSpec& config() const { return cfg_; }
  DType dtype() const override { return dtype_; }
  Backend& backend() override { return *backend_; }
  const TensorParallel& tp() const { return tp_; }
  const ContextParallel& cp() const { return cp_; }
  LossAccumulator& loss() override { return loss_; }
  // The mixture-of-experts layers' loads and balancing losses since the last take().
  MoeLog& moe_log() { return moe_log_; }
  // The sigmoid router's bias of every mixture-of-experts layer (empty for other models):
  // whole on every rank, moved after each optimizer step by the step's loads over the job,
  // saved in checkpoints as the stage's buffers.
  ExpertBias& expert_bias() { return expert_bias_; }
  // Keeps the thread that drives the expert exchange (ExpertParallel::progress) alive as long
  // as the model (build_stage makes it).
  void keep_progress_thread(std::unique_ptr<ProgressThread> thread) { progress_ = std::move(thread); }

  // PipelineStage's state and after-step hooks: the expert bias and the expert loads.
  std::vector<StageBuffer> buffers() override { return expert_bias_.buffers(); }
  std::string setting_deciding(const std::string& name) const override;
  std::vector<double> take_step_statistics() override;
  void after_optimizer_step(const std::vector<double>& job_statistics) override;
  std::string progress_text(const std::vector<double>& job_statistics) const override;
  std::vector<MetricsRecord> metrics_records(int step, const std::vector<double>& job_statistics) const override;
  void record_attention_logits() override { qk_log_.switch_on(); }
  std::vector<double> take_step_maxima() override { return qk_log_.take(); }
  std::vector<RowScale> qk_clip_scales(const std::vector<double>& job_maxima, double tau) override;

  // PipelineStage: chunk by chunk, as ModelChunk does it.
  // Tied heads, and the multi-token depths, which read the embedding on the head's stage.
  bool ties_embeddings() const override { return cfg_.tie_embeddings || cfg_.mtp_layers > 0; }
  Shape boundary_shape(const TokenShape& tokens) const override;
  std::unique_ptr<ChunkActivations> new_activations(int chunk) override;
  Tensor forward(int chunk, const MicroBatchData& mb, const Tensor& input, ChunkActivations& saved,
                 Pass pass, Recompute recompute, double dloss, double* loss_sum,
                 UnitHooks& hooks) override;
  Tensor backward(int chunk, const MicroBatchData& mb, const Tensor& dout, ChunkActivations& saved,
                  Recompute recompute, UnitHooks& hooks, DeferredWeightGradients* deferred) override;
  void backward_weights(int chunk, DeferredWeightGradients& deferred, UnitHooks& hooks) override;

 private:
  // The expert loads' part of the job's step statistics (the multi-token losses follow it).
  std::vector<double> expert_statistics(const std::vector<double>& job_statistics) const;

  std::unique_ptr<ProgressThread> progress_;  // first: the chunks' layers point to it
  Backend* backend_;
  TensorParallel tp_;
  ContextParallel cp_;
  ModelSpec cfg_;
  DType dtype_;
  ParameterStore store_;
  LossAccumulator loss_;
  MoeLog moe_log_;
  ExpertBias expert_bias_;
  QkLogitLog qk_log_;
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
};

}  // namespace meshtrain
