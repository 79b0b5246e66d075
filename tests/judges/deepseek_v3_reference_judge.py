#!/usr/bin/env python3
"""transformers' DeepseekV3ForCausalLM as the judge of the project's fp64 NumPy reference of it
(tests/reference/deepseek_v3_reference.py, through hf_decoder_reference.py).

Each case builds a tiny DeepseekV3ForCausalLM with transformers (its config class and modules,
random weights from a fixed seed, scaled as hf_judge_test.py scales them, the router's
e_score_correction_bias set by hand to distinct values), converts it to float64
(`model.double()`, the rotary frequencies remade in float64, and transformers' float32 casts
turned into float64 while it runs: hf_judge_test.float64_for_float32), and writes it with
`save_pretrained` (safetensors). Then:
- every operation of transformers' forward produces float64 (a dispatch-mode audit);
- the saved directory holds exactly the reference's parameter_names, shapes included;
- the reference, reading the saved tensors by their HF names and the saved config.json, gives
  transformers' mean cross-entropy within 1e-9 relative and its logits within 1e-10 absolute on
  random token batches, and the same greedy continuation (full forward each step);
- transformers' own from_pretrained of the directory gives the in-memory model's logits;
- the reference's loss moves when the rotary layout, the group limit or the correction bias is
  changed in it alone, so the agreement above tests each of them.
The cases cover q_lora_rank null and set, n_group 1 and > 1 with topk_group < n_group,
norm_topk_prob true and false, routed_scaling_factor != 1, first_k_dense_replace 0 and 1, the
default rotary and YaRN (factor 4; mscale_all_dim with and without mscale; beta and truncate
settings), rope_interleave true and false, attention_bias, two shared experts, rms_norm_eps 1e-5
(the latent norms stay at 1e-6). Each of these reference errors fails it (checked once by hand):
rotary pairs not interleaved, groups scored by their top expert, no mscale_all_dim^2, no
attention_factor, YaRN bounds not truncated, gates from the biased keys, latent norms at
rms_norm_eps.

Run it with the judges' environment:
  $(python3 scripts/judges.py path)/bin/python tests/judges/deepseek_v3_reference_judge.py
"""
import json
import os
import sys
import tempfile
import unittest

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import hf_decoder_reference as ref  # noqa: E402
from hf_judge_test import (float64_for_float32, rotary_in_float64, scale_deepseek_v3_routers,  # noqa: E402
                           scale_weights)

VOCAB, SEQ, BATCH, BATCHES = 128, 32, 3, 2
PROMPT, NEW_TOKENS = [5, 17, 99, 3, 42], 16
LOSS_RTOL, LOGITS_ATOL = 1e-9, 1e-10

_TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=8,
             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
             qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=8, max_position_embeddings=64,
             tie_word_embeddings=False)


def yarn(**kw):
    """{max_position_embeddings, rope_parameters} of a YaRN factor 4 over DeepSeek-V3's original
    context 4096, so that at qk_rope_head_dim 16 the ramp runs over pairs 2..6 (pairs 0, 1 kept,
    6, 7 divided); the longer context is what transformers expects beside it (it warns otherwise)."""
    return {"max_position_embeddings": 4 * 4096,
            "rope_parameters": dict({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 4096}, **kw)}


CASES = {
    # DeepSeek-V3's own pattern: query rank, mscale = mscale_all_dim (attention_factor 1, the
    # length scaling all in the softmax's m^2), groups 4 choosing 2, interleaved rotary.
    "qlora_yarn_groups4of2_interleaved": dict(
        _TINY, q_lora_rank=24, qk_rope_head_dim=16, n_group=4, topk_group=2, num_experts_per_tok=3,
        norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
        rope_interleave=True, **yarn(mscale=1.0, mscale_all_dim=1.0)),
    # Moonlight's pattern: no query rank, one group, default rotary, rms_norm_eps 1e-5 (the
    # latent norms keep 1e-6); unnormalised gates, scaled.
    "qnull_default_rope_group1_halves": dict(
        _TINY, q_lora_rank=None, rms_norm_eps=1e-5, qk_rope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=2,
        norm_topk_prob=False, routed_scaling_factor=1.7, first_k_dense_replace=0,
        rope_interleave=False, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
    # mscale_all_dim alone: attention_factor mscale(4) on cos and sin as well as m^2 on the
    # scores; non-default betas, no truncation; two groups choosing one.
    "qnull_yarn_mscale_all_dim_only_groups2of1": dict(
        _TINY, q_lora_rank=None, qk_rope_head_dim=16, n_group=2, topk_group=1, num_experts_per_tok=2,
        norm_topk_prob=True, routed_scaling_factor=1.0, first_k_dense_replace=1,
        rope_interleave=True,
        **yarn(mscale_all_dim=0.707, beta_fast=16.0, beta_slow=2.0, truncate=False)),
    # mscale != mscale_all_dim (attention_factor their ratio), Llama's rotary halves, attention
    # biases, two shared experts, groups 4 choosing 3, unnormalised, rms_norm_eps 1e-5.
    "qlora_yarn_ratio_halves_bias_groups4of3": dict(
        _TINY, q_lora_rank=24, rms_norm_eps=1e-5, qk_rope_head_dim=8, n_group=4, topk_group=3, num_experts_per_tok=4,
        norm_topk_prob=False, routed_scaling_factor=2.5, first_k_dense_replace=0, n_shared_experts=2,
        rope_interleave=False, attention_bias=True,
        **yarn(mscale=0.9, mscale_all_dim=0.7)),
}


def build_model(kwargs, seed=11):
    """A random tiny DeepseekV3ForCausalLM in float64 (eager attention and experts)."""
    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(**kwargs, attn_implementation="eager",
                                           experts_implementation="eager")
    model = transformers.DeepseekV3ForCausalLM(config)
    scale_weights(model, seed)
    scale_deepseek_v3_routers(model, seed)
    model.double()
    rotary_in_float64(model)
    return model.eval()


class DtypeAudit(TorchDispatchMode):
    """Records the (op, dtype) of every floating-point tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.seen.add((str(func.overloadpacket.__name__), t.dtype))
        return out


def hf_logits(model, tokens):
    with torch.no_grad(), float64_for_float32():
        return model(input_ids=torch.as_tensor(tokens)).logits.numpy()


def hf_greedy(model, prompt, steps):
    """transformers' argmax decoding, the whole prefix each step."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(hf_logits(model, [ids])[0, -1])))
    return ids[len(prompt):]


def read_saved(directory):
    """Every tensor save_pretrained wrote (one file or shards), by name, and config.json."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    weights = {}
    for f in files:
        weights.update(load_file(os.path.join(directory, f)))
    with open(os.path.join(directory, "config.json")) as f:
        return weights, json.load(f)


def mean_ce(logits, targets):
    return float(ref.cross_entropies(logits, targets).mean())


class DeepseekV3ReferenceJudge(unittest.TestCase):
    def run_case(self, name):
        model = build_model(CASES[name])
        with tempfile.TemporaryDirectory() as directory:
            model.save_pretrained(directory)
            weights, config = read_saved(directory)
            reloaded = transformers.AutoModelForCausalLM.from_pretrained(
                directory, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
        rotary_in_float64(reloaded)
        reloaded.eval()
        self.assertEqual({n: a.shape for n, a in weights.items()}, ref.parameter_names(config), name)
        self.assertTrue(all(a.dtype == np.float64 for a in weights.values()), name)

        rng = np.random.default_rng(7)
        worst_rel, worst_abs = 0.0, 0.0
        for b in range(BATCHES):
            rows = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1))
            with DtypeAudit() as audit:
                want = hf_logits(model, rows[:, :-1])
            others = sorted({(op, str(d)) for op, d in audit.seen if d != torch.float64})
            self.assertIn(("_softmax", torch.float64), audit.seen, name + ": the audit saw nothing")
            self.assertEqual(others, [], f"{name}: transformers computed these outside float64")
            got = ref.decoder_logits(weights, config, rows[:, :-1])
            loss_hf = mean_ce(want, rows[:, 1:])
            loss_ref = ref.mean_cross_entropy(weights, config, rows[:, :-1], rows[:, 1:])
            self.assertGreater(abs(loss_hf - np.log(VOCAB)), 0.1, name + ": the logits are nearly flat")
            worst_rel = max(worst_rel, abs(loss_ref - loss_hf) / loss_hf)
            worst_abs = max(worst_abs, float(np.abs(got - want).max()))
            print(f"{name} batch {b}: transformers {loss_hf:.15f}, reference {loss_ref:.15f}, "
                  f"logits max |diff| {np.abs(got - want).max():.2e} (max |logit| {np.abs(want).max():.1f})")
            np.testing.assert_array_equal(hf_logits(reloaded, rows[:, :-1]), want,
                                          name + ": from_pretrained of the saved directory")
        print(f"{name}: loss relative {worst_rel:.1e}, logits absolute {worst_abs:.1e}")
        self.assertLess(worst_rel, LOSS_RTOL, name)
        self.assertLess(worst_abs, LOGITS_ATOL, name)

        expected = hf_greedy(model, PROMPT, NEW_TOKENS)
        print(f"{name}: greedy {expected}")
        self.assertEqual(ref.greedy_generate(weights, config, PROMPT, NEW_TOKENS), expected, name)
        self.assertGreater(len(set(expected)), 6, name + ": a repetitive continuation proves little")
        self.check_sensitivity(name, weights, config, rng.integers(0, VOCAB, size=(BATCH, SEQ + 1)))

    def check_sensitivity(self, name, weights, config, rows):
        """The reference alone with the rotary layout flipped, the group limit lifted and the
        correction bias zeroed: each must move the loss by far more than the tolerance."""
        loss = lambda w, c: ref.mean_cross_entropy(w, c, rows[:, :-1], rows[:, 1:])  # noqa: E731
        base = loss(weights, config)
        unbiased = {n: (0 * a if n.endswith("e_score_correction_bias") else a) for n, a in weights.items()}
        flipped = dict(config, rope_interleave=not config["rope_interleave"])
        variants = {"rope_interleave flipped": (weights, flipped),
                    "e_score_correction_bias zeroed": (unbiased, config)}
        if config["topk_group"] < config["n_group"]:
            variants["every group eligible"] = (weights, dict(config, topk_group=config["n_group"]))
        for what, (w, c) in variants.items():
            moved = abs(loss(w, c) - base) / base
            print(f"{name}: {what} moves the reference's loss by {moved:.1e}")
            self.assertGreater(moved, 1e3 * LOSS_RTOL, f"{name}: {what} does not change the loss")


def add_cases():
    for name in CASES:
        setattr(DeepseekV3ReferenceJudge, "test_" + name, lambda self, n=name: self.run_case(n))


add_cases()

if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main(verbosity=2)
