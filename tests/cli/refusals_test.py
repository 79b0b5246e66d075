#!/usr/bin/env python3
"""Bad input is refused up front, on every rank, with one clear message.

Each case runs the real binary under mpiexec with a deck (and --set overrides) that is wrong in
one way, and checks that
  - every rank exits with status 1 (no rank aborted, none left waiting in a collective),
  - the error is printed exactly once (by one rank), and
  - it contains the expected text: file, key, value and what would be accepted.
The last cases stall one rank on purpose (in a dp, a tp and a pp group) and check that the job
ends after run.comm_timeout with the timeout status and a diagnosis instead of hanging.

usage: refusals_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
# CTest sets the MPI launch environment (MESHTRAIN_MPI_TEST_ENV in tests/CMakeLists.txt).
ENV = dict(os.environ)

DECK = """
[run]
device = "cpu"
name = "refusal"
dir = "{dir}/run"
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
steps = 2
global_batch = 8
micro_batch = 2
"""

# (name, ranks, overrides, expected substrings of the one error message)
CASES = [
    ("world size", 2, ["parallel.dp=2", "parallel.tp=2"],
     ["parallel.dp x tp x pp = 2 x 2 x 1 = 4 does not match the 2 ranks"]),
    ("dp auto", 4, ["parallel.tp=3"],
     ["parallel.dp = \"auto\" cannot fill 4 ranks with tp x pp = 3 x 1"]),
    ("heads", 3, ["parallel.tp=3"],
     ["parallel.tp = 3 does not divide model.heads = 4 (tp must be one of 1, 2, 4)"]),
    ("vocabulary", 4, ["parallel.tp=4", "model.vocab_size=258"],
     ["parallel.tp = 4 does not divide model.vocab_size = 258", "pad the vocabulary"]),
    ("layers", 4, ["parallel.pp=4", "model.layers=2"],
     ["model.layers = 2 is fewer than parallel.pp x virtual_stages = 4 x 1"]),
    ("batch", 4, ["train.global_batch=12"],
     ["train.global_batch = 12 is not divisible by dp x micro_batch = 4 x 2 = 8"]),
    ("interleaved micro-batches", 2,
     ["parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2",
      "train.global_batch=6"],
     ["micro-batches per step", "= 3) to be a multiple of parallel.pp = 2"]),
    ("unknown key", 2, ["train.lr_max=1"],
     ["unknown key train.lr_max (did you mean train.lr?)"]),
    ("unknown section", 1, ["trian.steps=3"], ["unknown section [trian] (did you mean [train]?)"]),
    ("wrong type", 2, ["model.layers=\"four\""],
     ["model.layers = \"four\" is a string (expected integer from 1 to 100000)"]),
    ("out of range", 2, ["train.steps=0"], ["train.steps = 0 is out of range (expected integer >= 1)"]),
    ("bad choice", 1, ["parallel.schedule=\"zigzag\""],
     ["parallel.schedule = \"zigzag\" is not a known value (expected one of \"gpipe\", \"1f1b\", \"interleaved\")"]),
    ("data file missing", 2, ["data.train=\"{dir}/missing_*.bin\""], ["missing_*.bin"]),
    ("vocabulary of the data", 2, ["model.vocab_size=128"],
     ["model.vocab_size = 128 is smaller than the vocabulary of data.train"]),
]


def run(ranks, args, tmp, env=ENV, timeout=120, mpmd=None):
    """Runs the binary on `ranks` ranks; returns (per-rank exit statuses, stdout+stderr, seconds).

    mpmd: a list of argument lists, one per rank, for an MPMD launch (one "-n 1" part each)."""
    status_dir = tempfile.mkdtemp(dir=tmp)
    # Each rank records its own exit status and reports success to mpiexec, which would otherwise
    # kill the remaining ranks as soon as the first one exits non-zero, before they report.
    wrapper = ('"$0" "$@"; echo $? > "{d}/rank.${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-0}}}}"'
               ).format(d=status_dir)
    if mpmd:
        cmd = [MPIEXEC]
        for i, part in enumerate(mpmd):
            cmd += ([":"] if i else []) + ["-n", "1", "sh", "-c", wrapper, BIN] + part
    else:
        cmd = [MPIEXEC, "-n", str(ranks), "sh", "-c", wrapper, BIN] + args
    start = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    statuses = {}
    for name in os.listdir(status_dir):
        with open(os.path.join(status_dir, name)) as f:
            statuses[int(name.split(".")[1])] = int(f.read())
    return statuses, p.stdout + p.stderr, time.time() - start, p.returncode


def report(name, ranks, statuses, output, seconds, expected, tmp):
    """Checks one refusal: exit 1 on every rank, one error, the expected text. Returns failures."""
    problems = []
    if sorted(statuses) != list(range(ranks)) or any(s != 1 for s in statuses.values()):
        problems.append("exit statuses %s, expected 1 on each of %d ranks" % (statuses, ranks))
    if output.count("meshtrain: error:") != 1:
        problems.append("error printed %d times" % output.count("meshtrain: error:"))
    for text in expected:
        if text.format(dir=tmp) not in output:
            problems.append("missing text: " + text)
    print("%-28s ranks %d  %5.1fs  %s" % (name, ranks, seconds, "ok" if not problems else "FAILED"))
    if problems:
        print("    " + "\n    ".join(problems))
        print("    output:\n      " + output.strip().replace("\n", "\n      "))
    return 1 if problems else 0


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))
        broken = os.path.join(tmp, "broken.toml")
        with open(broken, "w") as f:
            f.write("[model]\nlayers = = 4\n")
        cases = CASES + [
            ("missing deck", 2, None, [os.path.join(tmp, "nope.toml") + ": cannot read the input deck"]),
            ("not TOML", 2, "broken", [broken + ":2: not valid TOML"]),
        ]
        for name, ranks, overrides, expected in cases:
            if overrides is None:
                args = ["train", os.path.join(tmp, "nope.toml")]
            elif overrides == "broken":
                args = ["train", broken]
            else:
                args = ["train", deck]
                for o in overrides:
                    args += ["--set", o.format(dir=tmp)]
            statuses, output, seconds, _ = run(ranks, args, tmp)
            failures += report(name, ranks, statuses, output, seconds, expected, tmp)

        # Ranks launched differently (MPMD): refused on every rank before anything runs.
        mpmd = [["train", deck, "--set", "train.steps=2"], ["train", deck, "--set", "train.steps=3"]]
        statuses, output, seconds, _ = run(2, None, tmp, mpmd=mpmd)
        failures += report("different overrides (MPMD)", 2, statuses, output, seconds,
                           ["ranks were started differently: rank 1 has --set train.steps=3 where "
                            "rank 0 has --set train.steps=2 (override 1)"], tmp)
        mpmd = [["train", deck], ["train", broken]]
        statuses, output, seconds, _ = run(2, None, tmp, mpmd=mpmd)
        failures += report("different decks (MPMD)", 2, statuses, output, seconds,
                           ["rank 1 was given the deck " + broken + ", rank 0 the deck " + deck], tmp)

        # A rank that stalls in each kind of group: the job ends with the timeout status (3)
        # within seconds of run.comm_timeout, with a diagnosis naming the operation and group,
        # the stalled rank and its node, and no std::terminate (before the armed abort, the data-parallel path unwound into a second
        # timeout and terminated with 134).
        env = dict(ENV, MESHTRAIN_FAULT="stall:rank=1:step=2")
        for group, layout in (("dp", ["parallel.dp=2"]), ("tp", ["parallel.tp=2"]),
                              ("pp", ["parallel.pp=2"])):
            args = ["train", deck, "--set", "run.comm_timeout=4"]
            for o in layout:
                args += ["--set", o]
            statuses, output, seconds, code = run(2, args, tmp, env=env, timeout=90)
            problems = []
            if code != 3:
                problems.append("mpiexec exit status %d, expected 3 (timeout)" % code)
            if "did not complete within 4 s (run.comm_timeout)" not in output:
                problems.append("no timeout diagnosis")
            if "on group '%s'" % group not in output:
                problems.append("the diagnosis does not name group '%s'" % group)
            # The rank that noticed reads the flight records and names the one that stalled.
            if "likely cause: rank 1 (node %s)" % socket.gethostname() not in output:
                problems.append("the stalled rank 1 and its node are not named")
            if "terminate called" in output:
                problems.append("std::terminate")
            if seconds > 4 + 20:
                problems.append("took %.0f s" % seconds)
            print("%-28s ranks 2  %5.1fs  %s" % ("stalled rank (%s)" % group, seconds,
                                                 "ok" if not problems else "FAILED"))
            if problems:
                failures += 1
                print("    " + "\n    ".join(problems) + "\n    output:\n      " + output.replace("\n", "\n      "))
    print("%d failure(s)" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
