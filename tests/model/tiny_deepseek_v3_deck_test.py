#!/usr/bin/env python3
"""input/deepseek-v3-tiny.toml, the deepseek_v3 family's tiny deck, trains as shipped.

On 2 ranks (dp 2 with the experts split over them, ep 2), 100 of its 200 steps: the validation
loss falls from ~5.5 (uniform over 256 bytes) between its evaluations at steps 50 and 100 and
ends below 2.5; every logged step writes the experts' record for its 3 mixture layers (after
the dense first block, and the multi-token prediction depth's block, layer 3) of 8 experts,
every token routed to 2, the tokens adding up; and the depth's loss (mtp_loss), which falls too. The
family's numerics are proven elsewhere (the latent attention's and the group-limited router's
finite differences, the parity matrix); this proves the shipped deck and the family's defaults
under it.

usage: tiny_deepseek_v3_deck_test.py --meshtrain BIN --mpiexec MPIEXEC
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
DECK = os.path.join(REPO, "input", "deepseek-v3-tiny.toml")

with tempfile.TemporaryDirectory() as tmp:
    run_dir = os.path.join(tmp, "run")
    stdout, records = shipped_deck.train(args.meshtrain, args.mpiexec, DECK, 2, run_dir, 100)
    shipped_deck.expect_falling_validation(records, 2, 2.5)
    experts = [r for r in records if "expert_tokens" in r]
    if not experts:
        sys.exit("no expert records in metrics.jsonl")
    tokens_per_step = 16 * 64 * 2  # global batch x seq_len x top_k, per layer
    for r in experts:
        shipped_deck.expect_expert_record(r, [1, 2, 3], 8, tokens_per_step)
    mtp = [r["mtp_loss"] for r in records if "mtp_loss" in r]
    if len(mtp) < 2 or not mtp[-1] < mtp[0] - 1.0:
        sys.exit(f"mtp_loss {mtp[:1]} ... {mtp[-1:]}: expected a record each logged step, falling by over 1")
print("deepseek-v3-tiny trains")
