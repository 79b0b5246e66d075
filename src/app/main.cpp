// meshtrain: hybrid-parallel (data, tensor, pipeline) GPT training on MPI.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "meshtrain/app/address_space_check.h"
#include "meshtrain/app/commands.h"
#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/app/docs_page.h"
#include "meshtrain/app/hf_shards.h"
#include "meshtrain/app/init_watchdog.h"
#include "meshtrain/backend/thread_limit.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/nearest_name.h"

namespace {

// CLI11's own range checks print the numeric limits of double ("not in range 0 to 1.8e308");
// these say what is accepted in words. A validator returns "" or the problem.
CLI::Validator at_least_one(const std::string& what) {
  return CLI::Validator(
      [what](std::string& v) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(v, &used) >= 1 && used == v.size()) return "";
        } catch (const std::exception&) {
        }
        return v + " is not " + what + " (expected an integer >= 1)";
      },
      "INT>=1");
}

// Threads of one process: from 1 to kMaxThreads (backend/thread_limit.h says why there is a cap).
CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long n = std::stoll(v, &used);
          if (used == v.size() && n >= 1 && n <= meshtrain::kMaxThreads) return "";
        } catch (const std::exception&) {
        }
        return v + " is not a thread count (expected an integer from 1 to " +
               std::to_string(meshtrain::kMaxThreads) + ")";
      },
      "INT in [1," + std::to_string(meshtrain::kMaxThreads) + "]");
}

// An integer option from lo to hi, named in the message with its value and the range (a
// negative or too large --max-bad-lines printed 1.8e308's 309 digits as CLI11's bound).
CLI::Validator integer_in(const std::string& option, long long lo, long long hi,
                          const std::string& example) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long n = std::stoll(v, &used);
          if (used == v.size() && n >= lo && n <= hi) return "";
        } catch (const std::exception&) {
        }
        return option + " " + v + " is out of range (expected an integer from " +
               std::to_string(lo) + " to " + std::to_string(hi) + ", e.g. " + example + ")";
      },
      "INT in [" + std::to_string(lo) + "," + std::to_string(hi) + "]");
}

// 0 writes no validation shard; 1 would leave nothing to train on.
CLI::Validator validation_fraction() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double f = std::stod(v, &used);
          if (used == v.size() && f >= 0.0 && f < 1.0) return "";
          if (used == v.size() && f == 1.0)
            return "1 would put every token into validation and none into training (expected a "
                   "fraction from 0 up to, not including, 1; 0 writes no validation shard)";
        } catch (const std::exception&) {
        }
        return v + " is not a fraction from 0 up to, not including, 1 (e.g. 0.1; 0 writes no "
                   "validation shard)";
      },
      "FRACTION in [0,1)");
}

// CLI11 reads an unknown first word as a stray positional and answers "A subcommand is
// required"; say which word it was and what the sub-commands are. Returns true when refused.
bool refuse_unknown_subcommand(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string word = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  for (const std::string& n : names)
    if (n == word) return false;
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  const std::string hint = meshtrain::nearest_name(word, names);
  std::fprintf(stderr, "meshtrain: error: unknown sub-command '%s'%s; the sub-commands are %s "
               "(meshtrain --help describes them)\n",
               word.c_str(), hint.empty() ? "" : (" (did you mean '" + hint + "'?)").c_str(),
               all.c_str());
  return true;
}

// OMP_NUM_THREADS beyond the cap segfaulted the OpenMP runtime in the first parallel region of
// whichever command reached one (train, plan --all --time, ...): refused before any command
// starts, as is a MESHTRAIN_INIT_TIMEOUT that is not a number of seconds (init_watchdog.h). This is before MPI_Init, so each rank refuses on its own; the launcher's rank 0 (or a
// process started alone) prints it. Returns true when refused.
bool refuse_thread_environment() {
  using meshtrain::launched_rank;
  try {
    meshtrain::omp_num_threads_value(std::getenv("OMP_NUM_THREADS"));
    meshtrain::init_timeout_seconds(std::getenv("MESHTRAIN_INIT_TIMEOUT"));
    return false;
  } catch (const meshtrain::DeckError& e) {
    if (launched_rank() <= 0) {
      std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
      meshtrain::print_docs_pointer(e.what());
    }
    return true;
  }
}

// From the executable's preinit_array: before any shared library's constructor, OpenBLAS's
// included, which would spin for ever under a low address-space limit (address_space_check.h).
void check_address_space_before_libraries(int, char**, char** env) { meshtrain::refuse_small_address_space(env); }
__attribute__((section(".preinit_array"), used)) void (*const check_address_space)(int, char**, char**) =
    check_address_space_before_libraries;

}  // namespace

namespace meshtrain {
namespace {

// meshtrain train DECK [--set k=v]...
void add_train_options(CLI::App* cmd, TrainArgs& train) {
  cmd->add_option("deck", train.deck, "Input deck (TOML), e.g. input/default.toml")->required();
  cmd->add_option("--set", train.overrides,
                  "Override a deck key: --set section.key=value (repeatable)");
}

// meshtrain prepare FILES... --out PREFIX: text and JSON Lines into token shards.
void add_prepare_options(CLI::App* cmd, PrepareArgs& prepare) {
  cmd->add_option("inputs", prepare.inputs,
                  "Text files, and JSON Lines files (*.jsonl, *.jsonl.gz, *.jsonl.zst: "
                  "one JSON object per line, a document each)");
  cmd->add_option("--out", prepare.out_prefix,
                  "Output prefix: writes <prefix>_train.bin and <prefix>_val.bin")->required();
  cmd->add_option("--val-fraction", prepare.val_fraction,
                  "Fraction of each file kept for validation, from 0 (no validation shard) up to, "
                  "not including, 1")->check(validation_fraction());
  cmd->add_option("--synthetic", prepare.synthetic_bytes,
                  "Write the built-in generated corpus of this many bytes instead");
  cmd->add_option("--tokenizer", prepare.tokenizer,
                  "bytes (default), a SentencePiece .model, a GPT-2 BPE directory "
                  "(vocab.json + merges.txt), VOCAB.json,MERGES.txt, or a tokenizer.json");
  cmd->add_option("--train-tokenizer", prepare.train_tokenizer,
                  "Train a SentencePiece tokenizer on the files first: bpe:N or unigram:N "
                  "(N pieces), written as <prefix>_tokenizer.model")
      ->excludes("--tokenizer");
  cmd->add_option("--threads", prepare.threads, "Tokenizing threads (default: every core this process may use)")
      ->check(thread_count());
  cmd->add_option("--text-field", prepare.text_field,
                  "JSON Lines: the field holding each document's text (default \"text\"; "
                  "a dotted path such as meta.body reaches into nested objects)");
  cmd->add_option("--max-bad-lines", prepare.max_bad_lines,
                  "JSON Lines: how many bad lines (invalid JSON or UTF-8, no text field) "
                  "may be skipped, each named, before they are an error (default 0)")
      ->check(integer_in("--max-bad-lines", 0, std::numeric_limits<long long>::max(), "100"));
  cmd->add_option("--max-line-bytes", prepare.max_line_bytes,
                  "JSON Lines: the longest line read, in bytes; a longer one is a bad line, "
                  "read through without being held (default 67108864, 64 MiB)")
      ->check(integer_in("--max-line-bytes", 1, kMaxLineBytesLimit, "268435456"));
  cmd->add_flag("--force", prepare.force,
                "Replace outputs that exist (and the .tmp files of a killed prepare); an "
                "output that is one of the inputs is refused all the same");
  cmd->add_flag("--end-of-text", prepare.end_of_text,
                "Put the tokenizer's end-of-text token after every document (each text "
                "file's training and validation parts, each JSON Lines document): "
                "<|endoftext|> (GPT-2, Qwen), <|end_of_text|> (Llama 3), a SentencePiece "
                "model's </s>; what data.document_mask cuts sequences at");
}

// meshtrain bench --suite NAME: its --threads and --steps note whether they were given (BenchArgs).
void add_bench_options(CLI::App* cmd, BenchArgs& bench) {
  cmd->add_option("--suite", bench.suite,
                  "step, comm, pipeline, zero, checkpoint, gpu, all, calibrate (measure "
                  "this machine for the time model; with --out, write a machine profile), "
                  "hetero (4 ranks: one slow rank or stage, even against balanced work), async (5 "
                  "ranks: one slow replica, synchronous against parameter servers), context "
                  "(2+ ranks: ring attention on long sequences, memory per rank by cp), moe "
                  "(2, 4 or 8 ranks: a mixture of experts at ep 1 and ep N against the dense "
                  "model of its active parameters; the exchange a shared expert hides), "
                  "attention (1 rank: the CPU's causal attention at T 1024 and 2048, fp32 "
                  "and bf16, against the GEMM ceiling), window (1 rank: sliding-window "
                  "attention, W 1024, against full attention at T 8192 and 16384)")
      ->check(CLI::IsMember({"step", "comm", "pipeline", "zero", "checkpoint", "gpu", "all", "async",
                  "calibrate", "hetero", "context", "moe", "attention", "window"}));
  cmd->add_option("--threads", bench.threads,
                  "Threads per rank (step suite on one rank: rows at 1 and at this many; "
                  "calibrate: default as many as `train` runs on this launch)")->check(thread_count());
  cmd->add_option("--steps", bench.steps,
                  "Timed steps (median reported; async and hetero take at least 40 and 8 "
                  "unless given); calibrate: runs per measurement (3 or more)")
      ->check(at_least_one("a step count"));
  cmd->add_option("--model", bench.model,
                  "The step suite's model: gpt2 (GPT-2 124M, T 256, the figures), llama "
                  "(Llama 3's block at GPT-2 124M's sizes), mla (that block with DeepSeek-V3's "
                  "latent attention), or tiny / tiny-llama / tiny-mla (2 layers, for tests); "
                  "tiny also shrinks the other suites' models but moe's (every line in "
                  "seconds, ratios meaningless)")
      ->check(CLI::IsMember({"gpt2", "llama", "mla", "tiny", "tiny-llama", "tiny-mla"}));
  cmd->add_option("--json", bench.json, "Also write the results as JSON to this file");
  cmd->add_option("--dir", bench.dir, "Directory for the checkpoint suite's files");
  cmd->add_option("--out", bench.out,
                  "The calibrate suite's machine profile (TOML; written by rank 0, "
                  "atomically; input/machines/ holds datasheet ones)");
  cmd->add_option("--passes", bench.passes,
                  "calibrate: measure every point (GEMM size, memory, link size) this many "
                  "times, interleaved, and keep each point's median (default 3)")
      ->check(at_least_one("a pass count"));
}

// meshtrain plan DECK --world N: memory (and with --time, step time) of one layout or all.
void add_plan_options(CLI::App* cmd, PlanArgs& plan) {
  cmd->add_option("deck", plan.deck, "Input deck (TOML)")->required();
  cmd->add_option("--world", plan.world, "Ranks of the job to plan")
      ->required()
      ->check(at_least_one("a number of ranks"));
  cmd->add_flag("--all", plan.all, "Plan every valid layout for --world ranks, lowest peak first");
  cmd->add_option("--memory", plan.memory,
                  "Memory per rank (e.g. 16GiB, 80G): refuse layouts that do not fit");
  cmd->add_option("--threads", plan.threads, "Threads per rank of the planned run")
      ->check(thread_count());
  cmd->add_option("--device", plan.device, "Device of the planned run: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--time", plan.time,
                "Also predict the step time on the machine of --profile (with --all: rank the "
                "layouts by it)");
  cmd->add_option("--profile", plan.profile,
                  "Machine profile for --time: `meshtrain bench --suite calibrate --out P.toml`, "
                  "or input/machines/*.toml");
  cmd->add_flag("--json", plan.json, "With --all --time: one JSON object per layout, for scripts");
  cmd->add_option("--top", plan.top,
                  "With --all --time: list the N fastest layouts that fit (0: every layout)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--set", plan.overrides, "Override a deck key: --set section.key=value");
  cmd->add_flag("--config", plan.config,
                "Then print the effective configuration as TOML (the deck with its overrides "
                "and defaults, as the planned run would use it)");
}

// meshtrain export CHECKPOINT OUT --format hf.
void add_export_options(CLI::App* cmd, ExportArgs& exp) {
  cmd->add_option("checkpoint", exp.checkpoint, "Checkpoint file (step_*.h5)")->required();
  cmd->add_option("out", exp.out, "Output directory (created if needed)")->required();
  cmd->add_option("--format", exp.format, "Output format: hf (Hugging Face transformers)")
      ->required()->check(CLI::IsMember({"hf"}));
  cmd->add_option("--dtype", exp.dtype, "Element type of the exported tensors: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--max-shard-size", exp.max_shard_size,
                  "Largest weights file, as save_pretrained's max_shard_size (default 5GB; "
                  "also 500MB, 2GiB or bytes): one model.safetensors when all fits, else "
                  "model-0000k-of-0000n.safetensors and model.safetensors.index.json")
      ->check(CLI::Validator([](std::string& v) -> std::string {
        return parse_shard_size(v) ? "" : "not a size (bytes, or a number with KB, MB, GB, KiB, MiB or GiB, e.g. 5GB)";
      }, "SIZE"));

  cmd->add_option("--tokenizer", exp.tokenizer,
                  "The run's tokenizer.json, written into OUT with the tokenizer_config.json and "
                  "special_tokens_map.json beside it (default: no tokenizer files; export never "
                  "opens the path a checkpoint records)");
}

// meshtrain import DIR OUT --format hf.
void add_import_options(CLI::App* cmd, ImportArgs& imp) {
  cmd->add_option("dir", imp.dir, "Directory with config.json and model.safetensors or "
                  "model.safetensors.index.json")->required();
  cmd->add_option("out", imp.out, "Checkpoint file to write (e.g. gpt2.h5)")->required();
  cmd->add_option("--format", imp.format, "Input format: hf (Hugging Face transformers)")
      ->required()->check(CLI::IsMember({"hf"}));
  CLI::Option* deck_opt =
      cmd->add_option("--deck", imp.deck, "Input deck whose [model] the weights must match "
                      "(default: a deck built from config.json)");
  cmd->add_option("--deck-out", imp.deck_out,
                  "Write the deck built from config.json here (its [model] reproduces the "
                  "model; model.seq_len is max_position_embeddings, at most 2048 unless "
                  "--set model.seq_len says otherwise)")
      ->excludes(deck_opt);
  cmd->add_option("--set", imp.overrides, "Override a deck key: --set section.key=value");
  cmd->add_flag("--force", imp.force,
                "Replace OUT (and --deck-out) if it exists (never a directory holding another run's checkpoints)");
}

// meshtrain inspect CHECKPOINT, and meshtrain eval DECK --checkpoint CHECKPOINT.
void add_inspect_options(CLI::App* cmd, InspectArgs& inspect) {
  cmd->add_option("path", inspect.path, "Checkpoint file (step_*.h5)")->required();
}

void add_eval_options(CLI::App* cmd, EvalArgs& eval) {
  cmd->add_option("deck", eval.deck, "Input deck (TOML) describing the model and the layout")->required();
  cmd->add_option("--checkpoint", eval.checkpoint, "Checkpoint file (step_*.h5)")->required();
  cmd->add_option("--set", eval.overrides, "Override a deck key: --set section.key=value (repeatable)");
  // The default six decimals read well; comparing an fp64 run with a reference needs every
  // digit a double holds (17 significant digits need at most 17 decimals for a loss >= 0.1).
  cmd->add_option("--digits", eval.digits, "Decimals of the printed val_loss (default 6)")
      ->check(CLI::Range(0, 17));
  cmd->add_option("--task", eval.tasks,
                  "Multiple-choice task (JSON Lines: {\"context\", \"choices\", \"gold\"} or "
                  "HellaSwag's published form), scored by log-likelihood as lm-evaluation-harness "
                  "does: prints acc and acc_norm (repeatable)");
  cmd->add_option("--results", eval.results, "--task: write the scores as JSON to this file");
  cmd->add_option("--per-choice", eval.per_choice,
                  "--task: write each choice's log-likelihood as JSON Lines to this file");
  cmd->add_option("--max-line-bytes", eval.max_line_bytes,
                  "--task: the longest line read, in bytes (default 67108864, 64 MiB)")
      ->check(integer_in("--max-line-bytes", 1, kMaxLineBytesLimit, "268435456"));
}

// meshtrain diagnose RUN_DIR.
void add_diagnose_options(CLI::App* cmd, DiagnoseArgs& diagnose) {
  cmd->add_option("run_dir", diagnose.run_dir, "Run directory (run.dir, e.g. runs/default)")->required();
}

// Every sub-command's arguments, and the sub-command CLI11 parsed them into.
struct Commands {
  TrainArgs train;
  PrepareArgs prepare;
  BenchArgs bench;
  InspectArgs inspect;
  EvalArgs eval;
  SampleArgs sample;
  PlanArgs plan;
  DiagnoseArgs diagnose;
  ExportArgs exp;
  ImportArgs imp;
  CLI::App *train_cmd, *prepare_cmd, *bench_cmd, *inspect_cmd, *eval_cmd, *sample_cmd, *plan_cmd,
      *diagnose_cmd, *export_cmd, *import_cmd;

  explicit Commands(CLI::App& app)
      : train_cmd(app.add_subcommand("train", "Train a model as an input deck describes")),
        prepare_cmd(app.add_subcommand("prepare", "Turn text or JSON Lines files into token shards")),
        bench_cmd(app.add_subcommand("bench", "Benchmarks, each against this machine's own ceiling")),
        inspect_cmd(app.add_subcommand(
            "inspect", "Show a checkpoint's step, layout, deck and datasets, and verify its checksums")),
        eval_cmd(app.add_subcommand(
            "eval", "Validation loss of a checkpoint, on any layout: prints 'val_loss <value>'; with "
            "--task, multiple-choice accuracy")),
        sample_cmd(add_sample_subcommand(app, sample)),
        plan_cmd(app.add_subcommand(
            "plan", "Predict memory per rank of a deck's layout (or of every layout) before launching")),
        diagnose_cmd(app.add_subcommand(
            "diagnose", "After a hang or abort: merge the ranks' flight records and name where they parted")),
        export_cmd(app.add_subcommand(
            "export", "Write a checkpoint's model for Hugging Face (GPT2LMHeadModel, LlamaForCausalLM, "
                      "Qwen3ForCausalLM, MixtralForCausalLM or Qwen3MoeForCausalLM): config.json and "
                      "model.safetensors, or shards and their index")),
        import_cmd(app.add_subcommand(
            "import", "Turn a Hugging Face GPT-2, Llama, Qwen 3, Mixtral or Qwen3-MoE directory into a "
                      "step-0 checkpoint, to fine-tune with checkpoint.resume")) {
    add_train_options(train_cmd, train);
    add_prepare_options(prepare_cmd, prepare);
    add_bench_options(bench_cmd, bench);
    add_inspect_options(inspect_cmd, inspect);
    add_eval_options(eval_cmd, eval);
    add_plan_options(plan_cmd, plan);
    add_diagnose_options(diagnose_cmd, diagnose);
    add_export_options(export_cmd, exp);
    add_import_options(import_cmd, imp);
    app.add_subcommand("keys", "Print the input-deck reference (every key, its default and range)");
  }

  // Runs the parsed sub-command; returns its exit status.
  int run() {
    if (*train_cmd) return train_command(train);
    if (*prepare_cmd) {
      if (prepare.inputs.empty() && prepare.synthetic_bytes <= 0) {
        std::fprintf(stderr, "meshtrain prepare: give text files, or --synthetic BYTES\n");
        return kExitUsage;
      }
      return prepare_command(prepare);
    }
    if (*bench_cmd) {
      bench.threads_given = bench_cmd->get_option("--threads")->count() > 0;
      bench.steps_given = bench_cmd->get_option("--steps")->count() > 0;
      return bench_command(bench);
    }
    if (*plan_cmd) return plan_command(plan);
    if (*inspect_cmd) return inspect_command(inspect);
    if (*eval_cmd) return eval_command(eval);
    if (*sample_cmd) return sample_command(sample);
    if (*diagnose_cmd) return diagnose_command(diagnose);
    if (*export_cmd) return export_command(exp);
    if (*import_cmd) return import_command(imp);
    return keys_command();
  }
};

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  using namespace meshtrain;
  CLI::App app{"meshtrain " MESHTRAIN_VERSION
               ": hybrid-parallel GPT training on MPI. Run every rank with the same deck:\n"
               "  mpiexec -n 8 meshtrain train input/default.toml"};
  app.require_subcommand(1);
  // Usage errors start like every other error, so that logs and tests find them the same way.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "meshtrain: error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  Commands commands(app);
  // --help names the pages that explain each command (docs/ by topic).
  app.footer(docs_footer(""));
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    sub->footer(docs_footer(sub->get_name()));

  if (refuse_unknown_subcommand(app, argc, argv)) return kExitUsage;
  if (refuse_thread_environment()) return kExitInput;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? kExitOk : kExitUsage;
  }
  return commands.run();
}
