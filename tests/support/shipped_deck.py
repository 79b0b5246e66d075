"""What the tests of a shipped deck (tests/model/tiny_*_deck_test.py) share: train the deck as
shipped, for fewer steps, on local ranks; hold its validation loss to falling and below a bound;
continue a prompt from its checkpoint with `sample`. Each failure exits naming the deck."""
import json
import os
import subprocess
import sys


def train(meshtrain, mpiexec, deck, ranks, run_dir, steps, extra=()):
    """The deck trained for `steps` steps, a checkpoint at the last, with the deck keys `extra`
    ("section.key=value") set; returns (stdout, records of metrics.jsonl)."""
    command = [mpiexec, "-n", str(ranks), meshtrain, "train", deck, "--set", f"train.steps={steps}",
               "--set", f"checkpoint.every={steps}", "--set", f"run.dir=\"{run_dir}\""]
    for key in extra:
        command += ["--set", key]
    p = subprocess.run(command, capture_output=True, text=True, timeout=500)
    print(p.stdout[-3000:])
    if p.returncode != 0:
        print(p.stderr[-3000:])
        sys.exit(f"training {os.path.basename(deck)} exited {p.returncode}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return p.stdout, [json.loads(line) for line in f if line.strip()]


def expect_falling_validation(records, evaluations, below):
    losses = [r["val_loss"] for r in records if "val_loss" in r]
    print("val_loss by evaluation:", losses)
    if len(losses) != evaluations or not losses[-1] < losses[0] or not losses[-1] < below:
        sys.exit(f"validation losses {losses}: expected {evaluations}, falling, below {below}")


def expect_expert_record(r, layers, experts, tokens_per_step):
    """One logged step's experts' record: the mixture `layers`, `experts` counts for each, and
    every layer's counts adding up to the step's routed tokens (global batch x seq_len x top_k)."""
    if r["moe_layers"] != layers or r["experts"] != experts or \
            len(r["expert_tokens"]) != experts * len(layers):
        sys.exit(f"expert record of step {r['step']}: layers {r['moe_layers']}, "
                 f"{r['experts']} experts, {len(r['expert_tokens'])} counts")
    for i, layer in enumerate(layers):
        routed = sum(r["expert_tokens"][experts * i:experts * (i + 1)])
        if routed != tokens_per_step:
            sys.exit(f"step {r['step']} layer {layer}: {routed} tokens routed, "
                     f"expected {tokens_per_step}")


def expect_sample(meshtrain, deck, checkpoint):
    """Greedy `sample` on one rank continues "The " with 32 tokens' worth of bytes."""
    s = subprocess.run([meshtrain, "sample", deck, "--checkpoint", checkpoint, "--prompt", "The ",
                        "--tokens", "32", "--set", "run.threads=1"],
                       capture_output=True, text=True, timeout=120)
    print(s.stdout, s.stderr[-2000:])
    text = [line for line in s.stdout.splitlines() if line.startswith("The ")]
    if s.returncode != 0 or not text or len(text[0].encode()) < len("The ") + 8:
        sys.exit(f"sample exited {s.returncode}; expected the prompt continued: {s.stdout!r}")
