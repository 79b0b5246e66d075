#!/usr/bin/env python3
"""input/llama-tiny.toml, the deck a new user trains a Llama with, trains as shipped and samples.

On 4 ranks (dp 1 x tp 2 x pp 2, sequence parallel, grouped-query attention split over tp), 100 of
its 300 steps: the validation loss falls from ~5.5 (uniform over 256 bytes) below 2.0 and keeps
falling between its evaluations at steps 50 and 100; the step-100 checkpoint then continues a
prompt with `sample` (greedy, one rank), which must print the prompt and 32 generated tokens'
worth of bytes. The block's numerics are proven elsewhere (finite differences, the parity
matrix, the HF reference); this proves the shipped deck itself: its keys, layout and data.

usage: tiny_llama_deck_test.py --meshtrain BIN --mpiexec MPIEXEC
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--meshtrain", required=True)
ap.add_argument("--mpiexec", required=True)
args = ap.parse_args()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECK = os.path.join(REPO, "input", "llama-tiny.toml")

with tempfile.TemporaryDirectory() as tmp:
    run_dir = os.path.join(tmp, "run")
    train = [args.mpiexec, "-n", "4", args.meshtrain, "train", DECK, "--set", "train.steps=100",
             "--set", "checkpoint.every=100", "--set", f"run.dir=\"{run_dir}\""]
    p = subprocess.run(train, capture_output=True, text=True, timeout=500)
    print(p.stdout[-3000:])
    if p.returncode != 0:
        print(p.stderr[-3000:])
        sys.exit(f"training input/llama-tiny.toml exited {p.returncode}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        val = [json.loads(line) for line in f if '"val_loss"' in line]
    losses = [v["val_loss"] for v in val]
    print("val_loss by evaluation:", losses)
    if len(losses) != 2 or not losses[1] < losses[0] or not losses[1] < 2.0:
        sys.exit(f"validation losses {losses} at steps 50 and 100: expected falling, below 2.0")

    checkpoint = os.path.join(run_dir, "checkpoints", "step_00000100.h5")
    s = subprocess.run([args.meshtrain, "sample", DECK, "--checkpoint", checkpoint, "--prompt",
                        "The ", "--tokens", "32", "--set", "run.threads=1"],
                       capture_output=True, text=True, timeout=120)
    print(s.stdout, s.stderr[-2000:])
    text = [line for line in s.stdout.splitlines() if line.startswith("The ")]
    if s.returncode != 0 or not text or len(text[0].encode()) < len("The ") + 8:
        sys.exit(f"sample exited {s.returncode}; expected the prompt continued: {s.stdout!r}")
print("llama-tiny trains and samples")
