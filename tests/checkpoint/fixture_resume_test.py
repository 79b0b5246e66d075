#!/usr/bin/env python3
"""A checkpoint written by an earlier meshtrain still loads and continues with the same bits.

fixtures/gpt2-f404fd5/ holds a step-2 checkpoint of a tiny GPT-2, written by commit f404fd5
(before the model layer became specifications), the deck that wrote it, and in continued.json the
losses and gradient norms of the steps it continued with and a hash of every dataset of the
step-4 checkpoint. Today's binary resumes from it on 1 rank, and on 2 ranks in a tensor-parallel
layout (checkpoints are layout-free), and must reproduce them.

Bits depend on the machine: the binary is built with -march=native and the BLAS picks kernels by
CPU. On a machine of the recording's kind (CPU model and instruction-set flags) the single-rank
continuation must match bit for bit, its step-4 state included; elsewhere, and on 2 ranks, to
1e-4 relative: two fp32 steps from the same state differ in summation order by some 1e-6, while a
parameter loaded wrongly (transposed, misnamed, missing) moves the loss by far more. When a CPU
kernel's rounding changes on purpose, the continuation is recorded again (`continued_by` says by
what); the checkpoint itself stays as f404fd5 wrote it.

usage: fixture_resume_test.py --meshtrain BIN --mpiexec MPIEXEC
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "gpt2-f404fd5")
RELATIVE = 1e-4

ap = argparse.ArgumentParser()
ap.add_argument("--meshtrain", required=True)
ap.add_argument("--mpiexec", required=True)
args = ap.parse_args()


def machine():
    cpu = open("/proc/cpuinfo").read()
    flags = set(re.search(r"^flags\s*:\s*(.*)$", cpu, re.M).group(1).split())
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    return {"model_name": model.group(1) if model else "?",
            "isa_flags": sorted(f for f in flags if f in
                                ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"))}


def state_hash(path):
    import h5py  # Debian's python3-h5py; the exact check is skipped without it
    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in sorted(names):
            h.update(n.encode())
            h.update(f[n][()].tobytes())
    return h.hexdigest()


def continue_run(tmp, name, launch, extra):
    run_dir = os.path.join(tmp, name)
    start = os.path.join(tmp, "start_%s.h5" % name)
    shutil.copyfile(os.path.join(FIXTURE, "step_00000002.h5"), start)  # the fixture stays as it is
    p = subprocess.run(launch + [args.meshtrain, "train", os.path.join(FIXTURE, "deck.toml"),
                                 "--set", "run.dir=" + run_dir, "--set", "checkpoint.resume=" + start] + extra,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        return None, ["%s: train exited %d:\n%s" % (name, p.returncode, (p.stdout + p.stderr)[-3000:])]
    if "resumed from %s at step 2" % start not in p.stdout + p.stderr:
        return None, ["%s: the run did not say it resumed at step 2" % name]
    seen = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "loss" in r:
            seen[str(r["step"])] = {"loss": r["loss"], "grad_norm": r["grad_norm"]}
    return run_dir, seen


def main():
    want = json.load(open(os.path.join(FIXTURE, "continued.json")))
    same_machine = machine() == want["machine"]
    print("machine %s: %s" % (machine(), "the recording's kind: bit for bit" if same_machine
                               else "another kind than the recording's %s: to %g relative"
                               % (want["machine"], RELATIVE)))
    problems = []
    with tempfile.TemporaryDirectory(prefix="meshtrain-fixture-") as tmp:
        for name, launch, extra, exact in (
                ("single", [], [], same_machine),
                ("tp2", [args.mpiexec, "-n", "2"], ["--set", "parallel.tp=2"], False)):
            run_dir, seen = continue_run(tmp, name, launch, extra)
            if run_dir is None:
                problems += seen
                continue
            for step, values in want["continued"].items():
                for key, expected in values.items():
                    got = seen.get(step, {}).get(key)
                    ok = got is not None and (got == expected if exact else
                                              abs(got - expected) <= RELATIVE * abs(expected))
                    print("%-6s step %s %-9s %.9g (recorded %.9g) %s" % (
                        name, step, key, got if got is not None else float("nan"), expected,
                        "ok" if ok else "DIFFERS"))
                    if not ok:
                        problems.append("%s: step %s %s = %r, recorded %r" % (name, step, key, got, expected))
            if name == "single" and same_machine:
                try:
                    got = state_hash(os.path.join(run_dir, "checkpoints", "step_00000004.h5"))
                except ImportError:
                    print("single: step-4 state hash not compared (no h5py)")
                else:
                    print("single step-4 state sha256 %s" % ("ok" if got == want["step_4_state_sha256"] else "DIFFERS"))
                    if got != want["step_4_state_sha256"]:
                        problems.append("single: the step-4 state differs from the recording's")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    return 0


sys.exit(main())
