#!/usr/bin/env python3
"""`meshtrain import --format hf` given hostile or careless input (issue 50, "Trust, round three"),
through the real binary, with Hugging Face directories written by hf_llama_test's writers:

- every integer of config.json, in every family (gpt2, llama, qwen3, mixtral, qwen3_moe), is
  refused beyond the range of the deck key it becomes (2^32 + 2 layers is not 2), naming
  config.json, the key, the value and the range; never blamed on the --deck-out file.
- outputs are checked before anything is written: --deck-out naming the checkpoint (however
  spelled) or its temporary, an output that is an input (with --force), --deck-out onto a
  directory; nothing is written and no temporary is left.
- a checkpoint.dir locked by a running job (its .meshtrain.lock) is refused, naming the holder.
- an Inf or NaN weight is refused, naming the shard, the tensor and the first bad element.
- NUL, escape sequences and bidirectional controls in shard names, tensor names and model_type
  are shown escaped, never raw nor cut short; a shard name holding one is refused.
"""

import fcntl
import json
import os
import socket
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
import harness  # noqa: E402
import numpy as np  # noqa: E402
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
    # transformers 5's name, beside transformers 4's num_experts
    ("qwen3_moe", "num_local_experts", ("model.moe_experts", 1, 1 << 16)),
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

    def test_deck_out_naming_the_checkpoint(self):
        d = self.llama_dir("llama")
        out = os.path.join(self.dir, "out", "OUT.h5")
        os.makedirs(os.path.join(self.dir, "out", "sub"))
        os.symlink(os.path.join(self.dir, "out"), os.path.join(self.dir, "alias"))
        for deck_out in (out, os.path.join(self.dir, "out", "sub", "..", "OUT.h5"),
                         os.path.join(self.dir, "alias", "OUT.h5"), out + ".tmp"):
            with self.subTest(deck_out=deck_out):
                self.refused(d, out, ["is the same file as " + out, "give --deck-out a file of its own"],
                             "--deck-out", deck_out)

    def test_output_that_is_an_input(self):
        d = self.llama_dir("llama")
        config = os.path.join(d, "config.json")
        with open(config, "rb") as f:
            before = f.read()
        self.refused(d, config, ["%s (the checkpoint) is the same file as %s, which the import reads" % (config, config)],
                     "--force")
        link = os.path.join(self.dir, "weights.toml")
        os.link(os.path.join(d, "model.safetensors"), link)
        self.refused(d, os.path.join(self.dir, "out.h5"),
                     [link + " (--deck-out) is the same file as " + os.path.join(d, "model.safetensors")],
                     "--deck-out", link, "--force")
        with open(config, "rb") as f:
            self.assertEqual(f.read(), before)

    def test_deck_out_onto_a_directory(self):
        d = self.llama_dir("llama")
        adir = os.path.join(self.dir, "adir")
        os.makedirs(adir)
        self.refused(d, os.path.join(self.dir, "out.h5"), [adir + ": is a directory; --deck-out writes a deck file"],
                     "--deck-out", adir, "--force")
        # A directory's name that does not exist yet: nothing written, no "new/.tmp".
        for out, deck_out, needle in ((os.path.join(self.dir, "out.h5"), os.path.join(self.dir, "new") + "/",
                                       "/new/: names a directory; --deck-out writes a deck file"),
                                      (os.path.join(self.dir, "ckpt") + "/", os.path.join(self.dir, "n.toml"),
                                       "/ckpt/: names a directory; meshtrain import writes a checkpoint file")):
            self.refused(d, out, [needle], "--deck-out", deck_out)
        # Someone's file where the deck's temporary would go: refused before, and left as it is.
        deck = os.path.join(self.dir, "new.toml")
        with open(deck + ".tmp", "w") as f:
            f.write("someone's\n")
        self.refused(d, os.path.join(self.dir, "out.h5"), [deck + ".tmp: already exists"], "--deck-out", deck)
        # The deck written after the checkpoint, both in place, no temporary left.
        os.remove(deck + ".tmp")
        out = os.path.join(self.dir, "ok", "out.h5")
        self.import_(d, out, "--deck-out", deck)
        self.assertTrue(os.path.isfile(out) and os.path.isfile(deck))
        self.assertEqual([n for n in os.listdir(self.dir) + os.listdir(os.path.dirname(out)) if ".tmp" in n or
                          n == ".meshtrain.lock"], [])

    def test_checkpoint_dir_locked_by_a_running_job(self):
        d = self.llama_dir("llama")
        ckpts = os.path.join(self.dir, "job", "checkpoints")
        os.makedirs(ckpts)
        lock = os.path.join(ckpts, ".meshtrain.lock")
        # As the trainer's rank 0 holds it: an open-file-description lock naming the holder.
        held = open(lock, "w")
        self.addCleanup(held.close)
        held.write("node %s, pid %d, since 2026-01-01T00:00:00Z\n" % (socket.gethostname(), os.getpid()))
        held.flush()
        fcntl.fcntl(held, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        self.refused(d, os.path.join(ckpts, "step_00000000.h5"),
                     ["is in use by another run (%s is locked by node %s, pid %d" % (lock, socket.gethostname(),
                                                                                    os.getpid())])
        self.assertEqual(os.listdir(ckpts), [".meshtrain.lock"])

    def test_inf_and_nan_weights(self):
        arrays = hf.random_weights(hf.LLAMA, "F32", 1)
        for name, bad, dtype, word in (("model.layers.1.mlp.up_proj.weight", np.inf, "F32", "inf"),
                                       ("model.norm.weight", np.nan, "BF16", "NaN"),
                                       ("model.layers.0.self_attn.k_proj.weight", -np.inf, "F16", "-inf")):
            with self.subTest(dtype=dtype):
                tensors = {k: v.copy() for k, v in arrays.items()}
                shape = tensors[name].shape
                flat = 37 % tensors[name].size
                tensors[name].reshape(-1)[flat] = bad
                d = os.path.join(self.dir, "bad_" + dtype)
                hf.write_hf_dir(d, hf.LLAMA, tensors, dtype, shards=3)
                with open(os.path.join(d, "model.safetensors.index.json")) as f:
                    shard = os.path.join(d, json.load(f)["weight_map"][name])
                index = ", ".join(str(i) for i in np.unravel_index(flat, shape))
                self.refused(d, os.path.join(self.dir, "out.h5"),
                             ["%s: tensor %s holds %s at element %d (index [%s] of shape (%s))" % (
                                 shard, name, word, flat, index, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))])

    def escaped(self, d, needles):
        """Refused with the needles in the message, which holds no raw control or bidi character."""
        stderr = self.refused(d, os.path.join(self.dir, "out.h5"), needles)
        raw = [c for c in stderr if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) < 0xa0 or 0x202a <= ord(c) <= 0x202e
               or 0x2066 <= ord(c) <= 0x2069]
        self.assertEqual(raw, [], stderr)

    def sharded_with(self, name, edit):
        d = self.llama_dir(name, shards=2)
        index = os.path.join(d, "model.safetensors.index.json")
        with open(index) as f:
            idx = json.load(f)
        edit(idx["weight_map"])
        with open(index, "w") as f:
            json.dump(idx, f)
        return d, index

    def test_hostile_names_are_escaped(self):
        # A shard name with a NUL (open(2) would read "x"), one with an OSC sequence.
        for shard, shown in (("x\0/../../etc/passwd", "x\\x00/../../etc/passwd"),
                             ("m\x1b]0;owned\x07.safetensors", "m\\x1b]0;owned\\x07.safetensors")):
            with self.subTest(shard=shown):
                d, index = self.sharded_with("shard_%d" % len(shard),
                                             lambda m: m.__setitem__("model.norm.weight", shard))
                self.escaped(d, [index + ': weight_map places model.norm.weight in "' + shown +
                                 '", which holds a control character'])
        # A tensor name with an escape sequence the shard lacks.
        d, index = self.sharded_with("tensor", lambda m: m.__setitem__(
            "model.norm.weight\x1b[2J\u202e", m["model.norm.weight"]))
        self.escaped(d, [index + ": weight_map places model.norm.weight\\x1b[2J\\u{202e} in "])
        # A tensor name with a NUL in a shard's header: not part of the model, named whole.
        arrays = dict(hf.random_weights(hf.LLAMA, "F32", 1), **{"model.norm.weight\0evil": np.ones(2, np.float32)})
        d = os.path.join(self.dir, "nul_tensor")
        hf.write_hf_dir(d, hf.LLAMA, arrays, "F32")
        self.escaped(d, ["tensor model.norm.weight\\x00evil (2,) is not part of"])
        # model_type with a bidirectional override and an escape.
        d = self.llama_dir("type", dict(hf.LLAMA, model_type="llama\u202e\x1b[31m"))
        self.escaped(d, ['config.json: model_type = "llama\\u{202e}\\u001b[31m"'])


if __name__ == "__main__":
    harness.main()
