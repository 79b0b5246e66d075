#!/usr/bin/env python3
"""`meshtrain import --format hf` and `meshtrain export --format hf` for Mixtral and Qwen3-MoE, end
to end through the real binary, with Hugging Face directories of random weights in HF's layout
(one tensor per expert; tests/support/tiny_hf_moe.py):

- Mixtral, sharded F32, without a deck: --deck-out writes the mixture's keys; the checkpoint
  stacks expert e's w1 / w3 / w2 at index e of h.<i>.mlp.experts.gate / up / down; export (sharded
  again) gives every tensor back bit for bit and config.json's keys back; the deck trains 2 steps.
- Qwen3-MoE with a dense first block (mlp_only_layers [0]), one BF16 file, with a deck: the same,
  exported as bf16.
- refusals, each with its message and no file written: a missing expert, an expert of another
  shape, an expert too many, decoder_sparse_step, mlp_only_layers that are not the first blocks,
  a shared expert, a sliding window shorter than the deck's context, a deck of another mixture;
  and export of mixtures HF cannot hold (a shared expert, Mixtral without renormalisation).
"""

import json
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
import harness  # noqa: E402
import hf_llama_test as hf  # noqa: E402
import tiny_hf_moe  # noqa: E402

MIXTRAL = tiny_hf_moe.CONFIGS["mixtral"]
QWEN = tiny_hf_moe.CONFIGS["qwen3_moe_dense0"]


def qwen_moe_deck(run_dir, experts=4):
    return f"""[run]
device = "cpu"
dir = "{run_dir}"
seed = 3
log_every = 1

[model]
family = "qwen3"
layers = 2
d_model = 32
heads = 4
kv_heads = 2
ffn_hidden = 64
seq_len = 32
vocab_size = 256
tie_embeddings = false
rope_theta = 1000000.0
feed_forward = "moe"
moe_experts = {experts}
moe_top_k = 2
moe_ffn_hidden = 16
moe_first_dense_layers = 1

[data]
synthetic_bytes = 65536

[train]
precision = "fp32"
steps = 2
global_batch = 4
micro_batch = 2
warmup_steps = 1
eval_every = 0
"""


class HfMoe(harness.Case):
    def import_(self, directory, out, *extra, expect=0):
        return self.meshtrain(["import", "--format", "hf", directory, out] + list(extra), expect=expect)

    def export(self, ckpt, out, *extra, expect=0):
        return self.meshtrain(["export", ckpt, "--format", "hf", out] + list(extra), expect=expect)

    def check_round_trip(self, config, arrays, exported, dtype):
        got, dtypes = hf.read_hf_dir(exported)
        self.assertEqual(sorted(got), sorted(arrays))
        for name, a in arrays.items():
            self.assertEqual(dtypes[name], dtype, name)
            self.assertEqual(got[name].shape, a.shape, name)
            self.assertEqual(got[name].tobytes(), a.tobytes(), name + " differs after import -> export")
        with open(os.path.join(exported, "config.json")) as f:
            out = json.load(f)
        for key, value in config.items():
            if key in ("torch_dtype", "max_position_embeddings", "router_aux_loss_coef", "sliding_window"):
                continue
            self.assertEqual(out[key], value, key)
        # Through meshtrain's per-layer coefficient and back: equal to rounding.
        self.assertAlmostEqual(out["router_aux_loss_coef"], config["router_aux_loss_coef"], delta=1e-15)
        self.assertEqual(out["torch_dtype"], "bfloat16" if dtype == "BF16" else "float32")
        # meshtrain attends over the whole causal window: no sliding window, whatever it imported.
        self.assertIsNone(out["sliding_window"])
        self.assertFalse([n for n in os.listdir(exported) if n.startswith(".")], "staging left behind")

    def test_mixtral_sharded_deck_out_round_trip_trains(self):
        src = os.path.join(self.dir, "mixtral")
        _, arrays = tiny_hf_moe.write("mixtral", src, seed=1, shards=3)
        ckpt = os.path.join(self.dir, "ft", "checkpoints", "step_00000000.h5")
        deck = os.path.join(self.dir, "mixtral.toml")
        _, stdout, _ = self.import_(src, ckpt, "--deck-out", deck,
                                    "--set", f'run.dir="{os.path.join(self.dir, "ft")}"')
        self.assertIn(f"fine-tune it: meshtrain train {deck}", stdout)
        with open(deck) as f:
            text = f.read()
        # 0.02 x 2 choices / 2 mixture layers: HF's one loss over all layers as one per layer.
        for line in ('family = "llama"', "kv_heads = 2", "seq_len = 48", "tie_embeddings = false",
                     'feed_forward = "moe"', "moe_experts = 4", "moe_top_k = 2", "moe_ffn_hidden = 24",
                     "moe_normalize_top_k = true", "moe_first_dense_layers = 0", "moe_shared_ffn_hidden = 0",
                     "moe_aux_loss = 0.02", "rope_theta = 1e+06"):
            self.assertIn(line + "\n", text)
        with h5py.File(ckpt, "r") as f:
            up = f["/model/h.1.mlp.experts.up.weight"][...]
            down = f["/model/h.0.mlp.experts.down.weight"][...]
            router = f["/model/h.1.mlp.router.weight"][...]
            self.assertNotIn("h.0.mlp.gate.weight", f["model"])
        self.assertEqual(up.shape, (4, 24, 32))
        self.assertEqual(down.shape, (4, 32, 24))
        for e in range(4):
            self.assertEqual(up[e].tobytes(),
                             arrays[f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight"].tobytes())
            self.assertEqual(down[e].tobytes(),
                             arrays[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"].tobytes())
        self.assertEqual(router.tobytes(), arrays["model.layers.1.block_sparse_moe.gate.weight"].tobytes())

        out = os.path.join(self.dir, "hf")
        _, stdout, _ = self.export(ckpt, out, "--max-shard-size", "20KB")
        self.assertIn(", untied, 4 experts (top 2)) to " + out, stdout)
        self.assertIn("config.json (MixtralForCausalLM)", stdout)
        shards = [n for n in os.listdir(out) if n.startswith("model-")]
        self.assertGreater(len(shards), 1)
        self.check_round_trip(MIXTRAL, arrays, out, "F32")
        # The deck trains from the imported checkpoint (resume "auto": step 0 of its run).
        args = ["train", deck]
        for s in hf.TRAIN_SETS:
            args += ["--set", s]
        _, stdout, _ = self.meshtrain(args, ranks=1)
        self.assertIn(f"resumed from {ckpt} at step 0", stdout)
        self.assertEqual(sorted(harness.losses(stdout)), [1, 2])

    def test_qwen3_moe_dense_first_bf16_with_deck(self):
        src = os.path.join(self.dir, "qwen")
        _, arrays = tiny_hf_moe.write("qwen3_moe_dense0", src, seed=2, dtype="BF16")
        deck = os.path.join(self.dir, "qwen.toml")
        with open(deck, "w") as f:
            f.write(qwen_moe_deck(self.run_dir))
        ckpt = os.path.join(self.dir, "qwen.h5")
        self.import_(src, ckpt, "--deck", deck)
        with h5py.File(ckpt, "r") as f:
            self.assertEqual(f["/model/h.0.mlp.up.weight"][...].tobytes(),
                             arrays["model.layers.0.mlp.up_proj.weight"].tobytes())
            self.assertEqual(f["/model/h.1.mlp.experts.gate.weight"][3].tobytes(),
                             arrays["model.layers.1.mlp.experts.3.gate_proj.weight"].tobytes())
        out = os.path.join(self.dir, "hf")
        _, stdout, _ = self.export(ckpt, out, "--dtype", "bf16")
        self.assertIn("config.json (Qwen3MoeForCausalLM)", stdout)
        self.assertIn("model.safetensors", os.listdir(out))
        # The deck's own balancing coefficient (moe_aux_loss's default 0.01) is what is exported.
        config = dict(QWEN, router_aux_loss_coef=0.01 * 1 / 2)
        self.check_round_trip(config, arrays, out, "BF16")
        _, stdout, _ = self.meshtrain(["train", deck, "--set", f'checkpoint.resume="{ckpt}"'], ranks=1)
        self.assertIn(f"resumed from {ckpt} at step 0", stdout)
        self.assertEqual(sorted(harness.losses(stdout)), [1, 2])

    def test_refusals(self):
        arrays = tiny_hf_moe.random_weights(MIXTRAL, 4)
        target = os.path.join(self.dir, "bad.h5")

        def refused(directory, needle, *extra):
            _, _, stderr = self.import_(directory, target, *extra, expect=1)
            self.assertIn(needle, stderr)
            self.assertTrue(stderr.startswith("meshtrain: error: "), stderr)
            self.assertFalse(os.path.exists(target))

        def variant(name, config=MIXTRAL, tensors=arrays):
            d = os.path.join(self.dir, name)
            hf.write_hf_dir(d, config, tensors, "F32")
            return d

        p = "model.layers.1.block_sparse_moe.experts."
        missing = {k: v for k, v in arrays.items() if k != p + "3.w2.weight"}
        refused(variant("missing", tensors=missing), "model.safetensors: tensor " + p + "3.w2.weight is missing")
        wrong = dict(arrays, **{p + "2.w1.weight": arrays[p + "2.w1.weight"][:20]})
        refused(variant("shape", tensors=wrong), "tensor " + p + "2.w1.weight has shape (20, 32), but the deck's model")
        extra = dict(arrays, **{p + "4.w1.weight": arrays[p + "2.w1.weight"]})
        refused(variant("extra", tensors=extra), "tensor " + p + "4.w1.weight (24, 32) is not part of")
        refused(variant("window", config=dict(MIXTRAL, sliding_window=16)),
                "config.json: sliding_window = 16 (Mixtral then attends to the last sliding_window positions "
                "only", "--set", "model.seq_len=32")
        refused(variant("window_deck", config=dict(MIXTRAL, sliding_window=32)),
                "sliding_window = 32 (", "--set", "model.seq_len=48")
        qwen = tiny_hf_moe.random_weights(QWEN, 5)
        refused(variant("step", config=dict(QWEN, decoder_sparse_step=2), tensors=qwen),
                "config.json: decoder_sparse_step = 2 (")
        refused(variant("only", config=dict(QWEN, mlp_only_layers=[1]), tensors=qwen),
                "config.json: mlp_only_layers = [1] (meshtrain's dense blocks are the first k")
        refused(variant("shared", config=dict(QWEN, shared_expert_intermediate_size=32), tensors=qwen),
                "config.json: shared_expert_intermediate_size = 32 (")
        # A deck of another mixture, named with config.json's key and both values.
        deck = os.path.join(self.dir, "qwen.toml")
        with open(deck, "w") as f:
            f.write(qwen_moe_deck(self.run_dir, experts=8))
        refused(variant("qwen_ok", config=QWEN, tensors=qwen),
                "config.json: num_experts gives model.moe_experts = 4, but " + deck +
                " (with its --set overrides) has model.moe_experts = 8", "--deck", deck)
        refused(variant("qwen_ok2", config=QWEN, tensors=qwen),
                "config.json: mlp_only_layers gives model.moe_first_dense_layers = 1, but " + deck,
                "--deck", deck, "--set", "model.moe_experts=4", "--set", "model.moe_first_dense_layers=0")
        dense = dict(QWEN, model_type="qwen3")
        refused(variant("dense_vs_moe", config=dense, tensors=qwen),
                'config.json: model_type gives model.feed_forward = "dense", but ' + deck, "--deck", deck)

    def test_export_refuses_what_hf_cannot_hold(self):
        def refused(name, sets, needle):
            run_dir = os.path.join(self.dir, name)
            self.train(1, [f'run.dir="{run_dir}"', "train.steps=1", "checkpoint.every=1",
                           'model.family="llama"', 'model.feed_forward="moe"', "model.moe_experts=4"] + sets)
            out = os.path.join(self.dir, name + "_hf")
            _, _, stderr = self.export(os.path.join(run_dir, "checkpoints", "step_00000001.h5"), out, expect=1)
            self.assertIn(needle, stderr)
            self.assertFalse(os.path.exists(out))

        refused("shared", ["model.moe_shared_ffn_hidden=16", "model.qk_norm=true"],
                "model.moe_shared_ffn_hidden = 16, which Hugging Face Qwen3MoeForCausalLM cannot express")
        refused("unnormalised", ["model.moe_normalize_top_k=false"],
                "model.moe_normalize_top_k = false, which Hugging Face MixtralForCausalLM cannot express")


if __name__ == "__main__":
    harness.main()
