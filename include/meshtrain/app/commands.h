#pragma once
// The sub-commands of the meshtrain binary. Each returns the process exit status:
//   0 success;
//   1 bad input (deck, data, layout, an unwritable run directory) — every rank reports the
//     same error — or memory exhausted on a rank (std::bad_alloc; that rank reports it);
//   2 command-line usage; 3 a communication timed out (job aborted with a diagnosis);
//   4 an internal error (a bug: please report it);
//   5 the run diverged (loss or gradient norm not finite): change the deck's optimisation
//     settings, then train again;
//   75 (EX_TEMPFAIL) stopped early on SIGUSR1, SIGTERM or the stop file (after writing a
//     checkpoint, or during start-up before the first step): run again (requeue) to resume.

#include <string>
#include <vector>

#include "meshtrain/io/jsonl_documents.h"

namespace CLI {
class App;
}

namespace meshtrain {

inline constexpr int kExitOk = 0, kExitInput = 1, kExitUsage = 2, kExitTimeout = 3, kExitInternal = 4;
inline constexpr int kExitDiverged = 5;
inline constexpr int kExitHardwareFault = 6;  // train/hardware_fault.h
inline constexpr int kExitRequeue = 75;

struct TrainArgs {
  std::string deck;
  std::vector<std::string> overrides;  // --set section.key=value
};
int train_command(const TrainArgs& args);

struct PrepareArgs {
  std::vector<std::string> inputs;  // text files and JSON Lines files
  std::string out_prefix;
  double val_fraction = 0.1;
  long long synthetic_bytes = 0;    // > 0: generate the built-in corpus instead
  std::string tokenizer = "bytes";  // --tokenizer: io/tokenizer.h open_tokenizer()
  std::string train_tokenizer;      // --train-tokenizer "bpe:8000" / "unigram:8000"
  int threads = 0;                  // 0: every core
  std::string text_field = "text";  // JSON Lines inputs: the field holding the document
  long long max_bad_lines = 0;      // JSON Lines inputs: bad lines skipped before an error
  long long max_line_bytes = kDefaultMaxLineBytes;  // JSON Lines inputs: a longer line is bad
  bool end_of_text = false;         // --end-of-text: the tokenizer's token after every document
  bool force = false;               // --force: replace existing outputs (never an input)
};
int prepare_command(const PrepareArgs& args);

struct BenchArgs {
  std::string suite = "step";  // step, comm, pipeline, zero, checkpoint, gpu, calibrate, hetero, context, moe, attention, all
  int threads = 2;
  // --threads given: calibrate measures at args.threads; else at the threads `train` would run
  // on this launch (run_setup.h training_threads), which the time model prices training with.
  bool threads_given = false;
  int steps = 4;
  // --steps given: the suites with a floor of their own (async, hetero: enough steps for a
  // figure on a noisy machine) take it as given, so that a test can run every row briefly.
  bool steps_given = false;
  std::string model = "gpt2";  // the step suite's model: gpt2 (GPT-2 124M) or tiny (tests)
  std::string json;            // also write results as JSON here
  std::string dir = "runs/bench";  // where the checkpoint suite writes its files
  std::string out;  // the calibrate suite writes its machine profile here ("": not written)
  int passes = 3;   // calibrate: measurements of every point, interleaved; the median is kept
};
int bench_command(const BenchArgs& args);

struct PlanArgs {
  std::string deck;
  std::vector<std::string> overrides;
  int world = 1;
  bool all = false;
  std::string memory;  // budget per rank, e.g. "16GiB"
  int threads = 0;     // threads per rank of the planned run (0: run.threads, else 1)
  std::string device;  // "cpu" or "cuda": the device of the planned run (default: the deck's, else cpu)
  bool config = false; // also print the effective configuration (dump_config), after the plan
  bool time = false;    // also predict step time (needs profile)
  std::string profile;  // machine profile (TOML) the time is predicted on
  bool json = false;    // --all --time: one JSON object per layout
  int top = 10;         // --all --time: layouts to plan memory for and list (0: every one)
};
int plan_command(const PlanArgs& args);

int keys_command();

// Prints a checkpoint's attributes and datasets and verifies every checksum (one rank).
struct InspectArgs {
  std::string path;
};
int inspect_command(const InspectArgs& args);

// Loads a checkpoint into the deck's model, on any layout, and prints "val_loss <value>".
struct EvalArgs {
  std::string deck;
  std::string checkpoint;
  std::vector<std::string> overrides;
  int digits = 6;  // decimals of the printed val_loss
  std::vector<std::string> tasks;  // --task: multiple-choice task files (io/choice_tasks.h)
  std::string results;             // --results: the task scores as JSON
  std::string per_choice;          // --per-choice: each choice's log-likelihood, JSON Lines
  long long max_line_bytes = kDefaultMaxLineBytes;  // --task: a longer line is refused
};
int eval_command(const EvalArgs& args);

// Generates text from a checkpoint and prints prompt + continuation (app/sample_command.cpp).
struct SampleArgs {
  std::string deck;
  std::string checkpoint;
  std::string prompt;
  int tokens = 64;
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: off
  unsigned long long seed = 0;
  std::string tokenizer;     // empty: the deck's data.tokenizer
  std::vector<std::string> overrides;
};
int sample_command(const SampleArgs& args);
// Registers `sample` and its options on the command line, filling `args`.
CLI::App* add_sample_subcommand(CLI::App& app, SampleArgs& args);

// Merges the flight records of a run directory (<run.dir>/flight/) and names where the ranks of a
// group parted ways. Needs no MPI: run it on a login node after a failed job.
struct DiagnoseArgs {
  std::string run_dir;
};
int diagnose_command(const DiagnoseArgs& args);

// Writes a checkpoint's model as a Hugging Face directory (one rank): GPT2LMHeadModel,
// LlamaForCausalLM or Qwen3ForCausalLM, as save_pretrained writes them (config.json, the
// weights in one model.safetensors or in shards with their index; Llama and Qwen 3 also
// generation_config.json), and the tokenizer files `tokenizer` names.
struct ExportArgs {
  std::string checkpoint;
  std::string format = "hf";
  std::string out;
  std::string dtype = "fp32";  // fp32 or bf16
  std::string max_shard_size = "5GB";  // as save_pretrained's max_shard_size: "5GB", "500MB"
  // --tokenizer: the run's tokenizer.json, written with its tokenizer_config.json and
  // special_tokens_map.json from beside it; empty: none (the checkpoint's path is not opened).
  std::string tokenizer;
};
int export_command(const ExportArgs& args);

// Reads a Hugging Face GPT-2, Llama or Qwen 3 directory (config.json, model.safetensors or a
// sharded index), checks it against the deck's model (or builds the deck from config.json) and
// writes a step-0 meshtrain checkpoint that `train` resumes (one rank).
struct ImportArgs {
  std::string format = "hf";
  std::string dir;
  std::string deck;      // empty: built from config.json
  std::string deck_out;  // where to write the deck built from config.json (without --deck)
  std::string out;
  std::vector<std::string> overrides;
  bool force = false;  // replace an existing `out` (never another run's checkpoints beside it)
};
int import_command(const ImportArgs& args);

}  // namespace meshtrain
