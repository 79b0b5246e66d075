#!/usr/bin/env python3
"""`meshtrain export --format hf` and `meshtrain import --format hf`, end to end through the real
binary: train a tiny deck for 40 steps on two ranks (tensor parallel), export the checkpoint,
then WITHOUT meshtrain read model.safetensors with a reader written here from the format's
specification (struct + json + numpy) and check every name, shape and value against the
checkpoint (h5py); where PyTorch is installed, build GPT-2 from those tensors
(bench/gpt2_torch.py) and compute the loss on the very windows `meshtrain eval` uses (a
validation shard holding exactly them), which must agree to 1e-4 relative. Import must give the
checkpoint's /model datasets back bit for bit, resume on another layout at step 0, and refuse a
wrong shape, a missing tensor or another model with exit 1, a clear message and no output file.

Exit status 77 (CTest: skipped) when everything ran but PyTorch is missing, so the loss
comparison could not.
"""

import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import harness  # noqa: E402

try:
    import torch  # noqa: F401
    import gpt2_torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

L, C, H, T, V = 4, 32, 4, 16, 256  # harness.DECK's model
G, EVAL_BATCHES = 8, 2
STEPS = 40
WINDOWS = G * EVAL_BATCHES  # the validation shard's windows: exactly what eval reads, in order
DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2)}


# ---- safetensors, from the specification ----------------------------------------------------

def read_safetensors(path):
    """(header dict, {name: numpy array}, metadata) of a safetensors file, checking the layout:
    u64 LE header length N, N bytes of JSON (8-byte aligned end), then tensors tiling the data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header runs past the file"
    assert (8 + n) % 8 == 0, "the data does not start 8-byte aligned"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    arrays, at = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        assert begin == at, f"{name}: gap or overlap at {begin} (expected {at})"
        np_type, size = DTYPES[e["dtype"]]
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - begin == count * size, f"{name}: {end - begin} bytes for shape {e['shape']}"
        raw = data[begin:end]
        if e["dtype"] == "BF16":  # the upper half of a float32
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.dtype(np_type).newbyteorder("<")).astype(np.float32)
        arrays[name] = a.reshape(e["shape"])
        at = end
    assert at == len(data), "bytes after the last tensor"
    return header, arrays, metadata


def write_safetensors(path, arrays):
    """A float32 safetensors file of {name: array} (the test's damaged inputs)."""
    header, at, chunks = {}, 0, []
    for name, a in arrays.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        chunks.append(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def hf_names(tied):
    names = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C),
             "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
    for i in range(L):
        h = f"transformer.h.{i}."
        names.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                      h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                      h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                      h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                      h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                      h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    if not tied:
        names["lm_head.weight"] = (V, C)
    return names


def expected_from_checkpoint(path, tied):
    """The HF tensors, computed from the checkpoint's /model datasets by the mapping's
    definition: Conv1D weights are the transposes of meshtrain's (out, in), c_attn of qkv read
    as (3C, C)."""
    out = {}
    with h5py.File(path, "r") as f:
        def get(name):
            return np.asarray(f["/model/" + name][...], dtype=np.float32)
        out["transformer.wte.weight"] = get("wte")
        out["transformer.wpe.weight"] = get("wpe")
        out["transformer.ln_f.weight"] = get("ln_f.weight")
        out["transformer.ln_f.bias"] = get("ln_f.bias")
        for i in range(L):
            h, t = f"h.{i}.", f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                out[t + ln + ".weight"] = get(h + ln + ".weight")
                out[t + ln + ".bias"] = get(h + ln + ".bias")
            out[t + "attn.c_attn.weight"] = get(h + "attn.qkv.weight").reshape(3 * C, C).T
            out[t + "attn.c_attn.bias"] = get(h + "attn.qkv.bias").reshape(3 * C)
            out[t + "attn.c_proj.weight"] = get(h + "attn.proj.weight").T
            out[t + "attn.c_proj.bias"] = get(h + "attn.proj.bias")
            out[t + "mlp.c_fc.weight"] = get(h + "mlp.fc.weight").T
            out[t + "mlp.c_fc.bias"] = get(h + "mlp.fc.bias")
            out[t + "mlp.c_proj.weight"] = get(h + "mlp.proj.weight").T
            out[t + "mlp.c_proj.bias"] = get(h + "mlp.proj.bias")
        if not tied:
            out["lm_head.weight"] = get("lm_head.weight")
    return out


# ---- a validation shard of exactly the windows eval reads --------------------------------------

def write_val_shard(path):
    """WINDOWS windows of T + 1 tokens laid end to end (io/token_dataset.h): WINDOWS * T + 1
    tokens. Eval's batch e, position p reads window (e G + p) mod WINDOWS: each once, in order."""
    tokens = np.random.default_rng(5).integers(0, V, WINDOWS * T + 1).astype("<u2")
    harness.write_token_shard(path, tokens, V)
    return tokens.astype(np.int64)


def torch_loss(arrays, tokens, tied):
    """GPT-2 in PyTorch from the HF tensors: mean cross-entropy over eval's windows."""
    torch.manual_seed(0)
    model = gpt2_torch.GPT2(vocab=V, context=T, layers=L, heads=H, channels=C, tied=tied,
                            attention="explicit")
    gpt2_torch.load_hf_tensors(model, arrays)
    windows = np.stack([tokens[w * T:w * T + T + 1] for w in range(WINDOWS)])
    x = torch.from_numpy(windows[:, :-1].copy())
    y = torch.from_numpy(windows[:, 1:].copy())
    with torch.no_grad():
        return float(model(x, y))


class HfExport(harness.Case):
    def setUp(self):
        super().setUp()
        self.val = os.path.join(self.dir, "val.bin")
        self.tokens = write_val_shard(self.val)
        self.sets = [f'data.val="{self.val}"', f"train.eval_batches={EVAL_BATCHES}"]

    def run_model(self, tied):
        # Trained well away from the uniform start (loss 5.5 -> about 3.2), so that the logits
        # are large and a wrong mapping could not hide in a near-uniform loss.
        sets = self.sets + ["parallel.tp=2", f"model.tie_embeddings={'true' if tied else 'false'}",
                            f"train.steps={STEPS}", "train.lr=1e-2", "train.warmup_steps=2",
                            f"checkpoint.every={STEPS}"]
        self.train(2, sets)
        ckpt = self.ckpt(STEPS)
        out = os.path.join(self.dir, "hf")
        _, stdout, _ = self.meshtrain(["export", ckpt, "--format", "hf", out])
        self.assertIn("model.safetensors", stdout)
        self.assertEqual(sorted(os.listdir(out)),
                         ["config.json", "generation_config.json", "model.safetensors"])
        # The byte tokenizer has no begin/end-of-text token: none in either file.
        with open(os.path.join(out, "generation_config.json")) as f:
            self.assertEqual(json.load(f), {"_from_model_config": True})

        # Names, shapes and values, read without meshtrain, against the checkpoint.
        header, arrays, metadata = read_safetensors(os.path.join(out, "model.safetensors"))
        self.assertEqual({k: tuple(v["shape"]) for k, v in header.items()}, hf_names(tied))
        self.assertTrue(all(v["dtype"] == "F32" for v in header.values()))
        self.assertEqual(metadata["format"], "pt")
        self.assertEqual(metadata["meshtrain_step"], str(STEPS))
        with h5py.File(ckpt, "r") as f:
            self.assertEqual(metadata["meshtrain_lineage"], f.attrs["lineage"].decode()
                             if isinstance(f.attrs["lineage"], bytes) else f.attrs["lineage"])
        want = expected_from_checkpoint(ckpt, tied)
        for name, a in arrays.items():
            self.assertTrue(np.array_equal(a, want[name]), name)
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
        for key, value in {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                           "vocab_size": V, "n_positions": T, "n_embd": C, "n_layer": L,
                           "n_head": H, "activation_function": "gelu_new",
                           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": tied,
                           "torch_dtype": "float32"}.items():
            self.assertEqual(config[key], value, key)

        # bf16: the same tensors rounded to nearest even.
        out16 = os.path.join(self.dir, "hf16")
        self.meshtrain(["export", ckpt, "--format", "hf", out16, "--dtype", "bf16"])
        header16, arrays16, _ = read_safetensors(os.path.join(out16, "model.safetensors"))
        self.assertTrue(all(v["dtype"] == "BF16" for v in header16.values()))
        for name, a in arrays16.items():
            bits = want[name].astype(np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
            self.assertTrue(np.array_equal(a.view(np.uint32), rounded.view(np.uint32)), name)

        # The loss: meshtrain eval on one rank, PyTorch on the same windows.
        _, stdout, _ = self.meshtrain(["eval", self.deck, "--checkpoint", ckpt, "--set",
                                       "parallel.tp=1"] + sum((["--set", s] for s in self.sets +
                                       [f"model.tie_embeddings={'true' if tied else 'false'}"]), []),
                                      ranks=1)
        meshtrain_loss = float(stdout.split("val_loss ")[1].split()[0])
        if HAVE_TORCH:
            pytorch_loss = torch_loss(arrays, self.tokens, tied)
            print(f"\ntied={tied}: meshtrain eval val_loss {meshtrain_loss:.6f}, PyTorch from "
                  f"model.safetensors {pytorch_loss:.6f}, relative difference "
                  f"{abs(pytorch_loss - meshtrain_loss) / meshtrain_loss:.2e}")
            self.assertLess(abs(pytorch_loss - meshtrain_loss) / meshtrain_loss, 1e-4)
        return ckpt, out

    def test_tied_export_matches_checkpoint_and_pytorch_then_imports_bitwise(self):
        ckpt, out = self.run_model(tied=True)
        imported = os.path.join(self.dir, "imported.h5")
        _, stdout, _ = self.meshtrain(["import", "--format", "hf", out, "--deck", self.deck,
                                       imported])
        with h5py.File(ckpt, "r") as a, h5py.File(imported, "r") as b:
            self.assertEqual(int(b.attrs["step"]), 0)
            self.assertEqual(int(b.attrs["optimizer_steps"]), 0)
            self.assertNotEqual(a.attrs["lineage"], b.attrs["lineage"])
            self.assertEqual(sorted(a["model"]), sorted(b["model"]))
            for name in a["model"]:
                x, y = a["model"][name][...], b["model"][name][...]
                self.assertEqual(x.dtype, y.dtype, name)
                self.assertEqual(x.tobytes(), y.tobytes(), "/model/" + name + " differs")
                for moment in ("exp_avg", "exp_avg_sq"):
                    self.assertFalse(np.any(b["optim"][name][moment][...]), name)
        self.inspect(imported)
        # A fine-tune is an ordinary run from step 0, on another layout (dp 2).
        _, stdout, _ = self.train(2, [f'checkpoint.resume="{imported}"',
                                      f'run.dir="{os.path.join(self.dir, "ft")}"',
                                      "train.steps=2", "parallel.dp=2"])
        self.assertIn(f"resumed from {imported} at step 0", stdout)
        self.assertEqual(sorted(harness.losses(stdout)), [1, 2])

        # The imported checkpoint (written by one rank) exports the same tensor bytes as the
        # checkpoint of the two-rank run it came from; only the provenance differs.
        again = os.path.join(self.dir, "again")
        self.meshtrain(["export", imported, "--format", "hf", again])
        _, first, meta1 = read_safetensors(os.path.join(out, "model.safetensors"))
        _, second, meta2 = read_safetensors(os.path.join(again, "model.safetensors"))
        self.assertEqual(sorted(first), sorted(second))
        for name in first:
            self.assertEqual(first[name].tobytes(), second[name].tobytes(), name)
        self.assertEqual(meta2["meshtrain_step"], "0")
        self.assertNotEqual(meta1["meshtrain_lineage"], meta2["meshtrain_lineage"])

        # A bf16 export imports as its values widened to fp32.
        out16 = os.path.join(self.dir, "hf16")
        imported16 = os.path.join(self.dir, "imported16.h5")
        self.meshtrain(["import", "--format", "hf", out16, "--deck", self.deck, imported16])
        _, arrays16, _ = read_safetensors(os.path.join(out16, "model.safetensors"))
        with h5py.File(imported16, "r") as b:
            self.assertEqual(b["/model/wte"][...].tobytes(),
                             arrays16["transformer.wte.weight"].tobytes())
            self.assertEqual(b["/model/h.0.attn.qkv.weight"][...].reshape(3 * C, C).T.tobytes(),
                             arrays16["transformer.h.0.attn.c_attn.weight"].tobytes())

    def test_untied_exports_lm_head_and_imports_for_resume_auto(self):
        _, out = self.run_model(tied=False)
        # Imported as step 0 of a new run's checkpoint.dir, checkpoint.resume = "auto" (the
        # default) starts from it and a requeued job continues the run's own newest checkpoint.
        ft = os.path.join(self.dir, "ft")
        first = os.path.join(ft, "checkpoints", "step_00000000.h5")
        self.meshtrain(["import", "--format", "hf", out, "--deck", self.deck, first,
                        "--set", "model.tie_embeddings=false"])
        sets = ["model.tie_embeddings=false", f'run.dir="{ft}"', "checkpoint.every=1"]
        _, stdout, _ = self.train(1, sets + ["train.steps=1"])
        self.assertIn(f"resumed from {first} at step 0", stdout)
        _, stdout, _ = self.train(1, sets + ["train.steps=2"])
        self.assertIn("at step 1", stdout)

    def test_export_refusals(self):
        self.train(1, ["train.steps=2"])
        out = os.path.join(self.dir, "hf")
        # A model setting GPT-2 cannot express (here another LayerNorm epsilon) is refused by name.
        with h5py.File(self.ckpt(2), "r+") as f:
            model = f.attrs["model"]
            text = model.decode() if isinstance(model, bytes) else str(model)
            self.assertIn("layernorm_eps = 1e-05", text)
            f.attrs.modify("model", np.array(text.replace("1e-05", "1e-06").encode(),
                                              dtype=f.attrs.get_id("model").dtype))
        _, _, stderr = self.meshtrain(["export", self.ckpt(2), "--format", "hf", out], expect=1)
        self.assertIn("model.layernorm_eps = 1e-06 is a setting Hugging Face GPT2LMHeadModel "
                      "cannot express", stderr)
        self.assertFalse(os.path.exists(out))
        missing = os.path.join(self.dir, "absent.h5")
        _, _, stderr = self.meshtrain(["export", missing, "--format", "hf", out], expect=1)
        self.assertTrue(stderr.startswith("meshtrain: error: " + missing), stderr)
        _, _, stderr = self.meshtrain(["export", self.ckpt_dir, "--format", "hf", out], expect=1)
        self.assertIn("is a directory, not a checkpoint file", stderr)
        self.meshtrain(["export", self.ckpt(2), "--format", "onnx", out], expect=2)
        self.meshtrain(["export", self.ckpt(2), "--format", "hf", out, "--dtype", "fp16"], expect=2)

    def test_import_refusals(self):
        self.train(1, ["train.steps=2"])
        out = os.path.join(self.dir, "hf")
        self.meshtrain(["export", self.ckpt(2), "--format", "hf", out])
        _, arrays, _ = read_safetensors(os.path.join(out, "model.safetensors"))
        target = os.path.join(self.dir, "bad.h5")

        def refused(directory, needle, sets=()):
            args = ["import", "--format", "hf", directory, "--deck", self.deck, target]
            for s in sets:
                args += ["--set", s]
            _, _, stderr = self.meshtrain(args, expect=1)
            self.assertIn(needle, stderr)
            self.assertTrue(stderr.startswith("meshtrain: error: "), stderr)
            self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("bad.h5")], [])

        def variant(name, arrays):
            d = os.path.join(self.dir, name)
            os.makedirs(d)
            write_safetensors(os.path.join(d, "model.safetensors"), arrays)
            with open(os.path.join(out, "config.json")) as src, \
                    open(os.path.join(d, "config.json"), "w") as dst:
                dst.write(src.read())
            return d

        # As GPT2Model.save_pretrained wrote the original "gpt2" files: no "transformer." prefix,
        # the causal-mask buffers beside the weights, the tied head stored too. Accepted, and the
        # same weights as the checkpoint's.
        legacy = {k[len("transformer."):] if k.startswith("transformer.") else k: v
                  for k, v in arrays.items()}
        legacy["h.0.attn.bias"] = np.tril(np.ones((1, 1, T, T), dtype=np.float32))
        legacy["h.0.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
        legacy["lm_head.weight"] = arrays["transformer.wte.weight"]
        accepted = os.path.join(self.dir, "accepted.h5")
        self.meshtrain(["import", "--format", "hf", variant("legacy", legacy), "--deck", self.deck,
                        accepted])
        with h5py.File(self.ckpt(2), "r") as a, h5py.File(accepted, "r") as b:
            for name in a["model"]:
                self.assertEqual(a["model"][name][...].tobytes(), b["model"][name][...].tobytes(),
                                 name)
        os.remove(accepted)
        untied = dict(legacy)
        untied["lm_head.weight"] = legacy["lm_head.weight"] * 2
        refused(variant("untied", untied), "tensor lm_head.weight differs from "
                "transformer.wte.weight, but the deck's model")

        wrong = dict(arrays)
        wrong["transformer.wpe.weight"] = arrays["transformer.wpe.weight"][:8]
        st = os.path.join(self.dir, "wrong_shape", "model.safetensors")
        refused(variant("wrong_shape", wrong),
                f"{st}: tensor transformer.wpe.weight has shape (8, 32), but the deck's model")
        missing = {k: v for k, v in arrays.items() if k != "transformer.h.3.mlp.c_proj.bias"}
        st = os.path.join(self.dir, "missing", "model.safetensors")
        refused(variant("missing", missing), f"{st}: tensor transformer.h.3.mlp.c_proj.bias is missing")
        extra = dict(arrays)
        extra["transformer.h.4.ln_1.weight"] = arrays["transformer.h.0.ln_1.weight"]
        refused(variant("extra", extra), "tensor transformer.h.4.ln_1.weight (32,) is not part of")
        refused(out, os.path.join(out, "config.json") + ": n_head = 4, but " + self.deck +
                " (with its --set overrides) has model.heads = 2", sets=["model.heads=2"])
        refused(out, "n_layer = 4, but", sets=["model.layers=2"])
        refused(os.path.join(self.dir, "nowhere"), "not a directory")
        with open(os.path.join(variant("truncated", arrays), "model.safetensors"), "r+b") as f:
            f.truncate(100)
        refused(os.path.join(self.dir, "truncated"), "runs past the end of the file")


if __name__ == "__main__":
    status = 0
    try:
        harness.main()
    except SystemExit as e:
        status = e.code or 0
    if status == 0 and not HAVE_TORCH:
        print("SKIPPED: PyTorch is not installed (Debian: python3-torch), so the loss of the exported "
              "model was not compared with meshtrain eval; everything else passed", flush=True)
        sys.exit(77)
    sys.exit(status)
