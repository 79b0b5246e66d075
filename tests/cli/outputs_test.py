#!/usr/bin/env python3
"""What a run leaves in its run directory is what docs/running.md promises.

A 2-rank run (pp 2) with run.trace = true must write
  - metrics.jsonl: every line a JSON object; training lines with step, loss, lr, grad_norm,
    tokens_per_s, step_ms; evaluation lines with step and val_loss; memory lines per rank;
  - trace_rank0.json and trace_rank1.json: Chrome-trace JSON whose complete events ("ph": "X")
    include forward and backward spans of every micro-batch on each rank;
a progress line per logged step on stdout with an ETA, and a device line that names the precision
"auto" chose and why.

Then the same run on a full file system (metrics.jsonl, then trace_rank0.json, made a link to
/dev/full, where every write fails with ENOSPC): lost metrics lines are warned about once, loudly,
and counted at the end, while training goes on (exit 0); a trace that cannot be written is an
error every rank reports (exit 1, printed once) instead of a silent success.

usage: outputs_test.py MESHTRAIN_BINARY MPIEXEC
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
# CTest sets the MPI launch environment (MESHTRAIN_MPI_TEST_ENV in tests/CMakeLists.txt).
ENV = dict(os.environ)
DECK = """
# device-independent: asserts which files and fields a run writes, no numbers (CPU or GPU)
[run]
name = "outputs"
dir = "{dir}/run"
trace = true
log_every = 2
[model]
layers = 2
d_model = 32
heads = 4
seq_len = 16
[data]
synthetic_bytes = 65536
[train]
steps = 4
global_batch = 8
micro_batch = 2
eval_every = 2
eval_batches = 1
[parallel]
pp = 2
"""


def full_disk(tmp):
    """The runs whose outputs land on /dev/full; returns a list of problems."""
    problems = []
    if not os.path.exists("/dev/full"):
        print("SKIPPED: full file system cases (this system has no /dev/full)")
        return problems
    for target, exit_status in (("metrics.jsonl", 0), ("trace_rank0.json", 1)):
        case = os.path.join(tmp, "full-" + target.split(".")[0])
        os.makedirs(os.path.join(case, "run"))
        os.symlink("/dev/full", os.path.join(case, "run", target))
        deck = os.path.join(case, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=case))
        p = subprocess.run([MPIEXEC, "-n", "2", BIN, "train", deck], env=ENV, capture_output=True,
                           text=True, timeout=300)
        out = p.stdout + p.stderr
        name = "%s on a full disk" % target
        if p.returncode != exit_status:
            problems.append("%s: exit status %d, expected %d" % (name, p.returncode, exit_status))
        if target == "metrics.jsonl":
            warning = "run/metrics.jsonl: cannot write metrics (No space left on device) at step 1"
            if out.count("cannot write metrics") != 1 or warning not in out:
                problems.append("%s: expected one warning '%s'" % (name, warning))
            if "metrics.jsonl is incomplete: " not in out or "metrics lines could not be written" not in out:
                problems.append("%s: no count of the lost lines at the end" % name)
        else:
            error = "run/trace_rank0.json: cannot write the trace file: No space left on device"
            if out.count("meshtrain: error:") != 1 or error not in out:
                problems.append("%s: expected the error '%s' once" % (name, error))
        if "internal error" in out:
            problems.append("%s: reported as an internal error" % name)
        if problems:
            print(out)
    return problems


def main():
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))
        p = subprocess.run([MPIEXEC, "-n", "2", BIN, "train", deck], env=ENV, capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            return 1
        # train.precision is "auto": the device line names the choice and the reason.
        device = [l for l in p.stdout.splitlines() if l.startswith("device: ")]
        if len(device) != 1 or not re.search(r", precision (fp32|bf16) \(auto: [^)]+\), ", device[0]):
            problems.append("no device line naming auto's precision and why: %s" % device)
        progress = [l for l in p.stdout.splitlines() if l.startswith("step") and "| eta " in l]
        if len(progress) < 2:
            problems.append("no progress lines with an ETA:\n" + p.stdout)
        lines = [json.loads(l) for l in open(os.path.join(tmp, "run", "metrics.jsonl"))]
        train = [l for l in lines if "loss" in l]
        evals = [l for l in lines if "val_loss" in l]
        memory = [l for l in lines if "memory_rank" in l]
        for l in train:
            missing = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms"} - set(l)
            if missing:
                problems.append("training line without %s: %s" % (sorted(missing), l))
        if [l["step"] for l in evals] != [2, 4]:
            problems.append("evaluations at steps %s, expected [2, 4]" % [l["step"] for l in evals])
        if sorted({l["memory_rank"] for l in memory}) != [0, 1]:
            problems.append("memory lines for ranks %s" % sorted({l["memory_rank"] for l in memory}))
        for rank in (0, 1):
            trace = json.load(open(os.path.join(tmp, "run", "trace_rank%d.json" % rank)))
            names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
            # Rank r runs chunk r: forwards and backwards of micro-batches 0..1 (2 per rank).
            wanted = {"%dF%d" % (rank, m) for m in range(2)} | {"%dB%d" % (rank, m) for m in range(2)}
            if not wanted <= names:
                problems.append("trace of rank %d lacks %s" % (rank, sorted(wanted - names)))
        problems += full_disk(tmp)
    for pr in problems:
        print("FAILED: " + pr)
    print("%d problem(s)" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
