#!/usr/bin/env python3
"""`meshtrain bench --suite attention` with the tiny settings: per precision the CPU runs (fp32,
and bf16 where oneDNN has bf16 GEMMs) one row per head shape (HS = HV = 16 and 32, and latent
attention's HS 48 / HV 32), each with positive times, GFLOP/s and ceiling, ratios that agree with
GFLOP/s over the ceiling, wrong = 0, exit 0.

usage: bench_attention_test.py MESHTRAIN_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
problems = []


def check(condition, what):
    if not condition:
        problems.append(what)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "attention.json")
    p = subprocess.run([BIN, "bench", "--suite", "attention", "--model", "tiny", "--threads", "2",
                        "--steps", "2", "--json", out], cwd=tmp, capture_output=True, text=True,
                       timeout=300)
    print(p.stdout)
    check(p.returncode == 0, f"bench --suite attention exited {p.returncode}: {p.stderr[-2000:]}")
    rows = json.load(open(out))["rows"] if os.path.exists(out) else []
    names = [r["name"] for r in rows]
    check("fp32" in names, f"no fp32 row: {names}")
    shapes = sorted((r["HS"], r["HV"]) for r in rows if r["name"] == "fp32")
    check(shapes == [(16, 16), (32, 32), (48, 32)], f"fp32 head shapes {shapes}")
    for r in rows:
        check(r["T"] == 128 and r["forward_ms"] > 0 and r["backward_ms"] > 0
              and r["ceiling_gflops"] > 0, f"row {r}")
        for d in ("forward", "backward"):
            check(abs(r[f"{d}_ratio"] * r["ceiling_gflops"] - r[f"{d}_gflops"])
                  <= 1e-6 * r[f"{d}_gflops"] + 1e-9, f"{d} ratio of {r}")
    check(bool(rows) and all(r["wrong"] == 0 for r in rows), "a row is wrong")

for p in problems:
    print("FAILED:", p)
print("bench_attention_test:", "FAILED" if problems else "passed")
sys.exit(1 if problems else 0)
