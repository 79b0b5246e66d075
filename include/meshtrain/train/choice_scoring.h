#pragma once
// Multiple-choice tasks (io/choice_tasks.h) scored by log-likelihood the way
// lm-evaluation-harness scores them (its HFLM loglikelihood requests and multiple_choice
// metrics): for each choice, the sum of log softmax(logits)[token] over the continuation's
// tokens given the context; acc is right when the largest sum is the gold choice's, acc_norm
// when the largest sum divided by the choice's length in bytes is (ties: the lower index, as
// numpy's argmax).
//
// Tokens as the harness makes them: trailing spaces of the context move to the front of the
// continuation; the continuation's tokens are those of encode(context + continuation) past the
// first len(encode(context)); no begin-of-text token (the harness encodes without special
// tokens). A context and continuation longer than model.seq_len + 1 tokens are cut from the
// left as the harness cuts them (the model sees the last seq_len tokens before each scored one).
//
// The model runs through the generator (model/generator.h): one position at a time with the
// key/value cache, on any pipeline and tensor layout (not ZeRO-3), so every layout computes the
// same sums up to the rounding of its reductions. Data-parallel replicas take the examples in
// turn (example i: replica i % dp) and the sums are gathered exactly (each is one replica's).

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/io/choice_tasks.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

// One (context, continuation) request in tokens.
struct ChoiceRequest {
  std::vector<int32_t> input;    // fed to the model: (context + continuation)[-(seq_len+1):][:-1]
  std::vector<int32_t> targets;  // the continuation's tokens, predicted by input's last positions
};

// Every example's requests (per example, per choice). DataError "<path>: line N: ..." for a
// context that tokenizes to nothing, a choice that does, a continuation over model.seq_len
// tokens, or an id not below model.vocab_size.
std::vector<std::vector<ChoiceRequest>> tokenize_choices(const ChoiceTask& task,
                                                         const Tokenizer& tokenizer,
                                                         const ModelSpec& model);

struct TaskScore {
  std::string name;
  int64_t examples = 0, correct = 0, correct_norm = 0;
  std::vector<std::vector<double>> loglikelihoods;  // per example, per choice
  double acc() const { return examples > 0 ? static_cast<double>(correct) / examples : 0.0; }
  double acc_norm() const { return examples > 0 ? static_cast<double>(correct_norm) / examples : 0.0; }
};

// The tasks of `eval --task` and train.eval_tasks, read and tokenized once.
class ChoiceEvaluation {
 public:
  // Collective over the world: every rank reads and tokenizes, and all reach one verdict.
  ChoiceEvaluation(const std::vector<std::string>& paths, const Tokenizer& tokenizer,
                   const ModelSpec& model, Communicator& world,
                   uint64_t max_line_bytes = kDefaultMaxLineBytes);
  // Scores every task on the model as it is now. Collective over the world; every rank returns
  // the same scores. `layout`: the deck's parallel options (the pipeline's chunk placement).
  std::vector<TaskScore> run(PipelineStage& model, ProcessGrid& grid, const ParallelOptions& layout) const;
  const std::vector<ChoiceTask>& tasks() const { return tasks_; }

 private:
  std::vector<ChoiceTask> tasks_;
  std::vector<std::vector<std::vector<ChoiceRequest>>> requests_;  // per task, example, choice
};

}  // namespace meshtrain
