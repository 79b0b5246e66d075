#!/usr/bin/env python3
"""`meshtrain bench --suite step` prints the rows docs/benchmarks.md describes, on a tiny model.

  - one rank, --threads 2, for the tiny GPT-2 and the tiny Llama: the three GEMM ceilings at 1 and at 2 threads, the fp32 and bf16 steps
    at 1 and at 2 threads with their ratio to the ceiling of their thread count and their
    scaling over 1 thread and their non-GEMM share, the 2-thread breakdown with each kernel's
    speed-up, and the non-GEMM table (GEMMs against the rest, the slowest non-GEMM kernels);
  - two ranks (mpiexec -n 2, --threads 1): the data-parallel rows (dp 2x1 thread) against the
    summed ceilings of both ranks, with the exposed all-reduce's share of the step and the
    non-GEMM table;
every row checked (wrong = 0, exit 0), the figures positive and the shares within [0, 1]. Then
bench/cpu/compare_pytorch.py where PyTorch cannot be imported: it says so and exits 77.

usage: bench_step_test.py MESHTRAIN_BINARY MPIEXEC REPO
"""
import json
import os
import subprocess
import sys
import tempfile

BIN, MPIEXEC, REPO = sys.argv[1], sys.argv[2], sys.argv[3]
problems = []


def check(condition, what):
    if not condition:
        problems.append(what)


def run(command, cwd):
    p = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    print(p.stdout)
    if p.returncode != 0:
        print(p.stderr)
    check(p.returncode == 0, f"{' '.join(command)} exited {p.returncode}")
    return p


def rows_named(rows, *parts):
    return [r for r in rows if all(part in r["name"] for part in parts)]


def check_non_gemm(rows, model, label):
    """The non-GEMM table: per precision the step's GEMMs and the rest, which add up to the step
    (the shares to 1), and the slowest non-GEMM kernels, none of them a matmul, slowest first."""
    for precision in ("fp32", "bf16"):
        name = f"{model} {precision} {label}"
        gemm = [r for r in rows if r["name"] == name + ": GEMMs"]
        rest = [r for r in rows if r["name"] == name + ": non-GEMM"]
        top = [r for r in rows if r["name"].startswith(name + ": non-GEMM ")]
        ok = len(gemm) == 1 and len(rest) == 1 and 3 <= len(top) <= 8
        if ok:
            ok = (gemm[0]["ms/step"] > 0 and rest[0]["ms/step"] > 0
                  and abs(gemm[0]["share"] + rest[0]["share"] - 1) < 1e-6
                  and not any("matmul" in r["name"] for r in top)
                  and all(a["ms/step"] >= b["ms/step"] for a, b in zip(top, top[1:]))
                  and sum(r["share"] for r in top) <= rest[0]["share"] + 1e-6)
        check(ok, f"non-GEMM rows of '{name}': {gemm} {rest} {top}")


def one_rank(tmp, model="tiny"):
    """One rank's rows for the tiny GPT-2, or for the tiny Llama (the Llama step rows)."""
    out = os.path.join(tmp, model + ".json")
    run([BIN, "bench", "--suite", "step", "--model", model, "--threads", "2", "--steps", "2",
         "--json", out], tmp)
    if not os.path.exists(out):
        return
    rows = json.load(open(out))["rows"]
    for threads in (1, 2):
        label = f"{threads} thread" + ("s" if threads > 1 else "")
        for ceiling in ("OpenBLAS sgemm", "oneDNN fp32 matmul", "oneDNN bf16 matmul"):
            found = rows_named(rows, ceiling + ", " + label)
            check(len(found) == 1 and found[0]["GFLOP/s"] > 0 and found[0]["threads"] == threads,
                  f"ceiling row '{ceiling}, {label}': {found}")
        for precision in ("fp32", "bf16"):
            found = [r for r in rows_named(rows, f"{model} {precision}, {label}") if "tokens/s" in r]
            ok = len(found) == 1
            if ok:
                r = found[0]
                ok = (r["threads"] == threads and r["tokens"] == 4 * 32 and r["tokens/s"] > 0
                      and r["time_ms"] > 0 and 0 < r["ratio"] and r["scaling"] > 0
                      and (threads > 1 or abs(r["scaling"] - 1) < 1e-9)
                      and 0 < r["non_gemm"] < 1)
            check(ok, f"step row '{model} {precision}, {label}': {found}")
    check_non_gemm(rows, model, "(2 threads)")
    breakdown = [r for r in rows if "speedup" in r]
    check(len(breakdown) > 5 and any(r["speedup"] > 0 for r in breakdown),
          f"the 2-thread breakdown has no speedup column: {len(breakdown)} rows")
    if model == "tiny-llama":
        names = " ".join(r["name"] for r in breakdown)
        check(all(k in names for k in ("rmsnorm_forward", "swiglu_forward", "rotary_forward")),
              f"the Llama breakdown lacks its own kernels: {names}")
    if model == "tiny-mla":
        names = " ".join(r["name"] for r in breakdown)
        check(all(k in names for k in ("rmsnorm_forward", "rotary_forward")),
              f"the latent-attention breakdown lacks its own kernels: {names}")
    check(all(r["wrong"] == 0 for r in rows), "a row is wrong")


def two_ranks(tmp):
    out = os.path.join(tmp, "dp.json")
    run([MPIEXEC, "-n", "2", BIN, "bench", "--suite", "step", "--model", "tiny", "--threads", "1",
         "--steps", "2", "--json", out], tmp)
    if not os.path.exists(out):
        return
    rows = json.load(open(out))["rows"]
    for ceiling in ("OpenBLAS sgemm", "oneDNN fp32 matmul", "oneDNN bf16 matmul"):
        found = rows_named(rows, ceiling + ", 2x1 thread")
        check(len(found) == 1 and found[0]["GFLOP/s"] > 0, f"summed ceiling '{ceiling}': {found}")
    for precision in ("fp32", "bf16"):
        found = rows_named(rows, f"tiny {precision}, dp 2x1 thread")
        ok = len(found) == 1
        if ok:
            r = found[0]
            ok = (r["ranks"] == 2 and r["threads"] == 1 and r["tokens"] == 2 * 4 * 32
                  and r["tokens/s"] > 0 and r["ratio"] > 0 and 0 <= r["allreduce"] <= 1
                  and 0 < r["non_gemm"] < 1)
        check(ok, f"dp row 'tiny {precision}, dp 2x1 thread': {found}")
    check_non_gemm(rows, "tiny", "(dp 2x1 thread)")
    exposed = rows_named(rows, "of which gradient all-reduce")
    check(len(exposed) == 2 and all(0 <= r["share"] <= 1 for r in exposed),
          f"breakdown rows of the exposed all-reduce: {exposed}")
    check(all(r["wrong"] == 0 for r in rows), "a row is wrong")


def without_pytorch():
    """The comparison script, with `import torch` made to fail: a clear message and exit 77."""
    script = os.path.join(REPO, "bench", "cpu", "compare_pytorch.py")
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code, script], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 77 and "PyTorch is not installed" in p.stderr,
          f"compare_pytorch.py without PyTorch: exit {p.returncode}, stderr {p.stderr!r}")


with tempfile.TemporaryDirectory() as tmp:
    one_rank(tmp)
    one_rank(tmp, "tiny-llama")
    one_rank(tmp, "tiny-mla")
    two_ranks(tmp)
without_pytorch()
for p in problems:
    print("FAILED:", p)
print("bench_step_test:", "FAILED" if problems else "passed")
sys.exit(1 if problems else 0)
