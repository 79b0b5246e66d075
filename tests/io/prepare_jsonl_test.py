#!/usr/bin/env python3
"""`meshtrain prepare` on JSON Lines corpora through the real binary: a corpus of a few MB as
.jsonl, .jsonl.gz (Python's gzip, also as two concatenated members) and .jsonl.zst (the zstd
command) gives shards byte-identical to the same documents given as plain text files, one file
per document, with the byte tokenizer and with a SentencePiece one; the validation shard holds
the documents whose lines start in the last val_fraction of the file, whole; a dotted
--text-field reaches nested objects; bad lines within --max-bad-lines are skipped, each named;
--end-of-text puts the token after every document, text file or JSON Lines line alike.

usage: prepare_jsonl_test.py MESHTRAIN
"""
import gzip
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

FAILURES = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        FAILURES.append(name)


def run(meshtrain, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([meshtrain, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError("meshtrain %s failed (%d):\n%s" % (" ".join(args), p.returncode,
                                                              p.stdout + p.stderr))
    return p


def documents(n):
    """Documents as a pretraining set has them: paragraphs with newlines, quotes, backslashes,
    tabs, accents, CJK and emoji (JSON escapes of every kind), some without a final newline."""
    rng = random.Random(39)
    words = ("the quick brown fox jumps over a lazy dog café naïve 東京 数据 emoji 🙂 "
             "\"quoted\" back\\slash tab\there model token data").split(" ")
    docs = []
    for i in range(n):
        paragraphs = []
        for _ in range(rng.randint(1, 4)):
            paragraphs.append(" ".join(rng.choice(words) for _ in range(rng.randint(20, 90))))
        text = "\n\n".join(paragraphs) + ("\n" if i % 3 else "")
        docs.append("Document %d.\n%s" % (i, text))
    return docs


def jsonl(docs, make=lambda d: {"text": d}):
    return "".join(json.dumps(make(d), ensure_ascii=(i % 2 == 0)) + "\n"
                   for i, d in enumerate(docs)).encode("utf-8")


def tokens(path):
    """The token ids of a meshtrain shard (io/token_shard.h: 64-byte header, then the ids)."""
    with open(path, "rb") as f:
        data = f.read()
    width = struct.unpack_from("<I", data, 12)[0]
    return list(struct.unpack_from("<%d%s" % ((len(data) - 64) // width, "H" if width == 2 else "I"),
                                   data, 64))


def same(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def main():
    meshtrain = os.path.abspath(sys.argv[1])
    zstd = shutil.which("zstd")
    if zstd is None:
        print("FAIL the zstd command is missing (Debian package zstd; scripts/ensure-deps.sh test)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        docs = documents(2400)
        body = jsonl(docs)
        check("the corpus is a few MB", len(body) > 2_000_000, str(len(body)))
        plain_dir = os.path.join(tmp, "plain")
        os.makedirs(plain_dir)
        plain = []
        for i, d in enumerate(docs):
            plain.append(os.path.join(plain_dir, "%05d.txt" % i))
            with open(plain[-1], "w", encoding="utf-8") as f:
                f.write(d)
        corpus = os.path.join(tmp, "corpus.jsonl")
        with open(corpus, "wb") as f:
            f.write(body)
        with open(corpus + ".gz", "wb") as f:
            f.write(gzip.compress(body))
        # `cat a.gz b.gz`: gzip -d reads both members, so must prepare.
        half = body.index(b"\n", len(body) // 2) + 1
        with open(os.path.join(tmp, "members.jsonl.gz"), "wb") as f:
            f.write(gzip.compress(body[:half]) + gzip.compress(body[half:]))
        subprocess.run([zstd, "-q", "-f", corpus, "-o", corpus + ".zst"], check=True)
        # A document whose text is empty adds no tokens (an empty text file is refused, so it
        # has no plain twin), and blank lines are skipped.
        with open(os.path.join(tmp, "blanks.jsonl"), "wb") as f:
            f.write(b'{"text": ""}\n\n' + body.replace(b"\n", b"\n  \r\n", 7))
        nested = os.path.join(tmp, "nested.jsonl.zst")
        subprocess.run([zstd, "-q", "-o", nested],
                       input=jsonl(docs, lambda d: {"id": 1, "meta": {"lang": "en", "body": d}}),
                       check=True)

        out = os.path.join(tmp, "out")
        model = os.path.join(out, "spm")
        with open(os.path.join(tmp, "train.txt"), "w", encoding="utf-8") as f:
            f.write("".join(docs[:300]))
        run(meshtrain, "prepare", os.path.join(tmp, "train.txt"), "--train-tokenizer", "bpe:400",
            "--out", model)
        for tok in ("bytes", model + "_tokenizer.model"):
            name = "bytes" if tok == "bytes" else "sentencepiece"
            want = os.path.join(out, name + "_plain")
            run(meshtrain, "prepare", *plain, "--tokenizer", tok, "--val-fraction", "0",
                "--threads", "2", "--out", want)
            for src, extra in ((corpus, []), (corpus + ".gz", []), (corpus + ".zst", []),
                               (os.path.join(tmp, "members.jsonl.gz"), []),
                               (os.path.join(tmp, "blanks.jsonl"), []),
                               (nested, ["--text-field", "meta.body"])):
                got = os.path.join(out, name + "_" + os.path.basename(src).replace(".", "_"))
                run(meshtrain, "prepare", src, "--tokenizer", tok, "--val-fraction", "0",
                    "--threads", "2", "--out", got, *extra)
                check("%s: %s %s gives the plain files' shard" % (name, os.path.basename(src),
                                                                  " ".join(extra)),
                      same(got + "_train.bin", want + "_train.bin"))

        # Validation: the documents whose lines start at or after size - round(size x 0.1).
        split = len(body) - round(len(body) * 0.1)
        starts, at = [], 0
        for line in body.splitlines(keepends=True):
            starts.append(at)
            at += len(line)
        n_train = sum(1 for s in starts if s < split)
        tok = model + "_tokenizer.model"
        run(meshtrain, "prepare", *plain[:n_train], "--tokenizer", tok, "--val-fraction", "0",
            "--out", os.path.join(out, "head"))
        run(meshtrain, "prepare", *plain[n_train:], "--tokenizer", tok, "--val-fraction", "0",
            "--out", os.path.join(out, "tail"))
        got = os.path.join(out, "split")
        run(meshtrain, "prepare", corpus + ".zst", "--tokenizer", tok, "--out", got)
        check("validation holds the last tenth's documents, whole",
              0 < n_train < len(docs) and same(got + "_train.bin", os.path.join(out, "head_train.bin"))
              and same(got + "_val.bin", os.path.join(out, "tail_train.bin")))

        # --end-of-text: after every document, the same whether documents are files or lines.
        eot = ["--tokenizer", tok, "--end-of-text", "--val-fraction", "0"]
        run(meshtrain, "prepare", *plain, *eot, "--out", os.path.join(out, "eot_plain"))
        run(meshtrain, "prepare", corpus + ".zst", *eot, "--out", os.path.join(out, "eot_jsonl"))
        with_eot = tokens(os.path.join(out, "eot_jsonl_train.bin"))
        without = tokens(os.path.join(out, "sentencepiece_plain_train.bin"))
        eos = with_eot[-1]
        check("--end-of-text: JSON Lines gives the text files' shard",
              same(os.path.join(out, "eot_plain_train.bin"), os.path.join(out, "eot_jsonl_train.bin")))
        check("--end-of-text: one token after each document, nothing else changed",
              with_eot.count(eos) == len(docs) and [t for t in with_eot if t != eos] == without,
              "%d end-of-text tokens for %d documents" % (with_eot.count(eos), len(docs)))
        run(meshtrain, "prepare", plain[0], "--tokenizer", tok, "--end-of-text",
            "--val-fraction", "0.5", "--out", os.path.join(out, "eot_one"))
        parts = [tokens(os.path.join(out, "eot_one_%s.bin" % role)) for role in ("train", "val")]
        check("--end-of-text: a text file's training and validation parts each end with it",
              all(p and p[-1] == eos and p.count(eos) == 1 for p in parts), str(parts))
        p = subprocess.run([meshtrain, "prepare", corpus, "--end-of-text", "--out",
                            os.path.join(out, "bytes_eot")], capture_output=True, text=True)
        check("--end-of-text with a tokenizer that has no such token is refused",
              p.returncode == 2 and "--end-of-text: the bytes tokenizer has no end-of-text token"
              in p.stderr and not os.path.exists(os.path.join(out, "bytes_eot_train.bin")),
              p.stderr)

        # Bad lines within --max-bad-lines: skipped, each named by file and line.
        lines = body.splitlines(keepends=True)
        bad = lines[:5] + [b"{not json\n"] + lines[5:9] + [b'{"txt": "x"}\n', b"[1, 2]\n"] + lines[9:]
        dirty = os.path.join(tmp, "dirty.jsonl")
        with open(dirty, "wb") as f:
            f.write(b"".join(bad))
        got = os.path.join(out, "dirty")
        p = run(meshtrain, "prepare", dirty, "--val-fraction", "0", "--max-bad-lines", "3",
                "--out", got)
        check("bad lines within --max-bad-lines are skipped",
              same(got + "_train.bin", os.path.join(out, "bytes_plain_train.bin")))
        check("each skipped line is named",
              all(dirty + ": line %d: " % n in p.stderr for n in (6, 11, 12)) and
              "skipped 3 bad line(s) (--max-bad-lines 3)" in p.stderr, p.stderr)
        p = subprocess.run([meshtrain, "prepare", dirty, "--max-bad-lines", "2", "--out",
                            os.path.join(out, "refused")], capture_output=True, text=True)
        check("one bad line more than allowed is an error, no shard left",
              p.returncode == 1 and dirty + ": line 12: a JSON array" in p.stderr and
              not any(n.startswith("refused") for n in os.listdir(out)), p.stderr)
    print("%d failed" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
