#!/usr/bin/env python3
"""Pictures of a run, from what it wrote to its run directory (Debian's python3-matplotlib):

  RUNDIR/plots/training.png  training and validation loss, tokens/s, learning rate and gradient
                             norm per logged step (metrics.jsonl), and each rank's peak memory by
                             category (the memory records of metrics.jsonl);
  RUNDIR/plots/experts.png   a mixture of experts' routing (metrics.jsonl's expert records):
                             each MoE layer's balance (busiest expert's tokens over the mean, 1 is
                             even) per step, and the share of tokens each expert of each layer
                             took over the last logged step (a heat map);
  RUNDIR/plots/timeline.png  one training step on every rank (trace_rank<N>.json, written with
                             run.trace = true): forward and backward of each micro-batch, pipeline
                             waits and data-parallel communication — where the bubble is.

usage: scripts/plot-run.py RUNDIR [--step N] [--out DIR]
  --step N   the step the timeline shows (default: the traced step in the middle of the run,
             away from start-up and the last step's checkpoint)
  --out DIR  where the PNGs go (default RUNDIR/plots)
Prints what it drew (series and their points) so that logs and tests can check it. Exit 1 with a
message naming the file when the run directory holds nothing to draw.
"""
import argparse
import glob
import json
import os
import re
import sys


def fail(message):
    print(f"plot-run: error: {message}", file=sys.stderr)
    sys.exit(1)


def read_metrics(path):
    if not os.path.isfile(path):
        fail(f"{path}: no metrics.jsonl here (is this a run directory? it is run.dir, "
             f"runs/<run.name> by default)")
    train, val, memory, experts = [], [], {}, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                # The last line of a run killed while writing may be cut short: skip only that one.
                if number == sum(1 for _ in open(path, encoding="utf-8")):
                    continue
                fail(f"{path}:{number}: not a JSON record ({e.msg})")
            if "expert_tokens" in record:
                experts.append(record)
            elif "memory_rank" in record:
                memory[record["memory_rank"]] = record  # the latest record of each rank
            elif "val_loss" in record:
                val.append(record)
            elif "loss" in record:
                train.append(record)
    if not train and not val:
        fail(f"{path}: no training or validation records to draw")
    return train, val, memory, experts


def plot_experts(experts, out, plt):
    layers = experts[-1]["moe_layers"]
    n = experts[-1]["experts"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    steps = [r["step"] for r in experts]
    for i, layer in enumerate(layers):
        ax.plot(steps, [r["expert_balance"][i] for r in experts], label=f"layer {layer}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("busiest expert's tokens / mean")
    ax.set_title("expert balance per layer (1 = even)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    ax = axes[1]
    last = experts[-1]["expert_tokens"]
    shares = []
    for i in range(len(layers)):
        row = last[i * n:(i + 1) * n]
        total = sum(row) or 1.0
        shares.append([t / total for t in row])
    image = ax.imshow(shares, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(f"share of the tokens, step {experts[-1]['step']} (even: {1 / n:.3f})")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"{out}: expert balance {len(experts)} points x {len(layers)} layers, "
          f"{n} experts per layer")


def plot_training(train, val, memory, out, plt):
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    if train:
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="training loss")
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("loss")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[0][1]
    timed = [r for r in train if "tokens_per_s" in r]
    ax.plot([r["step"] for r in timed], [r["tokens_per_s"] for r in timed])
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s (whole job)")
    ax.set_title("throughput")
    ax.grid(alpha=0.3)

    ax = axes[1][0]
    ax.plot([r["step"] for r in train], [r["lr"] for r in train], label="learning rate")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    norm = ax.twinx()
    norm.plot([r["step"] for r in train], [r["grad_norm"] for r in train], color="tab:red",
              label="gradient norm")
    norm.set_ylabel("gradient norm (before clipping)", color="tab:red")
    ax.set_title("learning rate and gradient norm")

    ax = axes[1][1]
    categories = ["parameters", "gradients", "optimizer", "activations", "comm", "workspace"]
    ranks = sorted(memory)
    bottom = [0.0] * len(ranks)
    for category in categories:
        values = [memory[r].get(category, 0) / 2**20 for r in ranks]
        ax.bar([str(r) for r in ranks], values, bottom=bottom, label=category)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("rank")
    ax.set_ylabel("peak MiB")
    ax.set_title("memory per rank at its peak")
    if ranks:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"{out}: training loss {len(train)} points, validation loss {len(val)} points, "
          f"tokens/s {len(timed)} points, memory {len(ranks)} ranks")


def read_traces(run_dir):
    paths = glob.glob(os.path.join(run_dir, "trace_rank*.json"))
    traces = {}
    for path in paths:
        rank = int(re.search(r"trace_rank(\d+)\.json$", path).group(1))
        try:
            with open(path, encoding="utf-8") as f:
                traces[rank] = json.load(f)["traceEvents"]
        except (json.JSONDecodeError, KeyError) as e:
            fail(f"{path}: not a Chrome trace meshtrain wrote ({e})")
    return traces


def plot_timeline(traces, step, out, plt):
    # The step's window on each rank comes from that rank's own "step N" event: clocks of
    # different nodes need not agree, so every row is drawn from its own step start.
    steps = sorted({int(m.group(1)) for events in traces.values() for e in events
                    if e.get("cat") == "step" and (m := re.fullmatch(r"step (\d+)", e["name"]))})
    if not steps:
        fail("the traces hold no step events")
    if step is None:
        step = steps[len(steps) // 2]
    if step not in steps:
        fail(f"step {step} is not in the traces (traced steps: {steps[0]}-{steps[-1]})")
    colours = {"F": "tab:blue", "B": "tab:green", "p2p": "tab:orange", "dp": "tab:purple",
               "other": "tab:gray"}
    fig, ax = plt.subplots(figsize=(14, 0.5 * len(traces) + 1.5))
    drawn = 0
    width_ms = 0.0
    for row, rank in enumerate(sorted(traces)):
        events = traces[rank]
        window = next(e for e in events if e.get("cat") == "step" and e["name"] == f"step {step}")
        start, end = window["ts"], window["ts"] + window["dur"]
        width_ms = max(width_ms, window["dur"] / 1000)
        for e in events:
            if e.get("ph") != "X" or e.get("cat") == "step" or e["ts"] < start or e["ts"] >= end:
                continue
            if e.get("cat") == "compute":
                kind = "B" if re.search(r"B\d+$", e["name"]) else "F"
                y, h = row, 0.8
            elif e.get("cat") == "p2p":
                kind, y, h = "p2p", row + 0.55, 0.25
            else:
                kind, y, h = ("dp" if "dp" in e.get("cat", "") or e.get("tid") == 2 else "other"),\
                             row + 0.55, 0.25
            ax.broken_barh([((e["ts"] - start) / 1000, e["dur"] / 1000)], (y - 0.4, h),
                           facecolors=colours[kind])
            drawn += 1
    ax.set_yticks(range(len(traces)))
    ax.set_yticklabels([f"rank {r}" for r in sorted(traces)])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms since the start of step {step} (each rank's own clock)")
    ax.set_title(f"step {step}: forward (blue), backward (green), pipeline waits (orange), "
                 f"data-parallel communication (purple)")
    ax.set_xlim(0, width_ms)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"{out}: step {step}, {len(traces)} ranks, {drawn} events, {width_ms:.1f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--step", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not os.path.isdir(args.run_dir):
        fail(f"{args.run_dir}: not a directory (give a run directory, e.g. runs/default)")
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display on a login or compute node
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed for this Python (Debian: apt-get install "
             "python3-matplotlib; scripts/ensure-deps.sh test installs it)")
    out = args.out or os.path.join(args.run_dir, "plots")
    os.makedirs(out, exist_ok=True)
    train, val, memory, experts = read_metrics(os.path.join(args.run_dir, "metrics.jsonl"))
    plot_training(train, val, memory, os.path.join(out, "training.png"), plt)
    if experts:
        plot_experts(experts, os.path.join(out, "experts.png"), plt)
    traces = read_traces(args.run_dir)
    if traces:
        plot_timeline(traces, args.step, os.path.join(out, "timeline.png"), plt)
    else:
        print(f"no timeline: {args.run_dir} holds no trace_rank<N>.json (train with "
              f"--set run.trace=true)")


main()
