#!/usr/bin/env python3
"""`meshtrain prepare` keeps memory flat on JSON Lines whatever a line's length (issue 50): a
compressed bomb (a 1 MB .gz holding one 1 GiB line; a .zst of zeros) is refused as a line longer
than --max-line-bytes (64 MiB by default) with a peak RSS far below its size (each line was
buffered whole, at 2-9x its size: 2.1 GB before refusing line 1), and a valid long line within
the bound is tokenized in time linear in its length, and a line within it of deep nesting or many
numbers is parsed without a DOM (it cost 12-40x the line). The peak RSS is the child's own
(os.wait4's rusage), not that of every child this test started, and each bound is the growth over
the same binary's peak on a one-line file: the binary's own libraries are 20 MB resident without
the CUDA backend and 233 MB with it (cuBLAS, cuDNN and NCCL are loaded at start), which is no
part of what a line costs.

usage: prepare_jsonl_memory_test.py MESHTRAIN
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

FAILURES = []
GIB = 1 << 30
# How far above the binary's own peak (a one-line file's) the bomb may go: the 64 MiB line bound
# (held at most once, plus the copy of its last growth), under a quarter of the bomb.
BOMB_GROWTH = 236 << 20
# And a 20 MiB line of nesting or numbers, whose DOM cost 240-800 MB.
LINE_GROWTH = 140 << 20


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        FAILURES.append(name)


def run(meshtrain, *args):
    """(exit status, stderr, peak RSS in bytes, seconds) of one prepare."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.time()
    p = subprocess.Popen([meshtrain, "prepare", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env)
    err = p.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, usage.ru_maxrss * 1024, time.time() - start


def gzip_of_one_line(path, head, fill, total):
    """A gzip file of `head` then `fill` repeated up to `total` bytes, without a newline: written
    in 1 MiB pieces, so that this test does not hold the bomb either."""
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    piece = fill * ((1 << 20) // len(fill))
    with open(path, "wb") as f:
        f.write(z.compress(head))
        written = len(head)
        while written < total:
            n = min(len(piece), total - written)
            f.write(z.compress(piece[:n]))
            written += n
        f.write(z.flush())


def main():
    meshtrain = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(tmp, "small.jsonl")
        with open(small, "w") as f:
            f.write('{"text": "a small document"}\n')
        status, err, base, _ = run(meshtrain, small, "--val-fraction", "0", "--out",
                                   os.path.join(tmp, "small"))
        check("a one-line file prepares (the baseline, %d MB)" % (base >> 20), status == 0, err)
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        RSS_BOUND = base + BOMB_GROWTH
        bomb = os.path.join(tmp, "bomb.jsonl.gz")
        gzip_of_one_line(bomb, b'{"text": "', b"a", GIB)
        check("the bomb is small", os.path.getsize(bomb) < 4 << 20, str(os.path.getsize(bomb)))
        status, err, rss, _ = run(meshtrain, bomb, "--out", os.path.join(tmp, "bomb"))
        check("a 1 GiB line in a .gz is refused as longer than --max-line-bytes",
              status == 1 and bomb + ": line 1: the line is 1073741824 bytes (1.0 GiB) long, "
              "more than --max-line-bytes 67108864 bytes (64.0 MiB) allows" in err, err)
        check("... with a peak RSS of %d MB, under %d MB" % (rss >> 20, RSS_BOUND >> 20),
              rss < RSS_BOUND)
        check("... and no shard left", sorted(os.listdir(tmp)) == ["bomb.jsonl.gz"],
              str(os.listdir(tmp)))

        zstd = shutil.which("zstd")
        if zstd is None:
            check("the zstd command is there (Debian package zstd)", False)
        else:
            zeros = os.path.join(tmp, "zeros.jsonl.zst")
            with open(zeros, "wb") as f:
                z = subprocess.Popen([zstd, "-q", "-19", "-c"], stdin=subprocess.PIPE, stdout=f)
                for _ in range(512):
                    z.stdin.write(bytes(1 << 20))
                z.stdin.close()
                z.wait()
            status, err, rss, _ = run(meshtrain, zeros, "--out", os.path.join(tmp, "zeros"),
                                      "--max-bad-lines", "1")
            check("512 MiB of zeros in a .zst: one long bad line, then no document",
                  status == 1 and zeros + ": line 1: the line is 536870912 bytes" in err and
                  zeros + ": holds no document: its 1 line(s) are all blank or bad" in err, err)
            check("... with a peak RSS of %d MB, under %d MB" % (rss >> 20, RSS_BOUND >> 20),
                  rss < RSS_BOUND)

        # Lines within the bound whose JSON was costly as a DOM: 20 MiB of nested arrays (40x
        # its size as a DOM: 800 MB) and 20 MiB of numbers (12x). Read through nlohmann's SAX
        # interface, only the text field is kept.
        for name, middle in (("nested", b"[" * (10 << 20) + b"]" * (10 << 20)),
                             ("numbers", b"[" + b"0," * (10 << 20) + b"0]")):
            path = os.path.join(tmp, name + ".jsonl")
            with open(path, "wb") as f:
                f.write(b'{"text": "a document", "extra": ' + middle + b"}\n")
            status, err, rss, _ = run(meshtrain, path, "--val-fraction", "0", "--out",
                                      os.path.join(tmp, name))
            check("20 MiB of %s beside the text: a document, at a peak RSS of %d MB, under %d MB"
                  % (name, rss >> 20, (base + LINE_GROWTH) >> 20),
                  status == 0 and rss < base + LINE_GROWTH, err)
            os.remove(path)

        # A valid long line within the bound: the same tokens as the text on its own, in time
        # linear in its length (three times the line, at most six times the time: not nine).
        times = {}
        for mib in (12, 36):
            body = (b"the quick brown fox jumps over the lazy dog " * ((mib << 20) // 44))
            line = os.path.join(tmp, "long%d.jsonl" % mib)
            with open(line, "wb") as f:
                f.write(b'{"id": 1, "text": "' + body + b'"}\n')
            out = os.path.join(tmp, "long%d" % mib)
            best = None
            for attempt in range(2):
                for name in os.listdir(tmp):
                    if name.startswith("long%d_" % mib):
                        os.remove(os.path.join(tmp, name))
                status, err, rss, seconds = run(meshtrain, line, "--val-fraction", "0", "--out",
                                                out, "--threads", "1")
                best = seconds if best is None else min(best, seconds)
            times[mib] = best
            with open(out + "_train.bin", "rb") as f:
                f.seek(64)
                tokens = f.read()
            # Byte tokens are stored as little-endian uint16: each byte, then a zero.
            check("a valid %d MiB line is one document, its text's bytes" % mib,
                  status == 0 and tokens[0::2] == body and tokens[1::2] == bytes(len(body)), err)
            os.remove(line)
        check("time linear in the line's length (%.2f s for 12 MiB, %.2f s for 36 MiB)" %
              (times[12], times[36]), times[36] < 6 * times[12] + 0.5)
    print("%d failed" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
