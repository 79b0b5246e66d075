#include "meshtrain/train/choice_scoring.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/model/generator.h"
#include "meshtrain/parallel/schedule.h"

namespace meshtrain {

namespace {

std::vector<int32_t> model_ids(const std::vector<uint32_t>& ids, const Tokenizer& tokenizer,
                               const ModelSpec& model, const std::string& where) {
  std::vector<int32_t> out;
  for (const uint32_t id : ids) {
    if (id >= static_cast<uint64_t>(model.vocab_size))
      throw DataError(where, "token id " + std::to_string(id) + " is not below model.vocab_size = " +
                                 std::to_string(model.vocab_size) + " (tokenizer '" + tokenizer.kind() +
                                 "'): use the tokenizer the model was trained with (data.tokenizer)");
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

// The harness's _encode_pair and its left cut (see the header).
ChoiceRequest encode_pair(std::string context, std::string continuation, const Tokenizer& tokenizer,
                          const ModelSpec& model, const std::string& where) {
  const size_t kept = context.find_last_not_of(' ') + 1;  // npos + 1 = 0: all spaces
  continuation = context.substr(kept) + continuation;
  context.resize(kept);
  const std::vector<int32_t> whole = model_ids(tokenizer.encode(context + continuation), tokenizer, model, where);
  const size_t context_tokens = tokenizer.encode(context).size();
  ChoiceRequest r;
  if (context_tokens < whole.size())
    r.targets.assign(whole.begin() + static_cast<std::ptrdiff_t>(context_tokens), whole.end());
  if (r.targets.empty()) throw DataError(where, "tokenizes to no tokens past the context's (a choice must add text)");
  const auto window = static_cast<size_t>(model.seq_len);
  if (r.targets.size() > window)
    throw DataError(where, "is " + std::to_string(r.targets.size()) + " tokens, more than model.seq_len = " +
                               std::to_string(model.seq_len) + " (the model's context)");
  const size_t first = whole.size() > window + 1 ? whole.size() - (window + 1) : 0;
  r.input.assign(whole.begin() + static_cast<std::ptrdiff_t>(first), whole.end() - 1);
  return r;
}

// log softmax(logits)[target], in double.
double log_probability(const std::vector<double>& logits, int32_t target) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const double l : logits) sum += std::exp(l - max);
  return logits[static_cast<size_t>(target)] - max - std::log(sum);
}

double score_request(Generator& generator, const ChoiceRequest& r) {
  generator.reset();
  const size_t first_scored = r.input.size() - r.targets.size();
  double sum = 0;
  for (size_t i = 0; i < r.input.size(); ++i) {
    const std::vector<double> logits = generator.step(r.input[i]);
    if (i >= first_scored) sum += log_probability(logits, r.targets[i - first_scored]);
  }
  return sum;
}

size_t argmax(const std::vector<double>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Each rank's numbers summed over the world in rank order; exact where one rank holds each.
std::vector<double> world_sum(Communicator& world, const std::vector<double>& mine) {
  const std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double));
  std::vector<double> sum(mine.size(), 0.0), theirs(mine.size());
  for (const std::string& b : world.all_gather_bytes(bytes)) {
    std::memcpy(theirs.data(), b.data(), b.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
  }
  return sum;
}

}  // namespace

std::vector<std::vector<ChoiceRequest>> tokenize_choices(const ChoiceTask& task,
                                                         const Tokenizer& tokenizer,
                                                         const ModelSpec& model) {
  std::vector<std::vector<ChoiceRequest>> out;
  for (const ChoiceExample& e : task.examples) {
    const std::string line = task.path + ": line " + std::to_string(e.line);
    if (tokenizer.encode(e.context).empty())
      throw DataError(line, "the context \"" + e.context.substr(0, 60) +
                                "\" tokenizes to no tokens (expected text for the choices to continue)");
    std::vector<ChoiceRequest>& choices = out.emplace_back();
    for (size_t k = 0; k < e.continuations.size(); ++k)
      choices.push_back(encode_pair(e.context, e.continuations[k], tokenizer, model,
                                    line + ": choice " + std::to_string(k)));
  }
  return out;
}

ChoiceEvaluation::ChoiceEvaluation(const std::vector<std::string>& paths, const Tokenizer& tokenizer,
                                   const ModelSpec& model, Communicator& world,
                                   uint64_t max_line_bytes) {
  agree(world, [&] {
    for (const std::string& path : paths) {
      tasks_.push_back(read_choice_task(path, max_line_bytes));
      requests_.push_back(tokenize_choices(tasks_.back(), tokenizer, model));
    }
  });
}

std::vector<TaskScore> ChoiceEvaluation::run(PipelineStage& model, ProcessGrid& grid,
                                             const ParallelOptions& layout) const {
  Generator generator(model, &grid.comm(Axis::Pipeline),
                      chunk_owners(layout.pp, layout.virtual_stages, schedule_placement(layout.schedule)));
  const int replicas = grid.size(Axis::Data), replica = grid.rank(Axis::Data);
  // One rank of each replica reports its examples' sums (every rank of it computed them).
  const bool reports = grid.rank(Axis::Tensor) == 0 && grid.rank(Axis::Pipeline) == 0 &&
                       grid.rank(Axis::Context) == 0;
  std::vector<TaskScore> scores;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    std::vector<double> mine;
    for (size_t e = 0; e < requests_[t].size(); ++e)
      for (const ChoiceRequest& r : requests_[t][e]) {
        // Every rank of the owning replica runs the generator (its collectives); one reports.
        const bool owned = static_cast<int>(e % static_cast<size_t>(replicas)) == replica;
        const double ll = owned ? score_request(generator, r) : 0.0;
        mine.push_back(reports ? ll : 0.0);
      }
    const std::vector<double> all = world_sum(grid.world(), mine);
    TaskScore s;
    s.name = tasks_[t].name;
    size_t at = 0;
    for (const ChoiceExample& e : tasks_[t].examples) {
      std::vector<double> lls(all.begin() + static_cast<std::ptrdiff_t>(at),
                              all.begin() + static_cast<std::ptrdiff_t>(at + e.continuations.size()));
      at += e.continuations.size();
      std::vector<double> normed(lls.size());
      for (size_t k = 0; k < lls.size(); ++k) normed[k] = lls[k] / e.norm_bytes[k];
      ++s.examples;
      s.correct += argmax(lls) == static_cast<size_t>(e.gold);
      s.correct_norm += argmax(normed) == static_cast<size_t>(e.gold);
      s.loglikelihoods.push_back(std::move(lls));
    }
    scores.push_back(std::move(s));
  }
  return scores;
}

}  // namespace meshtrain
