#!/usr/bin/env python3
"""Chaos under the emulated multi-node Slurm cluster (label slow): a chain job (jobs/chain.sbatch)
of 4 ranks on 2 emulated nodes trains a tiny model for a few hundred steps, checkpointing every
20, while the test strikes a random rank 10 times at random moments with kill -9, SIGSTOP or
SIGTERM. Each strike ends the run: SIGTERM through the rank's own stop handler (checkpoint, exit
75), kill -9 and SIGSTOP as a crash (the others' collectives time out after run.comm_timeout, or
the launcher ends the step); the chain requeues the job each time and the next run resumes from
the newest complete checkpoint. The final checkpoint must be bitwise equal (every parameter and
AdamW moment) to the one of the same chain job run without faults.

The moments are random but reproducible: a seeded generator (MESHTRAIN_CHAOS_SEED, else the
clock; printed) picks each strike's signal, rank and how many steps past where the run started
it lands (1-20, so every strike lands while training still has steps to go); within that step
the moment is wherever the test's 20 ms poll of the log finds it (forward, backward, a
collective, a checkpoint write). Where each rank runs comes from a side channel: the job runs a
wrapper that records its task's rank, restart and pid, then execs meshtrain.

Reported: each strike (signal, rank, node, the step it hit) and the time it lost: from the strike
to the moment a later run logs the first step past the one struck (detection, requeue, start,
loading the checkpoint, retraining the lost steps), or to the next strike where that comes first
(so the losses add up); the chaos job's time against the uninterrupted one's; the test's duration.
Needs root and the Debian packages slurm-wlm and munge; otherwise it reports itself skipped (77).

usage: chaos_test.py --meshtrain BIN --repo REPO_ROOT [--srun-mpi pmix|pmi2]
"""
import argparse
import os
import random
import re
import signal
import sys
import tempfile
import time

from slurm_cluster import SKIP, Cluster, compare_checkpoints, final_checkpoint, report, sh, skip_reason

STEPS = 300
FAULTS = 10
RANKS, NODES = 4, 2
SIGNALS = [("kill -9", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP), ("SIGTERM", signal.SIGTERM)]
DECK = """
[run]
device = "cpu"
name = "chaos"
seed = 7
log_every = 1
threads = 1
comm_timeout = 4.0
flight_records = 0
[model]
layers = 2
d_model = 32
heads = 4
seq_len = 16
vocab_size = 256
[data]
synthetic_bytes = 65536
val = "none"
[train]
precision = "fp32"
steps = {steps}
global_batch = 8
micro_batch = 2
warmup_steps = 5
[parallel]
dp = 2
pp = 2
[checkpoint]
every = 20
keep = 2
"""


class Ranks:
    """The wrapper each task runs instead of meshtrain, and what it wrote."""

    def __init__(self, tmp, meshtrain):
        self.dir = os.path.join(tmp, "ranks")
        os.makedirs(self.dir)
        self.wrapper = os.path.join(tmp, "meshtrain-wrapper.sh")
        with open(self.wrapper, "w") as f:
            f.write('#!/bin/sh\n'
                    'echo "$SLURMD_NODENAME $$" > "%s/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}.$SLURM_PROCID"\n'
                    'exec "%s" "$@"\n' % (self.dir, os.path.abspath(meshtrain)))
        os.chmod(self.wrapper, 0o755)
        self.seen = set()

    def of(self, job, restart, rank):
        """(node, pid) of a rank of one run of the job, or None before it has started."""
        path = os.path.join(self.dir, "%s.%d.%d" % (job, restart, rank))
        try:
            node, pid = open(path).read().split()
        except (OSError, ValueError):
            return None
        self.seen.add(int(pid))
        return node, int(pid)

    def kill_leftovers(self):
        """Ends any rank the strikes left stopped (the job's end normally kills them)."""
        for pid in self.seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class Log:
    """The chain job's output, read as it grows: each line with the time it was seen and the
    restart (run) it belongs to."""

    def __init__(self, path):
        self.path, self.pos, self.partial = path, 0, ""
        self.lines = []  # (seconds, restart, text)
        self.restart = -1
        self.base = None  # the step this run started from
        self.step = None  # the last step this run logged

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except OSError:
            return
        now = time.time()
        text = self.partial + data
        *complete, self.partial = text.split("\n")
        for line in complete:
            m = re.match(r"meshtrain chain: job \d+, restart (\d+)", line)
            if m:
                self.restart, self.base, self.step = int(m.group(1)), None, None
            m = re.search(r"resumed from .* at step (\d+)", line)
            if m:
                self.base = int(m.group(1))
            m = re.match(r"step +(\d+)/", line)
            if m:
                self.step = int(m.group(1))
                if self.base is None:
                    self.base = self.step - 1
            self.lines.append((now, self.restart, line))

    def first_step_after(self, restart, step):
        """When a run after `restart` first logged a step past `step`."""
        for t, r, line in self.lines:
            m = re.match(r"step +(\d+)/", line)
            if r > restart and m and int(m.group(1)) > step:
                return t
        return None


def held_release(cluster, job, held_since):
    """Releases a requeued job Slurm holds (BeginTime) after 3 s, as Cluster.wait_gone does;
    returns (gone, held_since)."""
    run = sh(["squeue", "-h", "-j", job, "-o", "%T %r"], cluster.env)
    out = run.stdout.strip()
    if run.returncode == 0 and out == "" and not cluster.listed(job):
        return True, held_since
    if out == "PENDING BeginTime":
        held_since = held_since or time.time()
        if time.time() - held_since >= 3:
            sh(["scontrol", "update", "JobId=" + job, "StartTime=now"], cluster.env)
    else:
        held_since = None
    return False, held_since


def chaos(cluster, ranks, tmp, deck, plan):
    """Runs the chain under the strikes of `plan`; returns (strikes, log, failures)."""
    out = os.path.join(tmp, "chaos.out")
    job = cluster.sbatch("chain.sbatch", [deck, "--set", 'run.dir="chaos"'],
                         ["--time=10", "--chdir", tmp, "--nodes=%d" % NODES,
                          "--ntasks-per-node=%d" % (RANKS // NODES)], out, wait=False).id
    log = Log(out)
    strikes, struck_restart, held, gone = [], None, None, False
    deadline = time.time() + 600
    last_queue_poll = 0.0
    while time.time() < deadline:
        log.poll()
        i = len(strikes)
        if (i < len(plan) and log.restart != struck_restart and log.step is not None and
                log.base is not None and log.step - log.base >= plan[i][2] and log.step < STEPS - 5):
            name, sig, _, rank = plan[i]
            where = ranks.of(job, log.restart, rank)
            if where is not None:
                try:
                    os.kill(where[1], sig)
                    strikes.append(dict(kind=name, rank=rank, node=where[0], step=log.step,
                                        restart=log.restart, time=time.time()))
                    struck_restart = log.restart
                except OSError:
                    pass  # the run ended on its own meanwhile: strike the next one
        if time.time() - last_queue_poll > 0.5:
            last_queue_poll = time.time()
            gone, held = held_release(cluster, job, held)
            if gone:
                break
        time.sleep(0.02)
    log.poll()
    failures = []
    if not gone:
        sh(["scancel", job], cluster.env)
        failures.append("the chaos job did not end within 600 s:\n" + open(out).read()[-3000:])
    return strikes, log, failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--srun-mpi", default="pmix")
    args = p.parse_args()
    why = skip_reason()
    if why:
        print("SKIP: " + why)
        return SKIP
    started = time.time()
    seed = int(os.environ.get("MESHTRAIN_CHAOS_SEED", int(time.time()) % 100000))
    print("chaos seed %d (rerun with MESHTRAIN_CHAOS_SEED=%d)" % (seed, seed))
    rng = random.Random(seed)
    plan = []
    for _ in range(FAULTS):
        name, sig = rng.choice(SIGNALS)
        plan.append((name, sig, rng.randint(1, 20), rng.randrange(RANKS)))

    tmp = tempfile.mkdtemp(prefix="meshtrain_chaos_")
    failures = []
    ranks = Ranks(tmp, args.meshtrain)
    try:
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(steps=STEPS))
        env = {"MESHTRAIN_SRUN_MPI": args.srun_mpi, "MESHTRAIN_CHAIN_MAX_FAULTS": str(FAULTS)}
        with Cluster(args.repo, os.path.join(tmp, "cluster"), NODES, ranks.wrapper, extra_env=env) as cluster:
            placement = ["--time=10", "--chdir", tmp, "--nodes=%d" % NODES, "--ntasks-per-node=%d" % (RANKS // NODES)]
            t0 = time.time()
            calm = cluster.sbatch("chain.sbatch", [deck, "--set", 'run.dir="calm"'], placement,
                                  os.path.join(tmp, "calm.out"), timeout=300)
            calm_seconds = time.time() - t0
            print("uninterrupted chain job: exit %d in %.1f s" % (calm.status, calm_seconds))
            if calm.status != 0 or "requeueing" in calm.log:
                failures.append("the uninterrupted job failed or was requeued:\n" + calm.log[-3000:])
            t0 = time.time()
            strikes, log, chaos_failures = chaos(cluster, ranks, tmp, deck, plan)
            chaos_seconds = time.time() - t0
            failures += chaos_failures
        text = "\n".join(l for _, _, l in log.lines)
        lost = []
        for n, s in enumerate(strikes, 1):
            back = log.first_step_after(s["restart"], s["step"])
            # A strike that lands before training got back past the previous one takes over:
            # the time from then on is its own, so the losses add up to the time lost in all.
            following = strikes[n]["time"] if n < len(strikes) else None
            cut = back is not None and following is not None and following < back
            lost.append((following if cut else back) - s["time"] if back else None)
            print("strike %2d: %-7s rank %d (node %s) at step %3d: %s" % (
                n, s["kind"], s["rank"], s["node"], s["step"],
                ("%.1f s lost%s" % (lost[-1], " (until the next strike, which came first)" if cut else ""))
                if back else "training never got past it"))
        measured = [x for x in lost if x is not None]
        if measured:
            print("time lost per fault: mean %.1f s, min %.1f, max %.1f; chaos job %.1f s against %.1f s "
                  "uninterrupted (%.1f s per fault)" % (sum(measured) / len(measured), min(measured),
                                                        max(measured), chaos_seconds, calm_seconds,
                                                        (chaos_seconds - calm_seconds) / max(1, len(strikes))))
        for kind in sorted({s["kind"] for s in strikes}):
            xs = [x for s, x in zip(strikes, lost) if s["kind"] == kind and x is not None]
            if xs:
                print("  %s: %d strike(s), mean %.1f s lost" % (kind, len(xs), sum(xs) / len(xs)))
        if len(strikes) != FAULTS:
            failures.append("%d strikes landed, expected %d" % (len(strikes), FAULTS))
        if any(x is None for x in lost):
            failures.append("training did not get past a strike")
        if ("step %5d/%d" % (STEPS, STEPS)) not in text or "finished with status 0" not in text:
            failures.append("the chaos job did not train to the end:\n" + text[-3000:])
        if not failures:
            problems = compare_checkpoints(final_checkpoint(os.path.join(tmp, "calm")),
                                           final_checkpoint(os.path.join(tmp, "chaos")))
            print("final checkpoints: %s" % ("bitwise identical" if not problems else "; ".join(problems[:5])))
            failures += problems
    except RuntimeError as e:
        failures.append(str(e))
    finally:
        ranks.kill_leftovers()
    print("chaos test took %.0f s" % (time.time() - started))
    return report(tmp, failures)


if __name__ == "__main__":
    sys.exit(main())
