#include "meshtrain/model/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "meshtrain/backend/host_doubles.h"
#include "meshtrain/model/decoder_model.h"
#include "meshtrain/tensor/philox.h"

namespace meshtrain {

int32_t choose_token(const std::vector<double>& logits, const SamplingOptions& options,
                     int64_t position) {
  if (logits.empty()) throw std::invalid_argument("choose_token: no logits");
  // Candidates in order of decreasing logit, ties to the lower id: a fixed order makes the
  // cumulative sum, and so the choice, a pure function of the logits.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options.temperature <= 0.0) return *std::min_element(order.begin(), order.end(), better);
  size_t k = order.size();
  if (options.top_k > 0) k = std::min(k, static_cast<size_t>(options.top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    better);
  order.resize(k);
  std::vector<double> weight(k);
  const double max = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < k; ++i)
    sum += weight[i] = std::exp((logits[order[i]] - max) / options.temperature);
  const double u = Philox(options.seed, "sample").uniform(static_cast<uint64_t>(position)) * sum;
  double acc = 0;
  for (size_t i = 0; i < k; ++i) {
    acc += weight[i];
    if (u < acc) return order[i];
  }
  return order[k - 1];  // u rounded up to the sum
}

Generator::Generator(PipelineStage& stage, Communicator* pipeline, std::vector<int> chunk_owners)
    : model_(dynamic_cast<DecoderModel*>(&stage)), pipeline_(pipeline), owners_(std::move(chunk_owners)) {
  if (!model_) throw std::invalid_argument("generation: the model is not one model/decoder_model.h assembled");
  DecoderModel& model = *model_;
  const ModelSpec& cfg = model.config();
  const int stages = pipeline ? pipeline->size() : 1;
  chunks_ = stages * model.chunks();
  if (owners_.empty())
    for (int k = 0; k < chunks_; ++k) owners_.push_back(k % stages);
  if (static_cast<int>(owners_.size()) != chunks_)
    throw std::invalid_argument("generation: " + std::to_string(owners_.size()) +
                                " chunk owners for " + std::to_string(chunks_) + " chunks");
  int layers = 0;
  for (int v = 0; v < model.chunks(); ++v) layers += model.chunk(v).block_count();
  const bool whole = model.chunks() == 1 && model.chunk(0).embedding() && model.chunk(0).head() &&
                     layers == cfg.layers;
  if (stages == 1 && !whole)
    throw std::invalid_argument("generation from a model split into pipeline stages needs the "
                                "pipeline group (this rank holds " +
                                std::to_string(model.chunks()) + " chunk(s))");
  caches_.resize(static_cast<size_t>(cfg.layers));
  for (int v = 0; v < model.chunks(); ++v) {
    ModelChunk& chunk = model.chunk(v);
    for (int i = 0; i < chunk.block_count(); ++i)
      caches_[static_cast<size_t>(chunk.range().first_layer + i)] =
          chunk.block(i).attention().decode_cache(model.backend(), model.dtype(), cfg.seq_len);
  }
}

void Generator::reset() {
  context_.clear();
  length_ = 0;
}

std::vector<double> Generator::gather_logits(const Tensor& local) {
  Backend& be = model_->backend();
  const int64_t N = local.dim(0), Vl = local.dim(1);
  const int tp = model_->tp().size();
  Tensor all = local;
  if (tp > 1) {  // (tp, N, V/tp): the slices are contiguous in rank order
    all = be.empty({tp * N, Vl}, local.dtype(), MemoryCategory::Workspace);
    model_->tp().comm->all_gather(all, local).wait();
  }
  const std::vector<double> host = to_host_doubles(be, all, "generation");
  std::vector<double> out(host.size());
  for (int r = 0; r < tp; ++r)
    for (int64_t i = 0; i < N; ++i)
      std::copy_n(host.begin() + (r * N + i) * Vl, Vl, out.begin() + i * tp * Vl + r * Vl);
  return out;
}

// Model chunk k (of stages x virtual chunks, in model order) lives on stage owners_[k] as its
// local chunk: its index among that stage's chunks in model order. The token's activation (1, C) goes from chunk to
// chunk, point to point where the next chunk is on another stage; the last chunk's stage
// broadcasts the logits over the pipeline group, so every rank chooses the same token.
std::vector<double> Generator::run_position(int32_t token) {
  Backend& be = model_->backend();
  const int stages = pipeline_ ? pipeline_->size() : 1;
  const int stage = pipeline_ ? pipeline_->rank() : 0;
  const auto mine = [&](int k) { return owners_[static_cast<size_t>(k)] == stage; };
  const int64_t C = model_->config().d_model, V = model_->config().vocab_size;
  Tensor x;
  std::vector<double> logits;
  for (int k = 0, local = 0; k < chunks_; ++k) {
    if (!mine(k)) continue;
    ModelChunk& chunk = model_->chunk(local++);
    if (chunk.embedding()) {
      Tensor tok = be.empty({1}, DType::I32, MemoryCategory::Workspace);
      be.copy_from_host(tok, &token);
      x = chunk.embedding()->forward_at(tok, length_);
    } else if (!mine(k - 1)) {
      x = be.empty({1, C}, model_->dtype(), MemoryCategory::Workspace);
      pipeline_->recv(x, owners_[static_cast<size_t>(k - 1)], kTagBase + k).wait();
    }
    for (int i = 0; i < chunk.block_count(); ++i) {
      const size_t l = static_cast<size_t>(chunk.range().first_layer + i);
      x = chunk.block(i).decode(x, caches_[l], length_);
    }
    if (chunk.head()) logits = gather_logits(chunk.head()->logits(x));
    else if (!mine(k + 1)) pipeline_->send(x, owners_[static_cast<size_t>(k + 1)], kTagBase + k + 1).wait();
  }
  if (stages > 1) {
    Tensor all = be.empty({V}, DType::F64, MemoryCategory::Workspace);
    const int root = owners_.back();
    if (stage == root) be.copy_from_host(all, logits.data());
    pipeline_->broadcast(all, root).wait();
    logits.resize(static_cast<size_t>(V));
    be.copy_to_host(logits.data(), all);
  }
  ++length_;
  context_.push_back(token);
  return logits;
}

std::vector<double> Generator::step(int32_t token) {
  const int64_t T = model_->config().seq_len;
  if (length_ == T) {  // slide: rebuild from the last T / 2 tokens (see the header)
    const std::vector<int32_t> keep(context_.end() - std::max<int64_t>(T / 2, 1), context_.end());
    reset();
    for (int32_t t : keep) run_position(t);
  }
  return run_position(token);
}

std::vector<double> Generator::full_logits(const std::vector<int32_t>& tokens) {
  if (chunks_ != 1) throw std::invalid_argument("full_logits: the whole model on one stage only");
  if (model_->cp().on())
    throw std::invalid_argument("full_logits: not under context parallelism (each rank would "
                                "hold part of the sequence)");
  ModelChunk& chunk = model_->chunk(0);
  Backend& be = model_->backend();
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T < 1 || T > model_->config().seq_len)
    throw std::invalid_argument("full_logits: " + std::to_string(T) + " tokens, 1 to seq_len");
  Tensor tok = be.empty({T}, DType::I32, MemoryCategory::Workspace);
  be.copy_from_host(tok, tokens.data());
  const TensorParallel& tp = model_->tp();
  if (tp.sequence_parallel() && T % tp.size() != 0)
    throw std::invalid_argument("full_logits: under sequence parallelism the tokens (" +
                                std::to_string(T) + ") must divide over tp = " +
                                std::to_string(tp.size()));
  const TokenShape shape{1, T, {}};
  Tensor x = chunk.embedding()->forward(tok, shape);
  for (int l = 0; l < chunk.block_count(); ++l) {
    Block::Saved discard;
    x = chunk.block(l).forward(x, shape, discard, Recompute::Full);
  }
  // Under sequence parallelism each rank holds T / tp rows: gather them for the head.
  x = enter_tp_region_forward(be, tp, x, MemoryCategory::Workspace);
  return gather_logits(chunk.head()->logits(x));
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, int count,
                                         const SamplingOptions& options,
                                         const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt needs at least one token");
  reset();
  std::vector<double> logits;
  for (int32_t t : prompt) logits = step(t);
  std::vector<int32_t> out;
  int64_t position = static_cast<int64_t>(prompt.size());
  for (int i = 0; i < count; ++i, ++position) {
    const int32_t next = choose_token(logits, options, position);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 < count) logits = step(next);
  }
  return out;
}

}  // namespace meshtrain
