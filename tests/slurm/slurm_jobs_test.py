#!/usr/bin/env python3
"""The job scripts of jobs/, run for real on a single-node Slurm started for the test.

1. jobs/single-node.sbatch trains a small deck to the end (the uninterrupted run).
2. jobs/chain.sbatch trains the same deck under a 1-minute time limit with a USR1 warning 45 s
   before it (--signal=B:USR1@45): each run is cut short by the warning, checkpoints, exits 75
   and requeues itself; the next run resumes, until training is complete. Its final checkpoint
   must equal the uninterrupted run's bitwise (every parameter and AdamW moment). Should Slurm's
   warning be late for the first run, the test sends it (slurm_cluster.chain).
3. jobs/multi-node.sbatch runs (on one node) and finishes.
The harness (scripts/slurm-local.sh) starts munged, slurmctld and slurmd in a temporary
directory and stops every daemon it started, whatever happens. tests/slurm/multi_node_test.py
does the same on 4 emulated nodes. Needs root and the Debian
packages slurm-wlm and munge; otherwise the test reports itself skipped (exit 77).

Under MPICH (`--srun-mpi pmi2`) the same jobs start their ranks with srun --mpi=pmi2, as
jobs/README users of an MPICH build do (MESHTRAIN_SRUN_MPI).

usage: slurm_jobs_test.py --meshtrain BIN --repo REPO_ROOT [--srun-mpi pmix|pmi2]
"""
import argparse
import os
import sys
import tempfile

from slurm_cluster import SKIP, Cluster, chain, report, skip_reason

DECK = """
[run]
device = "cpu"
name = "slurm"
log_every = 10
threads = 1
[model]
layers = 4
d_model = 64
heads = 4
seq_len = 32
vocab_size = 256
[data]
synthetic_bytes = 131072
val = "none"
[train]
precision = "fp32"
steps = {steps}
global_batch = 8
micro_batch = 4
lr = 1e-3
warmup_steps = 10
[parallel]
dp = 2
[checkpoint]
every = 100000
keep = 2
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--srun-mpi", default="pmix",
                   help="srun's --mpi plugin for the jobs: pmix (Open MPI), pmi2 (MPICH)")
    args = p.parse_args()
    why = skip_reason()
    if why:
        print("SKIP: " + why)
        return SKIP

    tmp = tempfile.mkdtemp(prefix="meshtrain_slurm_")
    failures = []
    try:
        print("jobs start the ranks with srun --mpi=%s" % args.srun_mpi)
        with Cluster(args.repo, os.path.join(tmp, "cluster"), 1, args.meshtrain,
                     extra_env={"MESHTRAIN_SRUN_MPI": args.srun_mpi}) as cluster:
            # Steps of 20 to 100 ms on a 2-core machine (idle or busy): 300 steps are cut by Slurm's
            # warning within the first 30 s of a run, or by the test's at step 100.
            steps = 300
            deck = os.path.join(tmp, "deck.toml")
            with open(deck, "w") as f:
                f.write(DECK.format(steps=steps))
            # 1, 2. The uninterrupted run and the chain, on one node.
            failures += chain(cluster, tmp, deck, steps, ["--nodes=1", "--ntasks-per-node=2"])

            # 3. The multi-node script (on the one node there is).
            with open(deck, "w") as f:
                f.write(DECK.format(steps=5))
            m = cluster.sbatch("multi-node.sbatch", [deck, "--set", 'run.dir="m"'],
                               ["--time=5", "--nodes=1", "--chdir", tmp, "--ntasks-per-node=2"],
                               os.path.join(tmp, "m.out"), timeout=300)
            print("multi-node script: exit %d" % m.status)
            if m.status != 0 or "step     5/5" not in m.log:
                failures.append("multi-node job failed:\n" + m.log[-2000:])
    except RuntimeError as e:
        failures.append(str(e))
    return report(tmp, failures)


if __name__ == "__main__":
    sys.exit(main())
