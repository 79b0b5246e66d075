"""Hugging Face's DeepseekV3ForCausalLM (model_type "deepseek_v3": DeepSeek-V3/R1, Kimi K2,
Moonlight), forward only, in fp64 NumPy: the parts that differ from the Llama-shaped decoder of
hf_decoder_reference.py, which runs the layers and calls these for the attention and the MLP.

Written from the published formulas (DeepSeek-V2/V3 reports for multi-head latent attention and
the noaux_tc router, the YaRN paper for the rotary scaling) and from the semantics transformers
gives them (modeling_deepseek_v3.py, configuration_deepseek_v3.py, modeling_rope_utils.py's yarn
initialisation), not from meshtrain. Where transformers departs from the papers, this follows
transformers and says so:
- both latent RMSNorms (q_a_layernorm, kv_a_layernorm) use eps 1e-6 whatever rms_norm_eps says;
- the rotary channels of a query head's last qk_rope_head_dim rows, and of the one shared rotary
  key, pair as (x0, x1), (x2, x3), ... where rope_interleave is true (the default) and as
  (x_i, x_{i+d/2}) where false; either way the rotated pairs are written out as [first members |
  second members], so with interleave the output is de-interleaved;
- the softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-0.5 times mscale(factor,
  mscale_all_dim)^2 for any rope_type but "default", and YaRN's attention_factor multiplies cos
  and sin (so mscale_all_dim alone, without mscale, scales both);
- config.json's topk_method, scoring_func and moe_layer_freq are not read (the router is always
  noaux_tc, every layer from first_k_dense_replace on a mixture);
- the MTP layers (num_nextn_predict_layers) are no part of DeepseekV3ForCausalLM: mtp_losses
  below follows the DeepSeek-V3 report (section 2.2) in the layout of DeepSeek's checkpoints and
  of transformers' generic MtpLayer (modeling_layers.py): depth k at layer index
  num_hidden_layers + k - 1 joins [enorm(embed(token t+k)) | hnorm(h_{k-1})] (embedding first),
  projects it with eh_proj, runs one decoder layer (always a mixture: transformers' MTP config
  sets first_k_dense_replace 0), normalises with shared_head.norm, and predicts token t+k+1 with
  the main lm_head; h_0 is the main model's last hidden state after model.norm.
Weights are HF's on-disk names: model.layers.{i}.self_attn.{q_proj | q_a_proj, q_a_layernorm,
q_b_proj}, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; mlp.{gate, up, down}_proj (dense
layers), mlp.gate.weight, mlp.gate.e_score_correction_bias, mlp.experts.{e}.{gate, up,
down}_proj, mlp.shared_experts.{gate, up, down}_proj.
"""

import math

import numpy as np

import hf_decoder_reference as base

# DeepseekV3Config's defaults (DeepSeek-V3's shapes) for the keys read here, where a config.json
# leaves one out.
DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
            "first_k_dense_replace": 3, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "rope_interleave": True, "moe_intermediate_size": 2048, "intermediate_size": 18432,
            "max_position_embeddings": 4096}
LATENT_NORM_EPS = 1e-6  # DeepseekV3RMSNorm's default: the latent norms are built without rms_norm_eps


def setting(config, key):
    """config[key], or DeepseekV3Config's default where config.json omits it (q_lora_rank may
    be null: the full-rank q_proj)."""
    return config[key] if key in config else DEFAULTS[key]


def check_config(config):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads != heads:
        raise ValueError(f"num_key_value_heads {kv_heads} != num_attention_heads {heads}: latent "
                         "attention expands its keys and values per head")
    if setting(config, "qk_rope_head_dim") % 2:
        raise ValueError(f"qk_rope_head_dim {setting(config, 'qk_rope_head_dim')} must be even")
    experts, groups = setting(config, "n_routed_experts"), setting(config, "n_group")
    if experts % groups or experts // groups < 2:
        raise ValueError(f"n_routed_experts {experts} must split into n_group {groups} groups of "
                         "at least two (a group's score is the sum of its top two)")
    top_groups, k = setting(config, "topk_group"), setting(config, "num_experts_per_tok")
    if not 1 <= top_groups <= groups or k > top_groups * experts // groups:
        raise ValueError(f"topk_group {top_groups} of {groups} groups leaves "
                         f"{top_groups * experts // groups} experts for num_experts_per_tok {k}")
    rope = rope_parameters(config)
    if rope["rope_type"] not in ("default", "yarn"):
        raise NotImplementedError(f"rope_type {rope['rope_type']!r}: this reference knows "
                                  "'default' and 'yarn'")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise NotImplementedError("partial_rotary_factor: DeepSeek-V3 rotates all qk_rope_head_dim channels")


# ---- rotary: default and YaRN ------------------------------------------------------------------

def rope_parameters(config):
    """One dict from either config.json form (`rope_parameters`, or `rope_theta` + `rope_scaling`
    with "rope_type" or the older "type"), original_max_position_embeddings defaulting to
    max_position_embeddings as transformers' standardisation does."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    original = config.get("original_max_position_embeddings", setting(config, "max_position_embeddings"))
    params.setdefault("original_max_position_embeddings", original)
    return params


def yarn_mscale(factor, mscale=1.0):
    """YaRN's magnitude correction 0.1 m ln(s) + 1 (1 for s <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_factor(config, rope):
    """`factor`, or max_position_embeddings / original_max_position_embeddings where null."""
    if rope.get("factor") is not None:
        return float(rope["factor"])
    return setting(config, "max_position_embeddings") / float(rope["original_max_position_embeddings"])


def yarn_inverse_frequencies(config, rope, d):
    """YaRN's blend of the extrapolated frequencies theta^(-2i/d) and the interpolated ones
    (divided by factor): channel pairs that turn more than beta_fast times over the original
    context L keep theta^(-2i/d), those that turn fewer than beta_slow times are divided, and
    between them a linear ramp in i. The ramp's ends are the i at which a pair makes r turns in L,
    d ln(L / (2 pi r)) / (2 ln theta), floored/ceiled unless truncate is false, within [0, d-1]."""
    theta, L = float(rope["rope_theta"]), float(rope["original_max_position_embeddings"])
    factor = yarn_factor(config, rope)
    i_of_turns = lambda r: d * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta))  # noqa: E731
    low, high = i_of_turns(float(rope.get("beta_fast") or 32)), i_of_turns(float(rope.get("beta_slow") or 1))
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    kept = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    return kept / factor * ramp + kept * (1.0 - ramp)


def rotary_inverse_frequencies(config):
    """(qk_rope_head_dim / 2,) angular speeds of the rotary pairs."""
    rope, d = rope_parameters(config), setting(config, "qk_rope_head_dim")
    if rope["rope_type"] == "yarn":
        return yarn_inverse_frequencies(config, rope, d)
    return 1.0 / float(rope["rope_theta"]) ** (np.arange(0, d, 2, dtype=np.float64) / d)


def rotary_amplitude(config):
    """YaRN's attention_factor, the factor on cos and sin: as given, else mscale(factor,
    mscale) / mscale(factor, mscale_all_dim) where both are set (non-zero), else
    mscale(factor); 1 for the default rotary."""
    rope = rope_parameters(config)
    if rope["rope_type"] == "default":
        return 1.0
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor = yarn_factor(config, rope)
    if rope.get("mscale") and rope.get("mscale_all_dim"):
        return yarn_mscale(factor, float(rope["mscale"])) / yarn_mscale(factor, float(rope["mscale_all_dim"]))
    return yarn_mscale(factor)


def softmax_scale(config):
    """1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), times mscale(factor, mscale_all_dim)^2
    for a scaled rotary whose mscale_all_dim is set (DeepSeek-V3: 192^-0.5 * 1.3689^2)."""
    scale = (setting(config, "qk_nope_head_dim") + setting(config, "qk_rope_head_dim")) ** -0.5
    rope = rope_parameters(config)
    if rope["rope_type"] != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return scale


def rotate_pairs(x, positions, inv_freq, amplitude, interleaved):
    """The rotary embedding of x (..., T, d) as complex numbers: pair i, z = a + ib with (a, b) =
    (x_2i, x_2i+1) when interleaved, (x_i, x_i+d/2) otherwise, becomes amplitude * z *
    exp(i * position * inv_freq_i); written out [Re z_0..z_{d/2-1} | Im z_0..z_{d/2-1}]."""
    half = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    turn = np.exp(1j * np.outer(positions.astype(np.float64), inv_freq))  # (T, d/2)
    z = (a + 1j * b) * (amplitude * turn)
    return np.concatenate([z.real, z.imag], axis=-1)


# ---- multi-head latent attention ---------------------------------------------------------------

def latent_queries(x, weights, config, layer):
    """Queries (B, NH, T, d_nope + d_rope): q_proj(x), or q_b(RMSNorm_1e-6(q_a(x))) with a query
    rank; each head's rows are [no-position d_nope | rotary d_rope]."""
    B, T, _ = x.shape
    p = f"model.layers.{layer}.self_attn."
    if setting(config, "q_lora_rank") is None:
        q = base.linear(x, weights, p + "q_proj")
    else:
        norm = np.asarray(weights[p + "q_a_layernorm.weight"], dtype=np.float64)
        latent = base.rms_norm(base.linear(x, weights, p + "q_a_proj"), norm, LATENT_NORM_EPS)
        q = base.linear(latent, weights, p + "q_b_proj")
    d_qk = setting(config, "qk_nope_head_dim") + setting(config, "qk_rope_head_dim")
    return q.reshape(B, T, config["num_attention_heads"], d_qk).transpose(0, 2, 1, 3)


def latent_keys_values(x, weights, config, layer):
    """(k_nope (B, NH, T, d_nope), values (B, NH, T, d_v), k_rot (B, 1, T, d_rope)): one
    projection gives the kv latent (RMSNorm_1e-6) and the shared rotary key (not normed); kv_b
    expands the latent into each head's [k_nope | value] rows."""
    B, T, _ = x.shape
    p = f"model.layers.{layer}.self_attn."
    rank, d_n, d_v = (setting(config, k) for k in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
    compressed = base.linear(x, weights, p + "kv_a_proj_with_mqa")  # (B, T, rank + d_rope)
    norm = np.asarray(weights[p + "kv_a_layernorm.weight"], dtype=np.float64)
    latent = base.rms_norm(compressed[..., :rank], norm, LATENT_NORM_EPS)
    k_rot = compressed[..., None, rank:].transpose(0, 2, 1, 3)
    kv = base.linear(latent, weights, p + "kv_b_proj").reshape(B, T, config["num_attention_heads"], d_n + d_v)
    kv = kv.transpose(0, 2, 1, 3)
    return kv[..., :d_n], kv[..., d_n:], k_rot


def causal_softmax_attention(q, k, v, scale):
    """softmax(scale q k^T + causal mask) v per head; q, k (B, NH, T, d), v (B, NH, T, d_v)."""
    T = q.shape[2]
    scores = scale * (q @ k.transpose(0, 1, 3, 2))
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (probs / probs.sum(axis=-1, keepdims=True)) @ v


def latent_attention(x, weights, config, layer):
    """DeepseekV3Attention on x (B, T, C) -> (B, T, C): every head's key is [its k_nope | the
    shared rotated k_rot], its query [q_nope | rotated q_rot]; o_proj of the heads' outputs."""
    B, T, _ = x.shape
    d_n = setting(config, "qk_nope_head_dim")
    q = latent_queries(x, weights, config, layer)
    k_nope, v, k_rot = latent_keys_values(x, weights, config, layer)
    positions, inv_freq = np.arange(T), rotary_inverse_frequencies(config)
    amplitude, interleaved = rotary_amplitude(config), bool(setting(config, "rope_interleave"))
    q_rot = rotate_pairs(q[..., d_n:], positions, inv_freq, amplitude, interleaved)
    k_rot = rotate_pairs(k_rot, positions, inv_freq, amplitude, interleaved)
    q = np.concatenate([q[..., :d_n], q_rot], axis=-1)
    k = np.concatenate([k_nope, np.broadcast_to(k_rot, k_nope.shape[:-1] + k_rot.shape[-1:])], axis=-1)
    heads = causal_softmax_attention(q, k, v, softmax_scale(config))  # (B, NH, T, d_v)
    heads = heads.transpose(0, 2, 1, 3).reshape(B, T, -1)
    return base.linear(heads, weights, f"model.layers.{layer}.self_attn.o_proj")


# ---- the noaux_tc router and the mixture ------------------------------------------------------

def eligible_experts(keys, groups, top_groups):
    """(N, E) bool: the experts of each token's top_groups best groups, a group (E / groups
    consecutive experts) scored by the sum of its two highest keys; ties to the lower index."""
    N, E = keys.shape
    by_group = np.sort(keys.reshape(N, groups, E // groups), axis=-1)
    group_score = by_group[..., -1] + by_group[..., -2]  # (N, groups)
    best = np.argsort(-group_score, axis=-1, kind="stable")[:, :top_groups]
    chosen = np.zeros((N, groups), dtype=bool)
    np.put_along_axis(chosen, best, True, axis=-1)
    return np.repeat(chosen, E // groups, axis=-1)


def route_noaux_tc(tokens, weights, config, layer):
    """(experts (N, k), gates (N, k)) of DeepSeek-V3's router: scores s = sigmoid(x W^T); the
    choice by s + e_score_correction_bias among the eligible groups' experts (ties to the lower
    index); gates the unbiased s of the chosen, divided by their sum (+1e-20) where
    norm_topk_prob, times routed_scaling_factor."""
    p = f"model.layers.{layer}.mlp.gate."
    scores = 1.0 / (1.0 + np.exp(-base.linear(tokens, weights, p[:-1])))  # (N, E)
    keys = scores + np.asarray(weights[p + "e_score_correction_bias"], dtype=np.float64)
    eligible = eligible_experts(keys, setting(config, "n_group"), setting(config, "topk_group"))
    keys = np.where(eligible, keys, -np.inf)
    experts = np.argsort(-keys, axis=-1, kind="stable")[:, :setting(config, "num_experts_per_tok")]
    gates = np.take_along_axis(scores, experts, axis=-1)
    if setting(config, "norm_topk_prob"):
        gates = gates / (gates.sum(axis=-1, keepdims=True) + 1e-20)
    return experts, gates * float(setting(config, "routed_scaling_factor"))


def moe_with_shared_experts(x, weights, config, layer):
    """DeepseekV3MoE on x (B, T, C): the routed experts' SwiGLU outputs weighted by their gates,
    plus the shared experts' SwiGLU (one MLP of n_shared_experts * moe_intermediate_size)."""
    B, T, C = x.shape
    tokens = x.reshape(B * T, C)
    experts, gates = route_noaux_tc(tokens, weights, config, layer)
    p = f"model.layers.{layer}.mlp."
    out = np.zeros_like(tokens)
    for e in range(setting(config, "n_routed_experts")):
        rows, slot = np.nonzero(experts == e)
        if rows.size:
            q = f"{p}experts.{e}."
            out[rows] += gates[rows, slot][:, None] * base.swiglu(tokens[rows], weights, q + "gate_proj",
                                                                   q + "up_proj", q + "down_proj")
    if setting(config, "n_shared_experts"):
        q = p + "shared_experts."
        out += base.swiglu(tokens, weights, q + "gate_proj", q + "up_proj", q + "down_proj")
    return out.reshape(B, T, C)


def mlp_of_layer(x, weights, config, layer):
    """The first first_k_dense_replace layers dense (intermediate_size), the rest mixtures."""
    if layer < setting(config, "first_k_dense_replace"):
        return base.feed_forward(x, weights, layer)
    return moe_with_shared_experts(x, weights, config, layer)


# ---- what a directory holds -------------------------------------------------------------------

def attention_names(config, layer):
    """{name: shape} of one layer's latent attention."""
    C, NH = config["hidden_size"], config["num_attention_heads"]
    d_n, d_r, d_v = (setting(config, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    rq, rkv = setting(config, "q_lora_rank"), setting(config, "kv_lora_rank")
    p = f"model.layers.{layer}.self_attn."
    names = {p + "kv_a_proj_with_mqa.weight": (rkv + d_r, C), p + "kv_a_layernorm.weight": (rkv,),
             p + "kv_b_proj.weight": (NH * (d_n + d_v), rkv), p + "o_proj.weight": (C, NH * d_v)}
    if rq is None:
        names[p + "q_proj.weight"] = (NH * (d_n + d_r), C)
    else:
        names.update({p + "q_a_proj.weight": (rq, C), p + "q_a_layernorm.weight": (rq,),
                      p + "q_b_proj.weight": (NH * (d_n + d_r), rq)})
    if config.get("attention_bias"):
        names.update({p + n + ".bias": (names[p + n + ".weight"][0],)
                      for n in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj") if p + n + ".weight" in names})
    return names


def mlp_names(config, layer):
    """{name: shape} of one layer's dense MLP or mixture (router, bias, experts, shared)."""
    C, p = config["hidden_size"], f"model.layers.{layer}.mlp."
    swiglu = lambda q, F: {q + "gate_proj.weight": (F, C), q + "up_proj.weight": (F, C),  # noqa: E731
                           q + "down_proj.weight": (C, F)}
    if layer < setting(config, "first_k_dense_replace"):
        return swiglu(p, setting(config, "intermediate_size"))
    E, F = setting(config, "n_routed_experts"), setting(config, "moe_intermediate_size")
    names = {p + "gate.weight": (E, C), p + "gate.e_score_correction_bias": (E,)}
    for e in range(E):
        names.update(swiglu(f"{p}experts.{e}.", F))
    if setting(config, "n_shared_experts"):
        names.update(swiglu(p + "shared_experts.", F * setting(config, "n_shared_experts")))
    return names


def parameter_names(config):
    """The HF tensor names (and shapes) of a DeepseekV3ForCausalLM directory."""
    C, V = config["hidden_size"], config["vocab_size"]
    names = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,)})
        names.update(attention_names(config, i))
        names.update(mlp_names(config, i))
    if not config.get("tie_word_embeddings", False):
        names["lm_head.weight"] = (V, C)
    return names


# ---- multi-token prediction (DeepSeek-V3 report, section 2.2) ---------------------------------

def mtp_names(config, depth):
    """{name: shape} of MTP depth `depth` (1-based) as DeepSeek's checkpoints hold it, at layer
    index num_hidden_layers + depth - 1: its own tensors, the two copies of the shared embedding
    and head, and a mixture decoder layer."""
    C, V = config["hidden_size"], config["vocab_size"]
    layer = config["num_hidden_layers"] + depth - 1
    p = f"model.layers.{layer}."
    names = {p + "enorm.weight": (C,), p + "hnorm.weight": (C,), p + "eh_proj.weight": (C, 2 * C),
             p + "shared_head.norm.weight": (C,), p + "embed_tokens.weight": (V, C),
             p + "shared_head.head.weight": (V, C),
             p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,)}
    names.update(attention_names(config, layer))
    names.update(mlp_names(config, layer))
    return names


def mtp_losses(weights, config, tokens, targets):
    """Each MTP depth's mean cross-entropy over the rows (B, T) of token ids and their next
    tokens (targets[:, t] = token t + 1): depth k at position t < T - k reads token t + k
    (= targets[:, t + k - 1]) and predicts token t + k + 1 (= targets[:, t + k]); the positions
    past the sequence have no label and are left out (causal attention keeps them from the
    others, so the sequences are simply cut)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    eps = float(config["rms_norm_eps"])
    w = lambda name: np.asarray(weights[name], dtype=np.float64)  # noqa: E731
    embed, head = w("model.embed_tokens.weight"), np.asarray(base.lm_head_weight(weights, config), dtype=np.float64)
    h = base.decoder_hidden(weights, config, tokens)
    T = tokens.shape[1]
    losses = []
    for k in range(1, config.get("num_nextn_predict_layers", 0) + 1):
        n = T - k
        layer = config["num_hidden_layers"] + k - 1
        p = f"model.layers.{layer}."
        joined = np.concatenate([base.rms_norm(embed[targets[:, k - 1:k - 1 + n]], w(p + "enorm.weight"), eps),
                                 base.rms_norm(h[:, :n], w(p + "hnorm.weight"), eps)], axis=-1)
        x = base.decoder_layer(joined @ w(p + "eh_proj.weight").T, weights, mtp_layer_config(config), layer)
        h = base.rms_norm(x, w(p + "shared_head.norm.weight"), eps)
        losses.append(float(base.cross_entropies(h @ head.T, targets[:, k:k + n]).mean()))
    return losses


def mtp_layer_config(config):
    """The config an MTP decoder layer reads: every layer a mixture (transformers'
    get_mtp_config sets first_k_dense_replace to 0)."""
    return dict(config, first_k_dense_replace=0)
