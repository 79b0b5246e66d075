#!/usr/bin/env python3
"""How well the strategy advisor's time model predicts this machine (`make bench`).

    scripts/advisor-accuracy.py [--ranks 8] [--runs 3] [--steps 6] [--passes 3] [--quick] [--bin build/meshtrain]
                                [--launch both|typed|tuned]

Measures a machine profile with `meshtrain bench --suite calibrate --passes N` on the same launch, then for
a dozen layouts of one deck that exercise every axis and schedule (dp; tp with and without
sequence parallelism; pp with GPipe, 1F1B and interleaved; ZeRO 1-3; selective and full
recomputation; micro-batch size) predicts the step time (`meshtrain plan --time`) and measures it
(`meshtrain train`, each run a fresh job: the median step after the first, the median of --runs
runs). Then the layout `plan --all --time` ranks first ("auto") is run too. Prints the table,
Spearman's rank correlation of predicted and measured, the median absolute error and auto's
pick against the fastest measured, each beside the issue's target.

Under each launch (--launch, default both): "typed" is `mpirun -np N` as a user types it (the
MPI library's default binding and polling: ranks waiting in MPI spin on their cores), "tuned" adds
`--bind-to none` and mpi_yield_when_idle (waiting ranks sleep and lend their cores). The profile is
calibrated under the same launch as the runs it predicts, which is what makes the model hold for
either (calibrate measures how much waiting ranks lend: waiting_ranks_lend).

Exit status: 1 when a command fails or a result is missing (the figures themselves are
measurements of a shared, noisy machine and never fail the run); --quick is the tests' version:
2 layouts fewer ranks, 1 run, 3 steps, 1 calibration pass, a smaller model.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, overrides (besides dp = "auto")
LAYOUTS = [
    ("dp", {}),
    ("dp zero1", {"parallel.zero": 1}),
    ("dp zero2", {"parallel.zero": 2}),
    ("dp zero3", {"parallel.zero": 3}),
    ("dp rc full", {"parallel.recompute": '"full"'}),
    ("dp mb1", {"train.micro_batch": 1}),
    ("tp2", {"parallel.tp": 2}),
    ("tp2 sp rc sel", {"parallel.tp": 2, "parallel.sequence_parallel": "true",
                       "parallel.recompute": '"selective"'}),
    ("tp4", {"parallel.tp": 4}),
    ("pp2 1f1b", {"parallel.pp": 2, "train.micro_batch": 1}),
    ("pp2 gpipe", {"parallel.pp": 2, "parallel.schedule": '"gpipe"', "train.micro_batch": 1}),
    ("pp4 1f1b", {"parallel.pp": 4, "train.micro_batch": 1}),
    ("pp2 interleaved", {"parallel.pp": 2, "parallel.schedule": '"interleaved"',
                         "parallel.virtual_stages": 2, "train.micro_batch": 1}),
    ("tp2 pp2 zero1", {"parallel.tp": 2, "parallel.pp": 2, "parallel.zero": 1, "train.micro_batch": 1}),
]
QUICK = ["dp", "tp2", "pp2 gpipe"]

DECK = """\
# The advisor accuracy deck (scripts/advisor-accuracy.py).
[run]
name = "advisor"
dir = "{dir}"
log_every = 1
threads = 1
[model]
layers = {layers}
d_model = {d_model}
heads = 8
seq_len = {seq_len}
vocab_size = 512
[data]
train = "synthetic"
val = "none"
[train]
precision = "fp32"
steps = {steps}
global_batch = {global_batch}
micro_batch = 2
[parallel]
dp = "auto"
[checkpoint]
every = 0
resume = "none"
"""


def mpi_env(launch):
    """The environment of `launch`: "tuned" makes waiting ranks sleep; "typed" leaves the MPI
    library's defaults (only what running as root and more ranks than cores require)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_mpi_yield")}
    env.update(OMP_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    if launch == "tuned":
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def launcher(args, launch):
    if "mpich" in args.mpirun:
        return [args.mpirun, "-n", str(args.ranks)]
    return [args.mpirun, "-np", str(args.ranks)] + (["--bind-to", "none"] if launch == "tuned" else [])


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if p.returncode != 0:
        sys.stderr.write(f"advisor-accuracy: `{' '.join(cmd)}` failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        sys.exit(1)
    return p.stdout


def sets(overrides):
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={v}"]
    return out


def spearman(a, b):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--passes", type=int, default=3, help="calibrate's passes (each point's median)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bin", default=os.path.join("build", "meshtrain"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--out", default=os.path.join("runs", "advisor"))
    ap.add_argument("--launch", choices=["both", "typed", "tuned"], default=None,
                    help="typed: mpirun -np N as users type it; tuned: --bind-to none and "
                         "mpi_yield_when_idle; both (the default; --quick: tuned)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.steps, args.passes = 1, 3, 1
    launches = ["typed", "tuned"] if (args.launch or ("tuned" if args.quick else "both")) == "both" \
        else [args.launch or "tuned"]
    for launch in launches:
        measure_launch(args, launch)


def measure_launch(args, launch_name):
    out = os.path.join(args.out, launch_name)
    os.makedirs(os.path.join(REPO, out), exist_ok=True)
    deck = os.path.join(out, "advisor.toml")
    with open(os.path.join(REPO, deck), "w") as f:
        f.write(DECK.format(dir=os.path.join(out, "run"), layers=4 if args.quick else 8,
                            d_model=128 if args.quick else 256, seq_len=64 if args.quick else 128,
                            steps=args.steps, global_batch=4 * args.ranks))
    env = mpi_env(launch_name)
    launch = launcher(args, launch_name)
    profile = os.path.join(out, "machine.toml")
    run(launch + [args.bin, "bench", "--suite", "calibrate", "--threads", "1", "--passes", str(args.passes),
                  "--out", profile], env)

    def predict(overrides):
        text = run([args.bin, "plan", deck, "--world", str(args.ranks), "--time", "--profile", profile]
                   + sets(overrides))
        m = re.search(r"^# time on .*?: ([0-9.]+) ms", text, re.M)
        if not m:
            sys.exit(f"advisor-accuracy: no predicted time in:\n{text}")
        return float(m.group(1))

    def measure(overrides):
        medians = []
        for _ in range(args.runs):
            text = run(launch + [args.bin, "train", deck] + sets(overrides), env)
            steps = [float(x) for x in re.findall(r"\|\s+([0-9.]+) ms \|", text)]
            if len(steps) < 2:
                sys.exit(f"advisor-accuracy: no step times in:\n{text}")
            medians.append(statistics.median(steps[1:]))
        return statistics.median(medians)

    rows = []
    for name, overrides in LAYOUTS:
        if args.quick and name not in QUICK:
            continue
        tp = overrides.get("parallel.tp", 1)
        pp = overrides.get("parallel.pp", 1)
        if args.ranks % (tp * pp):
            continue
        rows.append((name, predict(overrides), measure(overrides)))
        print(f"  {name:<18} predicted {rows[-1][1]:9.1f} ms  measured {rows[-1][2]:9.1f} ms", flush=True)

    best = json.loads(run([args.bin, "plan", deck, "--world", str(args.ranks), "--all", "--time",
                           "--profile", profile, "--json", "--top", "1"]).splitlines()[0])
    auto = {"parallel.tp": best["tp"], "parallel.pp": best["pp"], "train.micro_batch": best["micro_batch"],
            "parallel.schedule": f'"{best["schedule"]}"', "parallel.virtual_stages": best["virtual_stages"],
            "parallel.zero": best["zero"], "parallel.recompute": f'"{best["recompute"]}"',
            "parallel.sequence_parallel": "true" if best["sequence_parallel"] else "false"}
    auto_ms = measure(auto)
    auto_name = (f"dp {best['dp']} tp {best['tp']} pp {best['pp']} {best['schedule']} mb {best['micro_batch']} "
                 f"zero {best['zero']} rc {best['recompute']}")

    predicted = [r[1] for r in rows]
    measured = [r[2] for r in rows]
    rho = spearman(predicted, measured) if len(rows) > 1 else 0.0
    error = statistics.median(abs(p / m - 1) for p, m in zip(predicted, measured))
    fastest = min(measured + [auto_ms])
    print(f"# advisor accuracy, launch {launch_name} (`{' '.join(launch)}`): {args.ranks} ranks, {len(rows)} "
          f"layouts, profile {profile} measured in this run under the same launch; "
          f"measured = median of {args.runs} runs' median step")
    print(f"# {'layout':<18} {'predicted_ms':>12} {'measured_ms':>12} {'ratio':>7}")
    for name, p, m in rows:
        print(f"  {name:<18} {p:12.1f} {m:12.1f} {p / m:7.2f}")
    print(f"  {'auto':<18} {best['step_ms']:12.1f} {auto_ms:12.1f} {best['step_ms'] / auto_ms:7.2f}   ({auto_name})")
    print(f"# spearman {rho:.2f} (target >= 0.8), median abs error {100 * error:.0f}% (target <= 20%), "
          f"auto / fastest measured {auto_ms / fastest:.2f} (target <= 1.10)")


if __name__ == "__main__":
    main()
