"""Hugging Face's LlamaForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM and
DeepseekV3ForCausalLM, forward only, in fp64 NumPy (DeepSeek-V3's latent attention, YaRN and
router in deepseek_v3_reference.py).

Written from the published semantics of transformers' modeling_llama.py, modeling_qwen3.py,
modeling_mixtral.py, modeling_qwen3_moe.py and modeling_rope_utils.py (the "default" and
"llama3" rotary initialisations), independently of
meshtrain's C++: the tests hold meshtrain to this, so it must share none of meshtrain's code or
conventions beyond Hugging Face's names. Everything is fp64, whatever the weights' dtype, so that
the only rounding left in a comparison is meshtrain's.

Inputs are what a Hugging Face directory holds: `weights`, a dict of HF tensor names
("model.embed_tokens.weight", "model.layers.{i}.self_attn.q_proj.weight", ...) to arrays in
nn.Linear's (out, in) layout, and `config`, the config.json dict. Entry points:
    decoder_logits(weights, config, tokens)             -> (B, T, V) logits
    mean_cross_entropy(weights, config, tokens, targets) -> the mean loss over every position
    greedy_generate(weights, config, prompt, steps)     -> the `steps` argmax continuations
Only numpy; no torch.
"""

import math

import numpy as np

FAMILIES = ("llama", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3")
QK_NORM = ("qwen3", "qwen3_moe")  # RMSNorm of each query and key head before the rotation


# ---- the configuration --------------------------------------------------------------------------

def rope_settings(config):
    """(rope_theta, scaling dict or None) from either config.json form: the classic top-level
    `rope_theta` + `rope_scaling` (with "rope_type", or the older "type"), or the newer
    `rope_parameters` that holds rope_theta and the scaling fields together."""
    if config.get("rope_parameters"):
        params = dict(config["rope_parameters"])
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    else:
        params = dict(config.get("rope_scaling") or {})
        theta = float(config.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("llama3", "yarn"):
        raise NotImplementedError(f"rope_type {kind!r}: this reference knows 'default', 'llama3' and 'yarn'")
    return theta, dict(params, rope_type=kind)


def head_dim(config):
    """Qwen 3 states head_dim (128 whatever hidden_size / heads); Llama may omit it."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def check_config(config):
    family = config.get("model_type")
    if family not in FAMILIES:
        raise NotImplementedError(f"model_type {family!r}: this reference knows {FAMILIES}")
    if config.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {config['hidden_act']!r}: only 'silu' (SwiGLU)")
    if config.get("use_sliding_window"):
        raise NotImplementedError("use_sliding_window: this reference is full causal attention")
    if family == "deepseek_v3":
        return deepseek_v3().check_config(config)
    if family == "qwen3_moe" and config.get("shared_expert_intermediate_size"):
        raise NotImplementedError("shared_expert_intermediate_size: Qwen3-MoE has no shared expert")
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")


# ---- the operations -----------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """weight * x / sqrt(mean(x^2) + eps) over the last axis (HF's LlamaRMSNorm/Qwen3RMSNorm;
    HF computes it in fp32, here fp64 like everything else)."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def inverse_frequencies(config):
    """The rotary inverse frequencies, (head_dim / 2,): theta^(-2i / d), then, for rope_type
    "yarn", YaRN's ramp (deepseek_v3_reference.yarn_inverse_frequencies), and for "llama3",
    Llama 3.1's rescaling by wavelength 2 pi / f against the original context L: wavelengths
    below L / high_freq_factor kept, above L / low_freq_factor divided by `factor`, and between
    the two a linear blend in L / wavelength of the divided and the kept."""
    theta, scaling = rope_settings(config)
    d = head_dim(config)
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if scaling is None:
        return inv
    if scaling["rope_type"] == "yarn":  # DeepSeek-V3's reference holds YaRN (modeling_rope_utils.py)
        ds = deepseek_v3()
        return ds.yarn_inverse_frequencies(config, ds.rope_parameters(config), d)
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2.0 * math.pi / inv
    out = np.where(wavelength > original / low, inv / factor, inv)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1.0 - smooth) * inv / factor + smooth * inv
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(between, blended, out)


def rotate(x, positions, inv_freq):
    """The rotate-half rotary embedding of x (..., T, d): channel i pairs with i + d/2, both
    turned by angle position * inv_freq[i] (HF's apply_rotary_pos_emb, cos/sin of the angles
    repeated over the two halves)."""
    angles = np.outer(positions.astype(np.float64), inv_freq)  # (T, d/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    half = x.shape[-1] // 2
    rotated_half = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated_half * sin


def linear(x, weights, name):
    """x @ W^T (+ b): nn.Linear with its (out, in) weight; the bias only where the weights
    have one (Llama's attention_bias / mlp_bias; Llama 3 and Qwen 3 have none)."""
    y = x @ np.asarray(weights[name + ".weight"], dtype=np.float64).T
    bias = weights.get(name + ".bias")
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


def silu(x):
    return x / (1.0 + np.exp(-x))


def attention(x, weights, config, layer, logit_maxima=None):
    """Causal grouped-query self-attention of one layer on x (B, T, C) -> (B, T, C). With a dict
    `logit_maxima`, logit_maxima[layer] becomes each head's largest pre-softmax logit (NH,) over
    the unmasked pairs (MuonClip's S_max, Kimi K2)."""
    B, T, _ = x.shape
    NH = config["num_attention_heads"]
    KVH = config.get("num_key_value_heads") or NH
    D = head_dim(config)
    eps = float(config["rms_norm_eps"])
    p = f"model.layers.{layer}.self_attn."
    q = linear(x, weights, p + "q_proj").reshape(B, T, NH, D)
    k = linear(x, weights, p + "k_proj").reshape(B, T, KVH, D)
    v = linear(x, weights, p + "v_proj").reshape(B, T, KVH, D)
    if config["model_type"] in QK_NORM:  # per-head norms of head_dim, before the rotation
        q = rms_norm(q, np.asarray(weights[p + "q_norm.weight"], dtype=np.float64), eps)
        k = rms_norm(k, np.asarray(weights[p + "k_norm.weight"], dtype=np.float64), eps)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, heads, T, D)
    window = config.get("sliding_window") if config["model_type"] == "mixtral" else None
    if window is not None and window < T:
        raise NotImplementedError(f"sliding_window {window} < {T} positions: this reference is "
                                  "full causal attention")
    inv_freq = inverse_frequencies(config)
    positions = np.arange(T)
    # YaRN's attention factor multiplies cos and sin (LlamaRotaryEmbedding's attention_scaling).
    _, scaling = rope_settings(config)
    amplitude = deepseek_v3().rotary_amplitude(config) if scaling and scaling["rope_type"] == "yarn" else 1.0
    q, k = amplitude * rotate(q, positions, inv_freq), amplitude * rotate(k, positions, inv_freq)
    group = NH // KVH
    kv_of_head = np.arange(NH) // group  # query head h reads key/value head h // group
    k, v = k[:, kv_of_head], v[:, kv_of_head]
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)  # (B, NH, T, T)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    if logit_maxima is not None:
        logit_maxima[layer] = scores.max(axis=(0, 2, 3))
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    heads_out = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, NH * D)
    return linear(heads_out, weights, p + "o_proj")


def swiglu(x, weights, gate, up, down):
    """down(silu(gate(x)) * up(x)): LlamaMLP, Qwen3MoeMLP, and MixtralBlockSparseTop2MLP with
    gate = w1, up = w3, down = w2."""
    return linear(silu(linear(x, weights, gate)) * linear(x, weights, up), weights, down)


def feed_forward(x, weights, layer):
    p = f"model.layers.{layer}.mlp."
    return swiglu(x, weights, p + "gate_proj", p + "up_proj", p + "down_proj")


def is_moe_layer(config, layer):
    """Mixtral: every layer. Qwen3-MoE: a layer not in mlp_only_layers whose index + 1 is a
    multiple of decoder_sparse_step, when num_experts > 0 (Qwen3MoeDecoderLayer)."""
    family = config["model_type"]
    if family == "mixtral":
        return True
    if family != "qwen3_moe":
        return False
    return (layer not in (config.get("mlp_only_layers") or []) and num_experts(config) > 0
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0)


def expert_names(config, layer, e):
    """(gate, up, down) linear names of expert e."""
    if config["model_type"] == "mixtral":
        p = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
        return p + "w1", p + "w3", p + "w2"
    p = f"model.layers.{layer}.mlp.experts.{e}."
    return p + "gate_proj", p + "up_proj", p + "down_proj"


def router_name(config, layer):
    block = "block_sparse_moe" if config["model_type"] == "mixtral" else "mlp"
    return f"model.layers.{layer}.{block}.gate"


def num_experts(config):
    """Mixtral: num_local_experts. Qwen3-MoE: num_experts (transformers 4's name) or
    num_local_experts (transformers 5 writes this one)."""
    if config["model_type"] == "mixtral":
        return config.get("num_local_experts", 8)
    return config.get("num_experts", config.get("num_local_experts", 128))


def sparse_moe(x, weights, config, layer):
    """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock on x (B, T, C): per token, the softmax of
    the router's logits, its top num_experts_per_tok probabilities (best first; equal ones to
    the lower expert index), renormalised to sum 1 (Mixtral always, Qwen3-MoE where
    norm_topk_prob), and the sum of the chosen experts' SwiGLU outputs weighted by them."""
    B, T, C = x.shape
    tokens = x.reshape(B * T, C)
    logits = linear(tokens, weights, router_name(config, layer))  # (N, E)
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    k = config.get("num_experts_per_tok", 2 if config["model_type"] == "mixtral" else 8)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (N, k)
    gates = np.take_along_axis(probs, chosen, axis=-1)
    if config["model_type"] == "mixtral" or config.get("norm_topk_prob", False):
        gates = gates / gates.sum(axis=-1, keepdims=True)
    out = np.zeros_like(tokens)
    for e in range(num_experts(config)):
        rows, slot = np.nonzero(chosen == e)
        if rows.size:
            out[rows] += gates[rows, slot][:, None] * swiglu(tokens[rows], weights, *expert_names(config, layer, e))
    return out.reshape(B, T, C)


def mlp_of_layer(x, weights, config, layer):
    return sparse_moe(x, weights, config, layer) if is_moe_layer(config, layer) else \
        feed_forward(x, weights, layer)


def lm_head_weight(weights, config):
    """lm_head.weight, or the token embedding where tied (tie_word_embeddings: Qwen3Config's
    default is false, as LlamaConfig's; a tied checkpoint may still carry lm_head.weight)."""
    if config.get("tie_word_embeddings", False):
        return weights["model.embed_tokens.weight"]
    return weights["lm_head.weight"]


def deepseek_v3():
    """deepseek_v3_reference, DeepSeek-V3's own layers: imported here rather than at the top
    because it builds on this module's operations."""
    import deepseek_v3_reference
    return deepseek_v3_reference


def layer_functions(config):
    """(attention, mlp) of a family's decoder layer, each f(x, weights, config, layer)."""
    if config["model_type"] == "deepseek_v3":
        return deepseek_v3().latent_attention, deepseek_v3().mlp_of_layer
    return attention, mlp_of_layer


# ---- the model ----------------------------------------------------------------------------------

def decoder_layer(x, weights, config, i, logit_maxima=None):
    """Decoder layer i (its tensors under model.layers.{i}.) on x (B, T, C): the pre-norm
    attention and MLP branches, each added to the residual stream."""
    eps = float(config["rms_norm_eps"])
    w = lambda name: np.asarray(weights[name], dtype=np.float64)  # noqa: E731
    attend, mlp = layer_functions(config)
    p = f"model.layers.{i}."
    normed = rms_norm(x, w(p + "input_layernorm.weight"), eps)
    x = x + (attend(normed, weights, config, i) if logit_maxima is None else
             attend(normed, weights, config, i, logit_maxima))
    return x + mlp(rms_norm(x, w(p + "post_attention_layernorm.weight"), eps), weights, config, i)


def decoder_hidden(weights, config, tokens, logit_maxima=None):
    """The last hidden state (B, T, C) after model.norm (HF's last_hidden_state) for token ids
    (B, T); logit_maxima as attention's."""
    check_config(config)
    x = np.asarray(weights["model.embed_tokens.weight"], dtype=np.float64)[np.asarray(tokens, dtype=np.int64)]
    for i in range(config["num_hidden_layers"]):
        x = decoder_layer(x, weights, config, i, logit_maxima)
    return rms_norm(x, np.asarray(weights["model.norm.weight"], dtype=np.float64),
                    float(config["rms_norm_eps"]))


def decoder_logits(weights, config, tokens):
    """Logits (B, T, V) for token ids (B, T) (or (T,): then (T, V))."""
    tokens = np.asarray(tokens, dtype=np.int64)
    single = tokens.ndim == 1
    if single:
        tokens = tokens[None]
    x = decoder_hidden(weights, config, tokens)
    logits = x @ np.asarray(lm_head_weight(weights, config), dtype=np.float64).T
    return logits[0] if single else logits


def cross_entropies(logits, targets):
    """-log softmax(logits)[target] at every position (log-sum-exp shifted by the maximum)."""
    top = logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(logits, np.asarray(targets, dtype=np.int64)[..., None], axis=-1)[..., 0]
    return log_z - picked


def mean_cross_entropy(weights, config, tokens, targets):
    """The mean next-token cross-entropy over every position of every row (B, T)."""
    return float(cross_entropies(decoder_logits(weights, config, tokens), targets).mean())


def greedy_generate(weights, config, prompt, steps):
    """The `steps` tokens that argmax decoding appends to `prompt` (a list of ids), recomputing
    the whole prefix each step (no cache: nothing here can go stale). Ties go to the lowest id
    (np.argmax), as HF's torch.argmax on CPU does in practice."""
    ids = [int(t) for t in prompt]
    out = []
    for _ in range(steps):
        nxt = int(np.argmax(decoder_logits(weights, config, np.array(ids))[-1]))
        ids.append(nxt)
        out.append(nxt)
    return out


def parameter_names(config):
    """The HF tensor names (and shapes) of a config: what a directory must hold."""
    if config["model_type"] == "deepseek_v3":
        return deepseek_v3().parameter_names(config)
    C, V = config["hidden_size"], config["vocab_size"]
    NH = config["num_attention_heads"]
    KVH = config.get("num_key_value_heads") or NH
    D, F = head_dim(config), config["intermediate_size"]
    family = config["model_type"]
    FE = F if family == "mixtral" else config.get("moe_intermediate_size")  # an expert's width
    names = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                      p + "self_attn.q_proj.weight": (NH * D, C),
                      p + "self_attn.k_proj.weight": (KVH * D, C),
                      p + "self_attn.v_proj.weight": (KVH * D, C),
                      p + "self_attn.o_proj.weight": (C, NH * D)})
        if is_moe_layer(config, i):
            names[router_name(config, i) + ".weight"] = (num_experts(config), C)
            for e in range(num_experts(config)):
                gate, up, down = expert_names(config, i, e)
                names.update({gate + ".weight": (FE, C), up + ".weight": (FE, C), down + ".weight": (C, FE)})
        else:
            names.update({p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                          p + "mlp.down_proj.weight": (C, F)})
        if family in QK_NORM:
            names.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    if not config.get("tie_word_embeddings", False):
        names["lm_head.weight"] = (V, C)
    return names
