#!/usr/bin/env python3
"""`meshtrain bench --suite context` on two ranks with the tiny settings: the ring row (the
ring's time, the compute-only ceiling, the transfers, the share hidden within [0, 1]) and the
planner's rows, whose activations per rank fall as 1/cp (within 10%: the token-independent
rest is small); every row wrong = 0, exit 0. One rank is refused with a clear message.

usage: bench_context_test.py MESHTRAIN_BINARY MPIEXEC
"""
import json
import os
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
problems = []


def check(condition, what):
    if not condition:
        problems.append(what)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "context.json")
    p = subprocess.run([MPIEXEC, "-n", "2", BIN, "bench", "--suite", "context", "--model", "tiny",
                        "--threads", "1", "--steps", "2", "--json", out],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    print(p.stdout)
    check(p.returncode == 0, f"bench --suite context exited {p.returncode}: {p.stderr[-2000:]}")
    rows = json.load(open(out))["rows"] if os.path.exists(out) else []
    ring = [r for r in rows if r["name"].startswith("ring T=")]
    check(len(ring) == 1 and ring[0]["cp"] == 2 and ring[0]["ring_ms"] > 0
          and ring[0]["compute_ms"] > 0 and ring[0]["transfer_ms"] > 0
          and 0 <= ring[0]["hidden"] <= 1 and ring[0]["ratio"] > 0, f"ring row: {ring}")
    plans = {int(r["cp"]): r for r in rows if r["name"].startswith("plan cp=")}
    check(sorted(plans) == [1, 2, 4], f"plan rows: {sorted(plans)}")
    for cp, r in plans.items():
        check(abs(r["of_cp1"] * cp - 1) < 0.1, f"cp {cp}: activations {r['of_cp1']:.3f} of cp 1's")
    check(bool(rows) and all(r["wrong"] == 0 for r in rows), "a row is wrong")

    alone = subprocess.run([BIN, "bench", "--suite", "context", "--model", "tiny"], cwd=tmp,
                           capture_output=True, text=True, timeout=60)
    check(alone.returncode != 0 and "needs 2 or more ranks" in alone.stderr,
          f"one rank: exit {alone.returncode}, stderr {alone.stderr!r}")

for p in problems:
    print("FAILED:", p)
print("bench_context_test:", "FAILED" if problems else "passed")
sys.exit(1 if problems else 0)
