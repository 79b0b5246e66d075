#!/usr/bin/env python3
"""`meshtrain import --format hf` given hostile or careless input (issue 50, "Trust, round three"),
through the real binary, with Hugging Face directories written by hf_llama_test's writers:

- every integer of config.json, in every family (gpt2, llama, qwen3, mixtral, qwen3_moe), is
  refused beyond the range of the deck key it becomes (2^32 + 2 layers is not 2), naming
  config.json, the key, the value and the range; never blamed on the --deck-out file.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
import harness  # noqa: E402
import hf_llama_test as hf  # noqa: E402
import tiny_hf_moe  # noqa: E402

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4,
        "n_positions": 16, "vocab_size": 256, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
FAMILIES = {"gpt2": GPT2, "llama": hf.LLAMA, "qwen3": hf.QWEN3, "mixtral": tiny_hf_moe.CONFIGS["mixtral"],
            "qwen3_moe": tiny_hf_moe.CONFIGS["qwen3_moe"]}
# (family, config.json key, the deck key it becomes, its range there)
LAYERS = ("model.layers", 1, 100000)
INTEGER_KEYS = [
    ("gpt2", "n_layer", LAYERS), ("gpt2", "n_embd", ("model.d_model", 1, 1 << 20)),
    ("gpt2", "n_head", ("model.heads", 1, 1 << 16)), ("gpt2", "n_positions", ("model.seq_len", 1, 1 << 20)),
    ("gpt2", "vocab_size", ("model.vocab_size", 2, 1 << 30)), ("gpt2", "n_inner", ("model.ffn_hidden", 1, 1 << 24)),
    ("llama", "num_hidden_layers", LAYERS), ("llama", "hidden_size", ("model.d_model", 1, 1 << 20)),
    ("llama", "num_attention_heads", ("model.heads", 1, 1 << 16)),
    ("llama", "vocab_size", ("model.vocab_size", 2, 1 << 30)),
    ("llama", "num_key_value_heads", ("model.kv_heads", 1, 65536)),
    ("llama", "head_dim", ("model.head_dim", 1, 65536)),
    ("llama", "intermediate_size", ("model.ffn_hidden", 1, 1 << 24)),
    ("qwen3", "num_hidden_layers", LAYERS), ("qwen3", "head_dim", ("model.head_dim", 1, 65536)),
    ("mixtral", "num_hidden_layers", LAYERS), ("mixtral", "num_local_experts", ("model.moe_experts", 1, 1 << 16)),
    ("mixtral", "num_experts_per_tok", ("model.moe_top_k", 1, 1 << 16)),
    ("mixtral", "intermediate_size", ("model.ffn_hidden", 1, 1 << 24)),
    ("qwen3_moe", "num_hidden_layers", LAYERS), ("qwen3_moe", "num_experts", ("model.moe_experts", 1, 1 << 16)),
    ("qwen3_moe", "moe_intermediate_size", ("model.moe_ffn_hidden", 1, 1 << 24)),
]


class HfImportTrust(harness.Case):
    def import_(self, directory, out, *extra, expect=0):
        return self.meshtrain(["import", "--format", "hf", directory, out] + list(extra), expect=expect)

    def refused(self, directory, out, needles, *extra, absent=()):
        """Import refused with exit 1, one error naming every needle, nothing new in self.dir."""
        before = set(self.files())
        _, _, stderr = self.import_(directory, out, *extra, expect=1)
        self.assertTrue(stderr.startswith("meshtrain: error: "), stderr)
        for needle in needles:
            self.assertIn(needle, stderr)
        for text in absent:
            self.assertNotIn(text, stderr)
        self.assertEqual(sorted(set(self.files()) - before), [], "written by a refused import")
        return stderr

    def files(self):
        for root, dirs, names in os.walk(self.dir):
            for n in names + dirs:
                yield os.path.join(root, n)

    def llama_dir(self, name, config=hf.LLAMA, shards=1):
        d = os.path.join(self.dir, name)
        hf.write_hf_dir(d, config, hf.random_weights(hf.LLAMA, "F32", 1), "F32", shards)
        return d

    def test_layers_beyond_32_bits_are_not_narrowed(self):
        # 2^32 + 2 layers over the weights of 2: imported as 2 before range checks.
        d = self.llama_dir("layers", dict(hf.LLAMA, num_hidden_layers=2**32 + 2))
        config = os.path.join(d, "config.json")
        self.refused(d, os.path.join(self.dir, "out.h5"),
                     [config + ": num_hidden_layers = 4294967298 (expected an integer from 1 to 100000, "
                      "what meshtrain's model.layers accepts)"])

    def test_every_integer_key_of_every_family(self):
        for family, key, (deck_key, lo, hi) in INTEGER_KEYS:
            for value in (hi + 1, 2**32 + 2, 2**64 - 1):
                with self.subTest(family=family, key=key, value=value):
                    d = os.path.join(self.dir, "%s_%s_%d" % (family, key, value))
                    os.makedirs(d)
                    with open(os.path.join(d, "config.json"), "w") as f:
                        json.dump(dict(FAMILIES[family], **{key: value}), f)
                    deck_out = os.path.join(self.dir, "new.toml")
                    stderr = self.refused(
                        d, os.path.join(self.dir, "out.h5"),
                        [os.path.join(d, "config.json") + ": %s = %d (expected an integer from %d to %d, "
                         "what meshtrain's %s accepts)" % (key, value, lo, hi, deck_key)],
                        "--deck-out", deck_out, absent=[deck_out])
                    self.assertEqual(stderr.count("error:"), 1, stderr)


if __name__ == "__main__":
    harness.main()
