#!/usr/bin/env python3
"""Hugging Face MixtralForCausalLM, Qwen3MoeForCausalLM and DeepseekV3ForCausalLM through
`meshtrain import` against the independent fp64 NumPy reference of their forward passes
(hf_decoder_reference.py: the router's softmax, top k, renormalisation, the experts' weighted sum,
dense first blocks; deepseek_v3_reference.py: latent attention, YaRN, the noaux_tc router with its
e_score_correction_bias, shared experts).

Each case writes a tiny HF directory of random weights (tests/support/tiny_hf_moe.py: Mixtral
with grouped-query attention; Qwen3-MoE with q/k norm, top 3 of 8 and norm_topk_prob false;
Qwen3-MoE with mlp_only_layers [0]; DeepSeek-V3 with a random routers' bias), imports it with
--deck-out, and requires:
- `meshtrain eval` of the imported checkpoint within 1e-9 (fp64) and 1e-5 (fp32) of the
  reference's mean cross-entropy on the windows eval reads (the language-model loss: the
  balancing losses are training-only);
- `meshtrain sample` greedy (key/value cache, tp 2) to append the reference's 32 argmax tokens;
- `meshtrain export` to give back every tensor bit for bit (DeepSeek-V3's routers' bias too), and
  the reference on the exported directory (its config.json and tensors) the loss eval gave.
And: an imported DeepSeek-V3 bias routes the first step `train` takes from the import.

Exit status 77 (CTest: skipped) where NumPy or h5py is missing.
"""

import json
import unittest
import os
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
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402
import hf_llama_test as hf  # noqa: E402
import tiny_hf_moe  # noqa: E402
from hf_reference_test import (EVAL_BATCHES, G, NEW_TOKENS, PROMPT, SEQ, VOCAB, ReferenceCase,  # noqa: E402
                               reference_eval_loss, write_eval_windows)

# The precision and device of the comparisons, whatever the imported deck says (a fine-tune's
# deck runs on whatever the host has).
CPU_FP64 = ['run.device="cpu"', 'train.precision="fp64"']


class HfMoeReference(ReferenceCase):
    def moe_case(self, kind):
        config = tiny_hf_moe.CONFIGS[kind]
        self.assertEqual(config["max_position_embeddings"], SEQ)  # the deck import writes trains SEQ
        hf_dir, ckpt = os.path.join(self.dir, "hf"), os.path.join(self.dir, "imported.h5")
        _, weights32 = tiny_hf_moe.write(kind, hf_dir, seed=11)
        weights = {k: v.astype(np.float64) for k, v in weights32.items()}
        deck = os.path.join(self.dir, "imported.toml")
        self.meshtrain(["import", "--format", "hf", hf_dir, ckpt, "--deck-out", deck])
        with open(deck) as f:
            text = f.read()
        self.assertIn('feed_forward = "moe"\n', text)

        val = os.path.join(self.dir, "val.bin")
        windows = G * EVAL_BATCHES
        tokens = write_eval_windows(val, windows, SEQ, VOCAB)
        val_set = ["--set", f'data.val="{val}"', "--set", 'run.device="cpu"', "--set",
                   f"train.global_batch={G}", "--set", "train.micro_batch=2", "--set",
                   f"train.eval_batches={EVAL_BATCHES}"]
        self.check_eval(kind + " imported", ckpt, weights, config, tokens, windows, val_set, deck)

        expected = ref.greedy_generate(weights, config, list(PROMPT), NEW_TOKENS)
        print(f"{kind}: greedy {expected}")
        self.assertEqual(self.sample_greedy(ckpt, deck, CPU_FP64), expected, kind)
        self.assertGreater(len(set(expected)), 16, "a repetitive continuation proves little")

        out = os.path.join(self.dir, "exported")
        self.meshtrain(["export", ckpt, "--format", "hf", out])
        exported, _ = hf.read_hf_dir(out)
        self.assertEqual(sorted(exported), sorted(weights32))
        for name, a in weights32.items():
            self.assertEqual(exported[name].tobytes(), a.tobytes(), name)
        with open(os.path.join(out, "config.json")) as f:
            exported_config = json.load(f)
        got = self.eval_loss(ckpt, val_set, "fp64", deck)
        want = reference_eval_loss({k: np.asarray(v, dtype=np.float64) for k, v in exported.items()},
                                   exported_config, tokens, windows, SEQ)
        print(f"{kind} exported: reference {want:.15f}, eval {got:.15f}")
        self.assertLess(abs(got - want) / want, 1e-9, kind + " exported")

    def test_mixtral_gqa(self):
        self.moe_case("mixtral")

    def test_qwen3_moe_qk_norm_unnormalised_top3(self):
        self.moe_case("qwen3_moe")

    def test_qwen3_moe_dense_first_block(self):
        self.moe_case("qwen3_moe_dense0")

    def test_deepseek_v3_with_its_routers_bias(self):
        """The routers' e_score_correction_bias (random, as wide as the scores' spread) is read
        into the expert bias: eval routes by it as the reference does, export writes it back."""
        self.moe_case("deepseek_v3")

    def test_deepseek_v3_bias_routes_the_first_training_step(self):
        """An imported bias that lifts expert 5 far above the others' scores in every mixture
        block: the first step `train` takes from the imported checkpoint sends every token to
        expert 5 (its experts' record), and the step's balancing update starts from the
        imported values (each moved by exactly the update rate)."""
        config = tiny_hf_moe.CONFIGS["deepseek_v3"]
        hf_dir, ckpt = os.path.join(self.dir, "hf"), os.path.join(self.dir, "imported.h5")
        weights = tiny_hf_moe.random_weights(config, 11)
        bias_names = sorted(n for n in weights if n.endswith("e_score_correction_bias"))
        self.assertEqual(len(bias_names), 2)
        for n in bias_names:
            weights[n] = np.where(np.arange(8) == 5, 4.0, weights[n]).astype(np.float32)
        hf.write_hf_dir(hf_dir, config, weights, "F32")
        deck = os.path.join(self.dir, "imported.toml")
        self.meshtrain(["import", "--format", "hf", hf_dir, ckpt, "--deck-out", deck])
        train_data = os.path.join(self.dir, "train.bin")
        write_eval_windows(train_data, G * EVAL_BATCHES, SEQ, VOCAB)
        rate = 0.001
        sets = [f'checkpoint.resume="{ckpt}"', f'run.dir="{self.run_dir}"', f'data.train="{train_data}"',
                'data.val="none"', "train.steps=1", "checkpoint.every=1", f"train.global_batch={G}",
                "train.micro_batch=2", "run.log_every=1", f"model.moe_bias_update_rate={rate}"] + CPU_FP64
        self.meshtrain(["train", deck] + [a for s in sets for a in ("--set", s)], ranks=1)
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"expert_tokens"' in line]
        first = [r for r in records if r["step"] == 1]
        self.assertEqual(len(first), 1, records)
        tokens = first[0]["expert_tokens"]
        self.assertEqual(first[0]["moe_layers"], [1, 2])
        for i in range(2):
            self.assertEqual(tokens[8 * i + 5], G * SEQ, f"block {i + 1}: {tokens[8 * i:8 * i + 8]}")
        with h5py.File(self.ckpt(1), "r") as f:
            for n in bias_names:
                block = n.split(".")[2]
                got = f[f"buffers/h.{block}.mlp.router.expert_bias"][...]
                moved = np.abs(got - weights[n].astype(np.float64))
                self.assertTrue(np.all(np.isclose(moved, rate, rtol=0, atol=1e-15) | (moved == 0)), (n, moved))
                self.assertLess(got[5], weights[n][5], "expert 5 took every token: its bias falls")


class ReferenceMoeSelfChecks(unittest.TestCase):
    """The reference's mixture against facts that need no meshtrain."""

    def test_one_expert_is_the_dense_mlp(self):
        # E = k = 1: every token's gate is 1 (renormalised or not: the one probability is 1), so
        # the mixture is its expert, a Llama MLP with the same weights.
        moe = dict(tiny_hf_moe.CONFIGS["qwen3_moe"], num_experts=1, num_experts_per_tok=1,
                   moe_intermediate_size=64, num_hidden_layers=1)
        dense = dict(moe, model_type="qwen3")
        rng = np.random.default_rng(4)
        w = {n: rng.standard_normal(s) * 0.3 for n, s in ref.parameter_names(moe).items()}
        d = {n.replace("mlp.experts.0.", "mlp."): v for n, v in w.items() if "mlp.gate." not in n}
        tokens = np.array([1, 5, 9, 2])
        np.testing.assert_allclose(ref.decoder_logits(w, moe, tokens), ref.decoder_logits(d, dense, tokens),
                                   rtol=1e-12, atol=1e-12)

    def test_gates_and_choice(self):
        # A router that prefers expert 2, then 0, then 1 for every token: the output is the
        # weighted sum of those experts' outputs, renormalised where asked.
        config = dict(tiny_hf_moe.CONFIGS["qwen3_moe"], num_experts=3, num_experts_per_tok=2,
                      num_hidden_layers=1)
        rng = np.random.default_rng(5)
        w = {n: rng.standard_normal(s) * 0.3 for n, s in ref.parameter_names(config).items()}
        x = np.abs(rng.standard_normal((1, 3, 32))) + 0.1  # positive: the router's sign is its order
        w["model.layers.0.mlp.gate.weight"] = np.stack([np.full(32, 0.05), np.zeros(32), np.full(32, 0.1)])
        logits = x[0] @ w["model.layers.0.mlp.gate.weight"].T
        p = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        out = {e: ref.swiglu(x[0], w, *ref.expert_names(config, 0, e)) for e in range(3)}
        for normalise in (False, True):
            c = dict(config, norm_topk_prob=normalise)
            g2, g0 = p[:, 2:3], p[:, 0:1]
            if normalise:
                g2, g0 = g2 / (g2 + g0), g0 / (g2 + g0)
            np.testing.assert_allclose(ref.sparse_moe(x, w, c, 0)[0], g2 * out[2] + g0 * out[0], rtol=1e-12)


if __name__ == "__main__":
    harness.main()
