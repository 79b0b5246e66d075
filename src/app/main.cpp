// meshtrain: hybrid-parallel (data, tensor, pipeline) GPT training on MPI.

#include <CLI/CLI.hpp>

#include "meshtrain/app/commands.h"

int main(int argc, char** argv) {
  using namespace meshtrain;
  CLI::App app{"meshtrain " MESHTRAIN_VERSION
               ": hybrid-parallel GPT training on MPI. Run every rank with the same deck:\n"
               "  mpiexec -n 8 meshtrain train input/default.toml"};
  app.require_subcommand(1);

  TrainArgs train;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a model as an input deck describes");
  train_cmd->add_option("deck", train.deck, "Input deck (TOML), e.g. input/default.toml")->required();
  train_cmd->add_option("--set", train.overrides,
                        "Override a deck key: --set section.key=value (repeatable)");

  PrepareArgs prepare;
  CLI::App* prepare_cmd = app.add_subcommand("prepare", "Turn text files into token shards (byte-level)");
  prepare_cmd->add_option("inputs", prepare.inputs, "Text files");
  prepare_cmd->add_option("--out", prepare.out_prefix,
                          "Output prefix: writes <prefix>_train.bin and <prefix>_val.bin")->required();
  prepare_cmd->add_option("--val-fraction", prepare.val_fraction,
                          "Fraction of each file kept for validation")->check(CLI::Range(0.0, 1.0));
  prepare_cmd->add_option("--synthetic", prepare.synthetic_bytes,
                          "Write the built-in generated corpus of this many bytes instead");

  BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "Benchmarks, each against this machine's own ceiling");
  bench_cmd->add_option("--suite", bench.suite, "step, comm, pipeline, zero, checkpoint, gpu or all")
      ->check(CLI::IsMember({"step", "comm", "pipeline", "zero", "checkpoint", "gpu", "all"}));
  bench_cmd->add_option("--threads", bench.threads, "Threads per rank")->check(CLI::PositiveNumber);
  bench_cmd->add_option("--steps", bench.steps, "Timed steps (median reported)")->check(CLI::PositiveNumber);
  bench_cmd->add_option("--json", bench.json, "Also write the results as JSON to this file");
  bench_cmd->add_option("--dir", bench.dir, "Directory for the checkpoint suite's files");

  InspectArgs inspect;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect", "Show a checkpoint's step, layout, deck and datasets, and verify its checksums");
  inspect_cmd->add_option("path", inspect.path, "Checkpoint file (step_*.h5)")->required();

  EvalArgs eval;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Validation loss of a checkpoint, on any layout: prints 'val_loss <value>'");
  eval_cmd->add_option("deck", eval.deck, "Input deck (TOML) describing the model and the layout")->required();
  eval_cmd->add_option("--checkpoint", eval.checkpoint, "Checkpoint file (step_*.h5)")->required();
  eval_cmd->add_option("--set", eval.overrides,
                       "Override a deck key: --set section.key=value (repeatable)");

  PlanArgs plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Predict memory per rank of a deck's layout (or of every layout) before launching");
  plan_cmd->add_option("deck", plan.deck, "Input deck (TOML)")->required();
  plan_cmd->add_option("--world", plan.world, "Ranks of the job to plan")->required()->check(CLI::PositiveNumber);
  plan_cmd->add_flag("--all", plan.all, "Plan every valid layout for --world ranks, lowest peak first");
  plan_cmd->add_option("--memory", plan.memory,
                       "Memory per rank (e.g. 16GiB, 80G): refuse layouts that do not fit");
  plan_cmd->add_option("--threads", plan.threads, "Threads per rank of the planned run");
  plan_cmd->add_option("--device", plan.device, "Device of the planned run: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  plan_cmd->add_option("--set", plan.overrides, "Override a deck key: --set section.key=value");

  DiagnoseArgs diagnose;
  CLI::App* diagnose_cmd = app.add_subcommand(
      "diagnose", "After a hang or abort: merge the ranks' flight records and name where they parted");
  diagnose_cmd->add_option("run_dir", diagnose.run_dir, "Run directory (run.dir, e.g. runs/default)")
      ->required();

  app.add_subcommand("keys", "Print the input-deck reference (every key, its default and range)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? kExitOk : kExitUsage;
  }
  if (*train_cmd) return train_command(train);
  if (*prepare_cmd) {
    if (prepare.inputs.empty() && prepare.synthetic_bytes <= 0) {
      std::fprintf(stderr, "meshtrain prepare: give text files, or --synthetic BYTES\n");
      return kExitUsage;
    }
    return prepare_command(prepare);
  }
  if (*bench_cmd) return bench_command(bench);
  if (*plan_cmd) return plan_command(plan);
  if (*inspect_cmd) return inspect_command(inspect);
  if (*eval_cmd) return eval_command(eval);
  if (*diagnose_cmd) return diagnose_command(diagnose);
  return keys_command();
}
