#!/usr/bin/env python3
"""meshtrain's Llama 3 and Qwen 3 against an independent fp64 NumPy reference of Hugging Face's
LlamaForCausalLM / Qwen3ForCausalLM (hf_decoder_reference.py), end to end through the binary.

Each case trains a tiny deck in fp64 for a few steps on two ranks, then reads the checkpoint with
h5py, renames meshtrain's parameters to Hugging Face's (the table below, written from the HF
modules' names, not from meshtrain's export) and requires `meshtrain eval` (fp64, one rank)
equal to the reference's mean cross-entropy on the very windows eval reads (a validation shard
holding exactly them) within 1e-9 relative, and the fp32 eval of the same checkpoint within
1e-5. Then it writes random weights, generated in HF's layout, into the checkpoint (the same
table backwards, checksums recomputed) and requires the same of eval, and `meshtrain sample`
greedy (temperature 0, key/value cache, tp 2) to write the same 32 tokens as the reference's
argmax decoding from the same prompt (random weights: a trained tiny model repeats one byte).
The cases: Llama 3 with grouped-query attention and the "llama3" rotary scaling (an original
context shorter than seq_len, so some wavelengths are kept, some blended and some stretched),
untied; Qwen 3 (q_norm/k_norm, head_dim != d_model / heads), tied; Llama with kv_heads == heads
(the fused (3, NH HS, C) qkv weight) and plain rotary, tied.

Hugging Face's own path too: random weights written as an HF directory, imported
(`import --deck-out`), evaluated against the reference (1e-9 fp64, 1e-5 fp32), exported, and the
reference on the exported weights against eval (Llama with GQA and scaling; Qwen 3).

The functions above the test class (hf_config, hf_weights_from_checkpoint, reference_eval_loss,
write_eval_windows, ...) are importable for the Hugging Face import/export tests.

Exit status 77 (CTest: skipped) where NumPy or h5py is missing.
"""

import os
import re
import subprocess
import unittest
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy as np
    import h5py
except ImportError as e:  # a visible skip, not a pass
    if __name__ == "__main__":
        print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy python3-h5py)")
        sys.exit(77)
    raise

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
import harness  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402

G, EVAL_BATCHES = 4, 2
STEPS = 30
NEW_TOKENS = 32
PROMPT = b"The cat "

# The cases' [model] keys (besides layers, vocab and seq_len, which every case shares).
CASES = {
    # Wavelengths 2 pi theta^(2i/d) at head_dim 16, theta 10000: 6.3 (below 32/4: kept),
    # 19.9 (between 32/4 and 32/1: blended), 62.8 and up (stretched by 4).
    "llama_gqa_scaled": {"family": '"llama"', "d_model": 64, "heads": 4, "kv_heads": 2,
                         "ffn_hidden": 96, "rope_theta": 10000.0, "rope_scaling": '"llama3"',
                         "rope_factor": 4.0, "rope_low_freq_factor": 1.0,
                         "rope_high_freq_factor": 4.0, "rope_original_max_positions": 32,
                         "tie_embeddings": "false"},
    "qwen3_head_dim": {"family": '"qwen3"', "d_model": 32, "heads": 4, "kv_heads": 2,
                       "head_dim": 16, "ffn_hidden": 80, "tie_embeddings": "true"},
    "llama_fused_qkv": {"family": '"llama"', "d_model": 32, "heads": 4, "ffn_hidden": 64,
                        "norm_eps": 1e-6, "tie_embeddings": "true"},
}
LAYERS, VOCAB, SEQ = 2, 256, 48
FAMILY_DEFAULTS = {  # families/'s defaults (families/registry.h: family_defaults), as HF's configs state them
    "llama": {"rope_theta": 500000.0, "norm_eps": 1e-5},
    "qwen3": {"rope_theta": 1000000.0, "norm_eps": 1e-6},
}


# ---- deck <-> Hugging Face ----------------------------------------------------------------------

def hf_config(model):
    """The config.json of a deck's [model] (a dict of key -> TOML text or number)."""
    family = model["family"].strip('"')
    d = FAMILY_DEFAULTS[family]
    C, NH = int(model["d_model"]), int(model["heads"])
    config = {
        "model_type": family,
        "architectures": ["LlamaForCausalLM" if family == "llama" else "Qwen3ForCausalLM"],
        "vocab_size": int(model["vocab_size"]), "hidden_size": C,
        "intermediate_size": int(model.get("ffn_hidden", 4 * C)),
        "num_hidden_layers": int(model["layers"]), "num_attention_heads": NH,
        "num_key_value_heads": int(model.get("kv_heads", NH)),
        "head_dim": int(model.get("head_dim", C // NH)),
        "rms_norm_eps": float(model.get("norm_eps", d["norm_eps"])),
        "rope_theta": float(model.get("rope_theta", d["rope_theta"])),
        "max_position_embeddings": int(model["seq_len"]), "hidden_act": "silu",
        "tie_word_embeddings": model.get("tie_embeddings", "false") == "true",
        "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
    }
    if model.get("rope_scaling", '"none"').strip('"') == "llama3":
        config["rope_scaling"] = {
            "rope_type": "llama3", "factor": float(model.get("rope_factor", 8.0)),
            "low_freq_factor": float(model.get("rope_low_freq_factor", 1.0)),
            "high_freq_factor": float(model.get("rope_high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(model.get("rope_original_max_positions", 8192))}
    return config


def name_table(config, fused):
    """[(meshtrain /model dataset, HF name or (q, k, v) names)]: meshtrain keeps nn.Linear's
    (out, in) layout and HF's head order, so the map is names only, except the fused multi-head
    weight h.{i}.attn.qkv.weight (3, NH HS, C) (kv_heads == heads without qk_norm), whose three
    slices are q_proj, k_proj and v_proj."""
    table = [("wte", "model.embed_tokens.weight"), ("ln_f.weight", "model.norm.weight")]
    if not config["tie_word_embeddings"]:
        table.append(("lm_head.weight", "lm_head.weight"))
    for i in range(config["num_hidden_layers"]):
        m, h = f"h.{i}.", f"model.layers.{i}."
        table += [(m + "ln_1.weight", h + "input_layernorm.weight"),
                  (m + "ln_2.weight", h + "post_attention_layernorm.weight"),
                  (m + "attn.proj.weight", h + "self_attn.o_proj.weight")]
        qkv = tuple(h + f"self_attn.{x}_proj.weight" for x in "qkv")
        table += [(m + "attn.qkv.weight", qkv)] if fused else list(zip(
            (m + f"attn.{x}.weight" for x in "qkv"), qkv))
        if config["model_type"] == "qwen3":
            table += [(m + f"attn.{x}.weight", h + f"self_attn.{x}.weight")
                      for x in ("q_norm", "k_norm")]
        table += [(m + f"mlp.{x}.weight", h + f"mlp.{x}_proj.weight") for x in ("gate", "up", "down")]
    return table


def checkpoint_table(f, config):
    """name_table for an open checkpoint, refusing a /model dataset the table does not map."""
    table = name_table(config, fused="h.0.attn.qkv.weight" in f["model"])
    unmapped = set(f["model"]) - {m for m, _ in table}
    if unmapped:
        raise KeyError(f"{f.filename}: /model datasets this table does not map: {sorted(unmapped)}")
    return table


def hf_weights_from_checkpoint(path, config):
    """{HF name: fp64 array} from a meshtrain checkpoint's /model datasets."""
    out = {}
    with h5py.File(path, "r") as f:
        for m, h in checkpoint_table(f, config):
            value = np.asarray(f["model"][m][...], dtype=np.float64)
            out.update(zip(h, value) if isinstance(h, tuple) else [(h, value)])
    return out


def write_hf_weights_into_checkpoint(path, weights, config):
    """Overwrites a checkpoint's /model datasets with HF-named weights (in the datasets' dtype)
    and their checksums (the documented formula, harness.checksum): a checkpoint meshtrain loads
    as its own, holding a model written in Hugging Face's layout."""
    with h5py.File(path, "r+") as f:
        for m, h in checkpoint_table(f, config):
            ds = f["model"][m]
            value = np.stack([weights[n] for n in h]) if isinstance(h, tuple) else weights[h]
            value = np.asarray(value, dtype=ds.dtype).reshape(ds.shape)
            ds[...] = value
            ds.attrs.modify("checksum", harness.checksum(value))


def random_hf_weights(config, seed):
    """Random weights in HF's layout, scaled so that the logits spread over several units and a
    greedy continuation varies (a trained tiny model repeats one byte; with tied embeddings, a
    large embedding makes each token predict itself, hence the small one)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in ref.parameter_names(config).items():
        if len(shape) == 1:  # norm weights around 1
            out[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            scale = 0.3 if name.endswith("embed_tokens.weight") else 3.0 / np.sqrt(shape[1])
            out[name] = scale * rng.standard_normal(shape)
    return out


# ---- the windows eval reads, and the reference's loss on them -----------------------------------

def write_eval_windows(path, windows, seq_len, vocab, seed=5):
    """A validation shard of `windows` windows of seq_len + 1 tokens laid end to end
    (io/token_dataset.h): eval's batch e, row p reads window e G + p, each once, in order.
    Returns the tokens."""
    tokens = np.random.default_rng(seed).integers(0, vocab, windows * seq_len + 1)
    harness.write_token_shard(path, tokens, vocab)
    return tokens


def reference_eval_loss(weights, config, tokens, windows, seq_len):
    """The mean cross-entropy over eval's windows (inputs tokens[w T : w T + T], targets one on)."""
    rows = np.stack([tokens[w * seq_len:w * seq_len + seq_len + 1] for w in range(windows)])
    return ref.mean_cross_entropy(weights, config, rows[:, :-1], rows[:, 1:])


def parse_val_loss(stdout):
    m = re.search(r"^val_loss (\S+)$", stdout, re.M)
    if not m:
        raise AssertionError("no 'val_loss <value>' line in:\n" + stdout)
    return float(m.group(1))


def deck_text(run_dir, model):
    lines = [f"{k} = {v}" for k, v in model.items()]
    return f"""# hf_reference_test: a tiny model trained in fp64 on the built-in corpus
[run]
device = "cpu"
name = "reference"
dir = "{run_dir}"
seed = 7
log_every = 10

[model]
{chr(10).join(lines)}

[data]
synthetic_bytes = 65536

[train]
precision = "fp64"
steps = {STEPS}
global_batch = {G}
micro_batch = 2
lr = 1e-2
warmup_steps = 2
eval_every = 0
eval_batches = {EVAL_BATCHES}

[checkpoint]
every = {STEPS}
"""


class ReferenceCase(harness.Case):
    """The comparisons against the reference (no tests of its own: hf_moe_reference_test.py
    builds on it)."""

    def eval_loss(self, ckpt, val_set, precision, deck=None):
        _, out, _ = self.meshtrain(["eval", deck or self.deck, "--checkpoint", ckpt, "--digits", "17",
                                    "--set", f'train.precision="{precision}"'] + val_set, ranks=1)
        return parse_val_loss(out)

    def check_eval(self, what, ckpt, weights, config, tokens, windows, val_set, deck=None):
        want = reference_eval_loss(weights, config, tokens, windows, SEQ)
        got = self.eval_loss(ckpt, val_set, "fp64", deck)
        got32 = self.eval_loss(ckpt, val_set, "fp32", deck)
        rel, rel32 = abs(got - want) / want, abs(got32 - want) / want
        print(f"\n{what}: reference {want:.15f}, eval fp64 {got:.15f} (relative {rel:.1e}), "
              f"fp32 {got32:.9f} (relative {rel32:.1e})")
        # Far from the uniform ln V, where a wrong mapping could hide in flat logits.
        self.assertGreater(abs(want - np.log(VOCAB)), 0.1, what + ": the logits are nearly flat")
        self.assertLess(rel, 1e-9, what)
        self.assertLess(rel32, 1e-5, what)

    def trained_checkpoint(self, name, steps=STEPS):
        """(HF config, checkpoint) of case `name` trained on two ranks (tensor parallel: the
        heads, kv heads and vocabulary split)."""
        model = dict(CASES[name], layers=LAYERS, vocab_size=VOCAB, seq_len=SEQ)
        with open(self.deck, "w") as f:
            f.write(deck_text(self.run_dir, model))
        self.train(2, ["parallel.tp=2", f"train.steps={steps}", f"checkpoint.every={steps}"])
        return hf_config(model), self.ckpt(steps)

    def sample_greedy(self, ckpt, deck=None, sets=()):
        """The tokens `meshtrain sample` appends to PROMPT greedily (key/value cache, tp 2)."""
        cmd = [harness.MPIEXEC, "-n", "2", harness.MESHTRAIN, "sample", deck or self.deck, "--checkpoint",
               ckpt, "--prompt", PROMPT.decode(), "--tokens", str(NEW_TOKENS), "--temperature", "0",
               "--set", "parallel.tp=2"]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, timeout=180,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        # stdout: the device line, then the prompt and the continuation, a byte per token (the
        # byte tokenizer), and a line break.
        text = p.stdout[p.stdout.index(b"\n" + PROMPT) + 1:]
        self.assertTrue(text.endswith(b"\n"), p.stdout)
        return list(text[len(PROMPT):-1])


class HfReference(ReferenceCase):
    def run_case(self, name):
        config, ckpt = self.trained_checkpoint(name)
        val = os.path.join(self.dir, "val.bin")
        windows = G * EVAL_BATCHES
        tokens = write_eval_windows(val, windows, SEQ, VOCAB)
        val_set = ["--set", f'data.val="{val}"']

        weights = hf_weights_from_checkpoint(ckpt, config)
        self.assertEqual({k: v.shape for k, v in weights.items()}, ref.parameter_names(config))
        self.check_eval(name + " trained", ckpt, weights, config, tokens, windows, val_set)

        # Random weights written in HF's layout into the checkpoint.
        weights = random_hf_weights(config, seed=3)
        write_hf_weights_into_checkpoint(ckpt, weights, config)
        self.check_eval(name + " random", ckpt, weights, config, tokens, windows, val_set)

        # Greedy generation: the key/value cache on two tensor ranks against full recomputation.
        expected = ref.greedy_generate(weights, config, list(PROMPT), NEW_TOKENS)
        print(f"{name}: greedy {expected}")
        self.assertEqual(self.sample_greedy(ckpt), expected, name)
        self.assertGreater(len(set(expected)), 16, "a repetitive continuation proves little")

    def test_sample_writes_token_zero(self):
        # A zero final norm makes every logit 0: greedy takes the lowest id, 0, which the byte
        # tokenizer decodes to a NUL byte; the text must still hold all of them.
        config, ckpt = self.trained_checkpoint("llama_fused_qkv", steps=1)
        weights = hf_weights_from_checkpoint(ckpt, config)
        weights["model.norm.weight"] = np.zeros_like(weights["model.norm.weight"])
        write_hf_weights_into_checkpoint(ckpt, weights, config)
        self.assertEqual(ref.greedy_generate(weights, config, list(PROMPT), NEW_TOKENS),
                         [0] * NEW_TOKENS)
        self.assertEqual(self.sample_greedy(ckpt), [0] * NEW_TOKENS)

    def import_export_case(self, name):
        """Random weights written as a Hugging Face directory (config.json, model.safetensors in
        F32: the weights rounded to float32 first, so that the file holds them exactly) ->
        `meshtrain import --deck-out` -> eval within 1e-9 (fp64) and 1e-5 (fp32) of the
        reference on those weights; then `meshtrain export` -> the reference on the exported
        weights gives the loss eval gave."""
        import hf_llama_test as hf  # the HF directory writer and reader (safetensors from its spec)
        model = dict(CASES[name], layers=LAYERS, vocab_size=VOCAB, seq_len=SEQ)
        config = hf_config(model)
        weights = {k: v.astype(np.float32).astype(np.float64)
                   for k, v in random_hf_weights(config, seed=11).items()}
        hf_dir, ckpt = os.path.join(self.dir, "hf"), os.path.join(self.dir, "imported.h5")
        hf.write_hf_dir(hf_dir, config, {k: v.astype(np.float32) for k, v in weights.items()}, "F32")
        deck = os.path.join(self.dir, "imported.toml")
        self.meshtrain(["import", "--format", "hf", hf_dir, ckpt, "--deck-out", deck])
        val = os.path.join(self.dir, "val.bin")
        windows = G * EVAL_BATCHES
        tokens = write_eval_windows(val, windows, SEQ, VOCAB)
        # The written deck is a fine-tune's: eval it on the CPU with this test's batches.
        val_set = ["--set", f'data.val="{val}"', "--set", 'run.device="cpu"', "--set",
                   f"train.global_batch={G}", "--set", "train.micro_batch=2", "--set",
                   f"train.eval_batches={EVAL_BATCHES}"]
        self.check_eval(name + " imported", ckpt, weights, config, tokens, windows, val_set, deck)

        out = os.path.join(self.dir, "exported")
        self.meshtrain(["export", ckpt, "--format", "hf", out])
        exported, _ = hf.read_hf_dir(out)
        exported = {k: np.asarray(v, dtype=np.float64) for k, v in exported.items()}
        self.assertEqual(sorted(exported), sorted(weights))
        got = self.eval_loss(ckpt, val_set, "fp64", deck)
        want = reference_eval_loss(exported, config, tokens, windows, SEQ)
        print(f"{name} exported: reference {want:.15f}, eval {got:.15f}")
        self.assertLess(abs(got - want) / want, 1e-9, name + " exported")

    def test_llama_import_export_against_reference(self):
        self.import_export_case("llama_gqa_scaled")

    def test_qwen3_import_export_against_reference(self):
        self.import_export_case("qwen3_head_dim")

    def test_llama_gqa_llama3_scaling_untied(self):
        self.run_case("llama_gqa_scaled")

    def test_qwen3_qk_norm_head_dim_tied(self):
        self.run_case("qwen3_head_dim")

    def test_llama_fused_qkv_tied(self):
        self.run_case("llama_fused_qkv")


class ReferenceSelfChecks(unittest.TestCase):
    """The reference's own pieces against facts that need no meshtrain."""

    def test_llama3_scaling_bands(self):
        config = hf_config(dict(CASES["llama_gqa_scaled"], layers=1, vocab_size=8, seq_len=SEQ))
        plain = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
        scaled = ref.inverse_frequencies(config)
        wavelength = 2 * np.pi / plain
        kept, stretched = wavelength < 8, wavelength > 32
        self.assertTrue(kept.any() and stretched.any() and (~kept & ~stretched).any())
        np.testing.assert_array_equal(scaled[kept], plain[kept])
        np.testing.assert_allclose(scaled[stretched], plain[stretched] / 4, rtol=1e-15)
        mid = ~kept & ~stretched
        self.assertTrue(np.all(scaled[mid] < plain[mid]) and np.all(scaled[mid] > plain[mid] / 4))

    def test_rope_parameters_form(self):
        # The newer config.json form (rope_parameters holding rope_theta and the scaling) reads
        # as the classic rope_theta + rope_scaling.
        classic = hf_config(dict(CASES["llama_gqa_scaled"], layers=1, vocab_size=8, seq_len=SEQ))
        newer = {k: v for k, v in classic.items() if k not in ("rope_theta", "rope_scaling")}
        newer["rope_parameters"] = dict(classic["rope_scaling"], rope_theta=classic["rope_theta"])
        np.testing.assert_array_equal(ref.inverse_frequencies(newer),
                                      ref.inverse_frequencies(classic))
        plain = dict(newer, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        np.testing.assert_array_equal(ref.inverse_frequencies(plain),
                                      1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16))

    def test_rotation_is_relative(self):
        # <R(m) q, R(n) k> depends on m - n only: the rotate-half pairing's defining property.
        rng = np.random.default_rng(1)
        q, k = rng.standard_normal(16), rng.standard_normal(16)
        inv = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
        rot = lambda x, p: ref.rotate(x[None], np.array([p]), inv)[0]  # noqa: E731
        self.assertAlmostEqual(rot(q, 7) @ rot(k, 3), rot(q, 14) @ rot(k, 10), places=12)
        self.assertNotAlmostEqual(rot(q, 7) @ rot(k, 3), rot(q, 7) @ rot(k, 5), places=3)

    def test_causal_and_grouped(self):
        # A later token changes no earlier logit; kv head j serves query heads j*g .. j*g + g-1.
        config = hf_config(dict(CASES["llama_gqa_scaled"], layers=1, vocab_size=16, seq_len=8))
        rng = np.random.default_rng(2)
        weights = {n: rng.standard_normal(s) * 0.3 for n, s in ref.parameter_names(config).items()}
        a = ref.decoder_logits(weights, config, np.array([1, 2, 3, 4, 5]))
        b = ref.decoder_logits(weights, config, np.array([1, 2, 3, 4, 9]))
        np.testing.assert_array_equal(a[:4], b[:4])
        self.assertFalse(np.allclose(a[4], b[4]))
        # The same model written as multi-head attention with the kv heads repeated (HF's
        # repeat_kv) gives the same logits.
        mha = dict(config, num_key_value_heads=4)
        repeated = dict(weights)
        for x in ("k_proj", "v_proj"):
            w = weights[f"model.layers.0.self_attn.{x}.weight"].reshape(2, 16, 64)
            repeated[f"model.layers.0.self_attn.{x}.weight"] = np.repeat(w, 2, axis=0).reshape(64, 64)
        np.testing.assert_allclose(ref.decoder_logits(repeated, mha, np.array([1, 2, 3, 4, 5])), a,
                                   rtol=1e-12, atol=1e-12)


if __name__ == "__main__":
    harness.main()
