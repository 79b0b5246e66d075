#include "meshtrain/model/decoder_model.h"

#include <cstddef>
#include <stdexcept>

#include "meshtrain/model/expert_load.h"
#include "meshtrain/model/mtp_log.h"
#include "meshtrain/model/stage_builder.h"

namespace meshtrain {

namespace {
ParamSpec lm_head_spec(const ModelSpec& cfg, bool tied) {
  ParamSpec s;
  // A tied copy carries the embedding's name: it starts from the same values and, with the
  // gradients summed over the embedding group, stays equal to it.
  s.name = tied ? "wte" : "lm_head.weight";
  s.global_shape = Shape{cfg.vocab_size, cfg.d_model};
  s.tp_split_dim = 0;
  s.tp_split = TpSplit::Vocab;
  if (tied) s.role = ParamRole::TokenEmbedding;
  return s;
}
}  // namespace

ModelChunk::ModelChunk(const LayerContext& ctx, const ModelSpec& cfg, const ChunkRange& range,
                       Parameter* tied_wte, LossAccumulator& loss)
    : ctx_(ctx), range_(range), loss_(&loss) {
  ParameterStore& store = *ctx.store;
  if (range.has_embedding) {
    embedding_unit_ = store.begin_unit("embedding");
    embedding_.emplace(ctx, cfg.vocab_size, cfg.seq_len, cfg.d_model,
                       cfg.positions == PositionKind::Learned, cfg.tie_embeddings);
  }
  for (int l = range.first_layer; l < range.end_layer; ++l) {
    block_units_.push_back(store.begin_unit("h." + std::to_string(l)));
    blocks_.push_back(std::make_unique<Block>(ctx, l, cfg));
  }
  if (range.has_head) {
    head_unit_ = store.begin_unit("head");
    Parameter* weight = nullptr;
    if (embedding_) tied_wte = &embedding_->wte();  // embedding and head in one chunk
    if (cfg.tie_embeddings && tied_wte) {
      weight = tied_wte;
      store.use(*tied_wte);
    } else {
      weight = &store.add(lm_head_spec(cfg, cfg.tie_embeddings), ctx.tp.rank(), ctx.tp.size());
      weight->tied_copy = cfg.tie_embeddings;
    }
    if (cfg.mtp_layers > 0) mtp_ = std::make_unique<MultiTokenPrediction>(ctx, cfg, mtp_embedding(cfg, tied_wte, weight), *weight);
    head_ = std::make_unique<LanguageModelHead>(ctx, cfg.d_model, cfg.norm, *weight, mtp_.get());
  }
}

// The token embedding the multi-token depths read: this rank's own (in this chunk, or in its
// first chunk under zb-v), the tied head's copy, or else a copy of the embedding made for them
// on the last pipeline stage. That copy is the tied head's mechanism (Megatron-Core's MTP on a
// pipeline shares the embedding the same way): it carries the embedding's name, so it starts from
// and loads the same values, and its gradient is summed with the first stage's over the
// embedding group (PipelineStage::ties_embeddings), so that both stay equal.
Parameter& ModelChunk::mtp_embedding(const ModelSpec& cfg, Parameter* rank_wte, Parameter* head_weight) {
  ParameterStore& store = *ctx_.store;
  Parameter* wte = rank_wte;
  if (!wte && cfg.tie_embeddings) wte = head_weight;
  if (!wte) {
    wte = &store.add(lm_head_spec(cfg, /*tied=*/true), ctx_.tp.rank(), ctx_.tp.size());
    wte->tied_copy = true;
  } else if (wte != head_weight) {
    store.use(*wte);  // the head's unit reads the embedding too, as a tied head does
  }
  return *wte;
}

Tensor ModelChunk::forward(const MicroBatchData& mb, const Tensor& input, Saved& saved, Pass pass,
                           Recompute recompute, double dloss, double* loss_sum, UnitHooks& hooks) {
  Tensor x = input;
  // A layer's own losses (model/moe_layer.h) are weighted as the head's per-token losses.
  TokenShape shape = mb.shape;
  shape.loss_weight = pass == Pass::Train ? dloss : 0.0;
  saved.loss_weight = shape.loss_weight;
  if (embedding_) {
    hooks.before_forward(embedding_unit_);
    x = embedding_->forward(mb.tokens, mb.shape);
    hooks.after_forward(embedding_unit_);
  }
  saved.blocks.resize(blocks_.size());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    hooks.before_forward(block_units_[i]);
    if (pass == Pass::Train) {
      x = blocks_[i]->forward(x, shape, saved.blocks[i], recompute);
    } else {
      Block::Saved discard;
      x = blocks_[i]->forward(x, shape, discard, Recompute::Full);
    }
    hooks.after_forward(block_units_[i]);
  }
  if (!head_) return x;
  // In training the head's backward runs inside its forward (see lm_head.h), so its backward
  // hooks are called here, not in backward().
  hooks.before_forward(head_unit_);
  if (pass == Pass::Train) hooks.before_backward(head_unit_);
  head_->forward(x, mb.targets, mb.shape, dloss, pass == Pass::Train ? &saved.head : nullptr,
                 *loss_);
  if (pass == Pass::Train) hooks.after_backward(head_unit_);
  hooks.after_forward(head_unit_);
  if (loss_sum && loss_->readout() == LossReadout::PerMicroBatch) *loss_sum += loss_->take();
  return {};
}

Tensor ModelChunk::backward(const MicroBatchData& mb, const Tensor& dout, Saved& saved,
                            Recompute recompute, UnitHooks& hooks,
                            DeferredWeightGradients* deferred) {
  auto begin = [&](int unit) {
    hooks.before_backward(unit);
    if (deferred) deferred->begin_unit(unit);
  };
  auto end = [&](int unit) {
    if (deferred) hooks.after_input_backward(unit);
    else hooks.after_backward(unit);
  };
  Tensor dx = dout;
  if (head_) dx = head_->backward(saved.head);
  TokenShape shape = mb.shape;
  shape.loss_weight = saved.loss_weight;
  for (size_t i = blocks_.size(); i-- > 0;) {
    begin(block_units_[i]);
    dx = blocks_[i]->backward(dx, shape, saved.blocks[i], recompute, deferred);
    end(block_units_[i]);
  }
  saved.blocks.clear();
  if (!embedding_) return dx;
  begin(embedding_unit_);
  embedding_->backward(dx, mb.tokens, mb.shape, deferred);
  end(embedding_unit_);
  return {};
}

void ModelChunk::backward_weights(DeferredWeightGradients& deferred, UnitHooks& hooks) {
  for (DeferredWeightGradients::Unit& u : deferred.take()) {
    hooks.before_weight_backward(u.unit);
    for (std::function<void()>& work : u.work) work();
    hooks.after_weight_backward(u.unit);
  }
}

DecoderModel::DecoderModel(Backend& backend, const TensorParallel& tp, const ModelSpec& cfg,
                   const std::vector<ChunkRange>& ranges, DType dtype, ContextParallel cp,
                   ExpertParallel ep)
    : backend_(&backend), tp_(tp), cp_(cp), cfg_(cfg), dtype_(dtype), loss_(backend), expert_bias_(cfg),
      qk_log_(cfg.layers, cfg.heads, cfg.heads / tp.size(), tp.rank()) {
  const LayerContext ctx{&backend, &store_, tp, cp, ep, &loss_, &moe_log_, &expert_bias_, &qk_log_};
  Parameter* wte = nullptr;
  for (const ChunkRange& r : ranges) {
    chunks_.push_back(std::make_unique<ModelChunk>(ctx, cfg, r, wte, loss_));
    if (chunks_.back()->embedding()) wte = &chunks_.back()->embedding()->wte();
  }
}

Shape DecoderModel::boundary_shape(const TokenShape& tokens) const {
  return {tp_.local_tokens(tokens.N()), cfg_.d_model};
}

std::unique_ptr<ChunkActivations> DecoderModel::new_activations(int /*chunk*/) {
  return std::make_unique<ModelChunk::Saved>();
}

namespace {
// The executor hands back only what new_activations made; another kind is a caller's bug.
ModelChunk::Saved& saved_of(ChunkActivations& saved) {
  return dynamic_cast<ModelChunk::Saved&>(saved);
}
}  // namespace

Tensor DecoderModel::forward(int chunk, const MicroBatchData& mb, const Tensor& input,
                         ChunkActivations& saved, Pass pass, Recompute recompute, double dloss,
                         double* loss_sum, UnitHooks& hooks) {
  return chunks_[static_cast<size_t>(chunk)]->forward(mb, input, saved_of(saved), pass, recompute,
                                                      dloss, loss_sum, hooks);
}

Tensor DecoderModel::backward(int chunk, const MicroBatchData& mb, const Tensor& dout,
                          ChunkActivations& saved, Recompute recompute, UnitHooks& hooks,
                          DeferredWeightGradients* deferred) {
  return chunks_[static_cast<size_t>(chunk)]->backward(mb, dout, saved_of(saved), recompute, hooks,
                                                       deferred);
}

void DecoderModel::backward_weights(int chunk, DeferredWeightGradients& deferred, UnitHooks& hooks) {
  chunks_[static_cast<size_t>(chunk)]->backward_weights(deferred, hooks);
}

std::string DecoderModel::setting_deciding(const std::string& name) const {
  if (ExpertBias::is_name(name)) return "model.moe_router";
  if (name.rfind("mtp.", 0) == 0) return "model.mtp_layers";  // the multi-token depths' tensors
  if (name.rfind("h.", 0) == 0) return "model.layers";  // every block's tensors: ModelChunk's units
  if (name == lm_head_spec(cfg_, false).name) return "model.tie_embeddings";
  return PipelineStage::setting_deciding(name);
}

std::vector<double> DecoderModel::take_step_statistics() {
  std::vector<double> sums = take_expert_load_sums(moe_log_, cfg_);
  // Then 2 numbers per multi-token depth, zeros on ranks without the head.
  std::vector<double> mtp(static_cast<size_t>(2 * cfg_.mtp_layers), 0.0);
  for (auto& c : chunks_)
    if (MultiTokenPrediction* m = c->mtp()) mtp = m->take_sums();
  sums.insert(sums.end(), mtp.begin(), mtp.end());
  return sums;
}

std::vector<double> DecoderModel::expert_statistics(const std::vector<double>& job_statistics) const {
  const size_t mtp = static_cast<size_t>(2 * cfg_.mtp_layers);
  if (job_statistics.size() < mtp) return {};
  return {job_statistics.begin(), job_statistics.end() - static_cast<std::ptrdiff_t>(mtp)};
}

void DecoderModel::after_optimizer_step(const std::vector<double>& job_statistics) {
  // The sigmoid router's bias moves by this step's loads over the whole job (the sums every
  // rank received alike), so every rank's copy stays equal; the next step chooses with it.
  if (expert_bias_.empty() || job_statistics.empty()) return;
  const ExpertLoadReport loads = expert_load_report(expert_statistics(job_statistics), cfg_);
  expert_bias_.update(loads.layers, loads.tokens, cfg_.moe.bias_update_rate);
}

std::string DecoderModel::progress_text(const std::vector<double>& job_statistics) const {
  return expert_load_progress(expert_load_report(expert_statistics(job_statistics), cfg_), cfg_) +
         mtp_loss_progress(job_statistics, cfg_);
}

std::vector<MetricsRecord> DecoderModel::metrics_records(int step, const std::vector<double>& job_statistics) const {
  std::vector<MetricsRecord> records =
      expert_load_records(step, expert_load_report(expert_statistics(job_statistics), cfg_), cfg_);
  for (MetricsRecord& r : mtp_loss_records(step, job_statistics, cfg_)) records.push_back(std::move(r));
  return records;
}

std::vector<RowScale> DecoderModel::qk_clip_scales(const std::vector<double>& job_maxima, double tau) {
  std::vector<RowScale> scales;
  if (job_maxima.empty()) return scales;
  const std::vector<double> gammas = qk_clip_gammas(job_maxima, tau);
  for (auto& c : chunks_)
    for (int b = 0; b < c->block_count(); ++b) c->block(b).attention().add_qk_clip_scales(gammas, scales);
  return scales;
}

std::unique_ptr<PipelineStage> build_stage(Backend& backend, const ModelSpec& spec,
                                           const std::vector<ChunkRange>& chunks, DType dtype,
                                           const TensorParallel& tp, const ContextParallel& cp,
                                           Communicator* expert_group) {
  ExpertParallel ep{expert_group};
  // Drives the expert exchange's all-to-all while the shared expert computes (parallel.ep > 1).
  std::unique_ptr<ProgressThread> progress;
  const bool shared_expert = spec.feed_forward == FeedForwardKind::Moe && spec.moe.shared_ffn_hidden > 0;
  if (ep.on() && shared_expert && !backend.planning()) {
    progress = std::make_unique<ProgressThread>();
    ep.progress = progress.get();
  }
  auto model = std::make_unique<DecoderModel>(backend, tp, spec, chunks, dtype, cp, ep);
  model->keep_progress_thread(std::move(progress));
  return model;
}

}  // namespace meshtrain
