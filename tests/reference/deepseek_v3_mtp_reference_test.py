#!/usr/bin/env python3
"""meshtrain's multi-token prediction loss (model/mtp_module.h) against the fp64 NumPy reference
of DeepSeek-V3's MTP depth (deepseek_v3_reference.mtp_losses, written from the DeepSeek-V3 report
and the layout of DeepSeek's checkpoints, not from meshtrain).

A tiny deepseek_v3 model with one MTP depth (latent attention, sigmoid-routed experts in groups,
a dense first block, the depth's block a mixture) trains one step on one rank in fp64; random
weights in Hugging Face's layout then replace its checkpoint's /model datasets (this test's own
name table, below, written from HF's module names), and the second step's metrics.jsonl record
must hold the reference's main cross-entropy (`loss`) and MTP cross-entropy (`mtp_loss`) on the
step's batch to 1e-9 relative (metrics.jsonl keeps 9 significant digits: 6e-10 relative at
these losses of about 8). The training set holds exactly one batch of windows, so every step
reads all of them (io/sampler.h: each epoch visits every sample once) and the means do not
depend on their order. The rotary rows are compared with rope_interleave false, the halves
layout meshtrain stores (deepseek_v3_reference_test.py checks the interleaved one).

Exit status 77 (CTest: skipped) where NumPy or h5py is missing.
"""
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy as np
    import h5py
except ImportError as e:  # a visible skip, not a pass
    print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy python3-h5py)")
    sys.exit(77)

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
import deepseek_v3_reference as dsv3  # noqa: E402
import harness  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402

LAYERS, C, VOCAB, SEQ, G, EXPERTS = 2, 32, 64, 16, 4, 8
CONFIG = {"model_type": "deepseek_v3", "num_hidden_layers": LAYERS, "hidden_size": C,
          "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": VOCAB,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": SEQ,
          "intermediate_size": 48, "q_lora_rank": 12, "kv_lora_rank": 10, "qk_nope_head_dim": 8,
          "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": EXPERTS,
          "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_shared_experts": 1,
          "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
          "routed_scaling_factor": 2.5, "rope_interleave": False, "tie_word_embeddings": False,
          "num_nextn_predict_layers": 1}

DECK = """# deepseek_v3_mtp_reference_test
[run]
name = "mtp"
dir = "{run_dir}"
seed = 3
device = "cpu"
log_every = 1

[model]
family = "deepseek_v3"
layers = {layers}
d_model = {C}
heads = 2
ffn_hidden = 48
seq_len = {seq}
vocab_size = {vocab}
q_lora_rank = 12
kv_lora_rank = 10
qk_nope_head_dim = 8
qk_rope_head_dim = 4
v_head_dim = 6
moe_experts = {experts}
moe_top_k = 2
moe_ffn_hidden = 8
moe_shared_ffn_hidden = 8
moe_groups = 4
moe_top_groups = 2
moe_first_dense_layers = 1
moe_aux_loss = 0.0
moe_bias_update_rate = 0.0
mtp_layers = 1

[data]
train = "{data}"
val = "none"

[train]
precision = "fp64"
steps = 1
global_batch = {G}
micro_batch = 2
lr = 1e-3
warmup_steps = 0
eval_every = 0

[checkpoint]
every = 1
keep = 3
"""


def block_table(m, h):
    """[(meshtrain /model dataset, HF name or per-expert names)] of one decoder layer: meshtrain
    prefix m ("h.1." or "mtp.0.block."), HF prefix h ("model.layers.1.")."""
    a = h + "self_attn."
    table = [(m + "ln_1.weight", h + "input_layernorm.weight"),
             (m + "ln_2.weight", h + "post_attention_layernorm.weight"),
             (m + "attn.q_a.weight", a + "q_a_proj.weight"), (m + "attn.q_a_norm.weight", a + "q_a_layernorm.weight"),
             (m + "attn.q_b.weight", a + "q_b_proj.weight"), (m + "attn.kv_a.weight", a + "kv_a_proj_with_mqa.weight"),
             (m + "attn.kv_a_norm.weight", a + "kv_a_layernorm.weight"),
             (m + "attn.kv_b.weight", a + "kv_b_proj.weight"), (m + "attn.proj.weight", a + "o_proj.weight")]
    return table


def mlp_table(m, h, moe):
    if not moe:
        return [(m + f"mlp.{x}.weight", h + f"mlp.{x}_proj.weight") for x in ("gate", "up", "down")]
    table = [(m + "mlp.router.weight", h + "mlp.gate.weight")]
    table += [(m + f"mlp.experts.{x}.weight", tuple(h + f"mlp.experts.{e}.{x}_proj.weight" for e in range(EXPERTS)))
              for x in ("gate", "up", "down")]
    table += [(m + f"mlp.shared.{x}.weight", h + f"mlp.shared_experts.{x}_proj.weight") for x in ("gate", "up", "down")]
    return table


def name_table():
    """Every /model dataset of the checkpoint and its HF name(s); the MTP depth at layer index
    num_hidden_layers, as DeepSeek's checkpoints hold it."""
    table = [("wte", "model.embed_tokens.weight"), ("ln_f.weight", "model.norm.weight"),
             ("lm_head.weight", "lm_head.weight")]
    for i in range(LAYERS):
        table += block_table(f"h.{i}.", f"model.layers.{i}.") + mlp_table(f"h.{i}.", f"model.layers.{i}.", i >= 1)
    h = f"model.layers.{LAYERS}."
    table += [("mtp.0.enorm.weight", h + "enorm.weight"), ("mtp.0.hnorm.weight", h + "hnorm.weight"),
              ("mtp.0.eh_proj.weight", h + "eh_proj.weight"), ("mtp.0.norm.weight", h + "shared_head.norm.weight")]
    table += block_table("mtp.0.block.", h) + mlp_table("mtp.0.block.", h, True)
    return table


def random_weights(seed):
    """Random weights of every reference tensor (the copies of the embedding and head in the MTP
    layer equal to the main ones, as in DeepSeek's checkpoints), large enough that the logits are
    far from flat; expert-choice biases 0 (moe_bias_update_rate 0 keeps meshtrain's there)."""
    rng = np.random.default_rng(seed)
    names = dsv3.parameter_names(CONFIG)
    names.update(dsv3.mtp_names(CONFIG, 1))
    out = {}
    for name, shape in names.items():
        if name.endswith("e_score_correction_bias"):
            out[name] = np.zeros(shape)
        elif len(shape) == 1:
            out[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            out[name] = 3.0 / np.sqrt(shape[1]) * rng.standard_normal(shape)
    h = f"model.layers.{LAYERS}."
    out[h + "embed_tokens.weight"] = out["model.embed_tokens.weight"]
    out[h + "shared_head.head.weight"] = out["lm_head.weight"]
    return out


def write_weights_into_checkpoint(path, weights):
    with h5py.File(path, "r+") as f:
        table = name_table()
        unmapped = set(f["model"]) - {m for m, _ in table}
        if unmapped:
            raise KeyError(f"{path}: /model datasets this test's table does not map: {sorted(unmapped)}")
        for m, h in table:
            ds = f["model"][m]
            value = np.stack([weights[n] for n in h]) if isinstance(h, tuple) else weights[h]
            value = np.asarray(value, dtype=ds.dtype).reshape(ds.shape)
            ds[...] = value
            ds.attrs.modify("checksum", harness.checksum(value))


class MtpReference(harness.Case):
    def test_mtp_loss_equals_the_reference(self):
        data = os.path.join(self.dir, "train.bin")
        tokens = np.random.default_rng(5).integers(0, VOCAB, G * SEQ + 1)
        harness.write_token_shard(data, tokens, VOCAB)
        with open(self.deck, "w") as f:
            f.write(DECK.format(run_dir=self.run_dir, layers=LAYERS, C=C, seq=SEQ, vocab=VOCAB,
                                experts=EXPERTS, data=data, G=G))
        self.train(1)
        weights = random_weights(seed=9)
        write_weights_into_checkpoint(self.ckpt(1), weights)
        self.train(1, ["train.steps=2"])
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            records = [r for r in map(json.loads, filter(str.strip, f)) if r.get("step") == 2]
        got_loss = next(r["loss"] for r in records if "loss" in r)
        got_mtp = next(r["mtp_loss"] for r in records if "mtp_loss" in r)

        rows = np.stack([tokens[w * SEQ:w * SEQ + SEQ + 1] for w in range(G)])
        want_loss = ref.mean_cross_entropy(weights, CONFIG, rows[:, :-1], rows[:, 1:])
        want_mtp = dsv3.mtp_losses(weights, CONFIG, rows[:, :-1], rows[:, 1:])
        print(f"\nmain: reference {want_loss:.15f}, meshtrain {got_loss:.15f}\n"
              f"mtp:  reference {want_mtp[0]:.15f}, meshtrain {got_mtp:.15f}")
        self.assertGreater(abs(want_mtp[0] - np.log(VOCAB)), 0.1, "the MTP logits are nearly flat")
        self.assertLess(abs(got_loss - want_loss) / want_loss, 1e-9)
        self.assertLess(abs(got_mtp - want_mtp[0]) / want_mtp[0], 1e-9)


if __name__ == "__main__":
    harness.main()
