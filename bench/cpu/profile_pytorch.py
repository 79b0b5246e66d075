#!/usr/bin/env python3
"""Where PyTorch's CPU training step spends its time, by operation class, for the comparison
with meshtrain's kernel profile (issue 51; `meshtrain bench --suite step` prints meshtrain's).

README
------
The same step as bench/cpu/compare_pytorch.py (its models, micro-batch, AdamW with the norm
clipped, autocast for bf16), eager: one untimed step, then --steps steps under torch.profiler.
Each operator's self CPU time goes to one class:
  gemm fwd / gemm bwd   the Linear layers' products (with their bias adds and views; backward:
                        the MmBackward/AddmmBackward nodes, bias gradients' sums included);
  attention             scaled_dot_product_attention forward and backward;
  rotary                Llama's rotary positions (cat, mul, add of rotate(), and their backward);
  norms                 LayerNorm / RMSNorm forward and backward;
  gelu/swiglu           GELU, SiLU and SwiGLU's product, forward and backward;
  softmax/xent          the loss: log_softmax, nll_loss and their backward;
  optimizer             the gradient norm, clipping, AdamW and zero_grad;
  embedding             token / position look-ups and their gradients;
  copies/other          the rest: every cast or copy (autocast's bf16 weights and activations,
                        the logits' fp32 cast, transposes' copies), residual adds, the autograd
                        engine's gradient accumulation.
A backward node takes the class of the forward operator with its sequence number (so a
MulBackward0 is SwiGLU's or rotary's as its forward was). Prints ms per step and share of the
profiled step (wall time, step by step), class by class.

  python3 bench/cpu/profile_pytorch.py --model gpt2 --threads 1 --precision fp32 --steps 2
"""

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch  # noqa: E402  (the models, shapes and optimizer of the comparison)

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
            "aten::_addmm_activation", "aten::baddbmm")
CAST_OPS = ("aten::to", "aten::_to_copy", "aten::copy_")
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
CLASSES = ("gemm fwd", "gemm bwd", "attention", "rotary", "norms", "gelu/swiglu", "softmax/xent",
           "optimizer", "embedding", "copies/other")


def class_of_name(name, backward):
    """An operator's or backward node's class by its name alone."""
    n = name.lower()
    if name in GEMM_OPS or any(k in n for k in ("mmbackward", "addmmbackward", "bmmbackward",
                                                 "linearbackward")):
        return "gemm bwd" if backward else "gemm fwd"
    if "scaled_dot_product" in n or "attention" in n:
        return "attention"
    if "layer_norm" in n or "rms_norm" in n or "layernorm" in n or "rmsnorm" in n:
        return "norms"
    if "gelu" in n or "silu" in n:
        return "gelu/swiglu"
    if "softmax" in n or "nll_loss" in n or "cross_entropy" in n:
        return "softmax/xent"
    if "embedding" in n:
        return "embedding"
    return None


def scoped(label, fn):
    def wrapped(*args, **kwargs):
        import torch
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)
    return wrapped


def label_modules(torch, model):
    """Labels for what operator names cannot tell: Linear layers, norms, Llama's rotary and
    SwiGLU product (any multiply in a Llama block outside rotate() is SwiGLU's)."""
    for module in model.modules():
        kind = type(module).__name__
        label = {"Linear": "class:gemm fwd", "LayerNorm": "class:norms", "RMSNorm": "class:norms",
                 "_RMSNorm": "class:norms", "Embedding": "class:embedding"}.get(kind)
        if label:
            module.forward = scoped(label, module.forward)
    if "llama_torch" in sys.modules:
        llama = sys.modules["llama_torch"]
        llama.rotate = scoped("class:rotary", llama.rotate)


def classify(events):
    """ms by class over the events: self CPU time of each operator, classed by its innermost
    labelled ancestor (a module label, a backward node, a phase)."""
    by_sequence = {}
    for e in events:  # forward operators' classes by sequence number
        if getattr(e, "sequence_nr", -1) is not None and e.sequence_nr >= 0 and \
                not e.name.startswith(BACKWARD_PREFIX):
            c = context_class(e, by_sequence, forward_only=True)
            if c and e.sequence_nr not in by_sequence:
                by_sequence[e.sequence_nr] = c
    totals, names = collections.Counter(), collections.defaultdict(collections.Counter)
    for e in events:
        if e.name.startswith(("class:", "phase:")) or e.name.startswith(BACKWARD_PREFIX):
            continue
        c = context_class(e, by_sequence) or "copies/other"
        totals[c] += e.self_cpu_time_total / 1e3
        names[c][e.name] += e.self_cpu_time_total / 1e3
    return totals, names


def context_class(e, by_sequence, forward_only=False):
    phase, node = None, e
    own = class_of_name(e.name, backward=False)
    chain = []
    while node is not None:
        chain.append(node)
        node = node.cpu_parent
    for a in chain:
        if a.name.startswith("phase:"):
            phase = a.name[len("phase:"):]
    if phase == "optimizer":
        return "optimizer"
    backward = phase == "backward"
    if e.name in CAST_OPS:
        return "copies/other"
    for a in chain:
        if a.name.startswith("class:"):
            return a.name[len("class:"):]
        if a.name.startswith(BACKWARD_PREFIX) and not forward_only:
            seq = getattr(a, "sequence_nr", -1)
            for b in a.cpu_children:  # the node's own event carries the forward's number
                if seq is None or seq < 0:
                    seq = getattr(b, "sequence_nr", -1)
            forward = by_sequence.get(seq)
            if forward == "gemm fwd":
                return "gemm bwd"
            if forward:
                return forward
            named = class_of_name(a.name[len(BACKWARD_PREFIX):], backward=True)
            if named:
                return named
            return "copies/other"
    if own:
        return "gemm bwd" if own == "gemm fwd" and backward else own
    if not backward and e.name == "aten::mul" and "llama_torch" in sys.modules:
        return "gelu/swiglu"
    return None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2", choices=("gpt2", "llama"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--steps", type=int, default=2, help="profiled steps (after one untimed)")
    p.add_argument("--top", type=int, default=0, help="also the N slowest operators per class")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny model (speeds meaningless)")
    return p.parse_args()


def main():
    args = parse_args()
    import torch
    s = compare_pytorch.SHAPES[(args.model, args.tiny)]
    build, described = compare_pytorch.model_builder(args.model, s)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build()
    label_modules(torch, model)
    optimizer, kind = compare_pytorch.adamw(torch, model.parameters())
    tokens = torch.randint(0, s["vocab"], (compare_pytorch.MICRO_BATCH, s["seq"] + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    rf = torch.profiler.record_function

    def step():
        with rf("phase:forward"):
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                loss = model(inputs, targets)
        with rf("phase:backward"):
            loss.backward()
        with rf("phase:optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.item()

    step()
    seconds = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
    totals, names = classify(prof.events())
    wall = sum(seconds) * 1e3 / args.steps
    print(f"# pytorch {torch.__version__} eager, {described}, {args.precision}, "
          f"{args.threads} thread(s), AdamW {kind}; {args.steps} profiled steps, "
          f"{wall:.1f} ms per step (wall, profiler on); self CPU time by class")
    print(f"# {'class':<14} {'ms/step':>9} {'share':>7}")
    for c in CLASSES:
        ms = totals.get(c, 0.0) / args.steps
        print(f"  {c:<14} {ms:9.1f} {ms / wall:7.3f}")
        for name, op_ms in names[c].most_common(args.top):
            print(f"  #   {name[:60]:<60} {op_ms / args.steps:9.1f}")
    rest = wall - sum(totals.values()) / args.steps
    print(f"  {'outside ops':<14} {rest:9.1f} {rest / wall:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
