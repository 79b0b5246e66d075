#!/usr/bin/env python3
"""PyTorch baseline for meshtrain's CPU step benchmark: GPT-2 124M training on the CPU.

README
------
`meshtrain bench --suite step` times meshtrain's training step on this CPU; this script times
the same step in PyTorch on the same machine and threads, so the two can be put side by side
(bench/cpu/run.sh runs both and prints meshtrain's ratio). The model is the suite's: GPT-2 small
(12 layers, 12 heads, 768 channels, vocabulary 50257 unpadded, context T = 256, tied
embeddings, tanh GELU), micro-batch 4, AdamW (betas 0.9/0.95, weight decay 0.1) with the
gradient norm clipped to 1, as meshtrain's deck defaults. Precisions: fp32, and bf16 autocast
(torch.autocast on the CPU: bf16 matmuls, fp32 master weights and optimizer). Attention is
F.scaled_dot_product_attention where PyTorch has it (2.0 and later), otherwise the explicit
masked softmax of full T x T products (what meshtrain computes too). Each thread count
(torch.set_num_threads) and precision gets one untimed step, then --steps timed steps; the
median step is reported, with tokens per second and GFLOP/s by meshtrain's FLOP count (PaLM:
6 x multiplying parameters + 12 L C T per token).

  python3 bench/cpu/compare_pytorch.py --threads 1,2 --steps 4 --json runs/pytorch-cpu.json

Output follows meshtrain's benchmark format: '#' header lines, then rows of fixed columns. Exit
status: 0 when every row is right; 1 when a result is wrong (a non-finite loss, or a first loss
off log(50257) by 0.5 or more); 77 when PyTorch is not installed (nothing was measured).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

EXIT_NO_PYTORCH = 77

LAYERS, HEADS, CHANNELS, VOCAB, SEQ, MICRO_BATCH = 12, 12, 768, 50257, 256, 4


def flops_per_token():
    """meshtrain's ModelSpec::flops_per_token for the model above."""
    c = CHANNELS
    block = 2 * 2 * c + 3 * c * c + 3 * c + c * c + c + 4 * c * c + 4 * c + 4 * c * c + c
    multiplying = VOCAB * c + LAYERS * block + 2 * c  # the position table is a lookup
    return 6.0 * multiplying + 12.0 * LAYERS * CHANNELS * SEQ


def time_steps(torch, GPT2, threads, precision, steps):
    """Median seconds of `steps` training steps after one untimed step, and every loss."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                  weight_decay=0.1, eps=1e-8)
    tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    seconds, losses = [], []
    for s in range(steps + 1):
        start = time.perf_counter()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16,
                            enabled=precision == "bf16"):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if s > 0:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated thread counts (torch.set_num_threads), e.g. 1,2")
    parser.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 (autocast) or both")
    parser.add_argument("--steps", type=int, default=4, help="timed steps (median reported)")
    parser.add_argument("--json", default="", help="also write the rows here")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t]
    precisions = [p for p in args.precision.split(",") if p]
    if any(t < 1 for t in threads) or not threads or args.steps < 1 or \
            any(p not in ("fp32", "bf16") for p in precisions) or not precisions:
        parser.error("--threads needs positive counts, --steps at least 1, --precision fp32/bf16")

    try:
        import torch
    except ImportError as e:
        print(f"# PyTorch is not installed ({e}): nothing measured. Install it to compare "
              f"(Debian: apt-get install python3-torch; elsewhere: pip install torch); exit "
              f"status {EXIT_NO_PYTORCH}", file=sys.stderr)
        return EXIT_NO_PYTORCH

    # The model is shared with the GPU baseline and the export test (bench/gpt2_torch.py).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import gpt2_torch
    has_sdpa = gpt2_torch.SDPA is not None

    def GPT2():
        return gpt2_torch.GPT2(vocab=VOCAB, context=SEQ, layers=LAYERS, heads=HEADS,
                               channels=CHANNELS)
    fpt = flops_per_token()
    tokens = MICRO_BATCH * SEQ
    print(f"# pytorch {torch.__version__} on the CPU ({os.cpu_count()} cores visible), GPT-2 "
          f"124M (vocabulary {VOCAB}, tied), T {SEQ}, micro-batch {MICRO_BATCH}, AdamW, "
          f"attention {'SDPA' if has_sdpa else 'explicit masked softmax'}; median of "
          f"{args.steps} steps after 1 untimed; {fpt * tokens / 1e9:.1f} GFLOP per step (PaLM, "
          f"as meshtrain counts); wrong: a non-finite loss or a first loss off log V by 0.5")
    print(f"# {'name':<26} {'threads':>8} {'tokens':>8} {'time_ms':>9} {'tokens/s':>9} "
          f"{'GFLOP/s':>8} {'loss0':>7} {'wrong':>6}")
    rows, wrong_total = [], 0
    for t in threads:
        for precision in precisions:
            seconds, losses = time_steps(torch, GPT2, t, precision, args.steps)
            wrong = int(abs(losses[0] - math.log(VOCAB)) >= 0.5) + \
                sum(0 if math.isfinite(x) else 1 for x in losses)
            wrong_total += wrong
            name = f"pytorch {precision}, {t} thread{'s' if t > 1 else ''}"
            row = {"name": name, "threads": t, "precision": precision, "tokens": tokens,
                   "time_ms": seconds * 1e3, "tokens/s": tokens / seconds,
                   "GFLOP/s": fpt * tokens / seconds / 1e9, "first_loss": losses[0],
                   "wrong": wrong}
            rows.append(row)
            print(f"  {name:<26} {t:8d} {tokens:8d} {row['time_ms']:9.1f} "
                  f"{row['tokens/s']:9.1f} {row['GFLOP/s']:8.1f} {losses[0]:7.3f} {wrong:6d}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"framework": "pytorch " + torch.__version__, "rows": rows}, f, indent=2)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
