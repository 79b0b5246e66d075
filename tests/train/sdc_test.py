#!/usr/bin/env python3
"""Silent data corruption through the real binary (train/replica_check.h, train/step_rerun.h).

1. Healthy runs raise no alarm, in every kind of replica: dp under ZeRO 0-3 (fp32 and bf16), tp
   (with sequence parallelism), pp with tied embeddings, cp. Each trains 30 steps with the replica
   check after every step and run.rerun_spike_factor = 1.000001, so that every step whose
   gradient norm is above the recent median is re-run (several per run, counted): the run
   finishes, and its final checkpoint is bitwise equal to the same run with no check and no
   re-run (a re-run changes nothing).
2. One bit flipped in one rank's copy of a parameter (MESHTRAIN_FAULT=flip_param) is found by the
   next replica check, in each kind of copy (data-parallel replicas under ZeRO 0, 1 and 2, a
   tensor group's copies of an unsplit parameter under ZeRO 3, the tied embedding's two stages):
   exit status 6 on every rank, the message once, naming the rank (and, where a majority exists,
   only it), its node, the parameter, and the step the copies last agreed. A check also runs
   before each checkpoint: the corruption is not saved.
3. One bit flipped in one rank's gradient in the first attempt of a step (flip_grad) makes a
   gradient-norm spike; the re-run gives other bits on that rank only: exit status 6, naming the
   rank, its node and "gradient", and no other rank (dp replicas under ZeRO 0 and 2, a pipeline's
   last stage, a second tensor rank, a tied embedding's last stage under ZeRO 1).

usage: sdc_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
NODE = socket.gethostname()
DECK = """
[run]
device = "cpu"
name = "sdc"
dir = "{dir}/run"
log_every = 5
threads = 1
flight_records = 0
# The straggler report names ranks too ("rank 2 (node ...) computes 2.4x the median"): on a loaded
# machine it would be taken for a fault naming the wrong rank.
straggler_threshold = 0
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
steps = 9
global_batch = 12
micro_batch = 2
warmup_steps = 1
[checkpoint]
every = 0
"""
HARDWARE_FAULT = 6


def train(tmp, name, ranks, sets, fault=None):
    case = os.path.join(tmp, name)
    os.makedirs(case)
    deck = os.path.join(case, "deck.toml")
    with open(deck, "w") as f:
        f.write(DECK.format(dir=case))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MESHTRAIN_FAULT", None)
    if fault:
        env["MESHTRAIN_FAULT"] = fault
    cmd = [MPIEXEC, "-n", str(ranks), BIN, "train", deck]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return p, os.path.join(case, "run")


def same_checkpoints(a, b):
    import h5py
    import numpy as np
    problems = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if not names:
            problems.append("no datasets in " + a)
        for n in names:
            if n not in fb or not np.array_equal(fa[n][()], fb[n][()]):
                problems.append("dataset %s differs" % n)
    return problems


HEALTHY = [  # (name, ranks, sets)
    ("dp2 zero0", 2, ["parallel.dp=2"]),
    ("dp2 zero1 bf16", 2, ["parallel.dp=2", "parallel.zero=1", 'train.precision="bf16"']),
    ("dp2 tp2 zero3", 4, ["parallel.dp=2", "parallel.tp=2", "parallel.zero=3"]),
    ("tp2 sequence parallel", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("pp2 dp2 tied zero0", 4, ["parallel.pp=2", "parallel.dp=2"]),
    ("tp2 pp2 zero2 bf16", 4, ["parallel.tp=2", "parallel.pp=2", "parallel.zero=2", 'train.precision="bf16"']),
    ("cp2", 2, ["parallel.cp=2"]),
]


def healthy(tmp):
    problems = []
    for name, ranks, sets in HEALTHY:
        common = sets + ["train.steps=30", "checkpoint.every=30"]
        checked, run_a = train(tmp, name + " checked", ranks,
                               common + ["run.replica_check_every=1", "run.rerun_spike_factor=1.000001"])
        plain, run_b = train(tmp, name + " plain", ranks,
                             common + ["run.replica_check_every=0", "run.rerun_spike_factor=0"])
        reruns = checked.stdout.count("re-run gave the same bits on every rank")
        print("%-24s checked: exit %d, %d step(s) re-run; plain: exit %d" %
              (name, checked.returncode, reruns, plain.returncode))
        if checked.returncode != 0 or plain.returncode != 0:
            problems.append("%s: a healthy run failed:\n%s%s" % (name, checked.stderr[-3000:], plain.stderr[-2000:]))
            continue
        if reruns < 1:
            problems.append("%s: no step was re-run (the re-run path went untested):\n%s" % (name, checked.stdout))
        final = "checkpoints/step_00000030.h5"
        problems += ["%s: re-run and checked vs plain: %s" % (name, p)
                     for p in same_checkpoints(os.path.join(run_a, final), os.path.join(run_b, final))]
    return problems


def expect_fault(name, p, texts, absent=()):
    out = p.stdout + p.stderr
    problems = []
    if p.returncode != HARDWARE_FAULT:
        problems.append("%s: exit %d, expected %d" % (name, p.returncode, HARDWARE_FAULT))
    errors = re.findall(r"meshtrain(?: \w+)?: (?:rank \d+: )?error:", out)
    if len(errors) != 1:
        problems.append("%s: the error printed %d times, expected once" % (name, len(errors)))
    for t in texts:
        if t.format(node=NODE) not in out:
            problems.append("%s: missing text: %s" % (name, t.format(node=NODE)))
    for t in absent:
        if t.format(node=NODE) in out:
            problems.append("%s: printed what it must not: %s" % (name, t.format(node=NODE)))
    if problems:
        problems.append("%s: output:\n%s" % (name, out[-3000:]))
    print("%-44s exit %d  %s" % (name, p.returncode, "ok" if not problems else "FAILED"))
    return problems


CORRUPT_REPLICA = [  # (name, ranks, sets, fault, expected texts, absent texts)
    ("dp3 zero0 fp32: a majority names one rank", 3, ["parallel.dp=3", "run.replica_check_every=3"],
     "flip_param:rank=1:step=3:param=h.0.attn.qkv.weight",
     ["replica check at step 3", "rank 1 (node {node}) differs from the other 2 of its data-parallel "
      "replicas (ranks 0 and 2) in h.0.attn.qkv.weight[0]", "train again from the start",
      "sbatch --exclude={node}"], ["rank 0 (node"]),
    ("dp2 zero1 bf16: two copies, no majority", 2,
     ["parallel.dp=2", "parallel.zero=1", 'train.precision="bf16"', "run.replica_check_every=2"],
     "flip_param:rank=0:step=4:param=wpe",
     ["replica check at step 4", "data-parallel replicas ranks 0 (node {node}) and 1 (node {node}) "
      "disagree in wpe[0] values", "the copies agreed at step 2: resume from a checkpoint of step 2"], []),
    ("dp2 zero2: a layer norm's element 5", 2, ["parallel.dp=2", "parallel.zero=2", "run.replica_check_every=2"],
     "flip_param:rank=1:step=2:param=ln_f.weight:index=5:bit=3",
     ["replica check at step 2", "in ln_f.weight[0] values"], []),
    ("tp2 dp2 zero3: an unsplit parameter's shard", 4,
     ["parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "run.replica_check_every=3"],
     "flip_param:rank=2:step=3:param=h.1.ln_2.bias",
     ["replica check at step 3", "tensor-parallel group ranks 2 (node {node}) and 3 (node {node}) "
      "disagree in h.1.ln_2.bias[0] optimizer state"], []),
    ("pp2 tied embeddings zero1: the last stage's copy", 2,
     ["parallel.pp=2", "parallel.zero=1", "run.replica_check_every=3"],
     "flip_param:rank=1:step=3:param=wte",
     ["tied-embedding copies (first and last stage) ranks 0 (node {node}) and 1 (node {node}) "
      "disagree in wte[0] values"], []),
    # The default cadence (100) is far off, but a checkpoint is due at step 3: checked first.
    ("dp3: checked before a checkpoint stores it", 3, ["parallel.dp=3", "checkpoint.every=3"],
     "flip_param:rank=2:step=3",
     ["replica check at step 3", "rank 2 (node {node}) differs from the other 2"], ["MB/s)"]),
]

CORRUPT_STEP = [  # (name, ranks, sets, fault, rank, step)
    ("dp2 zero0: a replica's gradient", 2, ["parallel.dp=2"], "flip_grad:rank=1:step=8", 1, 8),
    ("dp2 zero2: a gradient shard", 2, ["parallel.dp=2", "parallel.zero=2"], "flip_grad:rank=0:step=7", 0, 7),
    ("pp2 dp2: the last stage's gradient", 4, ["parallel.pp=2", "parallel.dp=2"], "flip_grad:rank=3:step=6", 3, 6),
    ("tp2: the second tensor rank's gradient", 2, ["parallel.tp=2"], "flip_grad:rank=1:step=7:index=40", 1, 7),
    ("pp2 tied zero1: the last stage", 2, ["parallel.pp=2", "parallel.zero=1"], "flip_grad:rank=1:step=9", 1, 9),
]


def main():
    tmp = tempfile.mkdtemp(prefix="meshtrain_sdc_")
    problems = []
    try:
        problems += healthy(tmp)
        for name, ranks, sets, fault, texts, absent in CORRUPT_REPLICA:
            p, run = train(tmp, name, ranks, sets, fault)
            problems += expect_fault(name, p, texts, absent)
            ckpts = os.path.join(run, "checkpoints")
            if "checkpoint.every=3" in sets and os.path.isdir(ckpts) and os.listdir(ckpts):
                problems.append("%s: a checkpoint was written: %s" % (name, os.listdir(ckpts)))
        for name, ranks, sets, fault, rank, step in CORRUPT_STEP:
            p, _ = train(tmp, name, ranks, sets, fault)
            others = ["rank %d (node" % r for r in range(ranks) if r != rank]
            problems += expect_fault(name, p, ["step %d was re-run on the same data and parameters because its "
                                               "gradient norm" % step,
                                               "different results on rank %d (node {node}: gradient)." % rank],
                                     others)
    finally:
        if not problems:
            shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("FAILED: " + p)
    print("%d failure(s)%s" % (len(problems), "" if not problems else "; files kept in " + tmp))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
