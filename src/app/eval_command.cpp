// `meshtrain eval DECK --checkpoint PATH`: the validation loss of a checkpoint, on whatever
// layout the deck (and --set) gives; checkpoints are layout-free, so it need not be the one
// that wrote it. With --task FILE.jsonl (repeatable), multiple-choice accuracy scored as
// lm-evaluation-harness scores it (train/choice_scoring.h): a line per task, and on request the
// scores as JSON (--results) and each choice's log-likelihood (--per-choice).

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/choice_scoring.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

// Written under PATH.tmp and renamed: a killed eval leaves no half file under PATH.
void write_output(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": cannot write: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(path + ": cannot rename " + tmp + " to it: " + std::strerror(errno));
}

std::string results_json(const std::vector<TaskScore>& scores, const CheckpointStats& loaded) {
  nlohmann::ordered_json j;
  j["checkpoint"] = loaded.path;
  j["step"] = loaded.step;
  for (const TaskScore& s : scores)
    j["tasks"][s.name] = {{"acc", s.acc()},          {"acc_norm", s.acc_norm()},
                          {"examples", s.examples},  {"correct", s.correct},
                          {"correct_norm", s.correct_norm}};
  return j.dump(2) + "\n";
}

// One line per choice: {"task", "example", "line", "choice", "loglikelihood", "gold"}.
std::string per_choice_jsonl(const std::vector<TaskScore>& scores, const ChoiceEvaluation& tasks) {
  std::ostringstream out;
  for (size_t t = 0; t < scores.size(); ++t)
    for (size_t e = 0; e < scores[t].loglikelihoods.size(); ++e)
      for (size_t k = 0; k < scores[t].loglikelihoods[e].size(); ++k) {
        nlohmann::ordered_json j;
        j["task"] = scores[t].name;
        j["example"] = e;
        j["line"] = tasks.tasks()[t].examples[e].line;
        j["choice"] = k;
        j["loglikelihood"] = scores[t].loglikelihoods[e][k];
        j["gold"] = tasks.tasks()[t].examples[e].gold;
        out << j.dump() << "\n";
      }
  return out.str();
}

void print_scores(const std::vector<TaskScore>& scores, int digits) {
  for (const TaskScore& s : scores)
    std::printf("task %s: acc %.*f (%lld/%lld) acc_norm %.*f (%lld/%lld)\n", s.name.c_str(), digits,
                s.acc(), static_cast<long long>(s.correct), static_cast<long long>(s.examples), digits,
                s.acc_norm(), static_cast<long long>(s.correct_norm), static_cast<long long>(s.examples));
}

}  // namespace

int eval_command(const EvalArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    RunSetup run = setup_run(args.deck, args.overrides, world);
    const Config& config = run.config;
    ProcessGrid& grid = *run.grid;
    const bool tasks_given = !args.tasks.empty();
    if (!config.data.has_val() && !tasks_given)
      throw DeckError(config.deck_path + ": data.val = \"none\": eval needs validation data "
                      "(data.val = \"synthetic\" or token shards), or a --task");
    if (tasks_given)
      if (const std::string why = generation_unsupported(config); !why.empty())
        throw DeckError(config.deck_path + ": --task scores with the generator: " + why);
    std::unique_ptr<ChoiceEvaluation> tasks;
    if (tasks_given) {
      std::unique_ptr<Tokenizer> tokenizer;
      agree(world, [&] { tokenizer = open_tokenizer(config.data.tokenizer); });
      tasks = std::make_unique<ChoiceEvaluation>(args.tasks, *tokenizer, config.model, world,
                                                 static_cast<uint64_t>(args.max_line_bytes));
    }
    Trainer trainer(config, grid, *run.backend);
    Checkpointer checkpointer(config, grid);
    const CheckpointStats loaded = checkpointer.load(trainer.state(), args.checkpoint);
    const bool leader = grid.world_rank() == 0;
    if (config.data.has_val()) {
      const double val = trainer.evaluate();
      if (leader) {
        std::printf("checkpoint %s: step %lld, layout %s, %d eval batch(es) of %d sequences\n",
                    loaded.path.c_str(), static_cast<long long>(loaded.step),
                    describe_layout(config).c_str(), config.train.eval_batches, config.train.global_batch);
        std::printf("val_loss %.*f\n", args.digits, val);
        std::fflush(stdout);
      }
    }
    if (!tasks) return kExitOk;
    const std::vector<TaskScore> scores = tasks->run(trainer.model(), grid, config.parallel);
    if (leader) {
      print_scores(scores, args.digits);
      std::fflush(stdout);
    }
    agree(world, [&] {
      if (!leader) return;
      if (!args.results.empty()) write_output(args.results, results_json(scores, loaded));
      if (!args.per_choice.empty()) write_output(args.per_choice, per_choice_jsonl(scores, *tasks));
    });
    return kExitOk;
  });
}

}  // namespace meshtrain
