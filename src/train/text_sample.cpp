#include "meshtrain/train/text_sample.h"

#include <cstdio>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/parallel/schedule.h"

namespace meshtrain {

int32_t start_token(const Tokenizer& tokenizer, int64_t vocab_size) {
  const std::vector<uint32_t> ids = tokenizer.encode("\n");
  if (!ids.empty() && ids[0] < static_cast<uint64_t>(vocab_size)) return static_cast<int32_t>(ids[0]);
  return 0;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                   const ModelSpec& model, const std::string& what,
                                   bool* implicit_start) {
  if (implicit_start) *implicit_start = prompt.empty();
  // A tokenizer that starts every text with a token (Llama 3's <|begin_of_text|>) starts the
  // prompt with it as Hugging Face's does, and an empty prompt is that token alone.
  const std::optional<uint32_t> bos = tokenizer.begin_of_text();
  if (prompt.empty() && !bos) return {start_token(tokenizer, model.vocab_size)};
  std::vector<uint32_t> ids = tokenizer.encode(prompt);
  if (bos) ids.insert(ids.begin(), *bos);
  if (ids.empty()) return {start_token(tokenizer, model.vocab_size)};
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= static_cast<uint64_t>(model.vocab_size))
      throw DeckError(what + ": token " + std::to_string(i) + " of the prompt has id " +
                      std::to_string(ids[i]) + ", not below model.vocab_size = " +
                      std::to_string(model.vocab_size) + " (tokenizer '" + tokenizer.kind() +
                      "', vocabulary " + std::to_string(tokenizer.vocab_size()) +
                      "): use the tokenizer the model was trained with (data.tokenizer, or "
                      "--tokenizer)");
  if (static_cast<int64_t>(ids.size()) > model.seq_len)
    throw DeckError(what + ": the prompt is " + std::to_string(ids.size()) +
                    " tokens, longer than model.seq_len = " + std::to_string(model.seq_len) +
                    " (the model's context): give at most " + std::to_string(model.seq_len) +
                    " tokens");
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string decode_tokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  // A generated id the tokenizer lacks (the model's padding rows) is shown, not fatal: a sample
  // during training must never end the run.
  std::string out;
  std::vector<uint32_t> run;
  for (const int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    if (id >= 0 && tokenizer.has_token(u)) {
      run.push_back(u);
      continue;
    }
    out += tokenizer.decode(run) + "<|id:" + std::to_string(id) + "|>";
    run.clear();
  }
  return out + tokenizer.decode(run);
}

std::string generation_unsupported(const Config& config) {
  const ParallelOptions& p = config.parallel;
  if (p.zero >= 3)
    return "parallel.zero = 3 shards the parameters: generation needs them whole (zero <= 2)";
  return "";
}

PeriodicSample::PeriodicSample(const Config& config, bool leader)
    : every_(config.train.sample_every), vocab_size_(config.model.vocab_size), leader_(leader) {
  if (every_ <= 0) return;
  if (const std::string why = generation_unsupported(config); !why.empty()) {
    if (leader_) {
      std::printf("train.sample_every = %d: no samples on this layout (%s)\n", every_, why.c_str());
      std::fflush(stdout);
    }
    every_ = 0;
    return;
  }
  tokenizer_ = open_tokenizer(config.data.tokenizer);
  const ParallelOptions& p = config.parallel;
  owners_ = chunk_owners(p.pp, p.virtual_stages, schedule_placement(p.schedule));
}

void PeriodicSample::after_step(int step, PipelineStage& model, Communicator& pipeline) {
  if (every_ <= 0 || step % every_ != 0) return;
  Generator generator(model, &pipeline, owners_);
  const std::vector<int32_t> start = {start_token(*tokenizer_, vocab_size_)};
  const std::vector<int32_t> out = generator.generate(start, kSampleTokens, SamplingOptions{});
  if (!leader_) return;
  std::string text = decode_tokens(*tokenizer_, out);
  for (char& c : text)  // one log line: control characters as spaces
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  std::printf("step %5d | sample: %s\n", step, text.c_str());
  std::fflush(stdout);
}

}  // namespace meshtrain
