#!/usr/bin/env python3
"""A token shard truncated (rewritten in place) while a run reads it ends the run with one agreed
message naming the file, exit status 1 on every rank; before, every rank reading the mapped file
died of SIGBUS (exit 135) without a word.

Trains the tiny deck on 2 ranks from a prepared shard, truncates the shard once a few steps are
logged, and checks the statuses, the message (once, naming the file and what happened), that no
rank crashed, and that the job ended within seconds.

usage: shard_truncation_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import re
import subprocess
import sys
import tempfile
import time

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
ENV = dict(os.environ)  # CTest sets the MPI launch environment

DECK = """
[run]
device = "cpu"
name = "truncation"
dir = "{dir}/run"
[model]
layers = 2
d_model = 32
heads = 2
seq_len = 16
vocab_size = 256
[data]
train = "{dir}/corpus_train.bin"
val = "none"
[train]
precision = "fp32"
steps = 1000000
global_batch = 8
micro_batch = 2
[checkpoint]
every = 0
"""


def main():
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([BIN, "prepare", "--synthetic", "4000000", "--out", os.path.join(tmp, "corpus"),
                        "--val-fraction", "0"], check=True, capture_output=True, env=ENV)
        shard = os.path.join(tmp, "corpus_train.bin")
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))
        status_dir = os.path.join(tmp, "status")
        os.makedirs(status_dir)
        # Each rank records its own status (mpiexec would kill the rest at the first non-zero).
        wrapper = '"$0" "$@"; echo $? > "%s/rank.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"' % status_dir
        job = subprocess.Popen([MPIEXEC, "-n", "2", "sh", "-c", wrapper, BIN, "train", deck], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        metrics = os.path.join(tmp, "run", "metrics.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and job.poll() is None:
            if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3:
                break
            time.sleep(0.05)
        os.truncate(shard, 64 + 100)
        truncated = time.time()
        try:
            out, _ = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            out = job.communicate()[0] + "\n[the job did not end within 60 s of the truncation]"
        took = time.time() - truncated
        statuses = {int(n.split(".")[1]): int(open(os.path.join(status_dir, n)).read())
                    for n in os.listdir(status_dir)}
        if statuses != {0: 1, 1: 1}:
            problems.append("exit statuses %s, expected 1 on both ranks" % statuses)
        said = "%s: the token shard was truncated while this run used it" % shard
        if out.count(said) != 1:
            problems.append("the message naming the file is printed %d times, expected once" % out.count(said))
        errors = len(re.findall(r"meshtrain(?: \w+)?: (?:rank \d+: )?error:", out))
        if errors != 1:
            problems.append("%d error lines, expected 1" % errors)
        for crash in ("Bus error", "signal 7", "terminate called", "core dumped"):
            if crash in out:
                problems.append("crashed: " + crash)
        if took > 30:
            problems.append("ended %.0f s after the truncation" % took)
        print("shard truncated during training: %s (%.1f s)" % ("ok" if not problems else "FAILED", took))
        if problems:
            print("    " + "\n    ".join(problems) + "\n    output:\n      " +
                  "\n      ".join(out.strip().splitlines()[-20:]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
