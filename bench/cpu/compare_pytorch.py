#!/usr/bin/env python3
"""PyTorch baseline for meshtrain's CPU step benchmark: GPT-2 124M or Llama 3's block at the same
sizes, trained on the CPU, eager and compiled.

README
------
`meshtrain bench --suite step [--model llama]` times meshtrain's training step on this CPU; this
script times the same step in PyTorch on the same machine and threads, so the two can be put side
by side (bench/cpu/run.sh runs both and prints meshtrain's ratio). The models are the suite's
(src/app/bench_step.cpp), micro-batch 4, context T = 256, vocabulary 50257 unpadded:
  --model gpt2   GPT-2 small (bench/gpt2_torch.py): 12 layers, 12 heads, 768 channels, learned
                 positions, LayerNorm, tanh GELU 4 x d_model wide, biases, tied embeddings;
  --model llama  Llama 3's block at GPT-2 small's sizes (bench/llama_torch.py): 12 layers,
                 d_model 768, 12 query heads and 4 key/value heads of 64, RMSNorm (eps 1e-5),
                 rotary positions (base 500000), SwiGLU 2048 wide, no biases, untied head.
The optimizer is AdamW (betas 0.9/0.95, weight decay 0.1; PyTorch's fused CPU kernel where it has
one, 2.4 and later) with the gradient norm clipped to 1, as meshtrain's deck defaults.
Precisions: fp32, and bf16 autocast (torch.autocast on the CPU: bf16 matmuls, fp32 master weights
and optimizer). Attention is F.scaled_dot_product_attention where PyTorch has it (2.0 and later),
otherwise the explicit masked softmax of full T x T products (what meshtrain computes too).

Modes (--mode, default both): eager, and torch.compile of the model (Inductor's default mode:
forward, loss and backward compiled; the optimizer step and clipping run eager). Each (threads,
precision, mode) gets a fresh model (torch.set_num_threads first, so compiled kernels are built
for that thread count), its untimed warm-up steps (eager: 1; compile: 2, the first of which
compiles; warmup_s is their time), then --steps timed steps; the median step is reported, with
tokens per second and GFLOP/s by meshtrain's FLOP count (PaLM: 6 x multiplying parameters + 12 L
C T per token). PyTorch's figure is the faster of the two modes; run.sh prints both. Compiling on
the CPU needs a C++ compiler: where it fails, a '#' line says why and the eager rows stand.

  python3 bench/cpu/compare_pytorch.py --model llama --threads 1,2 --steps 4 --json runs/pt.json

The judges' environment (scripts/judges.py path) has a current PyTorch; run.sh uses it. --tiny
swaps in the step suite's tiny models (meshtrain's --model tiny / tiny-llama), for tests: its
speeds mean nothing.

Output follows meshtrain's benchmark format: '#' header lines, then rows of fixed columns. Exit
status: 0 when every row is right; 1 when a result is wrong (a non-finite loss, or a first loss
off log V by 0.5 or more); 77 when PyTorch is not installed (nothing was measured).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

EXIT_NO_PYTORCH = 77
MICRO_BATCH = 4
WARMUP_STEPS = {"eager": 1, "compile": 2}

# The step suite's models (src/app/bench_step.cpp, step_model): the figures' and the tests' tiny
# ones. Llama: kv_heads = heads / 3 and ffn = 8 d_model / 3, as llama_step_spec.
SHAPES = {
    ("gpt2", False): dict(layers=12, heads=12, channels=768, vocab=50257, seq=256),
    ("gpt2", True): dict(layers=2, heads=2, channels=64, vocab=256, seq=32),
    ("llama", False): dict(layers=12, heads=12, kv_heads=4, channels=768, ffn=2048, vocab=50257,
                           seq=256),
    ("llama", True): dict(layers=2, heads=3, kv_heads=1, channels=48, ffn=128, vocab=256, seq=32),
}


def flops_per_token(model, s):
    """meshtrain's ModelSpec::flops_per_token: 6 x the parameters that multiply (not the position
    table, nor an untied token table, which are looked up) + attention, 12 x L x NH x HS x T."""
    c, layers = s["channels"], s["layers"]
    if model == "gpt2":
        block = 2 * 2 * c + 3 * c * c + 3 * c + c * c + c + 4 * c * c + 4 * c + 4 * c * c + c
        multiplying = s["vocab"] * c + layers * block + 2 * c  # LayerNorm: weight and bias
    else:
        kv = s["kv_heads"] * (c // s["heads"])
        block = 2 * c + c * c + 2 * c * kv + c * c + 3 * c * s["ffn"]  # norms, q, k v, o, SwiGLU
        multiplying = s["vocab"] * c + layers * block + c  # the head, the blocks, the final norm
    return 6.0 * multiplying + 12.0 * layers * c * s["seq"]


def model_builder(model, s):
    """A function that builds the model, and a line that says what it is."""
    # The models live beside the other PyTorch baselines (bench/gpt2_torch.py, llama_torch.py).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if model == "gpt2":
        import gpt2_torch
        return (lambda: gpt2_torch.GPT2(vocab=s["vocab"], context=s["seq"], layers=s["layers"],
                                        heads=s["heads"], channels=s["channels"]),
                f"GPT-2 ({s['layers']} layers, d {s['channels']}, {s['heads']} heads, tied)")
    import llama_torch
    return (lambda: llama_torch.Llama(vocab=s["vocab"], context=s["seq"], layers=s["layers"],
                                      heads=s["heads"], kv_heads=s["kv_heads"],
                                      channels=s["channels"], ffn_hidden=s["ffn"]),
            f"Llama block ({s['layers']} layers, d {s['channels']}, {s['heads']} heads, "
            f"{s['kv_heads']} kv heads, SwiGLU {s['ffn']}, untied)")


def adamw(torch, params):
    """AdamW as meshtrain's deck defaults, fused where PyTorch has a CPU kernel for it (2.4+)."""
    kwargs = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **kwargs), "for-each"


def optimizer_kind(torch):
    return adamw(torch, [torch.nn.Parameter(torch.zeros(1))])[1]


def time_steps(torch, build, s, threads, precision, mode, steps):
    """Median seconds of `steps` training steps after the mode's untimed warm-up, the seconds of
    that warm-up, and every loss. A failed compile raises (from the first step)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build()
    optimizer, _ = adamw(torch, model.parameters())
    if mode == "compile":
        torch._dynamo.reset()  # nothing cached from another thread count or precision
        model = torch.compile(model)
    tokens = torch.randint(0, s["vocab"], (MICRO_BATCH, s["seq"] + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    warmup = WARMUP_STEPS[mode]
    seconds, losses, warmup_seconds = [], [], 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16,
                            enabled=precision == "bf16"):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        elapsed = time.perf_counter() - start
        if step < warmup:
            warmup_seconds += elapsed
        else:
            seconds.append(elapsed)
    return statistics.median(seconds), warmup_seconds, losses


def first_line(error, limit=300):
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:limit]}"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt2", choices=("gpt2", "llama"),
                        help="the step suite's model: gpt2 (GPT-2 124M) or llama (Llama 3's "
                             "block at the same sizes, meshtrain's --model llama)")
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated thread counts (torch.set_num_threads), e.g. 1,2")
    parser.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 (autocast) or both")
    parser.add_argument("--mode", default="eager,compile",
                        help="eager, compile (torch.compile) or both")
    parser.add_argument("--steps", type=int, default=4, help="timed steps (median reported)")
    parser.add_argument("--json", default="", help="also write the rows here")
    parser.add_argument("--tiny", action="store_true",
                        help="tests only: the step suite's tiny model (meshtrain's --model tiny "
                             "or tiny-llama); speeds meaningless")
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",") if t]
    args.precision = [p for p in args.precision.split(",") if p]
    args.mode = [m for m in args.mode.split(",") if m]
    if not args.threads or any(t < 1 for t in args.threads) or args.steps < 1 or \
            not args.precision or any(p not in ("fp32", "bf16") for p in args.precision) or \
            not args.mode or any(m not in WARMUP_STEPS for m in args.mode):
        parser.error("--threads needs positive counts, --steps at least 1, --precision fp32/bf16, "
                     "--mode eager/compile")
    return args


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"# PyTorch is not installed ({e}): nothing measured. Install it to compare (the "
              f"judges' environment has it: python3 scripts/judges.py ensure, then its "
              f"bin/python; Debian: apt-get install python3-torch); exit status "
              f"{EXIT_NO_PYTORCH}", file=sys.stderr)
        return EXIT_NO_PYTORCH

    s = SHAPES[(args.model, args.tiny)]
    build, described = model_builder(args.model, s)
    import gpt2_torch  # on the path now
    fpt = flops_per_token(args.model, s)
    tokens = MICRO_BATCH * s["seq"]
    print(f"# pytorch {torch.__version__} on the CPU ({os.cpu_count()} cores visible, capability "
          f"{torch.backends.cpu.get_cpu_capability()}), {described}, vocabulary {s['vocab']}, T "
          f"{s['seq']}, micro-batch {MICRO_BATCH}, AdamW ({optimizer_kind(torch)}), attention "
          f"{'SDPA' if gpt2_torch.SDPA is not None else 'explicit masked softmax'}; median of "
          f"{args.steps} steps after {WARMUP_STEPS['eager']} untimed (compile: "
          f"{WARMUP_STEPS['compile']}, the first compiling; warmup_s: their time); "
          f"{fpt * tokens / 1e9:.2f} GFLOP per step (PaLM, as meshtrain counts); wrong: a "
          f"non-finite loss or a first loss off log V = {math.log(s['vocab']):.3f} by 0.5")
    print(f"# {'name':<40} {'threads':>8} {'tokens':>8} {'time_ms':>9} {'tokens/s':>9} "
          f"{'GFLOP/s':>8} {'warmup_s':>9} {'loss0':>7} {'wrong':>6}")
    rows, wrong_total, compile_error = [], 0, ""
    for t in args.threads:
        for precision in args.precision:
            for mode in args.mode:
                if mode == "compile" and compile_error:
                    continue
                try:
                    seconds, warmup, losses = time_steps(torch, build, s, t, precision, mode,
                                                         args.steps)
                except Exception as e:  # noqa: BLE001: any failure to compile, reported
                    if mode != "compile":
                        raise
                    compile_error = first_line(e)
                    print(f"# torch.compile failed, no compile rows ({compile_error}); it needs a "
                          f"C++ compiler (g++, or $CXX) and Python's headers", flush=True)
                    continue
                wrong = int(abs(losses[0] - math.log(s["vocab"])) >= 0.5) + \
                    sum(0 if math.isfinite(x) else 1 for x in losses)
                wrong_total += wrong
                name = f"pytorch {args.model} {mode} {precision}, {t} thread{'s' if t > 1 else ''}"
                row = {"name": name, "model": args.model, "mode": mode, "precision": precision,
                       "threads": t, "tokens": tokens, "time_ms": seconds * 1e3,
                       "tokens/s": tokens / seconds, "GFLOP/s": fpt * tokens / seconds / 1e9,
                       "warmup_s": warmup, "first_loss": losses[0], "wrong": wrong}
                rows.append(row)
                print(f"  {name:<40} {t:8d} {tokens:8d} {row['time_ms']:9.1f} "
                      f"{row['tokens/s']:9.1f} {row['GFLOP/s']:8.1f} {warmup:9.1f} "
                      f"{losses[0]:7.3f} {wrong:6d}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"framework": "pytorch " + torch.__version__, "model": args.model,
                       "tiny": args.tiny, "compile_error": compile_error, "rows": rows}, f,
                      indent=2)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
