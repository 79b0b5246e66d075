#!/usr/bin/env python3
"""Many nodes, for real: the job scripts of jobs/ on an emulated Slurm cluster of 4 nodes on this
one host (scripts/slurm-local.sh start DIR --nodes 4: one slurmd per node), jobs of 1, 2 and 4
nodes.

Where each rank ran comes from a side channel, not from meshtrain: the jobs run a wrapper as
MESHTRAIN_BIN that writes its task's rank (SLURM_PROCID, the MPI world rank under srun), node
(SLURMD_NODENAME) and pid to a file, then execs meshtrain.

1. jobs/multi-node.sbatch trains a small deck on 4 nodes x 2 tasks, dp x tp x pp = 2 x 2 x 2: the
   start-up line reports 8 ranks on 4 nodes, the ranks sit 2 per node on 4 distinct nodes, every
   tensor group lies inside one node, and the loss of every step equals the single-node run's
   (plain mpiexec, same deck and layout) within the fp32 layout tolerance (1e-5 relative, as in
   tests/parallel/layout_parity_test.cpp).
2. A 2-node job with tp = 4 on 2 tasks per node: its tensor group must span the two nodes, and the
   run warns, naming the group's ranks and both nodes. It writes a checkpoint at step 4.
3. That checkpoint resumes on 4 nodes (2 x 2 x 2) and on 1 node (pp = 2 on 2 tasks): both say
   "resumed from" it, and their losses after step 4 equal the reference's (checkpoints are
   layout-free).
4. A rank killed (SIGKILL) on one node ends the whole job within run.comm_timeout plus a few
   seconds, and the diagnosis names the dead rank's world rank and node.
5. jobs/chain.sbatch on 4 nodes survives time-limit stops and requeues, and its final checkpoint
   is bitwise equal to the uninterrupted run's (slurm_cluster.chain, as slurm_jobs_test.py on one
   node).
Needs root and the Debian packages slurm-wlm and munge; otherwise it reports itself skipped (77).

usage: multi_node_test.py --meshtrain BIN --mpiexec MPIEXEC --repo REPO_ROOT
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from slurm_cluster import SKIP, Cluster, chain, layout_line, losses, report, skip_reason

LOSS_TOLERANCE = 1e-5  # fp32 layouts, relative (tests/parallel/layout_parity_test.cpp)

# Checkpoints are written and read independently: MPI-IO's collective transfers (the automatic
# choice for a model this small, whose tensor-parallel slices are short strided runs) take tens
# of seconds per checkpoint with 4 to 8 ranks spinning on 2 cores under MPICH (docs/clusters.md, "Slurm"),
# and what this test proves of checkpoints (that they are layout-free across nodes) does not
# depend on how the bytes move; the collective path has tests of its own (checkpoint_*).
DECK = """
[run]
device = "cpu"
name = "multinode"
seed = 11
log_every = 1
threads = 1
comm_timeout = 5.0
[model]
layers = 4
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
warmup_steps = 1
[checkpoint]
every = {every}
keep = 3
io = "independent"
"""
STEPS = 8


def layout(dp, tp, pp):
    return ["--set", "parallel.dp=%d" % dp, "--set", "parallel.tp=%d" % tp, "--set", "parallel.pp=%d" % pp]


def tensor_groups(dp, tp, pp):
    """World ranks of each tensor group under the default order "tp-dp-pp":
    world_rank = tp_rank + TP * (dp_rank + DP * pp_rank)."""
    return [[t + tp * (d + dp * p) for t in range(tp)] for p in range(pp) for d in range(dp)]


class Placement:
    """The wrapper each task runs instead of meshtrain, and what it wrote: {rank: (node, pid)}."""

    def __init__(self, tmp, meshtrain):
        self.dir = os.path.join(tmp, "placement")
        os.makedirs(self.dir)
        self.wrapper = os.path.join(tmp, "meshtrain-wrapper.sh")
        with open(self.wrapper, "w") as f:
            f.write('#!/bin/sh\n'
                    'echo "$SLURM_PROCID $SLURMD_NODENAME $$" > "%s/$SLURM_JOB_ID.$SLURM_PROCID"\n'
                    'exec "%s" "$@"\n' % (self.dir, os.path.abspath(meshtrain)))
        os.chmod(self.wrapper, 0o755)

    def of(self, job):
        out = {}
        for name in os.listdir(self.dir):
            if name.startswith(job + "."):
                rank, node, pid = open(os.path.join(self.dir, name)).read().split()
                out[int(rank)] = (node, int(pid))
        return out


def compare_losses(what, got, reference, first_step):
    """Failures where `got` misses a step from first_step on or differs from the reference."""
    problems, worst = [], 0.0
    for step in range(first_step, STEPS + 1):
        if step not in got:
            problems.append("%s: no loss at step %d" % (what, step))
            continue
        error = abs(got[step] - reference[step]) / abs(reference[step])
        worst = max(worst, error)
        if error > LOSS_TOLERANCE:
            problems.append("%s: step %d loss %.9g, single-node %.9g (relative error %.2e > %.0e)" %
                            (what, step, got[step], reference[step], error, LOSS_TOLERANCE))
    print("  %s: steps %d-%d, worst relative loss error %.2e" % (what, first_step, STEPS, worst))
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--srun-mpi", default="pmix",
                   help="srun's --mpi plugin for the jobs: pmix (Open MPI), pmi2 (MPICH)")
    args = p.parse_args()
    why = skip_reason()
    if why:
        print("SKIP: " + why)
        return SKIP

    tmp = tempfile.mkdtemp(prefix="meshtrain_multinode_")
    deck = os.path.join(tmp, "deck.toml")
    with open(deck, "w") as f:
        f.write(DECK.format(steps=STEPS, every=0))
    ckpt_deck = os.path.join(tmp, "deck_ckpt.toml")  # the 2-node job's: a checkpoint at step 4
    with open(ckpt_deck, "w") as f:
        f.write(DECK.format(steps=STEPS, every=4))
    failures = []
    began = time.time()

    # The reference: one node, plain mpiexec, the same deck and layout as step 1.
    start = time.time()
    ref = subprocess.run([args.mpiexec, "-n", "8", args.meshtrain, "train", deck, "--set",
                          'run.dir="%s"' % os.path.join(tmp, "ref")] + layout(2, 2, 2),
                         capture_output=True, text=True, timeout=300, cwd=tmp,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    print("single-node reference (mpiexec, 8 ranks): exit %d in %.0f s" % (ref.returncode, time.time() - start))
    if ref.returncode != 0:
        print(ref.stdout[-2000:] + ref.stderr[-2000:])
        print("FAILED: the reference run")
        return 1
    reference = losses(os.path.join(tmp, "ref"))

    placement = Placement(tmp, args.meshtrain)
    try:
        print("jobs start the ranks with srun --mpi=%s" % args.srun_mpi)
        with Cluster(args.repo, os.path.join(tmp, "cluster"), 4, placement.wrapper,
                     extra_env={"MESHTRAIN_SRUN_MPI": args.srun_mpi}) as cluster:
            def submit(script, name, nodes, tasks, extra, wait=True, deck_path=deck):
                start = time.time()
                job = cluster.sbatch(script, [deck_path, "--set", 'run.dir="%s"' % name] + extra,
                                     ["--time=5", "--chdir", tmp, "--nodes=%d" % nodes,
                                      "--ntasks-per-node=%d" % tasks],
                                     os.path.join(tmp, name + ".out"), wait=wait)
                if wait:
                    print("%s: job %s, %d node(s) x %d task(s), exit %d in %.0f s" %
                          (name, job.id, nodes, tasks, job.status, time.time() - start))
                    if job.status != 0:
                        failures.append("job %s (%s) failed:\n%s" % (job.id, name, job.log[-3000:]))
                return job

            # 1. 4 nodes x 2 tasks, 2 x 2 x 2.
            job = submit("multi-node.sbatch", "layout", 4, 2, layout(2, 2, 2))
            line = layout_line(job.log)
            print("  " + line)
            if "8 ranks on 4 node(s): dp 2 x tp 2 x pp 2" not in line:
                failures.append("the layout line does not report 8 ranks on 4 nodes: %r" % line)
            where = placement.of(job.id)
            nodes = sorted(set(node for node, _ in where.values()))
            print("  ranks per node (from SLURMD_NODENAME): " +
                  ", ".join("%s: %s" % (n, sorted(r for r, (m, _) in where.items() if m == n)) for n in nodes))
            if sorted(where) != list(range(8)) or len(nodes) != 4 or \
                    any(sum(1 for m, _ in where.values() if m == n) != 2 for n in nodes):
                failures.append("expected 8 ranks, 2 on each of 4 nodes: %s" % where)
            else:
                for group in tensor_groups(2, 2, 2):
                    on = sorted(set(where[r][0] for r in group))
                    if len(on) != 1:
                        failures.append("tensor group %s spans nodes %s" % (group, on))
                print("  tensor groups %s: each inside one node" % tensor_groups(2, 2, 2))
            failures += compare_losses("4 nodes, 2 x 2 x 2", losses(os.path.join(tmp, "layout")), reference, 1)

            # 2. 2 nodes x 2 tasks, tp = 4: the tensor group spans both nodes. Checkpoint at 4.
            job = submit("multi-node.sbatch", "span", 2, 2, layout(1, 4, 1), deck_path=ckpt_deck)
            where = placement.of(job.id)
            if len(where) == 4:
                a, b = where[0][0], where[2][0]
                expected = ("1 of 1 tensor-parallel group(s) span nodes", "ranks 0-3 on nodes %s (ranks 0, 1), %s "
                            "(ranks 2, 3)" % (a, b))
                warning = [l for l in job.log.splitlines() if "warning: " in l]
                print("  " + (warning[0] if warning else "no warning"))
                if a == b or not all(any(e in l for l in warning) for e in expected):
                    failures.append("no warning naming the group and nodes %s, %s:\n%s" % (a, b, job.log[-2000:]))
            else:
                failures.append("the 2-node job's placement: %s" % where)
            failures += compare_losses("2 nodes, tp 4", losses(os.path.join(tmp, "span")), reference, 1)
            ckpt = os.path.join(tmp, "span", "checkpoints", "step_00000004.h5")

            # 3. That checkpoint, resumed on 4 nodes (2 x 2 x 2) and on 1 node (pp = 2).
            for name, script, nodes, tasks, grid in (("resume4", "multi-node.sbatch", 4, 2, layout(2, 2, 2)),
                                                     ("resume1", "single-node.sbatch", 1, 2, layout(1, 1, 2))):
                job = submit(script, name, nodes, tasks, grid + ["--set", 'checkpoint.resume="%s"' % ckpt])
                if "resumed from %s" % ckpt not in job.log:
                    failures.append("%s did not resume from %s:\n%s" % (name, ckpt, job.log[-2000:]))
                failures += compare_losses("%s (%d node(s)), resumed at step 4" % (name, nodes),
                                           losses(os.path.join(tmp, name)), reference, 5)

            # 4. A rank killed on one node: rank 5 (node 3 of 4), once training is under way.
            victim = 5
            job = submit("multi-node.sbatch", "kill", 4, 2, layout(2, 2, 2) + ["--set", "train.steps=100000"],
                         wait=False)
            log_path = os.path.join(tmp, "kill.out")
            end = time.time() + 180
            while time.time() < end and not re.search(r"^step +3/", open(log_path).read() if os.path.exists(log_path)
                                                      else "", re.M):
                time.sleep(0.5)
            where = placement.of(job.id)
            if victim not in where:
                failures.append("the kill job did not start training: %s" % open(log_path).read()[-2000:])
            else:
                node, pid = where[victim]
                killed = time.time()
                os.kill(pid, signal.SIGKILL)
                ended = cluster.wait_gone(job.id, 120)
                seconds = time.time() - killed
                log = open(log_path).read()
                cause = "likely cause: rank %d (node %s)" % (victim, node)
                print("  killed rank %d (pid %d on %s): the job ended after %.1f s (run.comm_timeout 5 s)" %
                      (victim, pid, node, seconds))
                for l in log.splitlines():
                    if "likely cause" in l:
                        print("  " + l[:200])
                        break
                if not ended or seconds > 5 + 10:
                    failures.append("the job did not end within run.comm_timeout + 10 s (%.1f s)" % seconds)
                if cause not in log:
                    failures.append("the diagnosis does not say %r:\n%s" % (cause, log[-3000:]))

            # 5. The chain on 4 nodes, dp 4 x pp 2: 500 steps, 7 s to a minute (idle or busy
            # host); each run of the chain writes a checkpoint.
            steps = 500
            chain_deck = os.path.join(tmp, "chain.toml")
            with open(chain_deck, "w") as f:
                f.write(DECK.format(steps=steps, every=100000).replace("log_every = 1", "log_every = 10") +
                        '[parallel]\ndp = 4\npp = 2\n')
            failures += chain(cluster, tmp, chain_deck, steps, ["--nodes=4", "--ntasks-per-node=2"],
                              uninterrupted="multi-node.sbatch", tag="chain_")
    except RuntimeError as e:
        failures.append(str(e))
    print("%.0f s in all" % (time.time() - began))
    return report(tmp, failures)


if __name__ == "__main__":
    sys.exit(main())
