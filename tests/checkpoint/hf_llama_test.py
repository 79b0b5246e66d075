#!/usr/bin/env python3
"""`meshtrain import --format hf` and `meshtrain export --format hf` for Llama 3 and Qwen 3, end to
end through the real binary, with Hugging Face directories written here from random weights in
HF's layout (LlamaForCausalLM / Qwen3ForCausalLM names, (out, in) linear weights, config.json as
transformers writes it) by a safetensors writer built from the format's specification:

- Llama with grouped-query attention, tied embeddings, Llama 3 rope_scaling, sharded F32;
  Qwen 3 with q/k norm and head_dim != d_model / heads, the newer rope_parameters form, one BF16
  file; Llama with kv_heads = heads (meshtrain's fused qkv), untied, F16.
- import (with --deck, and without it: --deck-out writes the deck) -> export gives every tensor
  back bit for bit (BF16 exported as bf16, F32 and F16 as fp32) and config.json's keys back.
- the deck --deck-out wrote trains 2 steps from the imported checkpoint.
- GPT-2 imports without a deck as well (--deck-out writes the one built from config.json).
- refusals, each with its message and no file written: a wrong shape, a missing tensor, a shard
  outside the directory (absolute, "..", a symbolic link), an unknown rope_type, a deck of
  another model, biases meshtrain cannot place.
"""

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SIZES = {"F32": 4, "F16": 2, "BF16": 2}

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 264,
         "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
         "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
         "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256,
         "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
         "attention_bias": False, "use_sliding_window": False, "torch_dtype": "bfloat16"}
FUSED = dict(LLAMA, vocab_size=256, num_key_value_heads=4, tie_word_embeddings=False, rope_scaling=None,
             rope_theta=10000.0, head_dim=None, torch_dtype="float16")


def hf_shapes(c):
    C, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or C // H
    out = {"model.embed_tokens.weight": (V, C)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (KV * D, C),
                    p + "self_attn.v_proj.weight": (KV * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                    p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                    p + "mlp.down_proj.weight": (C, F), p + "input_layernorm.weight": (C,),
                    p + "post_attention_layernorm.weight": (C,)})
        if c["model_type"] == "qwen3":
            out[p + "self_attn.q_norm.weight"] = (D,)
            out[p + "self_attn.k_norm.weight"] = (D,)
    out["model.norm.weight"] = (C,)
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, C)
    return out


def random_weights(c, dtype, seed):
    """Random float32 arrays that the dtype holds exactly (so every import is exact)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in hf_shapes(c).items():
        a = (rng.standard_normal(shape) * 0.2 + (1.0 if name.endswith("norm.weight") else 0.0)).astype(np.float32)
        if dtype == "F16":
            a = a.astype(np.float16).astype(np.float32)
        elif dtype == "BF16":
            a = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        out[name] = a
    return out


def encode(a, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> np.uint32(16)).astype("<u2").tobytes()


def write_safetensors(path, arrays, dtype="F32"):
    header, at, chunks = {}, 0, []
    for name, a in arrays.items():
        b = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        chunks.append(b)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def read_safetensors(path):
    """({name: float32 array}, {name: dtype}) from the format's specification."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode())
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    arrays, dtypes = {}, {}
    for name, e in header.items():
        raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, "<f4" if e["dtype"] == "F32" else "<f2").astype(np.float32)
        arrays[name] = a.reshape(e["shape"])
        dtypes[name] = e["dtype"]
    return arrays, dtypes


def read_hf_dir(d):
    """Every tensor of an HF directory, single-file or sharded."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    with open(index) as f:
        idx = json.load(f)
    arrays, dtypes = {}, {}
    for shard in sorted(set(idx["weight_map"].values())):
        a, t = read_safetensors(os.path.join(d, shard))
        for name in a:
            assert idx["weight_map"][name] == shard, name
        arrays.update(a)
        dtypes.update(t)
    assert sorted(arrays) == sorted(idx["weight_map"])
    assert idx["metadata"]["total_size"] == sum(a.size * SIZES[dtypes[n]] for n, a in arrays.items())
    return arrays, dtypes


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write_hf_dir(d, config, arrays, dtype, shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), arrays, dtype)
        return
    names = list(arrays)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, file), {n: arrays[n] for n in part}, dtype)
        weight_map.update({n: file for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tokenizer(d):
    """A byte-level BPE tokenizer.json without merges (every byte a token) and Llama 3's
    begin/end-of-text tokens as added tokens 256 and 257, with its tokenizer_config.json."""
    vocab = {ch: b for b, ch in sorted(bytes_to_unicode().items())}
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
    tok = {"version": "1.0", "added_tokens": [
        dict(flags, id=256, content="<|begin_of_text|>"),
        dict(flags, id=257, content="<|end_of_text|>")],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}}, f)


def qwen_deck(run_dir, seq_len=32):
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
head_dim = 16
ffn_hidden = 40
seq_len = {seq_len}
vocab_size = 256

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


TRAIN_SETS = ['run.device="cpu"', 'train.precision="fp32"', "train.steps=2", "train.global_batch=4",
              "train.micro_batch=2", "train.eval_every=0", "data.synthetic_bytes=65536",
              "train.sample_every=0", "run.log_every=1"]


class HfLlama(harness.Case):
    def import_(self, directory, out, *extra, expect=0):
        return self.meshtrain(["import", "--format", "hf", directory, out] + list(extra), expect=expect)

    def export(self, ckpt, out, *extra):
        return self.meshtrain(["export", ckpt, "--format", "hf", out] + list(extra))

    def check_round_trip(self, src, config, arrays, exported, dtype):
        got, dtypes = read_hf_dir(exported)
        self.assertEqual(sorted(got), sorted(arrays))
        for name, a in arrays.items():
            self.assertEqual(got[name].shape, a.shape, name)
            self.assertEqual(dtypes[name], dtype, name)
            self.assertEqual(got[name].tobytes(), a.tobytes(), name + " differs after import -> export")
        with open(os.path.join(exported, "config.json")) as f:
            out = json.load(f)
        for key, value in config.items():
            if key in ("torch_dtype", "bos_token_id", "eos_token_id", "rope_parameters"):
                continue
            if key == "head_dim" and value is None:
                value = config["hidden_size"] // config["num_attention_heads"]
            self.assertEqual(out[key], value, key)
        if "rope_parameters" in config:
            self.assertEqual(out["rope_theta"], config["rope_parameters"]["rope_theta"])
            self.assertIsNone(out["rope_scaling"])
        self.assertEqual(out["torch_dtype"], "bfloat16" if dtype == "BF16" else "float32")
        self.assertTrue(os.path.exists(os.path.join(exported, "generation_config.json")))
        self.assertFalse([n for n in os.listdir(exported) if n.startswith(".")], "staging left behind")

    def test_llama_gqa_tied_sharded_deck_out_then_trains(self):
        src = os.path.join(self.dir, "llama")
        arrays = random_weights(LLAMA, "F32", 1)
        write_hf_dir(src, LLAMA, arrays, "F32", shards=3)
        write_tokenizer(src)
        ckpt = os.path.join(self.dir, "ft", "checkpoints", "step_00000000.h5")
        deck = os.path.join(self.dir, "llama.toml")
        _, stdout, _ = self.import_(src, ckpt, "--deck-out", deck,
                                    "--set", f'run.dir="{os.path.join(self.dir, "ft")}"')
        self.assertIn(f"fine-tune it: meshtrain train {deck}", stdout)
        with open(deck) as f:
            text = f.read()
        for line in ('family = "llama"', "layers = 2", "d_model = 32", "heads = 4", "kv_heads = 2",
                     "ffn_hidden = 48", "seq_len = 64", "vocab_size = 264", "tie_embeddings = true",
                     'rope_scaling = "llama3"', "rope_original_max_positions = 16",
                     f'tokenizer = "{os.path.abspath(os.path.join(src, "tokenizer.json"))}"',
                     f'dir = "{os.path.join(self.dir, "ft")}"'):
            self.assertIn(line + "\n", text)
        # The family's defaults are left out: rope_theta 500000, norm_eps 1e-5, no bias.
        for key in ("rope_theta", "norm_eps", "bias", "head_dim"):
            self.assertNotIn("\n" + key + " =", text)
        # Fused?  No: kv_heads != heads gives separate q, k, v (their rows as HF's).
        with h5py.File(ckpt, "r") as f:
            self.assertEqual(f["/model/h.1.attn.k.weight"][...].tobytes(),
                             arrays["model.layers.1.self_attn.k_proj.weight"].tobytes())
            self.assertNotIn("lm_head.weight", f["model"])
        out = os.path.join(self.dir, "hf")
        _, stdout, _ = self.export(ckpt, out, "--max-shard-size", "20KB")
        files = sorted(os.listdir(out))
        shards = [n for n in files if n.startswith("model-")]
        self.assertGreater(len(shards), 1, files)
        self.assertEqual(shards[0], f"model-00001-of-{len(shards):05d}.safetensors")
        self.assertIn("model.safetensors.index.json", files)
        self.assertNotIn("model.safetensors", files)
        self.check_round_trip(src, LLAMA, arrays, out, "F32")
        # One shard when everything fits, as HF does; the old shards and index are gone.
        self.export(ckpt, out)
        self.assertNotIn("model.safetensors.index.json", os.listdir(out))
        self.assertFalse([n for n in os.listdir(out) if n.startswith("model-")])
        self.check_round_trip(src, LLAMA, arrays, out, "F32")
        # The checkpoint records the run's tokenizer as a path (data.tokenizer): export never opens
        # it, says so, and writes no tokenizer files and no bos/eos it would have taken from them.
        _, stdout, _ = self.export(ckpt, out)
        self.assertFalse({"tokenizer.json", "tokenizer_config.json"} & set(os.listdir(out)))
        self.assertIn("a path export does not open", stdout)
        self.assertIn("--tokenizer", stdout)
        with open(os.path.join(out, "generation_config.json")) as f:
            self.assertNotIn("bos_token_id", json.load(f))
        # Named on the command line: the run's tokenizer files, and its begin/end-of-text ids
        # from tokenizer_config.json.
        self.export(ckpt, out, "--tokenizer", os.path.join(src, "tokenizer.json"))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(src, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
        with open(os.path.join(out, "generation_config.json")) as f:
            gen = json.load(f)
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual((gen["bos_token_id"], gen["eos_token_id"]), (256, 257))
        self.assertEqual((cfg["bos_token_id"], cfg["eos_token_id"]), (256, 257))
        # The deck trains from the imported checkpoint (resume "auto": step 0 of its run).
        args = ["train", deck]
        for s in TRAIN_SETS:
            args += ["--set", s]
        _, stdout, _ = self.meshtrain(args, ranks=1)
        self.assertIn(f"resumed from {ckpt} at step 0", stdout)
        self.assertEqual(sorted(harness.losses(stdout)), [1, 2])

    def test_qwen3_bf16_with_deck_round_trip_and_train(self):
        src = os.path.join(self.dir, "qwen")
        arrays = random_weights(QWEN3, "BF16", 2)
        write_hf_dir(src, QWEN3, arrays, "BF16")
        deck = os.path.join(self.dir, "qwen.toml")
        with open(deck, "w") as f:
            f.write(qwen_deck(self.run_dir))
        ckpt = os.path.join(self.dir, "qwen.h5")
        self.import_(src, ckpt, "--deck", deck)
        with h5py.File(ckpt, "r") as f:
            self.assertEqual(f["/model/h.0.attn.q_norm.weight"][...].tobytes(),
                             arrays["model.layers.0.self_attn.q_norm.weight"].tobytes())
        out = os.path.join(self.dir, "hf")
        self.export(ckpt, out, "--dtype", "bf16")
        self.assertIn("model.safetensors", os.listdir(out))
        cfg = dict(QWEN3, max_position_embeddings=32)  # the deck trains 32 positions
        self.check_round_trip(src, cfg, arrays, out, "BF16")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["architectures"], ["Qwen3ForCausalLM"])
        _, stdout, _ = self.meshtrain(["train", deck, "--set", f'checkpoint.resume="{ckpt}"'], ranks=1)
        self.assertIn(f"resumed from {ckpt} at step 0", stdout)
        self.assertEqual(sorted(harness.losses(stdout)), [1, 2])

    def test_llama_fused_qkv_untied_f16(self):
        src = os.path.join(self.dir, "fused")
        arrays = random_weights(FUSED, "F16", 3)
        write_hf_dir(src, FUSED, arrays, "F16")
        ckpt = os.path.join(self.dir, "fused.h5")
        deck = os.path.join(self.dir, "fused.toml")
        self.import_(src, ckpt, "--deck-out", deck)
        with h5py.File(ckpt, "r") as f:
            qkv = f["/model/h.0.attn.qkv.weight"][...]
        self.assertEqual(qkv.shape, (3, 32, 32))
        for k, which in enumerate("qkv"):
            self.assertEqual(qkv[k].tobytes(), arrays[f"model.layers.0.self_attn.{which}_proj.weight"].tobytes())
        out = os.path.join(self.dir, "hf")
        self.export(ckpt, out)
        self.check_round_trip(src, FUSED, arrays, out, "F32")

    def test_export_never_opens_a_path_the_checkpoint_records(self):
        # A stranger's checkpoint whose @config names another file as the tokenizer (one that
        # parses as a tokenizer.json, with a tokenizer_config.json beside it): not copied.
        src = os.path.join(self.dir, "fused")
        write_hf_dir(src, FUSED, random_weights(FUSED, "F16", 3), "F16")
        ckpt = os.path.join(self.dir, "fused.h5")
        self.import_(src, ckpt, "--deck-out", os.path.join(self.dir, "fused.toml"))
        secret = os.path.join(self.dir, "secret")
        os.makedirs(secret)
        write_tokenizer(secret)
        with open(os.path.join(secret, "special_tokens_map.json"), "w") as f:
            f.write('{"password": "hunter2"}')
        with h5py.File(ckpt, "r+") as f:
            config = f.attrs["config"]
            config = config.decode() if isinstance(config, bytes) else config
            config, n = re.subn(r'(?m)^tokenizer = .*$', 'tokenizer = "%s"' % os.path.join(secret, "tokenizer.json"),
                                config)
            self.assertEqual(n, 1, config)
            del f.attrs["config"]
            f.attrs["config"] = config
        out = os.path.join(self.dir, "hf")
        _, stdout, _ = self.export(ckpt, out)
        self.assertEqual(sorted(n for n in os.listdir(out) if "token" in n), [])
        self.assertIn("a path export does not open", stdout)
        # --tokenizer: what the user names, refused (exit 1, nothing written) when it is not one.
        not_one = os.path.join(self.dir, "config.json")
        with open(not_one, "w") as f:
            f.write('{"model_type": "llama"}')
        other = os.path.join(self.dir, "hf2")
        _, _, stderr = self.meshtrain(["export", ckpt, "--format", "hf", other, "--tokenizer", not_one], expect=1)
        self.assertIn(not_one + ': has no "model" object', stderr)
        self.assertFalse(os.path.exists(other))

    def test_export_removes_only_its_own_stale_staging(self):
        src = os.path.join(self.dir, "fused")
        write_hf_dir(src, FUSED, random_weights(FUSED, "F16", 3), "F16")
        ckpt = os.path.join(self.dir, "fused.h5")
        self.import_(src, ckpt)
        out = os.path.join(self.dir, "hf")
        os.makedirs(out)
        host = socket.gethostname()
        dead, dead_too = subprocess.Popen(["true"]), subprocess.Popen(["true"])
        dead.wait()
        dead_too.wait()
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.makedirs(elsewhere)
        with open(os.path.join(elsewhere, "keep"), "w") as f:
            f.write("not the export's\n")
        stale = os.path.join(out, ".meshtrain-export.%s.%d" % (host, dead.pid))
        os.makedirs(stale)
        with open(os.path.join(stale, "model.safetensors"), "w") as f:
            f.write("half written\n")
        os.symlink(elsewhere, os.path.join(stale, "link"))  # removed as a link, not followed
        kept = [os.path.join(out, ".meshtrain-export.%s.%d" % (host, os.getpid())),  # alive
                os.path.join(out, ".meshtrain-export.another-host.%d" % dead.pid),  # not provably dead
                os.path.join(out, ".meshtrain-export.%d" % dead.pid)]  # no host in the name
        for d in kept:
            os.makedirs(d)
        link = os.path.join(out, ".meshtrain-export.%s.%d" % (host, dead_too.pid))
        os.symlink(elsewhere, link)  # a link named like staging: neither followed nor removed
        self.export(ckpt, out)
        self.assertFalse(os.path.exists(stale))
        for d in kept:
            self.assertTrue(os.path.isdir(d), d)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(os.listdir(elsewhere), ["keep"])
        self.assertEqual(sorted(n for n in os.listdir(out) if n.startswith(".")),
                         sorted(os.path.basename(d) for d in kept + [link]))

    def test_signal_during_export_leaves_nothing(self):
        # An export stopped (SIGSTOP) while its staging directory is being filled, then sent
        # SIGINT or SIGTERM: it exits 128 + the signal, its staging directory and the OUT it
        # made are gone; an OUT that held an export holds it still.
        big = dict(FUSED, vocab_size=16384, hidden_size=256, intermediate_size=512)
        src = os.path.join(self.dir, "big")
        write_hf_dir(src, big, random_weights(big, "F32", 4), "F32")
        ckpt = os.path.join(self.dir, "big.h5")
        self.import_(src, ckpt)
        previous = os.path.join(self.dir, "previous")
        self.export(ckpt, previous)
        before = {n: read(os.path.join(previous, n)) for n in os.listdir(previous)}
        for sig, out in ((signal.SIGTERM, os.path.join(self.dir, "new")), (signal.SIGINT, previous)):
            for attempt in range(5):
                p = subprocess.Popen([harness.MESHTRAIN, "export", ckpt, "--format", "hf", out,
                                      "--max-shard-size", "1MB"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                caught = False
                while p.poll() is None:
                    staged = [n for n in os.listdir(out) if n.startswith(".meshtrain-export.")] \
                        if os.path.isdir(out) else []
                    if staged and os.listdir(os.path.join(out, staged[0])):
                        p.send_signal(signal.SIGSTOP)
                        published = set(os.listdir(out)) - set(before if out == previous else ()) - set(staged)
                        caught = not published and os.path.isdir(os.path.join(out, staged[0]))
                        p.send_signal(sig)
                        p.send_signal(signal.SIGCONT)
                        break
                _, stderr = p.communicate(timeout=120)
                if caught:
                    break
            self.assertTrue(caught, "the export finished before it could be signalled, 5 times")
            self.assertEqual(p.returncode, 128 + sig, stderr)
            self.assertIn("export interrupted by " + sig.name, stderr)
            if out == previous:
                self.assertEqual({n: read(os.path.join(out, n)) for n in os.listdir(out)}, before)
            else:
                self.assertFalse(os.path.exists(out), os.listdir(out) if os.path.exists(out) else "")

    def test_gpt2_without_deck(self):
        # GPT-2 too: the deck built from config.json is the model that was exported.
        self.train(1, ["train.steps=2"])
        out = os.path.join(self.dir, "gpt2")
        self.export(self.ckpt(2), out)
        imported = os.path.join(self.dir, "gpt2.h5")
        deck = os.path.join(self.dir, "gpt2.toml")
        self.import_(out, imported, "--deck-out", deck)
        with open(deck) as f:
            text = f.read()
        for line in ('family = "gpt2"', "layers = 4", "d_model = 32", "heads = 4", "seq_len = 16",
                     "vocab_size = 256", "tie_embeddings = true", 'tokenizer = "bytes"'):
            self.assertIn(line + "\n", text)
        with h5py.File(self.ckpt(2), "r") as a, h5py.File(imported, "r") as b:
            self.assertEqual(sorted(a["model"]), sorted(b["model"]))
            for name in a["model"]:
                self.assertEqual(a["model"][name][...].tobytes(), b["model"][name][...].tobytes(), name)

    def test_refusals(self):
        good = os.path.join(self.dir, "good")
        arrays = random_weights(LLAMA, "F32", 4)
        write_hf_dir(good, LLAMA, arrays, "F32", shards=2)
        target = os.path.join(self.dir, "bad.h5")

        def refused(directory, needle, *extra):
            _, _, stderr = self.import_(directory, target, *extra, expect=1)
            self.assertIn(needle, stderr)
            self.assertTrue(stderr.startswith("meshtrain: error: "), stderr)
            self.assertFalse(os.path.exists(target))

        def variant(name, config=LLAMA, tensors=arrays, shards=1):
            d = os.path.join(self.dir, name)
            write_hf_dir(d, config, tensors, "F32", shards)
            return d

        wrong = dict(arrays)
        wrong["model.layers.1.mlp.up_proj.weight"] = arrays["model.layers.1.mlp.up_proj.weight"][:40]
        refused(variant("shape", tensors=wrong), os.path.join(self.dir, "shape", "model.safetensors") +
                ": tensor model.layers.1.mlp.up_proj.weight has shape (40, 32), but the deck's model")
        missing = {k: v for k, v in arrays.items() if k != "model.layers.0.self_attn.v_proj.weight"}
        refused(variant("missing", tensors=missing),
                "model.safetensors: tensor model.layers.0.self_attn.v_proj.weight is missing")
        extra = dict(arrays, **{"model.layers.2.input_layernorm.weight": arrays["model.norm.weight"]})
        refused(variant("extra", tensors=extra), "tensor model.layers.2.input_layernorm.weight (32,) is not part of")
        rope = dict(LLAMA, rope_scaling={"rope_type": "longrope", "factor": 4.0})
        refused(variant("rope", config=rope), 'config.json: rope_scaling.rope_type = "longrope" (meshtrain computes')
        refused(variant("act", config=dict(LLAMA, hidden_act="gelu")), 'hidden_act = "gelu"')
        refused(variant("qbias", config=dict(QWEN3, attention_bias=True)), "attention_bias = true (Qwen 3")
        refused(variant("mbias", config=dict(LLAMA, attention_bias=True)),
                "mlp_bias = false (with attention_bias = true")
        # A deck of another model, named with config.json's key and both values.
        deck = os.path.join(self.dir, "qwen.toml")
        with open(deck, "w") as f:
            f.write(qwen_deck(self.run_dir))
        refused(good, "config.json: model_type gives model.family = \"llama\", but " + deck +
                " (with its --set overrides) has model.family = \"qwen3\"", "--deck", deck)
        refused(variant("kv", config=dict(QWEN3)), "config.json: num_key_value_heads gives model.kv_heads = 2, but " +
                deck + " (with its --set overrides) has model.kv_heads = 1", "--deck", deck,
                "--set", "model.kv_heads=1")
        refused(variant("long", config=dict(QWEN3)), "max_position_embeddings = 4096, but", "--deck", deck,
                "--set", "model.seq_len=8192")
        # Shards outside the directory: an absolute path, "..", a symbolic link leading out.
        outside = os.path.join(self.dir, "outside.safetensors")
        write_safetensors(outside, {"model.norm.weight": arrays["model.norm.weight"]})
        for name, shard in (("absolute", outside), ("dotdot", "../outside.safetensors"),
                            ("link", "link.safetensors")):
            d = variant("sh_" + name, shards=2)
            if name == "link":
                os.symlink(outside, os.path.join(d, "link.safetensors"))
            index = os.path.join(d, "model.safetensors.index.json")
            with open(index) as f:
                idx = json.load(f)
            idx["weight_map"]["model.norm.weight"] = shard
            with open(index, "w") as f:
                json.dump(idx, f)
            why = {"absolute": "which is not a relative path", "dotdot": 'which climbs out with ".."',
                   "link": "which is a symbolic link leading to " + os.path.realpath(outside)}[name]
            refused(d, index + ': weight_map places model.norm.weight in "' + shard + '", ' + why)
        # A tokenizer.json that leads out of the directory: the deck built would name that file.
        d = variant("tok_link")
        write_tokenizer(self.dir)
        os.symlink(os.path.join(self.dir, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
        refused(d, os.path.join(d, "tokenizer.json") + ": is a symbolic link leading to " +
                os.path.realpath(os.path.join(self.dir, "tokenizer.json")) + ", outside " + d)
        # A symbolic link that stays inside the directory is a file of it.
        d = variant("sh_inside", shards=2)
        os.rename(os.path.join(d, "model-00002-of-00002.safetensors"), os.path.join(d, "real.safetensors"))
        os.symlink("real.safetensors", os.path.join(d, "model-00002-of-00002.safetensors"))
        ok = os.path.join(self.dir, "ok.h5")
        self.import_(d, ok)
        self.assertTrue(os.path.exists(ok))
        # --deck-out never writes over a file, and --deck excludes it.
        refused(good, deck + ": already exists", "--deck-out", deck)
        self.import_(good, target, "--deck", deck, "--deck-out", os.path.join(self.dir, "x.toml"), expect=2)


if __name__ == "__main__":
    harness.main()
