#!/usr/bin/env python3
"""Writes a tiny Hugging Face mixture-of-experts directory of random weights, as save_pretrained
leaves one: config.json and model.safetensors (or shards and their index) in HF's layout, one
tensor per expert. The kinds:

  mixtral              MixtralForCausalLM: grouped-query attention, 4 experts, top 2 (always
                       renormalised), untied, a sliding_window longer than the context;
  qwen3_moe            Qwen3MoeForCausalLM: q/k norm, head_dim != hidden_size / heads,
                       8 experts, top 3, norm_topk_prob false, tied;
  qwen3_moe_dense0     Qwen3MoeForCausalLM with mlp_only_layers [0] (a dense first block of
                       intermediate_size), norm_topk_prob true, untied;
  deepseek_v3          DeepseekV3ForCausalLM: latent attention with a query rank, interleaved
                       rotary rows, YaRN (DeepSeek-V3's mscale = mscale_all_dim), 8 experts in 4
                       groups choosing 2, top 3, a shared expert, a dense first block, untied;
                       each router's e_score_correction_bias random (F32, as DeepSeek stores it).

The tensor names come from the NumPy reference (tests/reference/hf_decoder_reference.py, written
from transformers' modules), the safetensors writer from the format's specification
(tests/checkpoint/hf_llama_test.py).

usage: tiny_hf_moe.py KIND DIR
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "checkpoint"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import hf_decoder_reference as ref  # noqa: E402
import hf_llama_test as hf  # noqa: E402

_COMMON = {"vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 48,
           "attention_dropout": 0.0, "output_router_logits": False}

CONFIGS = {
    "mixtral": dict(_COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                    rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=64,
                    router_aux_loss_coef=0.02, router_jitter_noise=0.0, tie_word_embeddings=False,
                    torch_dtype="float32"),
    "qwen3_moe": dict(_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                      head_dim=16, intermediate_size=64, moe_intermediate_size=16, num_experts=8,
                      num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0,
                      attention_bias=False, use_sliding_window=False, sliding_window=None,
                      router_aux_loss_coef=0.001, tie_word_embeddings=True,
                      torch_dtype="bfloat16"),
}
CONFIGS["qwen3_moe_dense0"] = dict(CONFIGS["qwen3_moe"], head_dim=8, num_experts=4,
                                   num_experts_per_tok=2, norm_topk_prob=True,
                                   mlp_only_layers=[0], tie_word_embeddings=False)

# Its original context (16) a third of the deck's, so that the YaRN ramp falls inside it.
CONFIGS["deepseek_v3"] = dict(
    _COMMON, num_hidden_layers=3, num_key_value_heads=4, architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3", intermediate_size=48, moe_intermediate_size=8, n_routed_experts=8,
    n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2, norm_topk_prob=True,
    routed_scaling_factor=2.5, first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
    rms_norm_eps=1e-6, rope_theta=10000.0, topk_method="noaux_tc", scoring_func="sigmoid",
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                  "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
    attention_bias=False, num_nextn_predict_layers=0, tie_word_embeddings=False, torch_dtype="float32")


def random_weights(config, seed, dtype="F32"):
    """Random float32 weights, in HF's layout, that `dtype` holds exactly, scaled so that the
    logits spread over several units, the routing varies from token to token and a greedy
    continuation varies (norm weights around 1; a small embedding, since a tied one would make
    each token predict itself)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in ref.parameter_names(config).items():
        if name.endswith("e_score_correction_bias"):  # around 0, as wide as the scores' spread
            a = 0.3 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            scale = 0.3 if name.endswith("embed_tokens.weight") else 3.0 / np.sqrt(shape[1])
            a = scale * rng.standard_normal(shape)
        a = a.astype(np.float32)
        if dtype == "BF16":  # truncated to bf16's 8 bits of mantissa
            a = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        out[name] = a
    return out


def write(kind, directory, seed=3, dtype="F32", shards=1):
    """Writes CONFIGS[kind] with random weights into `directory`; returns (config, weights)."""
    config = CONFIGS[kind]
    weights = random_weights(config, seed, dtype)
    hf.write_hf_dir(directory, config, weights, dtype, shards)
    return config, weights


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CONFIGS:
        sys.exit(__doc__)
    write(sys.argv[1], sys.argv[2])
