#!/usr/bin/env python3
"""PyTorch baseline for meshtrain's GPU benchmark: GPT-2 124M training throughput on one GPU.

README
------
`meshtrain bench --suite gpu` measures meshtrain's own training step on this GPU; this script
measures the same model trained by PyTorch on the same machine, so the two numbers can be put
side by side. It trains GPT-2 small (12 layers, 12 heads, 768 channels, vocabulary 50257 padded
to 50304, context T = 1024, tied embeddings) in bf16 autocast with fp32 master weights and
fused AdamW, attention through F.scaled_dot_product_attention (flash attention on Ampere and
Hopper), on synthetic uniformly random tokens (throughput does not depend on the data). The
micro-batch is the largest power of two that survives a forward and backward pass without
running out of memory, unless --batch fixes it. After --warmup untimed steps it times --steps
steps with CUDA events and prints tokens per second and the model-FLOP utilisation against
--peak-tflops (when given). Use --compile for torch.compile (slower start, faster steps).

  python3 bench/gpu/compare_pytorch.py --steps 20 --compile --json runs/pytorch.json

Output follows meshtrain's benchmark format: '#' header lines, then one row of fixed columns;
the exit status is non-zero when the run fails (no GPU, NaN loss).
"""

import argparse
import json
import math
import os
import sys
import time

import torch

# The model is shared with the CPU baseline and the export test (bench/gpt2_torch.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpt2_torch import GPT2  # noqa: E402


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def training_flops_per_token(model, layers, channels, context):
    # 6 N for the dense parts (forward + backward) plus attention's score and value products:
    # 6 * layers * T * C per token (12 * L * T * C halved by causality, as commonly counted).
    return 6 * parameter_count(model) + 6 * layers * context * channels


def make_step(model, optimizer, compile_model):
    forward = torch.compile(model) if compile_model else model

    def step(tokens, targets):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = forward(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def fits(batch, args):
    """One full training step at this micro-batch, or False on out-of-memory."""
    torch.cuda.empty_cache()
    try:
        model = GPT2(context=args.seq).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
        tokens = torch.randint(0, 50257, (batch, args.seq + 1), device="cuda")
        loss = make_step(model, optimizer, False)(tokens[:, :-1].contiguous(),
                                                  tokens[:, 1:].contiguous())
        torch.cuda.synchronize()
        ok = math.isfinite(loss.item())
    except torch.cuda.OutOfMemoryError:
        ok = False
    finally:
        model = optimizer = tokens = None
        torch.cuda.empty_cache()
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=0, help="micro-batch (0: largest that fits)")
    parser.add_argument("--seq", type=int, default=1024, help="context length T")
    parser.add_argument("--compile", action="store_true", help="torch.compile the step")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="dense bf16 peak of this GPU for the MFU column (e.g. from meshtrain)")
    parser.add_argument("--json", type=str, default="", help="also write the result here")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("# error: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)

    batch = args.batch
    if batch == 0:
        batch = next((b for b in (64, 32, 16, 8, 4, 2, 1) if fits(b, args)), 0)
        if batch == 0:
            print("# error: not even a micro-batch of 1 fits", file=sys.stderr)
            return 2

    model = GPT2(context=args.seq).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=True)
    step = make_step(model, optimizer, args.compile)
    tokens = torch.randint(0, 50257, (batch, args.seq + 1), device="cuda")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    compile_start = time.time()
    for _ in range(args.warmup):
        step(inputs, targets)
    torch.cuda.synchronize()
    warmup_s = time.time() - compile_start

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        loss = step(inputs, targets)
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1e3
    final_loss = loss.item()

    tokens_per_s = batch * args.seq * args.steps / seconds
    flops = training_flops_per_token(model, 12, 768, args.seq) * tokens_per_s
    mfu = flops / (args.peak_tflops * 1e12) if args.peak_tflops > 0 else float("nan")
    result = {
        "framework": "pytorch " + torch.__version__,
        "device": torch.cuda.get_device_name(),
        "model": "gpt2-124M",
        "parameters": parameter_count(model),
        "seq": args.seq,
        "micro_batch": batch,
        "compile": args.compile,
        "steps": args.steps,
        "step_ms": 1e3 * seconds / args.steps,
        "tokens_per_s": tokens_per_s,
        "model_tflops": flops / 1e12,
        "mfu": mfu,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "warmup_s": warmup_s,
        "final_loss": final_loss,
    }
    print(f"# pytorch {torch.__version__}, {result['device']}, GPT-2 124M "
          f"({result['parameters'] / 1e6:.1f}M parameters), bf16 autocast, T={args.seq}, "
          f"SDPA attention, torch.compile {'on' if args.compile else 'off'}")
    print("# micro_batch  step_ms  tokens_per_s  model_tflops  mfu  peak_mem_gib  loss  wrong")
    wrong = 0 if math.isfinite(final_loss) else 1
    print(f"{batch:13d} {result['step_ms']:8.1f} {tokens_per_s:13.0f} {flops / 1e12:13.1f} "
          f"{mfu:5.3f} {result['peak_memory_gib']:13.2f} {final_loss:5.2f} {wrong:6d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return wrong


if __name__ == "__main__":
    sys.exit(main())
