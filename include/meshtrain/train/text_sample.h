#pragma once
// Text in and out of generation (model/generator.h) for the commands that generate: `sample`
// and the periodic sample of `train` (train.sample_every). Encodes a prompt with the run's
// tokenizer and checks it against the model; says whether a layout can generate; generates and
// decodes. Not the generation itself (model/generator.h) nor the command line (app/).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/model/generator.h"

namespace meshtrain {

// The token an empty prompt starts from: the first token of "\n" (a line break is where text
// begins in every corpus we train on, and every tokenizer has one), else id 0. It is not
// printed: the continuation is the text.
int32_t start_token(const Tokenizer& tokenizer, int64_t vocab_size);

// The prompt's tokens, checked against the model: DeckError naming `what` (e.g. "--prompt")
// for an id >= model.vocab_size or more tokens than model.seq_len. An empty prompt gives
// {start_token()} and sets *implicit_start.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                   const ModelSpec& model, const std::string& what,
                                   bool* implicit_start);

std::string decode_tokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);

// "" when this layout can generate in place (model/generator.h: parameters not sharded by
// ZeRO-3), else why not.
std::string generation_unsupported(const Config& config);

// train.sample_every: after every N-th step, kSampleTokens greedy tokens from an empty prompt
// (start_token), printed by world rank 0 as "step N | sample: <text>". Every rank generates
// (each data-parallel replica the same tokens, its pipeline stages passing each token along; a
// few dozen one-token forwards, outside the timed step), so no rank waits for another. Layouts
// that cannot generate in place (generation_unsupported) skip it: the leader says so once, at
// the start.
class PeriodicSample {
 public:
  static constexpr int kSampleTokens = 32;
  PeriodicSample(const Config& config, bool leader);
  // Collective over every rank; pipeline: the grid's pipeline group.
  void after_step(int step, PipelineStage& model, Communicator& pipeline);

 private:
  int every_ = 0;
  int64_t vocab_size_ = 0;  // model.vocab_size
  bool leader_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int> owners_;  // the pipeline stage of each model chunk (Generator)
};

}  // namespace meshtrain
