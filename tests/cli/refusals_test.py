#!/usr/bin/env python3
"""Bad input is refused up front, on every rank, with one clear message.

Each case runs the real binary under mpiexec with a deck (and --set overrides) that is wrong in
one way, and checks that
  - every rank exits with status 1 (no rank aborted, none left waiting in a collective),
  - the error is printed exactly once (by one rank), and
  - it contains the expected text: file, key, value and what would be accepted.
A second table does the same for other commands and arguments (usage errors exit 2), corrupt
token shards, and run outcomes with their own status (a diverged run exits 5; memory exhausted
on a rank exits 1 with that rank's diagnosis). Then a SIGTERM during a long start-up must end
the job promptly with the requeue status (75). The last cases stall one rank on purpose (in a
dp, a tp and a pp group) and check that the job ends after run.comm_timeout with the timeout
status and a diagnosis instead of hanging.

usage: refusals_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import re
import signal
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
     ["--set train.lr_max=1: unknown key train.lr_max (did you mean train.lr?)"]),
    ("unknown section", 1, ["trian.steps=3"],
     ["--set trian.steps=3: unknown section [trian] (did you mean [train]?)"]),
    ("wrong type", 2, ["model.layers=\"four\""],
     ["--set model.layers=\"four\": model.layers = \"four\" is a string (expected integer from 1 to 100000)"]),
    ("beyond int64", 2, ["train.steps=99999999999999999999"],
     ["--set train.steps=99999999999999999999: train.steps = 99999999999999999999 is outside the "
      "64-bit integer range (expected integer >= 1)"]),
    ("run.name dot-dot", 2, ["run.name=\"..\""],
     ["run.name = \"..\" is not valid (expected letters, digits, '.', '_', '-'; not \".\" and "
      "without \"..\")"]),
    ("run.dir under a file", 2, ["run.dir=\"{dir}/deck.toml/run\""],
     ["deck.toml: run.dir = \"{dir}/deck.toml/run\": cannot create the run directory: "
      "{dir}/deck.toml is a file, not a directory"]),
    ("short validation shard", 2, ["data.train=\"{dir}/text_train.bin\"",
                                   "data.val=\"{dir}/short_val.bin\""],
     ["short_val.bin: no validation samples: seq_len = 16 needs at least 17 tokens"]),
    ("token beyond vocabulary", 2, ["data.train=\"{dir}/bad_token.bin\""],
     ["bad_token.bin: token 60000 at byte offset 264 (token 100) is not below the header's "
      "vocab_size 256"]),
    ("flipped token byte", 2, ["data.train=[\"{dir}/text_train.bin\", \"{dir}/flipped.bin\"]"],
     ["flipped.bin: checksum mismatch: the token bytes at offsets 64 to", "write it again with "
      "`meshtrain prepare`"]),
    ("out of range", 2, ["train.steps=0"], ["train.steps = 0 is out of range (expected integer >= 1)"]),
    ("bad choice", 1, ["parallel.schedule=\"zigzag\""],
     ["parallel.schedule = \"zigzag\" is not a known value (expected one of \"gpipe\", \"1f1b\", \"interleaved\")"]),
    ("data file missing", 2, ["data.train=\"{dir}/missing_*.bin\""], ["missing_*.bin"]),
    ("vocabulary of the data", 2, ["model.vocab_size=128"],
     ["model.vocab_size = 128 is smaller than the vocabulary of data.train"]),
]


# Other commands, arguments and outcomes: (name, ranks, arguments, exit status expected of every
# rank, expected substrings of the one error message[, options]). {deck} is the deck above and
# {dir} the test's directory; options: "memory_kb" limits each rank's address space.
COMMAND_CASES = [
    ("unknown sub-command", 1, ["trian", "{deck}"], 2,
     ["unknown sub-command 'trian' (did you mean 'train'?); the sub-commands are train, prepare, "
      "bench, inspect, eval, plan, diagnose, keys"]),
    ("plan --world 0", 1, ["plan", "{deck}", "--world", "0"], 2,
     ["--world: 0 is not a number of ranks (expected an integer >= 1)"]),
    ("prepare --val-fraction 1", 1,
     ["prepare", "--synthetic", "10000", "--out", "{dir}/p/x", "--val-fraction", "1"], 2,
     ["--val-fraction: 1 would put every token into validation and none into training (expected "
      "a fraction from 0 up to, not including, 1; 0 writes no validation shard)"]),
    ("prepare --val-fraction 2", 1,
     ["prepare", "--synthetic", "10000", "--out", "{dir}/p/x", "--val-fraction", "2"], 2,
     ["--val-fraction: 2 is not a fraction from 0 up to, not including, 1"]),
    ("prepare a directory", 1, ["prepare", "{dir}/", "--out", "{dir}/p/y"], 1,
     ["{dir}/: is a directory, not a text file"]),
    ("prepare --out a directory", 1, ["prepare", "--synthetic", "10000", "--out", "{dir}/"], 2,
     ["--out {dir}/ is a directory; --out takes a file prefix"]),
    ("train a directory", 2, ["train", "{dir}"], 1,
     ["{dir}: is a directory, not an input deck (expected a TOML file"]),
    ("plan a directory", 1, ["plan", "{dir}", "--world", "2"], 1,
     ["{dir}: is a directory, not an input deck"]),
    ("diverged", 2, ["train", "{deck}", "--set", "train.lr=1e30", "--set", "train.grad_clip=0",
                     "--set", "train.warmup_steps=0"], 5,
     ["deck.toml: the run diverged at step ", "lower train.lr (now 1e+30, e.g. 2.5e+29)",
      "warm up: train.warmup_steps = 10 (now 0)", "clip gradients: train.grad_clip = 1.0 (now 0: off)"]),
    # About 6 GB of fp32 parameters against a 1.5 GB address space: an allocation fails before
    # its pages are touched, so the test costs no memory.
    ("out of memory", 1, ["train", "{deck}", "--set", "model.d_model=4096", "--set",
                          "model.layers=8"], 1,
     ["rank 0: error: out of memory", "meshtrain plan DECK --world N --memory SIZE"],
     {"memory_kb": 1500000}),
]


def run(ranks, args, tmp, env=ENV, timeout=120, memory_kb=None, mpmd=None):
    """Runs the binary on `ranks` ranks; returns (per-rank exit statuses, stdout+stderr, seconds).

    mpmd: a list of argument lists, one per rank, for an MPMD launch (one "-n 1" part each)."""
    status_dir = tempfile.mkdtemp(dir=tmp)
    # Each rank records its own exit status and reports success to mpiexec, which would otherwise
    # kill the remaining ranks as soon as the first one exits non-zero, before they report.
    wrapper = ('"$0" "$@"; echo $? > "{d}/rank.${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-0}}}}"'
               ).format(d=status_dir)
    if memory_kb:
        wrapper = "ulimit -v %d; %s" % (memory_kb, wrapper)
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


def check(name, ranks, args, status, expected, tmp, **options):
    """Runs one case; prints its line; returns 1 if it failed, else 0."""
    statuses, output, seconds, _ = run(ranks, args, tmp, **options)
    problems = []
    if sorted(statuses) != list(range(ranks)) or any(s != status for s in statuses.values()):
        problems.append("exit statuses %s, expected %d on each of %d ranks" % (statuses, status, ranks))
    # Agreed errors say "meshtrain: error:", a rank's own "meshtrain: rank N: error:".
    printed = len(re.findall(r"meshtrain: (?:rank \d+: )?error:", output))
    if printed != 1:
        problems.append("error printed %d times" % printed)
    if "internal error" in output:
        problems.append("reported as an internal error")
    for text in expected:
        if text.format(dir=tmp) not in output:
            problems.append("missing text: " + text.format(dir=tmp))
    print("%-28s ranks %d  %5.1fs  %s" % (name, ranks, seconds, "ok" if not problems else "FAILED"))
    if problems:
        print("    " + "\n    ".join(problems))
        print("    output:\n      " + output.strip().replace("\n", "\n      "))
    return 1 if problems else 0


def make_shards(tmp):
    """Token shards for the data cases: a good one, a short validation one, and two corrupt
    copies of the good one (a token beyond the vocabulary, a flipped byte)."""
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 40)
    subprocess.run([BIN, "prepare", text, "--out", os.path.join(tmp, "text")], check=True,
                   capture_output=True)
    subprocess.run([BIN, "prepare", text, "--out", os.path.join(tmp, "short"), "--val-fraction",
                    "0.005"], check=True, capture_output=True)
    good = open(os.path.join(tmp, "text_train.bin"), "rb").read()
    bad = bytearray(good)
    bad[64 + 2 * 100:64 + 2 * 101] = (60000).to_bytes(2, "little")  # token 100
    open(os.path.join(tmp, "bad_token.bin"), "wb").write(bad)
    flipped = bytearray(good)
    flipped[64 + 2 * 500] ^= 0x01  # a letter becomes its neighbour: still in the vocabulary
    open(os.path.join(tmp, "flipped.bin"), "wb").write(flipped)


def rank_processes(launcher):
    """The pids of the meshtrain processes under the launcher `launcher`: its children under
    Open MPI's mpiexec, its grandchildren (below hydra_pmi_proxy) under MPICH's."""
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True,
                           text=True).stdout.split("\n")
    children, names = {}, {}
    for line in table:
        fields = line.split(None, 2)
        if len(fields) == 3:
            children.setdefault(int(fields[1]), []).append(int(fields[0]))
            names[int(fields[0])] = fields[2]
    found, todo = [], [launcher]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            if names[pid] == os.path.basename(BIN)[:15]:  # ps shows at most 15 characters
                found.append(pid)
    return found


def stop_during_startup(deck, tmp):
    """SIGTERM to every rank (as Slurm sends it) while the ranks generate a large synthetic
    corpus (minutes): the job must end within seconds with the requeue status, printing why
    once. Returns 1 if it failed, else 0."""
    args = [MPIEXEC, "-n", "2", BIN, "train", deck, "--set", "data.synthetic_bytes=2000000000"]
    start = time.time()
    p = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(5)
    ranks = rank_processes(p.pid)
    signalled = time.time()
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    try:
        output, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        output, _ = p.communicate()
    seconds = time.time() - signalled
    problems = []
    if len(ranks) != 2:
        problems.append("found %d rank processes, expected 2" % len(ranks))
    if p.returncode != 75:
        problems.append("mpiexec exit status %s, expected 75 (requeue)" % p.returncode)
    if output.count("stopping during start-up on SIGTERM") != 1:
        problems.append("the stop was reported %d times" % output.count("stopping during start-up"))
    # Slurm's KillWait is 30 s by default; the job must be gone well before.
    if seconds > 15:
        problems.append("took %.0f s after the signal" % seconds)
    print("%-28s ranks 2  %5.1fs  %s (%.1f s after SIGTERM)" % (
        "SIGTERM during start-up", time.time() - start, "ok" if not problems else "FAILED", seconds))
    if problems:
        print("    " + "\n    ".join(problems) + "\n    output:\n      " + output.replace("\n", "\n      "))
    return 1 if problems else 0


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))
        make_shards(tmp)
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
            failures += check(name, ranks, args, 1, expected, tmp)
        for name, ranks, args, status, expected, *options in COMMAND_CASES:
            args = [a.format(dir=tmp, deck=deck) for a in args]
            failures += check(name, ranks, args, status, expected, tmp, **(options[0] if options else {}))
        failures += stop_during_startup(deck, tmp)

        # Ranks launched differently (MPMD): refused on every rank before anything runs.
        mpmd = [["train", deck, "--set", "train.steps=2"], ["train", deck, "--set", "train.steps=3"]]
        failures += check("different overrides (MPMD)", 2, None, 1,
                          ["ranks were started differently: rank 1 has --set train.steps=3 where "
                           "rank 0 has --set train.steps=2 (override 1)"], tmp, mpmd=mpmd)
        mpmd = [["train", deck], ["train", broken]]
        failures += check("different decks (MPMD)", 2, None, 1,
                          ["rank 1 was given the deck " + broken + ", rank 0 the deck " + deck], tmp,
                          mpmd=mpmd)

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
