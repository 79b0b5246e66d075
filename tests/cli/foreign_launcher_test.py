#!/usr/bin/env python3
"""Started by the other MPI's launcher, every process is a singleton: each must stop at once with
the input-error status and a message naming the launcher, how many processes it started, the MPI
the binary links and the launcher to use (app/launch_check.h), instead of refusing the deck's
layout as if one rank had been asked for. Then scripts/run-local.sh, which picks the launcher
from the binary's libraries, runs the same binary as one job of 2 ranks: repeatedly, with the
machine's cores kept busy, because the pick once failed there (`ldd | grep -q` under pipefail).

usage: foreign_launcher_test.py MESHTRAIN_BINARY FLAVOUR   (FLAVOUR: openmpi or mpich)
Skips (77) where the other MPI's launcher is not installed.
"""
import os
import shutil
import subprocess
import sys
import tempfile

BIN, FLAVOUR = os.path.abspath(sys.argv[1]), sys.argv[2]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOREIGN = {"openmpi": "mpiexec.mpich", "mpich": "mpiexec.openmpi"}[FLAVOUR]
LINKED = {"openmpi": "Open MPI", "mpich": "MPICH"}[FLAVOUR]
RANKS = 2
DECK = """
[run]
name = "foreign"
dir = "{dir}/runs"
device = "cpu"
threads = 1
[model]
layers = 1
d_model = 16
heads = 2
seq_len = 16
vocab_size = 256
[data]
train = "synthetic"
val = "synthetic"
synthetic_bytes = 20000
[train]
precision = "fp32"
steps = 1
global_batch = 4
micro_batch = 2
eval_every = 0
eval_batches = 1
[parallel]
dp = "auto"
[checkpoint]
every = 0
"""


def main():
    launcher = shutil.which(FOREIGN)
    if not launcher:
        print(f"SKIPPED: {FOREIGN} is not installed (the other MPI's launcher)")
        return 77
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    failures = []
    with tempfile.TemporaryDirectory(prefix="meshtrain-foreign-") as tmp:
        deck = os.path.join(tmp, "tiny.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))

        p = subprocess.run([launcher, "-n", str(RANKS), BIN, "train", deck], env=env,
                           capture_output=True, text=True, timeout=120)
        errors = [line for line in p.stderr.splitlines() if line.startswith("meshtrain: error:")]
        print(f"{FOREIGN} -n {RANKS} ({LINKED} build): exit {p.returncode}")
        print("\n".join(errors))
        if p.returncode != 1:
            failures.append(f"exit {p.returncode}, not 1 (input error)")
        if len(errors) != RANKS:
            failures.append(f"{len(errors)} error lines, not one per process ({RANKS}):\n"
                            f"{p.stdout}{p.stderr}")
        for part in (f"started {RANKS} processes", f"this binary links {LINKED}"):
            if not all(part in e for e in errors):
                failures.append(f"an error line lacks `{part}`")
        if os.path.exists(os.path.join(tmp, "runs")):
            failures.append("a singleton went on to write the run directory")

        # The right launcher, picked by the script, while every core is busy: the pick alone many
        # times (the failure was a race), then whole runs.
        expected = {"openmpi": "mpiexec", "mpich": "mpiexec.mpich"}[FLAVOUR]
        pick = ("set -euo pipefail; unset MESHTRAIN_MPIEXEC; bin=$1; "
                "for i in $(seq 200); do source \"$2\"; echo \"$mpiexec\"; done")
        # Each burner stops by itself after 120 s, should this test be killed before its cleanup.
        burner = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
        burners = [subprocess.Popen([sys.executable, "-c", burner]) for _ in range(os.cpu_count() or 2)]
        try:
            p = subprocess.run(["bash", "-c", pick, "pick", BIN,
                                os.path.join(REPO, "scripts", "mpi-launcher.sh")],
                               env=env, capture_output=True, text=True, timeout=300)
            picks = p.stdout.split()
            wrong = [x for x in picks if x != expected]
            print(f"scripts/mpi-launcher.sh: {len(picks)} picks, {len(wrong)} not {expected}")
            if p.returncode != 0 or len(picks) != 200 or wrong:
                failures.append(f"the launcher pick: exit {p.returncode}, {len(picks)} picks, "
                                f"{len(wrong)} not {expected}: {sorted(set(wrong))}\n{p.stderr}")
            for attempt in range(2):
                p = subprocess.run([os.path.join(REPO, "scripts", "run-local.sh"), str(RANKS), deck,
                                    "--set", f"run.name=attempt{attempt}"],
                                   env=dict(env, MESHTRAIN_BIN=BIN), capture_output=True,
                                   text=True, timeout=300)
                print(f"scripts/run-local.sh {RANKS} (attempt {attempt + 1}): exit {p.returncode}")
                if p.returncode != 0:
                    failures.append(f"scripts/run-local.sh exited {p.returncode}:\n"
                                    f"{p.stdout}{p.stderr}")
                    break
        finally:
            for b in burners:
                b.kill()
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
