#!/usr/bin/env python3
"""`meshtrain plan`'s lines for generation's cache (src/app/plan_command.cpp print_sample_cache),
one per pipeline stage, against sizes computed here by hand from the decks' shapes:

- input/llama-tiny.toml, standard attention: 4 layers, 2 key/value heads of 128 / 4 = 32
  channels. A layer keeps keys and values, 2 x 2 x 32 = 128 elements per token, split with the
  heads over tp. tp 2, pp 2 with the partition [1, 3], fp32: 1 x 64 x 4 = 256 and
  3 x 64 x 4 = 768 bytes per token; one rank, bf16: 4 x 128 x 2 = 1024.
- input/deepseek-v3-tiny.toml, latent attention: 3 layers keeping kv_lora_rank 32 +
  qk_rope_head_dim 8 = 40 elements per token, whole on every tp rank (not split): fp64 on one
  rank and on tp 2 alike, 3 x 40 x 8 = 960; pp 2 with [1, 2], fp32: 160 and 320
  (the multi-token depth, on the last stage, keeps no cache: sample leaves it out).
- DeepSeek-V3's cache shape on the tiny deck (61 layers, kv_lora_rank 512, qk_rope_head_dim 64),
  bf16: 576 x 2 x 61 = 70,272 bytes per token.
Per sequence: those times seq_len (128 and 64).

usage: plan_sample_cache_test.py MESHTRAIN REPO
"""
import os
import re
import subprocess
import sys

BIN, REPO = sys.argv[1], sys.argv[2]
LINE = re.compile(r"^# sample: cache of (.+) per sequence of seq_len (\d+) \(([\d,]+) bytes per token\) "
                  r"on each rank of stage pp (\d+)$", re.M)
failures = []


def kib(n):
    return f"{n / 1024:.2f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def expect(deck, world, sets, seq_len, per_token):
    """plan prints, for stage k, per_token[k] bytes per token and seq_len times that per sequence."""
    cmd = [BIN, "plan", os.path.join(REPO, "input", deck), "--world", str(world)]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    got = [(m.group(1), int(m.group(2)), int(m.group(3).replace(",", "")), int(m.group(4)))
           for m in LINE.finditer(p.stdout)]
    want = [(kib(n * seq_len), seq_len, n, stage) for stage, n in enumerate(per_token)]
    if p.returncode != 0 or got != want:
        failures.append(f"{' '.join(cmd)}: exit {p.returncode}, lines {got}, expected {want}\n"
                        f"{p.stdout}{p.stderr}")
    else:
        print(f"ok: {deck} {' '.join(sets)}: {per_token} bytes per token")


# Standard attention: split with the key/value heads.
expect("llama-tiny.toml", 4, ["parallel.tp=2", "parallel.pp=2", "parallel.partition=[1,3]",
                              'train.precision="fp32"'], 128, [256, 768])
expect("llama-tiny.toml", 1, ["parallel.tp=1", "parallel.pp=1", 'train.precision="bf16"'], 128, [1024])
# Latent attention: whole on every tensor rank.
expect("deepseek-v3-tiny.toml", 1, ["parallel.ep=1", 'train.precision="fp64"'], 64, [960])
expect("deepseek-v3-tiny.toml", 2, ["parallel.ep=1", "parallel.tp=2", 'train.precision="fp64"'], 64, [960])
expect("deepseek-v3-tiny.toml", 2, ["parallel.ep=1", "parallel.pp=2", "parallel.partition=[1,2]",
                                    'train.precision="fp32"'], 64, [160, 320])
expect("deepseek-v3-tiny.toml", 1, ["parallel.ep=1", "model.layers=61", "model.kv_lora_rank=512",
                                    "model.qk_rope_head_dim=64", 'train.precision="bf16"'], 64, [70272])

if failures:
    sys.exit("\n".join(failures))
print("plan prints generation's cache per stage")
