#!/usr/bin/env python3
"""Asynchronous data parallelism through the real binary (parallel/parameter_server.h).

  - staleness 0 is synchronous data parallelism: the losses of every step those of the sync run
    (fp64, to round-off), with 1 server and dp 2; with 2 servers and tp 2 inside the replicas;
    with 1 server and pp 2 inside them;
  - staleness 2, 4 replicas, replica 3 slowed: the recorded staleness never exceeds 2 and is
    above 0 somewhere (the replicas did run apart); the validation loss is reported;
  - checkpoints cross modes: an async run's step-3 checkpoint resumed by a sync run, and a sync
    run's resumed by an async run, continue the sync run's losses;
  - refusals: async without servers, servers in a sync run, staleness in a sync run, ZeRO with
    async, a job without room for the servers: the message once, the input-error status.

usage: async_test.py MESHTRAIN_BINARY MPIEXEC
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
DECK = """
[run]
device = "cpu"
name = "async"
dir = "{dir}/run"
log_every = 1
threads = 1
flight_records = 0
comm_timeout = 120
[model]
layers = 2
d_model = 32
heads = 4
seq_len = 16
[data]
synthetic_bytes = 32768
[train]
precision = "fp64"
steps = 6
global_batch = 8
micro_batch = 2
warmup_steps = 1
eval_every = 3
eval_batches = 1
[parallel]
dp = {dp}
[checkpoint]
every = {every}
"""

ASYNC = ['parallel.data_sync="async"']


def train(tmp, name, ranks, sets=(), dp=2, every=0, slowdown=None, deck_dir=None):
    case = deck_dir or os.path.join(tmp, name)
    os.makedirs(case, exist_ok=True)
    deck = os.path.join(case, "deck.toml")
    with open(deck, "w") as f:
        f.write(DECK.format(dir=case, dp=dp, every=every))
    env = dict(os.environ)
    env.pop("MESHTRAIN_SLOWDOWN", None)
    if slowdown:
        env["MESHTRAIN_SLOWDOWN"] = slowdown
    cmd = [MPIEXEC, "-n", str(ranks), BIN, "train", deck]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    p.dir = case
    return p


def metrics(p):
    path = os.path.join(p.dir, "run", "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(p):
    return {m["step"]: m["loss"] for m in metrics(p) if "loss" in m}


def same(a, b, tol=1e-9):
    return bool(a) and a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol * abs(b[k]) for k in b)


def main():
    tmp = tempfile.mkdtemp(prefix="meshtrain_async_")
    problems = []

    def expect(ok, what, p):
        if not ok:
            problems.append("%s:\n%s" % (what, (p.stdout + p.stderr)[-3000:]))

    sync = train(tmp, "sync", 2)
    expect(sync.returncode == 0 and len(losses(sync)) == 6, "the sync run", sync)
    ref = losses(sync)

    for name, ranks, sets in [
        ("s0 1 server dp 2", 3, ASYNC + ["parallel.servers=1"]),
        ("s0 2 servers dp 2 x tp 2", 6, ASYNC + ["parallel.servers=2", "parallel.tp=2"]),
        ("s0 1 server dp 2 x pp 2", 5, ASYNC + ["parallel.servers=1", "parallel.pp=2"]),
    ]:
        p = train(tmp, name.replace(" ", "_"), ranks, sets)
        expect(p.returncode == 0 and same(losses(p), ref),
               "%s: losses %s, expected the sync run's %s" % (name, losses(p), ref), p)

    stale = train(tmp, "s2", 5, ASYNC + ["parallel.servers=1", "parallel.staleness=2",
                                          "train.steps=16", "train.eval_every=8"],
                  dp=4, slowdown="3:4")
    rows = [m for m in metrics(stale) if "staleness_max" in m]
    worst = max((m["staleness_max"] for m in rows), default=-1)
    vals = [m["val_loss"] for m in metrics(stale) if "val_loss" in m]
    expect(stale.returncode == 0 and len(rows) == 16 and 0 < worst <= 2 and len(vals) == 2 and
           all(m["staleness_bound"] == 2 for m in rows),
           "staleness 2: %d rows, largest staleness %s (expected 1 or 2), val losses %s" %
           (len(rows), worst, vals), stale)

    # Checkpoints across modes: each run writes step 3 and step 6; a second run resumes step 3.
    for name, first, second, ranks in [("async to sync", ASYNC + ["parallel.servers=1"], [], (3, 2)),
                                       ("sync to async", [], ASYNC + ["parallel.servers=1"], (2, 3))]:
        d = os.path.join(tmp, name.replace(" ", "_"))
        a = train(tmp, name, ranks[0], first, every=3, deck_dir=d)
        found = glob.glob(os.path.join(d, "run", "checkpoints", "step_*3.h5"))
        ckpt = found[0] if found else os.path.join(d, "run", "checkpoints", "step_3.h5")
        expect(a.returncode == 0 and os.path.exists(ckpt), "%s: the first run's step-3 checkpoint" % name, a)
        shutil.rmtree(os.path.join(d, "run2"), ignore_errors=True)
        b = train(tmp, name, ranks[1], second + ['checkpoint.resume="%s"' % ckpt,
                                                 'run.dir="%s"' % os.path.join(d, "run2"),
                                                 'checkpoint.dir="%s"' % os.path.join(d, "ckpt2")],
                  every=3, deck_dir=d)
        b.dir = os.path.join(d, "x")  # metrics of the second run are in run2
        path = os.path.join(d, "run2", "metrics.jsonl")
        got = {}
        if os.path.exists(path):
            with open(path) as f:
                got = {m["step"]: m["loss"] for m in map(json.loads, f) if "loss" in m}
        want = {k: v for k, v in ref.items() if k > 3}
        expect(b.returncode == 0 and "resumed from" in b.stdout and same(got, want),
               "%s: resumed losses %s, expected the sync run's %s" % (name, got, want), b)

    for name, ranks, sets, message in [
        ("no servers", 2, ASYNC, 'parallel.data_sync = "async" needs parallel.servers >= 1'),
        ("idle servers", 3, ["parallel.servers=1"], "parallel.servers = 1 is given but parallel.data_sync"),
        ("sync staleness", 2, ["parallel.staleness=2"], "parallel.staleness = 2 is given but"),
        ("zero", 3, ASYNC + ["parallel.servers=1", "parallel.zero=1"], "parallel.zero = 1 (parallel.data_sync"),
        ("no room", 2, ASYNC + ["parallel.servers=1"],
         "does not match the 1 ranks of this job besides the 1 server(s) (launch 3 ranks"),
        ("too many servers", 3, ASYNC + ["parallel.servers=1000000", "parallel.dp=1"],
         "parallel.servers = 1000000 leaves"),
    ]:
        p = train(tmp, name.replace(" ", "_"), ranks, sets)
        out = p.stdout + p.stderr
        expect(p.returncode == 1 and out.count(message) == 1,
               "%s: exit %d (expected 1), message '%s' %d time(s)" % (name, p.returncode, message,
                                                                     out.count(message)), p)

    shutil.rmtree(tmp, ignore_errors=True)
    for pr in problems:
        print("FAILED: " + pr)
    print("%d problem(s)" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
