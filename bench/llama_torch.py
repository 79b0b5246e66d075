"""Llama 3's block in PyTorch as meshtrain computes it (family "llama", HF's LlamaForCausalLM):
pre-RMSNorm blocks (eps 1e-5, a weight, no bias), rotary positions on queries and keys (base
500000, no scaling, the two halves of each head rotated as HF's rotate_half), grouped-query causal
attention scaled by 1/sqrt(head size), a SwiGLU feed-forward (down(silu(gate(x)) * up(x))), no
biases anywhere, an untied head, and the mean cross-entropy over every token.

Beside gpt2_torch.py, for the CPU benchmark baseline (bench/cpu/compare_pytorch.py --model
llama), which trains what `meshtrain bench --suite step --model llama` trains (src/app/
bench_step.cpp, llama_step_spec). The q/k/v and gate/up projections are each one Linear, their
outputs split: the same products as separate ones, in fewer and larger GEMMs. Import it after
`torch` is known to be importable; it imports torch itself.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2_torch import SDPA


def rms_norm(channels, eps):
    """nn.RMSNorm where PyTorch has it (2.4 and later), else the same formula by hand."""
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(channels, eps=eps)
    return _RMSNorm(channels, eps)


class _RMSNorm(nn.Module):
    def __init__(self, channels, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotary_tables(context, head_size, theta):
    """cos and sin of every (position, frequency), each (T, HS): frequency i of the first half
    repeated in the second, as HF lays them out for rotate_half."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)  # (T, HS/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """x (B, NH, T, HS) rotated by the tables (T, HS), in x's precision (bf16 under autocast)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, channels, heads, kv_heads, ffn_hidden, eps):
        super().__init__()
        self.heads, self.kv_heads, self.head_size = heads, kv_heads, channels // heads
        self.norm1 = rms_norm(channels, eps)
        # qkv's output features are [q (NH x HS) | k (KV x HS) | v (KV x HS)]
        self.qkv = nn.Linear(channels, (heads + 2 * kv_heads) * self.head_size, bias=False)
        self.proj = nn.Linear(heads * self.head_size, channels, bias=False)
        self.norm2 = rms_norm(channels, eps)
        self.gate_up = nn.Linear(channels, 2 * ffn_hidden, bias=False)  # [gate | up]
        self.down = nn.Linear(ffn_hidden, channels, bias=False)

    def attention(self, q, k, v):
        """q (B, NH, T, HS), k and v (B, KV, T, HS) -> (B, NH, T, HS), causal."""
        group = self.heads // self.kv_heads
        if SDPA is not None:
            try:
                return SDPA(q, k, v, is_causal=True, enable_gqa=group > 1)
            except TypeError:  # 2.0 to 2.4: no enable_gqa
                pass
        k, v = (y.repeat_interleave(group, dim=1) for y in (k, v))
        if SDPA is not None:
            return SDPA(q, k, v, is_causal=True)
        t = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))  # (B, NH, T, T)
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        hs = self.head_size
        q, k, v = self.qkv(self.norm1(x)).split(
            (self.heads * hs, self.kv_heads * hs, self.kv_heads * hs), dim=2)
        # (B, T, n x HS) -> (B, n, T, HS)
        q = q.view(b, t, self.heads, hs).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, hs).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, hs).transpose(1, 2)
        y = self.attention(rotate(q, cos, sin), rotate(k, cos, sin), v)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, self.heads * hs))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab, context, layers, heads, kv_heads, channels, ffn_hidden,
                 theta=500000.0, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, channels)
        self.blocks = nn.ModuleList(Block(channels, heads, kv_heads, ffn_hidden, eps)
                                    for _ in range(layers))
        self.norm_f = rms_norm(channels, eps)
        self.lm_head = nn.Linear(channels, vocab, bias=False)
        cos, sin = rotary_tables(context, channels // heads, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers), as gpt2_torch.GPT2
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) \
                    else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
