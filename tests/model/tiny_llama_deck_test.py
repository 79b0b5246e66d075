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
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import shipped_deck  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--meshtrain", required=True)
ap.add_argument("--mpiexec", required=True)
args = ap.parse_args()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECK = os.path.join(REPO, "input", "llama-tiny.toml")

with tempfile.TemporaryDirectory() as tmp:
    run_dir = os.path.join(tmp, "run")
    _, records = shipped_deck.train(args.meshtrain, args.mpiexec, DECK, 4, run_dir, 100)
    shipped_deck.expect_falling_validation(records, 2, 2.0)
    shipped_deck.expect_sample(args.meshtrain, DECK,
                               os.path.join(run_dir, "checkpoints", "step_00000100.h5"))
print("llama-tiny trains and samples")
