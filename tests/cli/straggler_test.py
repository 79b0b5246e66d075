#!/usr/bin/env python3
"""The straggler report through the real binary (train/straggler_report.h, parallel/slowdown.h).

4 ranks, dp 4, a small model, 12 steps logged every 4 (windows closing at steps 1, 4, 8, 12):
  - MESHTRAIN_SLOWDOWN="2:4" (rank 2 four times slower): the log names rank 2 as a straggler,
    with its node and coordinates, and no other rank; metrics.jsonl holds one record per window
    with 4-long rank_compute_ms and rank_wait_ms and "stragglers" naming rank 2 only;
  - without MESHTRAIN_SLOWDOWN no rank is named;
  - run.straggler_threshold = 0: no report at all;
  - a bad MESHTRAIN_SLOWDOWN ends the run with the input-error status, the message once.

Timings on a machine whose cores the ranks share with each other (and with other work: a build,
other tests) are noisy: a rank descheduled in the middle of its compute looks slow. So the runs
use run.straggler_threshold = 1.5 (1.25 by default), windows of 4 steps, a slowdown well above
the threshold, and a timing case that fails is run once more before it counts as failed.

usage: straggler_test.py MESHTRAIN_BINARY MPIEXEC
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
RANKS = 4
# The ranks may outnumber the cores: each runs one thread, and the slowed rank sleeps (it takes
# no core from the others while it pads its compute).
DECK = """
[run]
device = "cpu"
name = "straggler"
dir = "{dir}/run"
log_every = 4
straggler_threshold = 1.5
threads = 1
flight_records = 0
[model]
layers = 2
d_model = 128
heads = 4
seq_len = 64
[data]
synthetic_bytes = 65536
val = "none"
[train]
precision = "fp32"
steps = 12
global_batch = 16
micro_batch = 2
warmup_steps = 1
[parallel]
dp = 4
"""


def train(tmp, name, slowdown=None, sets=()):
    case = os.path.join(tmp, name)
    os.makedirs(case)
    deck = os.path.join(case, "deck.toml")
    with open(deck, "w") as f:
        f.write(DECK.format(dir=case))
    env = dict(os.environ)
    env.pop("MESHTRAIN_SLOWDOWN", None)
    if slowdown is not None:
        env["MESHTRAIN_SLOWDOWN"] = slowdown
    cmd = [MPIEXEC, "-n", str(RANKS), BIN, "train", deck]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    metrics = os.path.join(case, "run", "metrics.jsonl")
    windows = []
    if os.path.exists(metrics):
        windows = [l for l in map(json.loads, open(metrics)) if "rank_compute_ms" in l]
    return p, windows


def named(stdout):
    return sorted({int(m.group(1)) for m in re.finditer(r"^straggler: rank (\d+) ", stdout, re.M)})


STEPS = [1, 4, 8, 12]  # the log steps: step 1, every run.log_every, the last


def check_slow(p, windows):
    """Rank 2 slowed: named, and no other rank; returns problems."""
    problems = []
    if p.returncode != 0:
        return ["rank 2 slowed: exit %d:\n%s" % (p.returncode, p.stdout + p.stderr)]
    lines = [l for l in p.stdout.splitlines() if l.startswith("straggler:")]
    if named(p.stdout) != [2]:
        problems.append("rank 2 slowed: stragglers named %s, expected [2]:\n%s" %
                        (named(p.stdout), p.stdout))
    elif not all(re.match(r"straggler: rank 2 \(node \S+, dp 2 tp 0 pp 0\) computes \d+\.\d\dx the "
                          r"median \(\d+\.\d vs \d+\.\d ms per step\) in \d+ consecutive windows$",
                          l) for l in lines):
        problems.append("the straggler line does not read as documented:\n" + "\n".join(lines))
    if [w["step"] for w in windows] != STEPS:
        problems.append("straggler records at steps %s, expected %s" % ([w["step"] for w in windows], STEPS))
    for w in windows:
        if len(w["rank_compute_ms"]) != RANKS or len(w["rank_wait_ms"]) != RANKS:
            problems.append("a record without %d per-rank numbers: %s" % (RANKS, w))
        if any(s != 2 for s in w["stragglers"]):
            problems.append("a record names a rank other than 2: %s" % w)
    if not any(w["stragglers"] == [2] for w in windows):
        problems.append("no record names rank 2: %s" % windows)
    return problems


def check_even(p, windows):
    """No slowdown: nobody named; returns problems."""
    problems = []
    if p.returncode != 0 or named(p.stdout):
        problems.append("no slowdown: exit %d, stragglers named %s:\n%s" %
                        (p.returncode, named(p.stdout), p.stdout + p.stderr))
    if [w["step"] for w in windows] != STEPS:
        problems.append("no slowdown: straggler records at steps %s, expected %s" %
                        ([w["step"] for w in windows], STEPS))
    return problems


def timed(tmp, name, check, slowdown=None):
    """A timing case, run a second time if the first fails (see the top)."""
    for attempt in (1, 2):
        p, windows = train(tmp, "%s%d" % (name, attempt), slowdown=slowdown)
        for w in windows:
            print("%s (attempt %d) step %2d: compute %s wait %s stragglers %s" % (
                name, attempt, w["step"], " ".join("%6.1f" % v for v in w["rank_compute_ms"]),
                " ".join("%6.1f" % v for v in w["rank_wait_ms"]), w["stragglers"]))
        print("\n".join(l for l in p.stdout.splitlines() if l.startswith("straggler:")))
        problems = check(p, windows)
        if not problems:
            return []
        print("%s, attempt %d:\n  %s" % (name, attempt, "\n  ".join(problems)))
    return problems


def main():
    problems = timed(tmp := tempfile.mkdtemp(prefix="meshtrain_straggler_"), "slow", check_slow,
                     slowdown="2:4")
    problems += timed(tmp, "even", check_even)

    p, windows = train(tmp, "off", slowdown="2:4", sets=["run.straggler_threshold=0"])
    if p.returncode != 0 or named(p.stdout) or windows:
        problems.append("run.straggler_threshold = 0: exit %d, named %s, %d records" %
                        (p.returncode, named(p.stdout), len(windows)))

    p, _ = train(tmp, "bad", slowdown="2:0.5")
    out = p.stdout + p.stderr
    message = 'MESHTRAIN_SLOWDOWN="2:0.5": factor 0.5 of "2:0.5" is below 1'
    if p.returncode != 1 or out.count(message) != 1 or "RANK:FACTOR" not in out:
        problems.append("bad MESHTRAIN_SLOWDOWN: exit %d (expected 1), message '%s' %d time(s):\n%s"
                        % (p.returncode, message, out.count(message), out))
    shutil.rmtree(tmp, ignore_errors=True)
    for pr in problems:
        print("FAILED: " + pr)
    print("%d problem(s)" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
