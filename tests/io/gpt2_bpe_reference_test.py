#!/usr/bin/env python3
"""GPT-2 byte-level BPE: meshtrain's encoder (C++, PCRE2) against an independent Python one.

The reference below is written from the published description of GPT-2's encoder (Radford et
al. 2019, openai/gpt-2 src/encoder.py): bytes_to_unicode, the pre-tokenizer regex with Unicode
classes (the `regex` module, as the original), and bpe() merging the lowest-ranked pair until
none is left. No GPT-2 vocabulary can be downloaded here, so the test first learns one: plain
BPE training over a small corpus (most frequent pair first), written as vocab.json and
merges.txt. Then every text is encoded by the reference and by `meshtrain prepare --tokenizer`
(read back from the shard it writes): the ids must be identical, for the directory form, the
"VOCAB,MERGES" form and the tokenizer.json prepare writes beside the shards, and for a
LLaMA-3-style tokenizer.json (its Split regex, model.ignore_merges). Finally a split into
train/validation shards must concatenate to the ids of the whole text.

usage: gpt2_bpe_reference_test.py MESHTRAIN
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import regex  # Debian python3-regex

PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """Printable bytes stand for themselves; the rest map to 256, 257, ... in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


B2U = bytes_to_unicode()


# LLaMA 3's pre-tokenizer (its tokenizer.json: a Split by this regex, then ByteLevel), which
# meshtrain reads from a tokenizer.json together with model.ignore_merges.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def words(text, pattern=PATTERN):
    return ["".join(B2U[b] for b in w.encode("utf-8")) for w in pattern.findall(text)]


def learn_bpe(corpus, merges_wanted):
    """Most frequent adjacent pair first, over the pre-tokens of the corpus."""
    counts = {}
    for w in words(corpus):
        counts[tuple(w)] = counts.get(tuple(w), 0) + 1
    merges = []
    for _ in range(merges_wanted):
        pairs = {}
        for w, n in counts.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        new_counts = {}
        for w, n in counts.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_counts[tuple(out)] = new_counts.get(tuple(out), 0) + n
        counts = new_counts
    vocab = {B2U[b]: b for b in range(256)}  # byte tokens first, in byte order
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


class Encoder:
    """GPT-2's encode(): pre-tokenize, map bytes, bpe() each word by merge rank."""

    def __init__(self, vocab, merges, pattern=PATTERN, ignore_merges=False):
        self.vocab = vocab
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.cache = {}
        self.pattern = pattern
        self.ignore_merges = ignore_merges

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        self.cache[token] = word
        return word

    def encode(self, text):
        out = []
        for w in words(text, self.pattern):
            if self.ignore_merges and w in self.vocab:
                out.append(self.vocab[w])  # a whole pre-token in the vocabulary is that token
            else:
                out.extend(self.vocab[p] for p in self.bpe(w))
        return out


CORPUS = """The quick brown fox jumps over the lazy dog. It's 2024, and we've seen 1,000 foxes!
Don't you think they'll come back? I'm sure she'd say so; we're certain.
Numbers: 3.14159, 2718, 42 and 1234567890. Café, naïve, résumé, Zürich, Ελληνικά, русский.
日本語のテキスト、中文文本。 Emoji: 😀🎉 and symbols: © ® ™ — … “quotes” «guillemets».
    indented line with    runs of   spaces\tand\ttabs
""" * 3

TEXTS = {
    "ascii": "Hello world! This is a test of the encoder, with punctuation... and more.",
    "contractions": "I'm sure it's fine; we've done it, they'll see, she'd know, you're right. "
                    "DON'T SHOUT, It'S ok, 's 't 're 've 'm 'll 'd, rock'n'roll",
    "digits": "0 1 12 123 1234 12345 3.14 1,000,000 2024-01-31 +49 (0)30 x2 v1.2.3 ٣٤ Ⅻ ½",
    "unicode": "Café naïve résumé Zürich Ελληνικά русский 日本語のテキスト 中文 한국어 العربية "
               "עברית हिन्दी 😀🎉👍🏽 e\u0301 ﬁ Ⅻ ℌ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "whitespace": "a  b   c    d\t\te\n\nf\n\n\n  g   \n\t h \r\n i\u00a0j\u3000k\u2003l  "
                  "\u200bm\u0085n   ",
    "leading": "   leading spaces and trailing   ",
    "newlines": "\n\nline one\nline two\n\n\nline three\n",
    "mixed": "x=1;y=2;print(x+y)  # code?!  <tag attr=\"v\">text</tag> {json: [1, 2]}",
    "single": "z",
    "long": CORPUS,
}


def run(meshtrain, *args):
    p = subprocess.run([meshtrain, "prepare", *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: meshtrain prepare {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"MTTOKENS", path
    width, count = struct.unpack_from("<IQ", data, 12)
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    return list(struct.unpack_from(fmt, data, 64))


def main():
    meshtrain = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        vocab, merges = learn_bpe(CORPUS, 300)
        tokdir = os.path.join(tmp, "gpt2")
        os.makedirs(tokdir)
        with open(os.path.join(tokdir, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(os.path.join(tokdir, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            for a, b in merges:
                f.write(f"{a} {b}\n")
        ref = Encoder(vocab, merges)
        pair = os.path.join(tokdir, "vocab.json") + "," + os.path.join(tokdir, "merges.txt")
        # The same vocabulary as a LLaMA-3-style tokenizer.json: its regex, ignore_merges, and a
        # whole word added to the vocabulary that the merges would not make.
        vocab3 = dict(vocab)
        whole = B2U[ord(" ")] + "encoder"
        assert len(ref.bpe(whole)) > 1, "the merges must not make the added word by themselves"
        vocab3[whole] = len(vocab3)
        llama3 = os.path.join(tmp, "llama3_tokenizer.json")
        with open(llama3, "w", encoding="utf-8") as f:
            json.dump({"version": "1.0", "added_tokens": [],
                       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                           {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX},
                            "behavior": "Isolated", "invert": False},
                           {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": False}]},
                       "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                   "trim_offsets": True, "use_regex": True},
                       "model": {"type": "BPE", "ignore_merges": True, "vocab": vocab3,
                                 "merges": [[a, b] for a, b in merges]}}, f, ensure_ascii=False)
        ref3 = Encoder(vocab3, merges, regex.compile(LLAMA3_REGEX), ignore_merges=True)
        for name, text in TEXTS.items():
            path = os.path.join(tmp, name + ".txt")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            want = ref.encode(text)
            out = os.path.join(tmp, "out", name)
            forms = [("directory", tokdir), ("vocab,merges", pair)]
            run(meshtrain, path, "--out", out, "--val-fraction", "0", "--tokenizer", tokdir)
            forms.append(("written tokenizer.json", out + "_tokenizer.json"))
            for form, spec in forms:
                o = out + "_" + form.split()[0].replace(",", "_")
                run(meshtrain, path, "--out", o, "--val-fraction", "0", "--tokenizer", spec)
                got = read_shard(o + "_train.bin")
                if got != want:
                    failures += 1
                    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                 min(len(got), len(want)))
                    print(f"FAIL {name} ({form}): {len(got)} ids vs {len(want)} from the "
                          f"reference, first difference at {first}: "
                          f"{got[first:first + 5]} vs {want[first:first + 5]}")
                else:
                    print(f"ok   {name} ({form}): {len(got)} ids identical")
            o = out + "_llama3"
            run(meshtrain, path, "--out", o, "--val-fraction", "0", "--tokenizer", llama3)
            got, want3 = read_shard(o + "_train.bin"), ref3.encode(text)
            if got != want3:
                failures += 1
                print(f"FAIL {name} (LLaMA 3 regex, ignore_merges): {len(got)} ids vs "
                      f"{len(want3)} from the reference")
            else:
                print(f"ok   {name} (LLaMA 3 regex, ignore_merges): {len(got)} ids identical")
        # Train/validation split at a text boundary: the two shards are the whole text's ids.
        big = os.path.join(tmp, "big.txt")
        text = CORPUS * 40
        with open(big, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        out = os.path.join(tmp, "out", "split")
        run(meshtrain, big, "--out", out, "--val-fraction", "0.3", "--tokenizer", tokdir,
            "--threads", "3")
        train, val = read_shard(out + "_train.bin"), read_shard(out + "_val.bin")
        if train + val != ref.encode(text) or not val:
            failures += 1
            print(f"FAIL split: {len(train)} + {len(val)} ids do not make the whole text's")
        else:
            print(f"ok   split: {len(train)} + {len(val)} ids = the whole text's")
    if failures:
        sys.exit(f"{failures} comparison(s) failed")
    print("all identical")


if __name__ == "__main__":
    main()
