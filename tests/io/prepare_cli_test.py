#!/usr/bin/env python3
"""`meshtrain prepare` and `train` through the real binary: bad input exits non-zero with the
file in the message and leaves no shard (nor .tmp) behind; llm.c shards train as they are.

usage: prepare_cli_test.py MESHTRAIN
"""
import os
import struct
import subprocess
import sys
import tempfile

FAILURES = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        FAILURES.append(name)


def run(meshtrain, *args, cwd=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([meshtrain, *args], capture_output=True, text=True, cwd=cwd, env=env)


def refused(meshtrain, tmp, name, args, status, needles):
    out = os.path.join(tmp, "out_" + name.replace(" ", "_"))
    os.makedirs(out)
    p = run(meshtrain, "prepare", *args, "--out", os.path.join(out, "x"))
    left = sorted(os.listdir(out))
    check(name, p.returncode == status and all(n in p.stderr for n in needles) and not left,
          f"exit {p.returncode} (expected {status}), files left {left}, stderr:\n{p.stderr}")


def text(n=3000):
    words = "the quick brown fox jumps over lazy dog café naïve data model token".split()
    return "".join(" ".join(words[(i * 7 + k) % len(words)] for k in range(9)) + "\n"
                   for i in range(n))


def main():
    meshtrain = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good.txt")
        with open(good, "w", encoding="utf-8") as f:
            f.write(text())
        junk = os.path.join(tmp, "junk.bin")
        with open(junk, "wb") as f:
            f.write(b"PK\x03\x04\x00\x00" + bytes(range(256)) * 10)
        empty = os.path.join(tmp, "empty.txt")
        open(empty, "w").close()
        model = os.path.join(tmp, "m")
        p = run(meshtrain, "prepare", good, "--train-tokenizer", "bpe:300", "--out", model)
        check("train a tokenizer", p.returncode == 0 and
              'data.tokenizer = "' + model + '_tokenizer.model"' in p.stdout and
              "model.vocab_size = 300" in p.stdout, p.stdout + p.stderr)
        spm = model + "_tokenizer.model"

        refused(meshtrain, tmp, "binary input, subword tokenizer",
                [good, junk, "--tokenizer", spm], 1, [junk + ": NUL byte at byte offset 4"])
        refused(meshtrain, tmp, "binary input, training",
                [junk, "--train-tokenizer", "bpe:300"], 1, [junk + ": NUL byte at byte offset 4"])
        refused(meshtrain, tmp, "empty file", [good, empty], 1, [empty + ": text file is empty"])
        refused(meshtrain, tmp, "directory", [good, tmp], 1, [tmp + ": is a directory"])
        refused(meshtrain, tmp, "missing file", [os.path.join(tmp, "nope.txt")], 1,
                ["nope.txt: cannot open text file"])
        refused(meshtrain, tmp, "vocabulary the text cannot fill",
                [good, "--train-tokenizer", "bpe:100000"], 1,
                [good + ": cannot train a bpe tokenizer of 100000 pieces", "value <="])
        refused(meshtrain, tmp, "vocabulary above 2^32", [good, "--train-tokenizer", "bpe:4294967296"],
                2, ["is more than a token id holds"])
        refused(meshtrain, tmp, "malformed --train-tokenizer", [good, "--train-tokenizer", "bpe"],
                2, ["expected bpe:N or unigram:N"])
        refused(meshtrain, tmp, "not a tokenizer", [good, "--tokenizer", junk], 1,
                [junk + ": is not a tokenizer meshtrain can open", "SentencePiece"])
        p = run(meshtrain, "prepare", junk, "--out", os.path.join(tmp, "bytes", "x"))
        check("bytes take binary input", p.returncode == 0, p.stderr)

        # llm.c shards (dev/data/data_common.py): GPT-2 uint16 tokens at byte 1024.
        llmc = os.path.join(tmp, "llmc.bin")
        tokens = [(i * 7919) % 50257 for i in range(4000)]
        with open(llmc, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack("<%dH" % len(tokens), *tokens))
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(f"""[run]
device = "cpu"
dir = "{tmp}/run"
[model]
layers = 1
d_model = 16
heads = 2
seq_len = 8
vocab_size = 50257
[data]
train = "{llmc}"
val = "none"
[train]
precision = "fp32"
steps = 1
global_batch = 2
micro_batch = 1
""")
        p = run(meshtrain, "train", deck)
        check("llm.c shard trains", p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:])
        p = run(meshtrain, "train", deck, "--set", "model.vocab_size=50000")
        check("llm.c shard bounded by model.vocab_size", p.returncode == 1 and
              "is not below model.vocab_size 50000" in p.stderr and llmc in p.stderr,
              f"exit {p.returncode}: " + p.stderr[-2000:])
        # A checkpoint records the tokenizer by kind and size: a moved file resumes, another
        # tokenizer is refused.
        p = run(meshtrain, "prepare", good, "--tokenizer", spm, "--out", os.path.join(tmp, "sp"))
        check("prepare with a SentencePiece model", p.returncode == 0, p.stderr)
        deck = os.path.join(tmp, "sp.toml")
        with open(deck, "w") as f:
            f.write(f"""[run]
device = "cpu"
dir = "{tmp}/sprun"
[model]
layers = 1
d_model = 16
heads = 2
seq_len = 8
vocab_size = 320
[data]
train = "{tmp}/sp_train.bin"
val = "none"
tokenizer = "{tmp}/sp_tokenizer.model"
[train]
precision = "fp32"
steps = 1
global_batch = 2
micro_batch = 1
[checkpoint]
every = 1
""")
        p = run(meshtrain, "train", deck)
        check("train with data.tokenizer", p.returncode == 0, p.stderr[-2000:])
        moved = os.path.join(tmp, "moved.model")
        os.rename(os.path.join(tmp, "sp_tokenizer.model"), moved)
        p = run(meshtrain, "train", deck, "--set", "train.steps=2",
                "--set", f'data.tokenizer="{moved}"')
        check("resume with the tokenizer moved", p.returncode == 0 and "resum" in p.stdout.lower(),
              p.stdout[-1500:] + p.stderr[-1500:])
        p = run(meshtrain, "train", deck, "--set", "train.steps=3",
                "--set", 'data.tokenizer="bytes"')
        check("resume with another tokenizer is refused", p.returncode != 0 and
              'model.tokenizer = "sentencepiece:300" in the checkpoint' in p.stderr,
              f"exit {p.returncode}: " + p.stderr[-1500:])
    if FAILURES:
        sys.exit(f"{len(FAILURES)} failed: {', '.join(FAILURES)}")


if __name__ == "__main__":
    main()
