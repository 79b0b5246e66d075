#!/usr/bin/env python3
"""`meshtrain prepare`'s outputs (io/prepare_outputs.h) through the real binary (issue 50): an
existing shard, tokenizer or stale .tmp is replaced only with --force; an output that is an input
(the same name, a hard link, a link either way, the tokenizer's file) is refused even with
--force; a failure at the end leaves no output under its final name (a directory where the
validation shard goes left the training shard published); SIGTERM and SIGINT during the work
remove the temporaries and end prepare by the same signal.

usage: prepare_outputs_test.py MESHTRAIN
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        FAILURES.append(name)


def prepare(meshtrain, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([meshtrain, "prepare", *args], capture_output=True, text=True, env=env)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def text(n):
    words = "the quick brown fox jumps over lazy dog café naïve data model token".split()
    return "".join(" ".join(words[(i * 7 + k) % len(words)] for k in range(9)) + "\n"
                   for i in range(n))


def refused(name, p, needles, status=1):
    check(name, p.returncode == status and all(n in p.stderr for n in needles),
          "exit %d (expected %d), stderr:\n%s" % (p.returncode, status, p.stderr))


def main():
    meshtrain = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text(2000))
        other = os.path.join(tmp, "other.txt")
        with open(other, "w", encoding="utf-8") as f:
            f.write(text(500))
        x = os.path.join(tmp, "x")
        p = prepare(meshtrain, corpus, "--out", x)
        check("a first prepare", p.returncode == 0, p.stderr)
        before = read(x + "_train.bin"), read(x + "_val.bin")

        # Existing outputs: refused and untouched; replaced with --force.
        p = prepare(meshtrain, other, "--out", x)
        refused("an existing shard is refused without --force", p,
                [x + "_train.bin: exists; prepare never replaces an output unless told to",
                 "--force"])
        check("... and left as it was", (read(x + "_train.bin"), read(x + "_val.bin")) == before)
        p = prepare(meshtrain, "--synthetic", "10000", "--out", x)
        refused("--synthetic over an existing shard is refused", p, [x + "_train.bin: exists"])
        p = prepare(meshtrain, other, "--out", x, "--force")
        check("--force replaces them", p.returncode == 0 and
              read(x + "_train.bin") != before[0] and not os.path.exists(x + "_train.bin.tmp"),
              p.stderr)

        # A stale .tmp (a prepare killed with SIGKILL): refused, then replaced with --force; a
        # .tmp that links to an input is the input, even with --force.
        y = os.path.join(tmp, "y")
        with open(y + "_val.bin.tmp", "w") as f:
            f.write("left by a killed prepare")
        p = prepare(meshtrain, corpus, "--out", y)
        refused("a stale .tmp is refused without --force", p,
                [y + "_val.bin.tmp: exists: the temporary of a prepare that was killed"])
        check("... and nothing is written", sorted(n for n in os.listdir(tmp) if n.startswith("y"))
              == ["y_val.bin.tmp"])
        p = prepare(meshtrain, corpus, "--out", y, "--force")
        check("--force replaces a stale .tmp", p.returncode == 0 and
              sorted(n for n in os.listdir(tmp) if n.startswith("y")) ==
              ["y_train.bin", "y_val.bin"], p.stderr)
        z = os.path.join(tmp, "z")
        os.symlink(corpus, z + "_train.bin.tmp")
        original = read(corpus)
        p = prepare(meshtrain, corpus, "--out", z, "--force")
        refused("a .tmp that links to an input is refused even with --force", p,
                [z + "_train.bin.tmp: is the same file as " + corpus + ", an input of this "
                 "prepare, which writing its temporary would destroy"])
        check("... and the input is intact", read(corpus) == original)
        os.remove(z + "_train.bin.tmp")

        # An output that is an input, by identity.
        kept = read(x + "_train.bin")
        p = prepare(meshtrain, x + "_train.bin", "--out", x, "--force")
        refused("prepare --out X X_train.bin --force is refused", p,
                [x + "_train.bin: is an input of this prepare", "--force never replaces an input"])
        check("... and X_train.bin is intact", read(x + "_train.bin") == kept)
        hard = os.path.join(tmp, "hard.txt")
        os.link(corpus, hard)
        h = os.path.join(tmp, "h")
        os.symlink(hard, h + "_val.bin")
        p = prepare(meshtrain, corpus, "--out", h, "--force")
        refused("an output linking to a hard link of the input is refused", p,
                [h + "_val.bin: is the same file as " + corpus])
        check("... and the input is intact", read(corpus) == original)

        model = os.path.join(tmp, "m")
        p = prepare(meshtrain, corpus, "--train-tokenizer", "bpe:300", "--out", model)
        check("train a tokenizer", p.returncode == 0, p.stderr)
        spm = model + "_tokenizer.model"
        spm_bytes = read(spm)
        p = prepare(meshtrain, corpus, "--train-tokenizer", "bpe:300", "--out", model)
        refused("--train-tokenizer over existing outputs is refused before training", p,
                [model + "_train.bin: exists"])
        check("... without training first", "training a bpe tokenizer" not in p.stderr, p.stderr)
        p = prepare(meshtrain, other, "--tokenizer", spm, "--out", model, "--force")
        refused("an output that is the tokenizer's file is refused even with --force", p,
                [spm + ": is an input of this prepare"])
        check("... and the tokenizer is intact", read(spm) == spm_bytes)

        # All or nothing: a directory where the validation shard goes is refused before any
        # shard is written (it failed the rename after the training shard was published).
        d = os.path.join(tmp, "d")
        os.makedirs(d + "_val.bin/inside")
        p = prepare(meshtrain, corpus, "--out", d, "--force")
        refused("a directory as an output is refused up front", p,
                [d + "_val.bin: is a directory where prepare would write an output"])
        check("... and no shard is published", not os.path.exists(d + "_train.bin") and
              not os.path.exists(d + "_train.bin.tmp"), str(os.listdir(tmp)))
        os.makedirs(os.path.join(tmp, "t_tokenizer.model"))
        p = prepare(meshtrain, corpus, "--tokenizer", spm, "--out", os.path.join(tmp, "t"),
                    "--force")
        refused("a directory where the tokenizer goes is refused up front", p,
                ["t_tokenizer.model: is a directory"])
        check("... and no shard is published",
              not os.path.exists(os.path.join(tmp, "t_train.bin")), str(os.listdir(tmp)))

        # Signals: the temporaries are removed and prepare ends by the signal (status 128 + n
        # in a shell). A corpus that a SentencePiece model takes seconds to tokenize.
        big = os.path.join(tmp, "big.txt")
        with open(big, "w", encoding="utf-8") as f:
            f.write(text(400000))
        for sig in (signal.SIGTERM, signal.SIGINT):
            s = os.path.join(tmp, "s%d" % sig)
            env = dict(os.environ, OMP_NUM_THREADS="1")
            proc = subprocess.Popen([meshtrain, "prepare", big, "--tokenizer", spm, "--threads",
                                     "2", "--out", s], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, env=env)
            deadline = time.time() + 60
            while not os.path.exists(s + "_train.bin.tmp") and proc.poll() is None and \
                    time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            running = proc.poll() is None
            proc.send_signal(sig)
            err = proc.stderr.read()
            proc.wait()
            left = sorted(n for n in os.listdir(tmp) if n.startswith("s%d" % sig))
            check("%s while tokenizing: no .tmp left, ended by the signal" % sig.name,
                  running and proc.returncode == -sig and left == [] and
                  "prepare stopped by %s; its unfinished outputs were removed" % sig.name in err,
                  "running when signalled: %s, exit %s, left %s, stderr:\n%s" %
                  (running, proc.returncode, left, err))
    print("%d failed" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
