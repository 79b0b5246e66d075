// `meshtrain sample DECK --checkpoint PATH --prompt TEXT --tokens N ...`: text from a
// checkpoint, generated with a key/value cache (model/generator.h).
//
// Layout: the checkpoint is layout-free; sample loads it as eval does, on the deck's tensor
// parallelism (parallel.tp, heads split over the tensor group) when it divides the world size,
// else tp = 1, with everything else forced to what generation needs: pp = 1, one virtual
// stage, zero = 0, dp = world / tp (each data-parallel replica
// generates the same tokens; world rank 0 prints). So any deck runs on any number of ranks.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/model/generator.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/text_sample.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {
// CLI11's Range lets NaN through (no comparison with it is true) and words its bounds as
// doubles; this one refuses every non-finite number.
CLI::Validator temperature_range() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double t = std::stod(v, &used);
          if (used == v.size() && std::isfinite(t) && t >= 0.0 && t <= 1e6) return "";
        } catch (const std::exception&) {
        }
        return v + " is not a temperature (expected a finite number from 0 to 1e6; 0: greedy)";
      },
      "FLOAT in [0,1e6]");
}
}  // namespace

CLI::App* add_sample_subcommand(CLI::App& app, SampleArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "sample", "Generate text from a checkpoint (key/value cache; greedy or temperature/top-k)");
  cmd->add_option("deck", args.deck, "Input deck (TOML) describing the model")->required();
  cmd->add_option("--checkpoint", args.checkpoint, "Checkpoint file (step_*.h5)")->required();
  cmd->add_option("--prompt", args.prompt,
                  "Text to continue (default empty: start from the tokenizer's line break)");
  cmd->add_option("--tokens", args.tokens, "Tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--temperature", args.temperature, "0: greedy (argmax); else softmax(logits/T)")
      ->check(temperature_range());
  cmd->add_option("--top-k", args.top_k, "Sample among the K most likely tokens; 0: all")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--seed", args.seed, "Sampling seed (the tokens are a function of it)");
  cmd->add_option("--tokenizer", args.tokenizer,
                  "Tokenizer: \"bytes\" or a tokenizer file (default: the deck's data.tokenizer)");
  cmd->add_option("--set", args.overrides, "Override a deck key: --set section.key=value");
  return cmd;
}

namespace {
// What generation needs of the layout (see the file comment); after the user's overrides, so
// these win. global_batch = world with one-sequence micro-batches divides over any dp.
// tp, ep 0: the deck's.
std::vector<std::string> generation_layout(std::vector<std::string> overrides, int world, int tp,
                                           int ep) {
  if (tp > 0) overrides.push_back("parallel.tp=" + std::to_string(tp));
  if (ep > 0) overrides.push_back("parallel.ep=" + std::to_string(ep));
  for (const char* o : {"parallel.pp=1", "parallel.virtual_stages=1", "parallel.schedule=\"1f1b\"",
                        "parallel.zero=0", "parallel.recompute=\"none\"",
                        "parallel.dp=\"auto\"", "data.val=\"none\"", "train.micro_batch=1"})
    overrides.emplace_back(o);
  overrides.push_back("train.global_batch=" + std::to_string(world));
  return overrides;
}
}  // namespace

int sample_command(const SampleArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    // The deck's tp and ep if this world can hold them (the same verdict on every rank: the
    // same deck text, the same layout check), else 1 (checkpoints are layout-free). Any other
    // fault of the deck is reported below.
    int tp = 1, ep = 1;
    try {
      const Config deck = load_config(args.deck, generation_layout(args.overrides, world.size(), 0, 0), world);
      tp = deck.parallel.tp;
      ep = deck.parallel.ep;
    } catch (const DeckError&) {
    }
    RunSetup run = setup_run(args.deck, generation_layout(args.overrides, world.size(), tp, ep), world);
    const Config& config = run.config;
    const bool leader = run.grid->world_rank() == 0;
    // A tokenizer file can be missing on one node only: the ranks agree, one message is printed.
    std::unique_ptr<Tokenizer> tokenizer;
    bool implicit_start = false;
    std::vector<int32_t> prompt;
    agree(world, [&] {
      tokenizer = open_tokenizer(args.tokenizer.empty() ? config.data.tokenizer : args.tokenizer);
      prompt = encode_prompt(*tokenizer, args.prompt, config.model, "--prompt", &implicit_start);
    });

    Trainer trainer(config, *run.grid, *run.backend);
    Checkpointer checkpointer(config, *run.grid);
    const CheckpointStats loaded = checkpointer.load(trainer.state(), args.checkpoint);
    std::unique_ptr<Generator> generator;
    try {
      generator = std::make_unique<Generator>(trainer.model());
    } catch (const std::invalid_argument& e) {  // the same on every rank
      throw DeckError(config.deck_path + ": " + e.what());
    }
    const SamplingOptions options{args.temperature, args.top_k, args.seed};
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> out = generator->generate(prompt, args.tokens, options);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (leader) {
      // The text on stdout (prompt + continuation); how it was made on stderr.
      const std::string text = implicit_start ? decode_tokens(*tokenizer, out)
                                              : args.prompt + decode_tokens(*tokenizer, out);
      // Written by length: a byte tokenizer's token 0 is a NUL byte, which %s would stop at.
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      std::fprintf(stderr,
                   "# %s step %lld: %zu prompt + %zu generated tokens in %.3f s (%.1f tokens/s), "
                   "tokenizer %s, temperature %g, top-k %d, seed %llu, tp %d\n",
                   loaded.path.c_str(), static_cast<long long>(loaded.step), prompt.size(),
                   out.size(), seconds,
                   seconds > 0 ? static_cast<double>(prompt.size() + out.size()) / seconds : 0.0,
                   tokenizer->kind().c_str(), args.temperature, args.top_k,
                   static_cast<unsigned long long>(args.seed), config.parallel.tp);
    }
    return kExitOk;
  });
}

}  // namespace meshtrain
