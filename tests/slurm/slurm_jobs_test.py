#!/usr/bin/env python3
"""The job scripts of jobs/, run for real on a single-node Slurm started for the test.

1. jobs/single-node.sbatch trains a small deck to the end (the uninterrupted run).
2. jobs/chain.sbatch trains the same deck under a 1-minute time limit with a USR1 warning 45 s
   before it (--signal=B:USR1@45): each run is cut short by the warning, checkpoints, exits 75
   and requeues itself; the next run resumes, until training is complete. Its final checkpoint
   must equal the uninterrupted run's bitwise (every parameter and AdamW moment).
3. jobs/multi-node.sbatch runs (on one node) and finishes.
The harness (scripts/slurm-local.sh) starts munged, slurmctld and slurmd in a temporary
directory and stops every daemon it started, whatever happens. Needs root and the Debian
packages slurm-wlm and munge; otherwise the test reports itself skipped (exit 77).

usage: slurm_jobs_test.py --meshtrain BIN --repo REPO_ROOT
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77

DECK = """
[run]
device = "cpu"
name = "slurm"
log_every = 10
threads = 1
[model]
layers = 4
d_model = 256
heads = 4
seq_len = 64
vocab_size = 256
[data]
synthetic_bytes = 262144
val = "none"
[train]
steps = {steps}
global_batch = 16
micro_batch = 4
lr = 1e-3
warmup_steps = 10
[parallel]
dp = 2
[checkpoint]
every = 100000
keep = 2
"""


def sh(cmd, env, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


def wait_gone(job, env, timeout):
    """Waits until Slurm no longer lists the job (finished, not requeued). Slurm holds a
    requeued job about two minutes (reason BeginTime) before it may start again; the test
    releases it at once to keep its run time down."""
    end = time.time() + timeout
    while time.time() < end:
        out = sh(["squeue", "-h", "-j", job, "-o", "%T %r"], env).stdout.strip()
        if out == "":
            return True
        if out == "PENDING BeginTime":
            sh(["scontrol", "update", "JobId=" + job, "StartTime=now"], env)
        time.sleep(1)
    return False


def final_checkpoint(run_dir):
    ckpts = sorted(f for f in os.listdir(os.path.join(run_dir, "checkpoints")) if f.endswith(".h5"))
    return os.path.join(run_dir, "checkpoints", ckpts[-1])


def compare_checkpoints(a, b):
    import h5py
    import numpy as np
    problems = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        if fa.attrs["step"] != fb.attrs["step"]:
            problems.append("steps differ: %s vs %s" % (fa.attrs["step"], fb.attrs["step"]))
        names = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if not names:
            problems.append("no datasets")
        for n in names:
            if n not in fb or not np.array_equal(fa[n][()], fb[n][()]):
                problems.append("dataset %s differs" % n)
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--repo", required=True)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("SKIP: the Slurm daemons need root")
        return SKIP
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            print("SKIP: %s not installed (Debian packages slurm-wlm, munge)" % tool)
            return SKIP

    tmp = tempfile.mkdtemp(prefix="meshtrain_slurm_")
    harness = os.path.join(args.repo, "scripts", "slurm-local.sh")
    cluster = os.path.join(tmp, "cluster")
    env = dict(os.environ, SLURM_CONF=os.path.join(cluster, "slurm.conf"),
               MESHTRAIN_BIN=os.path.abspath(args.meshtrain), OMP_NUM_THREADS="1")
    failures = []
    try:
        up = sh([harness, "start", cluster], env, timeout=60)
        if up.returncode != 0:
            print(up.stdout + up.stderr)
            return 1
        # Steps of ~0.2 s on a 2-core machine: the chain needs several runs of ~15 s each.
        steps = 200
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(steps=steps))
        jobs = os.path.join(args.repo, "jobs")
        common = ["--chdir", tmp, "--ntasks-per-node=2", "--nodes=1"]

        # 1. Uninterrupted.
        start = time.time()
        a = sh(["sbatch", "--wait", "--output", os.path.join(tmp, "a.out"), "--time=10"] + common +
               [os.path.join(jobs, "single-node.sbatch"), deck, "--set", 'run.dir="a"'], env, timeout=600)
        print("uninterrupted job: exit %d in %.0f s" % (a.returncode, time.time() - start))
        if a.returncode != 0:
            failures.append("single-node job failed: " + a.stdout + a.stderr +
                            open(os.path.join(tmp, "a.out")).read()[-2000:])

        # 2. The chain under a 1-minute limit, warned 45 s before it.
        start = time.time()
        b = sh(["sbatch", "--parsable", "--output", os.path.join(tmp, "b.out"), "--time=1",
                "--signal=B:USR1@45"] + common +
               [os.path.join(jobs, "chain.sbatch"), deck, "--set", 'run.dir="b"'], env)
        job = b.stdout.strip().split(";")[0]
        done = wait_gone(job, env, 600)
        log = open(os.path.join(tmp, "b.out")).read()
        stops, resumes = log.count("stopping at step"), log.count("resumed from")
        print("chain job %s: %d stop(s) at the warning, %d resume(s), %.0f s" % (job, stops, resumes, time.time() - start))
        if not done:
            failures.append("the chain did not finish in 600 s")
        if stops < 1 or resumes < 1 or "requeueing" not in log:
            failures.append("the chain was not interrupted and resumed:\n" + log[-3000:])
        if ("step %5d/%d" % (steps, steps)) not in log or "finished with status 0" not in log:
            failures.append("the chain did not train to the end:\n" + log[-3000:])
        if not failures:
            problems = compare_checkpoints(final_checkpoint(os.path.join(tmp, "a")),
                                           final_checkpoint(os.path.join(tmp, "b")))
            print("final checkpoints: %s" % ("bitwise identical" if not problems else "; ".join(problems[:5])))
            failures += problems

        # 3. The multi-node script (on the one node there is).
        with open(deck, "w") as f:
            f.write(DECK.format(steps=5))
        m = sh(["sbatch", "--wait", "--output", os.path.join(tmp, "m.out"), "--time=5", "--nodes=1",
                "--chdir", tmp, "--ntasks-per-node=2", os.path.join(jobs, "multi-node.sbatch"), deck,
                "--set", 'run.dir="m"'], env, timeout=300)
        mlog = open(os.path.join(tmp, "m.out")).read()
        print("multi-node script: exit %d" % m.returncode)
        if m.returncode != 0 or "step     5/5" not in mlog:
            failures.append("multi-node job failed:\n" + mlog[-2000:])
    finally:
        sh([harness, "stop", cluster], env, timeout=60)
        if not failures:
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAILED: " + f)
    print("%d failure(s)%s" % (len(failures), "" if not failures else "; files kept in " + tmp))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
