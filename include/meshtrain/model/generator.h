#pragma once
// Autoregressive text generation from a DecoderModel with a key/value cache: the prompt runs
// through the blocks one position at a time, each layer keeping the keys and values of every
// position so far (CausalSelfAttention::decode), or under latent attention the compressed
// latent and the rotary key (LatentAttention::decode), so a new token costs one position's
// work, not a forward over the whole prefix.
//
// Layouts: any pipeline (with the pipeline group: the stages pass the token's activation along,
// point to point, and the last broadcasts the logits) and parameters resident (not ZeRO-3
// sharded). Tensor parallelism works: each tp rank keeps the cache of its own heads,
// the tp regions of training reduce the partial outputs, and the vocabulary-parallel logits are
// gathered, so every rank of the tp group holds the same full logits and chooses the same token.
// (Latent attention's cache is not split by heads: every tp rank keeps the whole of it.)
// A sequence-parallel model generates too: one token does not split, so the decode path uses the
// same group without sequence parallelism (same weights; TensorParallel::without_sequence).
// Every rank of the tp and pipeline groups must call the same methods.
//
// The cache holds model.seq_len positions. When it is full and the context goes on, the window
// slides: the cache is rebuilt from the last seq_len / 2 tokens (at positions 0 ..), which is
// what a full forward over that window would see. Each rebuild costs seq_len / 2 positions,
// once per seq_len / 2 new tokens.
//
// Sampling (choose_token) is a pure function of the logits, the options and the token's
// position in the whole text: Philox keyed by (seed, "sample"), counted by position. It is the
// same on every rank and every layout (up to the rounding of the logits).

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/decode_cache.h"
#include "meshtrain/model/pipeline_stage.h"

namespace meshtrain {

class DecoderModel;

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax, the lowest id among equal maxima)
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 0;
};

// The next token from logits (V): greedy at temperature 0, else drawn from
// softmax(logits / temperature) restricted to the top_k largest (ties to the lower id), with the
// uniform number Philox(seed, "sample").uniform(position).
int32_t choose_token(const std::vector<double>& logits, const SamplingOptions& options,
                     int64_t position);

class Generator {
 public:
  // Throws std::invalid_argument naming what is unsupported (see the layouts above). `model`:
  // a stage of model/decoder_model.h, which assembles every family (any other is refused).
  // pipeline: the pipeline group, when the model is split over stages (null: it is not).
  // chunk_owners: the stage of each model chunk over all stages, in model order (the schedule's
  // placement, parallel/schedule.h rank_chunks); empty: looped, chunk k on stage k % stages.
  explicit Generator(PipelineStage& model, Communicator* pipeline = nullptr,
                     std::vector<int> chunk_owners = {});

  // Forgets the context.
  void reset();
  // Positions in the cache.
  int64_t cached() const { return length_; }
  // Runs `token` at the next position (sliding the window first when the cache is full) and
  // returns the logits (V) for the token after it. Collective over the tp and pipeline groups.
  std::vector<double> step(int32_t token);
  // The reference: logits (T, V), row t for the token after tokens[0..t], from the model's
  // training forward over the whole sequence (no cache); a model on one stage only.
  // tokens.size() <= seq_len (and a multiple of tp under sequence parallelism).
  std::vector<double> full_logits(const std::vector<int32_t>& tokens);

  // Feeds `prompt` (at least one token), then chooses `count` tokens one at a time, calling
  // on_token (if any) with each as soon as it is chosen. Returns the new tokens. Positions for
  // the sampler count from the start of the prompt.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int count,
                                const SamplingOptions& options,
                                const std::function<void(int32_t)>& on_token = {});

 private:
  std::vector<double> gather_logits(const Tensor& local);  // (N, V/tp) -> (N, V) on the host
  std::vector<double> run_position(int32_t token);

  static constexpr int kTagBase = 0x5A0000;  // point-to-point tags: base + receiving chunk

  DecoderModel* model_;
  Communicator* pipeline_;
  int chunks_ = 1;                         // model chunks over all stages
  std::vector<int> owners_;                // stage of each chunk, in model order
  std::vector<DecodeCache> caches_;        // per global layer, this rank's (model/decode_cache.h)
  std::vector<int32_t> context_;           // the tokens in the cache, in order
  int64_t length_ = 0;
};

}  // namespace meshtrain
