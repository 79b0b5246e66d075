#!/usr/bin/env python3
"""Hugging Face transformers as the judge of `meshtrain import` and `export --format hf`, for every family.

Each case builds a tiny model with transformers itself (its config class, its modules, random
weights from a fixed seed, scaled so that the logits spread and a greedy continuation varies) and
writes it with `save_pretrained` (safetensors; fp32 once sharded by a small max_shard_size, bf16
once). Then, through the real binary:
- `meshtrain import --format hf DIR OUT.h5 --deck-out D.toml`;
- `meshtrain eval` (fp64) equals transformers' loss on the very windows eval reads (the model
  `from_pretrained` from the directory in float64) within 1e-9 relative, and eval in fp32 within
  1e-5;
- `meshtrain sample` greedy (temperature 0, key/value cache, tp 2, fp64) writes the 32 tokens
  transformers' argmax decoding writes from the same prompt;
- where the project's own NumPy reference (tests/reference/hf_decoder_reference.py, the offline
  fallback) knows the family, it agrees with transformers within 1e-9.
Then the other way: the imported model is trained 3 steps by meshtrain on 4 ranks of a mixed
layout (tp 2 x pp 2; experts: tp 2 x dp 2 with ep 2) and exported (`meshtrain export --format
hf`); transformers loads the export with no missing, unexpected or mismatched keys and no warning
about them, gives eval's loss (1e-9 in float64), the same greedy tokens, and reads its
GenerationConfig.
DeepSeek-V3 (with and without q_lora_rank; groups, a routers' bias set by hand so that it
decides the choice, shared experts, dense first blocks, YaRN) goes both ways the same (greedy
`sample` through its cache of the compressed latent).
FP8 block-scaled import (quantization_config "fp8"): a Llama quantized blockwise by torch imports
as its ceil-rule dequantization bit for bit (which transformers' own dequantization gives), and
evaluates to transformers' loss on the dequantized model.

Runs in the judges' environment (scripts/judges.py run): CTest label `judge`.
"""
import contextlib
import json
import logging
import os
import sys
import warnings

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "io"))
import harness  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402
from hf_reference_test import (EVAL_BATCHES, G, NEW_TOKENS, PROMPT, ReferenceCase,  # noqa: E402
                               write_eval_windows)

SEQ, VOCAB = 48, 256
# Byte-level BPE's printable stand-ins back to bytes (GPT-2's bytes_to_unicode, inverted).
U2B = {u: b for b, u in __import__("gpt2_bpe_reference_test").B2U.items()}
WINDOWS = G * EVAL_BATCHES
CPU_FP64 = ['run.device="cpu"', 'train.precision="fp64"']

_DENSE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
_MOE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=SEQ)
_DEEPSEEK_V3 = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=8,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                    qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=8, max_position_embeddings=SEQ,
                    num_nextn_predict_layers=0, tie_word_embeddings=False)


def case_configs():
    """{case: (config, save dtype, max_shard_size or None)}: every family and the variants its
    import must hold (GQA, the llama3 and yarn rotary scalings, tied and untied, q/k norm with
    head_dim != hidden / heads, experts with and without renormalised top-k, dense first blocks)."""
    t = transformers
    llama3_rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16}
    yarn_rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                 "original_max_position_embeddings": 512}
    return {
        "gpt2_fp32_sharded": (t.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                           n_head=4, bos_token_id=VOCAB - 1,
                                           eos_token_id=VOCAB - 1), torch.float32, "24KB"),
        "llama_gqa_llama3_untied_fp32_sharded": (
            t.LlamaConfig(**_DENSE, tie_word_embeddings=False, rope_parameters=llama3_rope),
            torch.float32, "40KB"),
        "llama_tied_bf16": (t.LlamaConfig(**dict(_DENSE, num_key_value_heads=4),
                                          tie_word_embeddings=True), torch.bfloat16, None),
        "qwen3_head_dim_bf16": (t.Qwen3Config(**dict(_DENSE, hidden_size=32, intermediate_size=80),
                                              head_dim=16, tie_word_embeddings=True),
                                torch.bfloat16, None),
        # YaRN (rope_type "yarn", no mscale keys: cos and sin times 0.1 ln 4 + 1): with head_dim
        # 16, theta 10000 and original 512 the ramp runs over pairs 0 to 4 of 8.
        "qwen3_yarn_fp32": (t.Qwen3Config(**dict(_DENSE, hidden_size=32, intermediate_size=80),
                                          head_dim=16, tie_word_embeddings=False,
                                          rope_parameters=yarn_rope),
                            torch.float32, None),
        "mixtral_fp32": (t.MixtralConfig(**_MOE, intermediate_size=24, num_local_experts=4,
                                         num_experts_per_tok=2, tie_word_embeddings=False),
                         torch.float32, "40KB"),
        "qwen3_moe_bf16": (t.Qwen3MoeConfig(**_MOE, head_dim=16, intermediate_size=64,
                                            moe_intermediate_size=16, num_experts=8,
                                            num_experts_per_tok=3, norm_topk_prob=False,
                                            mlp_only_layers=[0], tie_word_embeddings=True),
                           torch.bfloat16, None),
        # DeepSeek-V3's pattern: latent attention with a query rank, interleaved rotary rows,
        # YaRN with mscale = mscale_all_dim (the softmax's m^2; original context SEQ / 4, as
        # transformers expects beside factor 4), 8 experts in 4 groups choosing 2, a shared
        # expert, a dense first block; MTP left out (num_nextn_predict_layers 0).
        "deepseek_v3_fp32_sharded": (t.DeepseekV3Config(
            **_DEEPSEEK_V3, q_lora_rank=24, qk_rope_head_dim=8, n_group=4, topk_group=2,
            num_experts_per_tok=3, n_shared_experts=1, routed_scaling_factor=2.5,
            first_k_dense_replace=1, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": SEQ // 4, "mscale": 1.0,
                             "mscale_all_dim": 1.0}), torch.float32, "40KB"),
        # Moonlight's pattern: queries straight from the input (q_lora_rank null), rotary rows in
        # halves, one group, two shared experts, unnormalised gates, every block a mixture.
        "deepseek_v3_qnull_bf16": (t.DeepseekV3Config(
            **_DEEPSEEK_V3, q_lora_rank=None, qk_rope_head_dim=4, n_group=1, topk_group=1,
            num_experts_per_tok=2, n_shared_experts=2, norm_topk_prob=False,
            routed_scaling_factor=1.7, first_k_dense_replace=0, rope_interleave=False,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
            torch.bfloat16, None),
    }


def scale_weights(model, seed):
    """Random weights from a fixed seed, scaled as tests/support/tiny_hf_moe.py does (norms
    around 1, matrices 3 / sqrt(fan-in), a small embedding): transformers' own initialisation
    (std 0.02) gives nearly flat logits, where a wrong mapping could hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # GPT-2's; a large one would choose the same token always
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "wte" in name or "wpe" in name or "embed_tokens" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:  # GPT-2's Conv1D keeps (in, out); nn.Linear (out, in)
                fan_in = p.shape[0] if type(model).__name__.startswith("GPT2") else p.shape[1]
                p.copy_(3.0 / fan_in ** 0.5 * torch.randn(p.shape, generator=g))


def scale_deepseek_v3_routers(model, seed):
    """DeepseekV3ForCausalLM's routers: weights of scale hidden^-0.5 (sigmoid scores that spread
    without saturating) and an e_score_correction_bias (a buffer, zeros as built) of distinct,
    float32-exact values as wide as the scores' spread, so that it changes which experts are chosen."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DeepseekV3TopkRouter):
                module.weight.copy_(model.config.hidden_size ** -0.5 * torch.randn(module.weight.shape, generator=g))
                bias = 0.3 * torch.randn(module.e_score_correction_bias.shape, generator=g)
                module.e_score_correction_bias.copy_(bias.to(torch.float32))


def write_model(config, dtype, shard, directory, seed=11):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    scale_weights(model, seed)
    if config.model_type == "deepseek_v3":
        scale_deepseek_v3_routers(model, seed)
    model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(directory, **kwargs)


@contextlib.contextmanager
def float64_for_float32():
    """transformers computes RMSNorm, the rotary table and Mixtral's router probabilities in
    float32 whatever the model's dtype (its code says `.to(torch.float32)`, `dtype=torch.float`,
    `.float()`), which leaves 1e-9 to 1e-8 between its "float64" loss and an exact one. While the
    judge runs, torch.float and torch.float32 name float64 and Tensor.float() makes float64, so
    that transformers' own code runs in float64 throughout."""
    saved = torch.float, torch.float32, torch.Tensor.float
    torch.float = torch.float32 = torch.float64
    torch.Tensor.float = lambda self, memory_format=torch.preserve_format: self.to(
        torch.float64, memory_format=memory_format)
    try:
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float = saved


def rotary_in_float64(model):
    """The rotary modules' inverse frequencies made again by transformers' own initialisers in
    float64 (they were made in float32 when the model was built)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    for module in model.modules():
        if not (hasattr(module, "inv_freq") and hasattr(module, "rope_type")):
            continue
        init = (module.compute_default_rope_parameters if module.rope_type == "default"
                else ROPE_INIT_FUNCTIONS[module.rope_type])
        with float64_for_float32():
            inv_freq, scaling = init(module.config)
        assert inv_freq.dtype == torch.float64 and scaling == module.attention_scaling
        module.inv_freq = inv_freq


def judge_model(directory):
    """The saved model as transformers reads it, in float64 (its experts through the eager
    loop: the grouped product has no float64 kernel)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float64, experts_implementation="eager")
    rotary_in_float64(model)
    return model.eval()


def judge_loss(model, tokens):
    rows = torch.as_tensor(np.stack([tokens[w * SEQ:w * SEQ + SEQ + 1] for w in range(WINDOWS)]))
    with torch.no_grad(), float64_for_float32():
        logits = model(input_ids=rows[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             rows[:, 1:].reshape(-1)).item()


def judge_greedy(model, prompt, steps):
    """transformers' argmax decoding (full forward each step: no cache shared with anything)."""
    ids = list(prompt)
    with torch.no_grad(), float64_for_float32():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def reference_loss(directory, tokens):
    """The NumPy reference's loss on the same files, or None where it does not know the family."""
    import json
    import hf_llama_test as hf
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if config["model_type"] not in ref.FAMILIES:
        return None
    weights, _ = hf.read_hf_dir(directory)
    weights = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    rows = np.stack([tokens[w * SEQ:w * SEQ + SEQ + 1] for w in range(WINDOWS)])
    return ref.mean_cross_entropy(weights, config, rows[:, :-1], rows[:, 1:])


class TransformersJudgesImport(ReferenceCase):
    def run_case(self, name):
        config, dtype, shard = case_configs()[name]
        hf_dir = os.path.join(self.dir, "hf")
        write_model(config, dtype, shard, hf_dir)
        if shard:
            self.assertTrue(os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")),
                            name + ": expected a sharded save")
        ckpt, deck = os.path.join(self.dir, "imported.h5"), os.path.join(self.dir, "imported.toml")
        self.meshtrain(["import", "--format", "hf", hf_dir, ckpt, "--deck-out", deck])

        val = os.path.join(self.dir, "val.bin")
        tokens = write_eval_windows(val, WINDOWS, SEQ, VOCAB)
        val_set = ["--set", f'data.val="{val}"', "--set", 'run.device="cpu"', "--set",
                   f"train.global_batch={G}", "--set", "train.micro_batch=2", "--set",
                   f"train.eval_batches={EVAL_BATCHES}"]
        model = judge_model(hf_dir)
        want = judge_loss(model, tokens)
        got = self.eval_loss(ckpt, val_set, "fp64", deck)
        got32 = self.eval_loss(ckpt, val_set, "fp32", deck)
        rel, rel32 = abs(got - want) / want, abs(got32 - want) / want
        print(f"\n{name}: transformers {want:.15f}, eval fp64 {got:.15f} (relative {rel:.1e}), "
              f"fp32 {got32:.9f} (relative {rel32:.1e})")
        self.assertGreater(abs(want - np.log(VOCAB)), 0.1, name + ": the logits are nearly flat")
        self.assertLess(rel, 1e-9, name)
        self.assertLess(rel32, 1e-5, name)

        fallback = reference_loss(hf_dir, tokens)
        if fallback is not None:
            print(f"{name}: NumPy reference {fallback:.15f}")
            self.assertLess(abs(fallback - want) / want, 1e-9, name + ": the NumPy reference")

        self.check_greedy(name, model, ckpt, deck)
        self.export_case(name, ckpt, deck, val_set, tokens, config)

    def check_greedy(self, name, model, ckpt, deck):
        """`sample` greedy (tp 2, fp64) writes transformers' argmax decoding."""
        expected = judge_greedy(model, list(PROMPT), NEW_TOKENS)
        print(f"{name}: greedy {expected}")
        self.assertEqual(self.sample_greedy(ckpt, deck, CPU_FP64), expected, name)
        self.assertGreater(len(set(expected)), 8, "a repetitive continuation proves little")

    def export_case(self, name, imported, deck, val_set, tokens, config):
        """The imported model trained a few steps by meshtrain on 4 ranks of a mixed layout,
        exported, and loaded by transformers: no missing, unexpected or mismatched keys and no
        warning about them, eval's loss, the same greedy tokens, and its GenerationConfig."""
        moe = hasattr(config, "num_experts_per_tok")
        layout = (["parallel.tp=2", "parallel.dp=2", "parallel.ep=2"] if moe else
                  ["parallel.tp=2", "parallel.pp=2", "parallel.dp=1"])
        sets = layout + [f'checkpoint.resume="{imported}"', 'run.device="cpu"', 'train.precision="fp32"',
                         "train.steps=3", "checkpoint.every=3", f'run.dir="{self.run_dir}"',
                         "train.global_batch=8", "train.micro_batch=2", 'data.val="none"',
                         "train.lr=1e-3", "train.warmup_steps=1"]
        self.meshtrain(["train", deck] + [a for s in sets for a in ("--set", s)], ranks=4, timeout=600)
        trained = self.ckpt(3)
        out = os.path.join(self.dir, "exported")
        self.meshtrain(["export", trained, "--format", "hf", out])

        records = []
        handler = _Recorder(records)
        hf_log = transformers.utils.logging.get_logger("transformers")
        hf_log.addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model, info = transformers.AutoModelForCausalLM.from_pretrained(
                    out, dtype=torch.float64, experts_implementation="eager", output_loading_info=True)
        finally:
            hf_log.removeHandler(handler)
        for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            self.assertFalse(info.get(key), f"{name} export: {key} {info.get(key)}")
        said = records + [str(w.message) for w in caught]
        about_keys = [m for m in said if any(w in m.lower() for w in (
            "missing", "unexpected", "mismatch", "not initialized", "newly initialized", "not used"))]
        self.assertEqual(about_keys, [], f"{name} export: transformers warned about the weights")
        transformers.GenerationConfig.from_pretrained(out)
        rotary_in_float64(model)
        model.eval()

        want = judge_loss(model, tokens)
        got = self.eval_loss(trained, val_set, "fp64", deck)
        rel = abs(got - want) / want
        print(f"{name} trained on 4 ranks ({' '.join(layout)}), exported: transformers {want:.15f}, "
              f"eval fp64 {got:.15f} (relative {rel:.1e})")
        self.assertLess(rel, 1e-9, name + " exported")
        self.check_greedy(name + " exported", model, trained, deck)


FP8_BLOCK = [128, 128]


def quantize_fp8_blocks(w, block):
    """`w` (fp32, (R, C)) as DeepSeek-V3's checkpoints hold it: float8_e4m3fn codes and a float32
    scale per block of the ceil grid (the last block partial), each block's absolute maximum / 448."""
    rows, cols = w.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    scale = torch.empty(grid, dtype=torch.float32)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for a in range(grid[0]):
        for b in range(grid[1]):
            part = w[a * block[0]:(a + 1) * block[0], b * block[1]:(b + 1) * block[1]]
            scale[a, b] = part.abs().max().clamp(min=1e-12) / 448.0
            q[a * block[0]:(a + 1) * block[0], b * block[1]:(b + 1) * block[1]] = \
                (part / scale[a, b]).to(torch.float8_e4m3fn)
    return q, scale


def ceil_rule_dequantize(q, scale, block):
    """W = e4m3(Q) * S[i // bm, j // bn] in float64 (exact), rounded once to float32."""
    s = scale.to(torch.float64).repeat_interleave(block[0], 0)[:q.shape[0]]
    s = s.repeat_interleave(block[1], 1)[:, :q.shape[1]]
    return (q.to(torch.float64) * s).to(torch.float32)


class TransformersJudgesFp8Import(ReferenceCase):
    """FP8 block-scaled import (DeepSeek-V3's checkpoint format, for any family): a tiny Llama whose
    linears torch quantizes blockwise into float8_e4m3fn codes and `weight_scale_inv` (blocks of
    128 x 128; the MLP's 320 rows or columns end in a partial block), with quantization_config in
    config.json. meshtrain's import equals the ceil-rule dequantization bit for bit (compared through
    an import of the dequantized weights saved as float32), which equals transformers' own
    `_dequantize_fp8_weight` and, where the shape is a multiple of the block, its CPU loader's
    `Fp8Dequantize._dequantize_one` (which refuses a partial block). Eval of the import in fp64 equals
    transformers' loss on the dequantized model within 1e-9."""

    def test_llama_fp8_block_scaled(self):
        from safetensors.torch import load_file, save_file
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight
        config = transformers.LlamaConfig(**dict(_DENSE, hidden_size=256, intermediate_size=320),
                                          tie_word_embeddings=False)
        dense_dir, fp8_dir = os.path.join(self.dir, "dense"), os.path.join(self.dir, "fp8")
        write_model(config, torch.float32, None, dense_dir)
        weights = load_file(os.path.join(dense_dir, "model.safetensors"))
        stored, partial = {}, 0
        for name, w in weights.items():
            if not (name.startswith("model.layers.") and name.endswith("_proj.weight")):
                stored[name] = w  # embeddings, head and norms stay as they are (DeepSeek-V3's)
                continue
            q, scale = quantize_fp8_blocks(w, FP8_BLOCK)
            want = ceil_rule_dequantize(q, scale, FP8_BLOCK)
            theirs = _dequantize_fp8_weight(q.clone(), scale, FP8_BLOCK, torch.float64).to(torch.float32)
            self.assertTrue(torch.equal(theirs, want), name + ": transformers' _dequantize_fp8_weight")
            if w.shape[0] % FP8_BLOCK[0] == 0 and w.shape[1] % FP8_BLOCK[1] == 0:
                loader = Fp8Dequantize(None)._dequantize_one(q, scale, torch.float64).to(torch.float32)
                self.assertTrue(torch.equal(loader, want), name + ": transformers' CPU loader")
            else:
                partial += 1
            stored[name], stored[name + "_scale_inv"], weights[name] = q, scale, want
        self.assertGreater(partial, 0, "no tensor ends in a partial block")
        os.makedirs(fp8_dir)
        save_file(stored, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
        save_file(weights, os.path.join(dense_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(dense_dir, "config.json")) as f:
            cfg = json.load(f)
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": FP8_BLOCK}
        with open(os.path.join(fp8_dir, "config.json"), "w") as f:
            json.dump(cfg, f)

        got = {}
        for name, d in (("fp8", fp8_dir), ("dense", dense_dir)):
            got[name] = os.path.join(self.dir, name + ".h5")
            self.meshtrain(["import", "--format", "hf", d, got[name], "--deck-out",
                            os.path.join(self.dir, name + ".toml")])
        import h5py
        with h5py.File(got["fp8"], "r") as a, h5py.File(got["dense"], "r") as b:
            self.assertEqual(sorted(a["model"]), sorted(b["model"]))
            for name in a["model"]:
                self.assertTrue(np.array_equal(a["model"][name][...], b["model"][name][...]),
                                "the FP8 import's " + name + " against the dequantized weights")

        val = os.path.join(self.dir, "val.bin")
        tokens = write_eval_windows(val, WINDOWS, SEQ, VOCAB)
        val_set = ["--set", f'data.val="{val}"', "--set", 'run.device="cpu"', "--set",
                   f"train.global_batch={G}", "--set", "train.micro_batch=2", "--set",
                   f"train.eval_batches={EVAL_BATCHES}"]
        want = judge_loss(judge_model(dense_dir), tokens)
        loss = self.eval_loss(got["fp8"], val_set, "fp64", os.path.join(self.dir, "fp8.toml"))
        rel = abs(loss - want) / want
        print(f"\nllama fp8 block-scaled: transformers (dequantized) {want:.15f}, eval fp64 {loss:.15f} "
              f"(relative {rel:.1e}); {partial} tensors end in a partial block")
        self.assertGreater(abs(want - np.log(VOCAB)), 0.1, "the logits are nearly flat")
        self.assertLess(rel, 1e-9)


MIXED_TEXT = ("Grüße aus Köln! 東京で会いましょう。Привет, мир. مرحبا 👩‍👩‍👧‍👦 👍🏽 1234567 "
              "I'M you'RE it's\t\ttabs  and\r\n<|end_of_text|> plain.")


def llama3_style_tokenizer(directory, text):
    """A Llama 3 style tokenizer.json (its pre-tokenizer regex, ignore_merges, byte level) of 500
    tokens trained by tokenizers itself on `text`, with Llama 3's special tokens, and the
    tokenizer_config.json Llama 3 ships (PreTrainedTokenizerFast)."""
    import tokenizers
    from gpt2_bpe_reference_test import LLAMA3_REGEX
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(ignore_merges=True))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=500, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    os.makedirs(directory)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                   "eos_token": "<|end_of_text|>", "model_max_length": SEQ,
                   "clean_up_tokenization_spaces": False}, f)
    return tok.get_vocab_size()


class TransformersJudgesTokenizerExport(ReferenceCase):
    """A Llama trained by meshtrain on text of its own tokenizer.json, exported with --tokenizer:
    AutoTokenizer reads the export and gives the ids meshtrain's prepare gives on a mixed-script
    text, and transformers continues a prompt with the tokens meshtrain's sample writes."""

    def test_llama_with_its_tokenizer(self):
        corpus = os.path.join(self.dir, "corpus.txt")
        text = "".join((MIXED_TEXT + " The cat sat on the mat. ") * 40 for _ in range(8))
        with open(corpus, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        tok_dir = os.path.join(self.dir, "tok")
        size = llama3_style_tokenizer(tok_dir, text)
        tok_json = os.path.join(tok_dir, "tokenizer.json")
        data = os.path.join(self.dir, "data")
        self.meshtrain(["prepare", corpus, "--out", data, "--tokenizer", tok_json,
                        "--val-fraction", "0.1"])
        vocab = (size + 3) // 4 * 4  # divisible by tp; the tokenizer's ids fill the first `size`
        deck = os.path.join(self.dir, "tok.toml")
        with open(deck, "w") as f:
            f.write(f"""[run]
device = "cpu"
name = "tok"
dir = "{self.run_dir}"
seed = 3
[model]
family = "llama"
layers = 2
d_model = 32
heads = 4
kv_heads = 2
ffn_hidden = 48
seq_len = {SEQ}
vocab_size = {vocab}
[data]
train = "{data}_train.bin"
val = "{data}_val.bin"
tokenizer = "{tok_json}"
[train]
precision = "fp32"
steps = 4
global_batch = 8
micro_batch = 2
lr = 3e-3
warmup_steps = 1
eval_every = 0
eval_batches = 1
[checkpoint]
every = 4
""")
        self.meshtrain(["train", deck, "--set", "parallel.tp=2", "--set", "parallel.pp=2"], ranks=4,
                       timeout=600)
        out = os.path.join(self.dir, "exported")
        self.meshtrain(["export", self.ckpt(4), "--format", "hf", out, "--tokenizer", tok_json])

        hf_tok = transformers.AutoTokenizer.from_pretrained(out)
        sample_path = os.path.join(self.dir, "mixed.txt")
        with open(sample_path, "w", encoding="utf-8", newline="") as f:
            f.write(MIXED_TEXT)
        self.meshtrain(["prepare", sample_path, "--out", os.path.join(self.dir, "mixed"),
                        "--tokenizer", tok_json, "--val-fraction", "0"])
        from gpt2_bpe_reference_test import read_shard
        ours = read_shard(os.path.join(self.dir, "mixed_train.bin"))
        theirs = hf_tok.encode(MIXED_TEXT, add_special_tokens=False, split_special_tokens=True)
        self.assertEqual(theirs, ours, "AutoTokenizer on the export against meshtrain's prepare")
        generation = transformers.GenerationConfig.from_pretrained(out)
        self.assertEqual((generation.bos_token_id, generation.eos_token_id),
                         (hf_tok.bos_token_id, hf_tok.eos_token_id))

        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
        rotary_in_float64(model)
        model.eval()
        prompt = hf_tok.encode(PROMPT.decode(), add_special_tokens=False)
        expected = judge_greedy(model, prompt, NEW_TOKENS)
        # sample writes the prompt, then the continuation as the tokenizer's bytes.
        written = bytes(self.sample_greedy(self.ckpt(4), deck, ['train.precision="fp64"']))
        want = bytes(U2B[c] for t in hf_tok.convert_ids_to_tokens(expected) for c in t)
        print(f"greedy with the exported tokenizer: {want!r}")
        self.assertEqual(written, want)


class _Recorder(logging.Handler):
    """Collects what transformers logs while it loads an export."""

    def __init__(self, records):
        super().__init__(level=logging.WARNING)
        self.records = records

    def emit(self, record):
        self.records.append(record.getMessage())


def _add_tests():
    for name in case_configs():
        setattr(TransformersJudgesImport, "test_" + name,
                lambda self, name=name: self.run_case(name))


_add_tests()

if __name__ == "__main__":
    print(f"judges: torch {torch.__version__}, transformers {transformers.__version__}")
    harness.main()
