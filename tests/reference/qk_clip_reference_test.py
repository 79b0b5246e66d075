#!/usr/bin/env python3
"""MuonClip's QK-clip (train.qk_clip_threshold; Kimi K2, arXiv 2507.20534) against the fp64 NumPy
reference, through the binary, on a tiny Llama in fp64 with Muon: multi-head (the fused
(3, NH HS, C) qkv weight) and grouped-query attention (separate q, k, v).

Each case trains one step without clipping (checkpoint W1), then resumes W1 for step 2 twice,
with the threshold tau and without. The reference (hf_decoder_reference.py, Hugging Face's Llama
written from transformers' semantics) runs step 2's window through W1 and records every head's
largest pre-softmax logit S_h; tau is put between them, so that some heads clip and others not.
The clipped run's weights must then equal the unclipped run's with the published rule applied by
the reference (to 1e-12 relative): gamma_h = tau / S_h where S_h > tau; multi-head attention's
query and key rows of head h times sqrt(gamma_h), grouped-query attention's query rows times
gamma_h and the shared key heads untouched; every other tensor the same bits. The step's
metrics.jsonl record must hold max_h S_h (to its 10 digits) and the count of clipped heads.
Then the clipped step resumed on two ranks, as dp 2 (ZeRO 0, 1 and 3), tp 2 and pp 2, must give
the one rank's weights (1e-12 relative): every rank holding part of a head agrees on its maximum,
and the scaling reaches every copy of the weights.

Usage: qk_clip_reference_test.py MESHTRAIN MPIEXEC. Exit 77 (skipped) without NumPy or h5dump.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy)")
    sys.exit(77)
if shutil.which("h5dump") is None:
    print("SKIPPED: h5dump is not installed (Debian: hdf5-tools)")
    sys.exit(77)
sys.path.insert(0, HERE)
import hf_decoder_reference as ref  # noqa: E402

L, C, NH, T, V = 2, 32, 4, 16, 256
TOLERANCE = 1e-12
# The two-rank layouts held to the single rank: the maxima over replicas and stages, each tensor
# rank's own heads, and the scaling of ZeRO's shards (the values refreshed from them).
LAYOUTS = {"dp2": ["parallel.dp=2"], "dp2_zero1": ["parallel.dp=2", "parallel.zero=1"],
           "dp2_zero3": ["parallel.dp=2", "parallel.zero=3"], "tp2": ["parallel.tp=2"],
           "pp2": ["parallel.pp=2"]}

DECK = """[run]
device = "cpu"
dir = "{run_dir}"
seed = 7
log_every = 1

[model]
family = "llama"
layers = {L}
d_model = {C}
heads = {NH}
kv_heads = {kv_heads}
seq_len = {T}
vocab_size = {V}
tie_embeddings = false

[data]
train = "{shard}"
val = "none"

[train]
precision = "fp64"
optimizer = "muon"
lr = 0.05
warmup_steps = 0
steps = 1
global_batch = 2
micro_batch = 1
eval_every = 0

[checkpoint]
every = 1
keep = 4
"""


def write_token_shard(path, tokens):
    """io/token_shard.h's layout, as tests/checkpoint/harness.py writes it."""
    sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
    import harness  # noqa: E402
    harness.write_token_shard(path, tokens, V)


def run(args, env=None):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def dataset(ckpt, name, shape):
    """/model/<name> of a checkpoint, exactly (h5dump's raw little-endian fp64)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as raw:
        subprocess.run(["h5dump", "-b", "LE", "-d", f"/model/{name}", "-o", raw.name, ckpt],
                       check=True, capture_output=True)
        return np.fromfile(raw.name, dtype="<f8").reshape(shape)


def model_tensors(kv_heads):
    """{meshtrain name: shape} of the tiny Llama; (name, HF names) for the reference."""
    D, ffn = C // NH, 4 * C
    fused = kv_heads == NH
    shapes = {"wte": (V, C), "ln_f.weight": (C,), "lm_head.weight": (V, C)}
    for i in range(L):
        m = f"h.{i}."
        shapes.update({m + "ln_1.weight": (C,), m + "ln_2.weight": (C,),
                       m + "attn.proj.weight": (C, NH * D)})
        if fused:
            shapes[m + "attn.qkv.weight"] = (3, NH * D, C)
        else:
            shapes.update({m + "attn.q.weight": (NH * D, C), m + "attn.k.weight": (kv_heads * D, C),
                           m + "attn.v.weight": (kv_heads * D, C)})
        shapes.update({m + f"mlp.{x}.weight": s for x, s in
                       (("gate", (ffn, C)), ("up", (ffn, C)), ("down", (C, ffn)))})
    return shapes


def hf_weights(values):
    """meshtrain's names -> Hugging Face's (the map of hf_reference_test.py's name_table)."""
    out = {"model.embed_tokens.weight": values["wte"], "model.norm.weight": values["ln_f.weight"],
           "lm_head.weight": values["lm_head.weight"]}
    for i in range(L):
        m, h = f"h.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = values[m + "ln_1.weight"]
        out[h + "post_attention_layernorm.weight"] = values[m + "ln_2.weight"]
        out[h + "self_attn.o_proj.weight"] = values[m + "attn.proj.weight"]
        if m + "attn.qkv.weight" in values:
            for x, part in zip("qkv", values[m + "attn.qkv.weight"]):
                out[h + f"self_attn.{x}_proj.weight"] = part
        else:
            for x in "qkv":
                out[h + f"self_attn.{x}_proj.weight"] = values[m + f"attn.{x}.weight"]
        for x in ("gate", "up", "down"):
            out[h + f"mlp.{x}_proj.weight"] = values[m + f"mlp.{x}.weight"]
    return out


def hf_config(kv_heads):
    return {"model_type": "llama", "vocab_size": V, "hidden_size": C, "intermediate_size": 4 * C,
            "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": kv_heads,
            "head_dim": C // NH, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "max_position_embeddings": T, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "rope_scaling": None}


def clipped(values, maxima, tau):
    """The published rule applied to `values` (meshtrain's names) by the heads' maxima (L, NH)."""
    D = C // NH
    out = dict(values)
    for i in range(L):
        gamma = np.where(maxima[i] > tau, tau / maxima[i], 1.0)
        rows = np.repeat(gamma, D)[:, None]  # per query row: its head's gamma
        m = f"h.{i}.attn."
        if m + "qkv.weight" in values:
            w = values[m + "qkv.weight"].copy()
            w[0] *= np.sqrt(rows)
            w[1] *= np.sqrt(rows)
            out[m + "qkv.weight"] = w
        else:
            out[m + "q.weight"] = values[m + "q.weight"] * rows
    return out


def differences(ours, theirs, what):
    failures = []
    for name, want in theirs.items():
        error = np.max(np.abs(ours[name] - want)) / max(np.max(np.abs(want)), 1e-300)
        if error > TOLERANCE:
            failures.append(f"{what}: {name} differs by {error:.2e} relative")
    return failures


def check_case(binary, mpiexec, kv_heads, work):
    shapes = model_tensors(kv_heads)
    tokens = np.random.default_rng(3).integers(0, V, T + 1)
    shard = os.path.join(work, "train.bin")
    write_token_shard(shard, tokens)  # one window: every step reads it

    def deck(name):
        path = os.path.join(work, name + ".toml")
        with open(path, "w") as f:
            f.write(DECK.format(run_dir=os.path.join(work, name), L=L, C=C, NH=NH, kv_heads=kv_heads,
                                T=T, V=V, shard=shard))
        return path

    def ckpt(name, step):
        return os.path.join(work, name, "checkpoints", "step_%08d.h5" % step)

    def read_all(path):
        return {n: dataset(path, n, s) for n, s in shapes.items()}

    run([binary, "train", deck("first")])
    w1 = read_all(ckpt("first", 1))
    maxima = {}
    ref.decoder_hidden(hf_weights(w1), hf_config(kv_heads), tokens[None, :T], maxima)  # both samples
    S = np.stack([maxima[i] for i in range(L)])  # (L, NH)
    ordered = np.sort(S.ravel())
    tau = 0.5 * (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2])
    if not tau > 0:
        return [f"kv_heads {kv_heads}: the heads' maxima {ordered} leave no positive threshold between them"]
    resume = ["--set", f'checkpoint.resume="{ckpt("first", 1)}"', "--set", "train.steps=2"]
    clip = ["--set", f"train.qk_clip_threshold={tau!r}"]
    run([binary, "train", deck("plain")] + resume)
    out = run([binary, "train", deck("clipped")] + resume + clip)
    plain, ours = read_all(ckpt("plain", 2)), read_all(ckpt("clipped", 2))
    what = f"kv_heads {kv_heads}"
    failures = differences(ours, clipped(plain, S, tau), what)
    clipped_heads = int(np.sum(S > tau))
    with open(os.path.join(work, "clipped", "metrics.jsonl")) as f:
        records = [r for r in map(json.loads, f) if "qk_max_logit" in r and r["step"] == 2]
    if len(records) != 1:
        failures.append(f"{what}: no single qk_max_logit record of step 2 in metrics.jsonl")
    else:
        r = records[0]
        # metrics.jsonl writes 10 significant digits
        if abs(r["qk_max_logit"] - S.max()) > 2e-9 * abs(S.max()):
            failures.append(f"{what}: qk_max_logit {r['qk_max_logit']!r}, the reference {S.max()!r}")
        if r["qk_clipped_heads"] != clipped_heads:
            failures.append(f"{what}: {r['qk_clipped_heads']} heads clipped, the reference {clipped_heads}")
    if f"clipped {clipped_heads}" not in out:
        failures.append(f"{what}: the progress line does not say 'clipped {clipped_heads}'")
    print(f"{what}: maxima {np.round(S, 4).tolist()}, tau {tau:.4f}: {clipped_heads} of {S.size} "
          f"heads clipped")
    for name, layout in LAYOUTS.items():
        sets = [a for key in layout for a in ("--set", key)]
        run([mpiexec, "-n", "2", binary, "train", deck(name)] + sets + resume + clip)
        failures += differences(read_all(ckpt(name, 2)), ours, f"{what}, {name} against one rank")
    return failures


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    failures = []
    for kv_heads in (NH, NH // 2):
        work = tempfile.mkdtemp(prefix="meshtrain_qk_clip_")
        try:
            failures += check_case(sys.argv[1], sys.argv[2], kv_heads, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
