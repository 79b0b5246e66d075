#!/usr/bin/env python3
"""The strategy advisor end to end, on 2 ranks: a measured machine profile, the ranked layouts
of `plan --all --time` (text and JSON), and `train` with "auto" layout choices taking the layout
the ranking puts first, with a profile file and with one measured at start-up; plus the
refusals (an "auto" deck planned without a profile, a profile that does not exist) and the
accuracy benchmark's quick version (scripts/advisor-accuracy.py --quick) running as written.

usage: advisor_test.py MESHTRAIN_BINARY MPIEXEC
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ)

DECK = """
[run]
name = "advisor"
dir = "{dir}"
device = "cpu"
threads = 1
[model]
layers = 4
d_model = 64
heads = 4
seq_len = 32
vocab_size = 256
[data]
synthetic_bytes = 65536
val = "none"
[train]
precision = "fp32"
steps = 3
global_batch = 8
micro_batch = "auto"
[parallel]
dp = "auto"
tp = "auto"
pp = "auto"
zero = "auto"
recompute = "auto"
schedule = "auto"
profile = "{profile}"
"""

failures = []


def check(ok, what, output=""):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}\n{output[-3000:]}")
    else:
        print(f"ok: {what}")


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=REPO)
    return p.returncode, p.stdout + p.stderr


def threads_per_rank(profile):
    m = re.search(r"^threads_per_rank = (\d+)", open(profile).read(), re.M) if os.path.exists(profile) else None
    return int(m.group(1)) if m else None


def check_calibrate_threads_as_train(tmp, deck):
    """calibrate without --threads measures at the threads `train` runs on the same launch (its
    device line), so that the time model prices training with training's rates: from the node's
    cores (2 ranks), and from OMP_NUM_THREADS (1 rank)."""
    no_omp = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    for ranks, env in ((2, no_omp), (1, dict(no_omp, OMP_NUM_THREADS="1"))):
        profile = os.path.join(tmp, f"threads-{ranks}.toml")
        p = subprocess.run([MPIEXEC, "-n", str(ranks), BIN, "bench", "--suite", "calibrate", "--passes", "1",
                            "--steps", "3", "--out", profile], capture_output=True, text=True, env=env,
                           timeout=300, cwd=REPO)
        out = p.stdout + p.stderr
        p = subprocess.run([MPIEXEC, "-n", str(ranks), BIN, "train", deck, "--set", "run.threads=0",
                            "--set", "train.steps=1", "--set", "parallel.profile=\"\"",
                            "--set", f'run.dir="{os.path.join(tmp, f"threads-run-{ranks}")}"'],
                           capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
        out += p.stdout + p.stderr
        m = re.search(r"^device: .*?(\d+) thread\(s\) per rank", out, re.M)
        check(m is not None and threads_per_rank(profile) == int(m.group(1)),
              f"calibrate on {ranks} rank(s) without --threads measures at train's threads "
              f"(profile {threads_per_rank(profile)}, train {m.group(1) if m else None})", out)


def check_launch_recorded(tmp, deck, profile):
    """The profile records the launch calibrate measured under (each rank's bound cores, whether
    waiting ranks yield or spin); plan --time says which launch its times assume, and train under
    another launch warns in one line naming what differs."""
    text = open(profile).read() if os.path.exists(profile) else ""
    cores = re.search(r"^cores_per_rank = (\d+)$", text, re.M)
    idle = re.search(r'^idle_ranks = "(yield|spin)"$', text, re.M)
    check(cores is not None and idle is not None, "calibrate records the launch in the profile", text)
    if not (cores and idle):
        return
    code, out = run([BIN, "plan", deck, "--world", "2", "--time", "--profile", profile, "--threads", "1"])
    check(code == 0 and re.search(r"^# launch: times assume the launch .*each rank bound to \d+ core", out, re.M),
          "plan --time names the launch its times assume", out)
    # The same profile as if calibrated under another launch: one more core per rank, the other
    # idle mode.
    other_cores, other_idle = int(cores.group(1)) + 1, "spin" if idle.group(1) == "yield" else "yield"
    other = os.path.join(tmp, "other-launch.toml")
    with open(other, "w") as f:
        f.write(text.replace(cores.group(0), f"cores_per_rank = {other_cores}")
                    .replace(idle.group(0), f'idle_ranks = "{other_idle}"'))
    code, out = run([MPIEXEC, "-n", "2", BIN, "train", deck, "--set", f'parallel.profile="{other}"',
                     "--set", f'run.dir="{os.path.join(tmp, "other-launch")}"'])
    lines = [l for l in out.splitlines() if "differs from the one machine profile" in l]
    check(code == 0 and len(lines) == 1 and other in lines[0] and
          f"each rank bound to {cores.group(1)} core" in lines[0] and f"(calibrated: {other_cores})" in lines[0] and
          f"waiting ranks {idle.group(1)} (calibrated: {other_idle})" in lines[0] and
          "predicted times assume the calibrated launch" in lines[0],
          "train under another launch than the profile's warns once, naming what differs", out)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "machine.toml")
        # One pass keeps the test short; the profile's notes say how many were taken.
        code, out = run([MPIEXEC, "-n", "2", BIN, "bench", "--suite", "calibrate", "--threads", "1",
                         "--passes", "1", "--out", profile])
        check(code == 0 and os.path.exists(profile), "calibrate on 2 ranks writes a profile", out)
        check(os.path.exists(profile) and "median of 1 pass(es)" in open(profile).read(),
              "the profile's notes record the passes", out)

        deck = os.path.join(tmp, "auto.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=os.path.join(tmp, "run"), profile=profile))

        check_calibrate_threads_as_train(tmp, deck)

        # The ranking, as JSON: every field, fastest first among those planned.
        code, out = run([BIN, "plan", deck, "--world", "2", "--all", "--time", "--profile", profile,
                         "--json", "--top", "5", "--threads", "1"])
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        check(code == 0 and len(rows) == 5, "plan --all --time --json lists the 5 fastest that fit", out)
        keys = {"dp", "tp", "pp", "micro_batch", "schedule", "virtual_stages", "zero", "recompute",
                "sequence_parallel", "step_ms", "mfu", "peak_bytes"}
        check(all(keys <= set(r) for r in rows), "every JSON layout has the documented fields", out)
        check(all(rows[i]["step_ms"] <= rows[i + 1]["step_ms"] for i in range(len(rows) - 1)),
              "layouts come fastest first", out)
        check(all(r["dp"] * r["tp"] * r["pp"] == 2 and r["peak_bytes"] > 0 and 0 < r["mfu"] < 1 for r in rows),
              "each layout fills the world, with a planned peak and an MFU", out)

        code, out = run([BIN, "plan", deck, "--world", "2", "--all", "--time", "--profile", profile,
                         "--threads", "1"])
        check(code == 0 and re.search(r"^  1 +dp \d tp \d pp \d", out, re.M) is not None,
              "plan --all --time prints a ranked table", out)

        # A mixture of experts: the advisor ranks ep among the divisors of dp x cp that divide
        # the experts (moe-tiny: 8 experts on 4 ranks), with the exchange's share; dense layouts
        # carry no ep field (theirs is always 1).
        moe_deck = os.path.join(REPO, "input", "moe-tiny.toml")
        code, out = run([BIN, "plan", moe_deck, "--world", "4", "--all", "--time", "--profile", profile,
                         "--json", "--top", "0", "--threads", "1"])
        moe_rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        check(code == 0 and {r.get("ep") for r in moe_rows} == {1, 2, 4} and
              all(r["ep_ms"] > 0 for r in moe_rows if r["ep"] > 1) and
              all(r["ep_ms"] == 0 for r in moe_rows if r["ep"] == 1),
              "plan --all --time ranks a mixture of experts' layouts at ep 1, 2 and 4", out)
        check(all("ep" not in r for r in rows), "a dense model's layouts have no ep", out)
        # parallel.ep = "auto": the advisor's choice among those ep, the deck's other choices kept
        # (moe-tiny fixes tp 1, pp 1, 1f1b, ZeRO 0, no recomputation and micro-batch 2).
        code, out = run([BIN, "plan", moe_deck, "--world", "4", "--time", "--profile", profile,
                         "--threads", "1", "--set", 'parallel.ep="auto"'])
        m = re.search(r'^# "auto" takes (.*?) \(([0-9.]+) ms\)', out, re.M)
        fixed = [r for r in moe_rows if r["tp"] == 1 and r["pp"] == 1 and r["zero"] == 0 and
                 r["recompute"] == "none" and r["micro_batch"] == 2 and r["schedule"] == "1f1b"]
        best_ep = min(fixed, key=lambda r: r["step_ms"])["ep"] if fixed else None
        chosen = re.search(r"\bep (\d+)", m.group(1)) if m else None
        check(code == 0 and m is not None and best_ep is not None and
              (int(chosen.group(1)) if chosen else 1) == best_ep,
              "parallel.ep = \"auto\" takes the fastest ep the ranking gives the deck's other choices",
              out + "\nfixed rows: " + json.dumps(fixed))
        code, out = run([BIN, "plan", deck, "--world", "2", "--time", "--profile", profile, "--threads", "1",
                         "--set", 'parallel.ep="auto"'])
        check(code == 0 and re.search(r'^# "auto" takes dp \d', out, re.M) is not None and
              not re.search(r'^# "auto" takes [^(]*\bep ', out, re.M),
              "parallel.ep = \"auto\" on a dense model is ep 1", out)

        # train takes the ranking's first layout and says so, with the runner-up.
        best = rows[0]
        code, out = run([MPIEXEC, "-n", "2", BIN, "train", deck])
        m = re.search(r'layout: "auto" chose dp (\d+) tp (\d+) pp (\d+) (\S+)', out)
        check(code == 0 and m is not None and "runner-up" in out, "train with \"auto\" reports its choice", out)
        if m:
            check((int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)) ==
                  (best["dp"], best["tp"], best["pp"], best["schedule"]),
                  "train takes the layout plan ranks first", out)
        check(re.search(r"^step +3/3", out, re.M) is not None, "the chosen layout trains", out)
        check("differs from the one machine profile" not in out,
              "train under the launch the profile was calibrated under does not warn", out)

        check_launch_recorded(tmp, deck, profile)

        # A profile measured at start-up (parallel.profile = "").
        code, out = run([MPIEXEC, "-n", "2", BIN, "train", deck, "--set", 'parallel.profile=""',
                         "--set", f'run.dir="{os.path.join(tmp, "measured")}"'])
        check(code == 0 and "measured at start-up" in out and re.search(r"^step +3/3", out, re.M) is not None,
              "train measures the machine when parallel.profile is empty", out)

        # Refusals: one clear message, non-zero exit, on every rank.
        code, out = run([BIN, "plan", deck, "--world", "2"])
        check(code == 1 and "--profile" in out and "auto" in out, "an \"auto\" deck planned without a profile", out)
        missing = os.path.join(tmp, "nope.toml")
        code, out = run([MPIEXEC, "-n", "2", BIN, "train", deck, "--set", f'parallel.profile="{missing}"'])
        check(code == 1 and missing in out and "parallel.profile" in out and out.count("nope.toml") <= 2,
              "a missing parallel.profile is one error naming it", out)

        code, out = run([sys.executable, os.path.join(REPO, "scripts", "advisor-accuracy.py"), "--quick",
                         "--ranks", "2", "--bin", BIN, "--mpirun", MPIEXEC, "--out", os.path.join(tmp, "accuracy")], timeout=600)
        check(code == 0 and "spearman" in out and "auto" in out, "advisor-accuracy.py --quick runs", out)

    if failures:
        print(f"{len(failures)} failure(s): {failures}")
        sys.exit(1)


if __name__ == "__main__":
    main()
