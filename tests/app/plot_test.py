#!/usr/bin/env python3
"""scripts/plot-run.py draws what a real run wrote, and refuses what it cannot draw.

A 2-rank run of the default deck as a pipeline (dp 1 x tp 1 x pp 2) with traces writes its run
directory; the script must then write two PNGs of the promised size and say it drew every training
and validation record of metrics.jsonl, the memory of both ranks, and a timeline of both ranks
with compute events in it. Refused, exit 1 with a message naming the path: a directory that is not
there, one without metrics.jsonl, a step the traces do not hold, a trace that is not JSON.
Exit 77 (skipped) without matplotlib.

usage: plot_test.py MESHTRAIN MPIEXEC REPO
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

BIN, MPIEXEC, REPO = sys.argv[1], sys.argv[2], sys.argv[3]
SCRIPT = os.path.join(REPO, "scripts", "plot-run.py")
problems = []

try:
    import matplotlib  # noqa: F401
except ImportError:
    print("SKIPPED: matplotlib is not installed (python3-matplotlib)")
    sys.exit(77)


def check(condition, what):
    if not condition:
        problems.append(what)


def plot(*words):
    p = subprocess.run([sys.executable, SCRIPT, *words], capture_output=True, text=True,
                       timeout=300)
    print(p.stdout + p.stderr)
    return p


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


with tempfile.TemporaryDirectory(prefix="meshtrain-plot-") as tmp:
    run_dir = os.path.join(tmp, "run")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    train = subprocess.run(
        [MPIEXEC, "-n", "2", BIN, "train", os.path.join(REPO, "input", "default.toml"),
         "--set", "parallel.tp=1", "--set", "parallel.sequence_parallel=false",
         "--set", "train.steps=8", "--set", "run.log_every=2", "--set", "train.eval_every=4",
         "--set", "train.eval_batches=1", "--set", "run.trace=true",
         "--set", "checkpoint.every=0", "--set", f"run.dir={run_dir}",
         "--set", "data.synthetic_bytes=200000"],
        capture_output=True, text=True, timeout=600, env=env)
    if train.returncode != 0:
        print(train.stdout + train.stderr)
        sys.exit(f"the training run failed (exit {train.returncode})")

    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    n_train = sum(1 for r in records if "loss" in r and "memory_rank" not in r)
    n_val = sum(1 for r in records if "val_loss" in r)
    p = plot(run_dir)
    check(p.returncode == 0, f"plot-run.py exited {p.returncode}")
    training = os.path.join(run_dir, "plots", "training.png")
    timeline = os.path.join(run_dir, "plots", "timeline.png")
    check(png_size(training) == (1200, 800), f"training.png is {png_size(training)}, not 1200x800")
    check(png_size(timeline) is not None and png_size(timeline)[0] == 1400,
          f"timeline.png is {png_size(timeline)}, not 1400 wide")
    drew = re.search(r"training loss (\d+) points, validation loss (\d+) points, tokens/s (\d+) "
                     r"points, memory (\d+) ranks", p.stdout)
    check(drew is not None, "no summary of the training picture")
    if drew:
        check(int(drew.group(1)) == n_train > 1,
              f"drew {drew.group(1)} training points; metrics.jsonl has {n_train}")
        check(int(drew.group(2)) == n_val >= 2,
              f"drew {drew.group(2)} validation points; metrics.jsonl has {n_val}")
        check(drew.group(4) == "2", f"memory of {drew.group(4)} ranks, not 2")
    steps = re.search(r"timeline\.png: step (\d+), (\d+) ranks, (\d+) events", p.stdout)
    check(steps is not None and steps.group(2) == "2" and int(steps.group(3)) >= 2 * 2,
          f"timeline summary wrong: {steps.group(0) if steps else None}")

    # --step and --out
    other = os.path.join(tmp, "pictures")
    p = plot(run_dir, "--step", "3", "--out", other)
    check(p.returncode == 0 and "step 3," in p.stdout and os.path.isfile(
        os.path.join(other, "timeline.png")), "--step 3 --out DIR did not draw step 3 there")

    # Refusals: exit 1, the path named.
    def refused(words, needle, what):
        p = plot(*words)
        check(p.returncode == 1 and needle in p.stderr and "Traceback" not in p.stderr,
              f"{what}: exit {p.returncode}, stderr {p.stderr!r}")

    refused([os.path.join(tmp, "nowhere")], "nowhere: not a directory", "missing directory")
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    refused([empty], "metrics.jsonl: no metrics.jsonl here", "no metrics")
    refused([run_dir, "--step", "999"], "step 999 is not in the traces", "untraced step")
    broken = os.path.join(tmp, "broken")
    shutil.copytree(run_dir, broken)
    with open(os.path.join(broken, "trace_rank2.json"), "w") as f:
        f.write("{not json")
    refused([broken], "trace_rank2.json: not a Chrome trace", "broken trace")

if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print("plot-run.py: pictures and refusals as promised")
