#!/usr/bin/env python3
"""input/moe-tiny.toml, the deck a new user trains a mixture of experts with, trains as shipped.

On 2 ranks (dp 2 with the experts split over them, ep 2: the rows travel by all-to-all), 100 of
its 300 steps, with a greedy sample every 50 (generation through the expert exchange): the validation loss falls from ~5.5 (uniform over 256 bytes) below 2.0 and keeps
falling between its evaluations at steps 50 and 100; every logged step writes the experts'
record (3 mixture layers of 8 experts, every token routed to 2: the tokens add up), whose
balance is reported on the step line; the routing, near collapse early on (the extreme is
E / top_k = 4: every token on the same 2 experts), is pulled back by the load-balancing loss to
below 2.5 at step 100; scripts/plot-run.py draws plots/experts.png from it; and the
step-100 checkpoint continues a prompt with `sample` on one rank (which holds every expert: the
checkpoint's experts are global tensors). The layer's numerics are proven elsewhere
(finite differences, the parity matrix); this proves the shipped deck, its keys and its log.

usage: tiny_moe_deck_test.py --meshtrain BIN --mpiexec MPIEXEC
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import shipped_deck  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--meshtrain", required=True)
ap.add_argument("--mpiexec", required=True)
args = ap.parse_args()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECK = os.path.join(REPO, "input", "moe-tiny.toml")

with tempfile.TemporaryDirectory() as tmp:
    run_dir = os.path.join(tmp, "run")
    stdout, records = shipped_deck.train(args.meshtrain, args.mpiexec, DECK, 2, run_dir, 100,
                                         ["train.sample_every=50"])
    samples = [line for line in stdout.splitlines() if "| sample: " in line]
    if len(samples) != 2:
        sys.exit(f"expected the samples of steps 50 and 100, got {samples}")
    if "experts max/mean" not in stdout:
        sys.exit("the step lines do not report the experts' balance")
    shipped_deck.expect_falling_validation(records, 2, 2.0)
    experts = [r for r in records if "expert_tokens" in r]
    logged = [r["step"] for r in records if "loss" in r and "val_loss" not in r]
    if [r["step"] for r in experts] != logged:
        sys.exit(f"expert records at steps {[r['step'] for r in experts]}, step lines at {logged}")
    tokens_per_step = 16 * 128 * 2  # global batch x seq_len x top_k, per layer
    for r in experts:
        shipped_deck.expect_expert_record(r, [1, 2, 3], 8, tokens_per_step)
        if not all(1.0 <= b <= 4.0 for b in r["expert_balance"]):
            sys.exit(f"step {r['step']}: balance {r['expert_balance']} outside [1, 4]")
        if not all(x > 0 for x in r["moe_load_balance_loss"]):
            sys.exit(f"step {r['step']}: load-balancing losses {r['moe_load_balance_loss']}")
    print("balance (max/mean) by logged step:",
          [round(max(r["expert_balance"]), 3) for r in experts])
    if not max(experts[-1]["expert_balance"]) < 2.5:
        sys.exit(f"balance {experts[-1]['expert_balance']} at step 100: the load-balancing loss "
                 f"did not pull the routing back below 2.5")

    plot = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "plot-run.py"), run_dir],
                          capture_output=True, text=True, timeout=120)
    print(plot.stdout, plot.stderr[-2000:])
    if plot.returncode != 0 or not os.path.isfile(os.path.join(run_dir, "plots", "experts.png")):
        sys.exit("scripts/plot-run.py drew no plots/experts.png")

    shipped_deck.expect_sample(args.meshtrain, DECK,
                               os.path.join(run_dir, "checkpoints", "step_00000100.h5"))
print("moe-tiny trains, logs its experts and samples")
