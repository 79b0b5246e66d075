"""GPT-2 in PyTorch as meshtrain computes it: learned positions, pre-LayerNorm blocks (eps 1e-5),
causal attention scaled by 1/sqrt(head size), tanh GELU, an MLP 4 x d_model wide, the head tied
to the token embedding unless told otherwise, and the mean cross-entropy over every token.

One module for everything that puts meshtrain beside PyTorch: the CPU and GPU benchmark baselines
(bench/cpu/compare_pytorch.py, bench/gpu/compare_pytorch.py) and the Hugging Face export test
(tests/checkpoint/hf_export_test.py), which loads an exported model.safetensors with
load_hf_tensors() and checks the loss against `meshtrain eval`. Import it after `torch` is known
to be importable; it imports torch itself.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# PyTorch 2.0 and later; older ones get the explicit masked softmax (what meshtrain computes).
SDPA = getattr(F, "scaled_dot_product_attention", None)


class Block(nn.Module):
    def __init__(self, channels, heads, context, attention="auto"):
        super().__init__()
        self.heads = heads
        self.use_sdpa = SDPA is not None and attention != "explicit"
        self.ln1 = nn.LayerNorm(channels, eps=1e-5)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels, eps=1e-5)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fc_proj = nn.Linear(4 * channels, channels)
        if not self.use_sdpa:
            self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril(),
                                 persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        # qkv's output features are [q | k | v], each split into heads contiguously
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        # (B, T, C) -> (B, NH, T, HS)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        if self.use_sdpa:
            y = SDPA(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))  # (B, NH, T, T)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """attention: "auto" (SDPA where PyTorch has it) or "explicit" (masked softmax)."""

    def __init__(self, vocab=50304, context=1024, layers=12, heads=12, channels=768, tied=True,
                 attention="auto"):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, channels)
        self.wpe = nn.Embedding(context, channels)
        self.blocks = nn.ModuleList(Block(channels, heads, context, attention)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels, eps=1e-5)
        self.lm_head = nn.Linear(channels, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight  # as GPT-2
        # GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def load_hf_tensors(model, tensors):
    """Copies Hugging Face GPT2LMHeadModel tensors ({name: numpy array or tensor}) into `model`.
    HF's Conv1D weights are (in, out), nn.Linear's (out, in): those are transposed. A tied model
    takes its head from transformer.wte.weight; an untied one needs lm_head.weight. Raises
    KeyError for a missing tensor and ValueError for a tensor left over or of the wrong shape."""
    left = dict(tensors)

    def take(name, param, transpose=False):
        value = torch.as_tensor(left.pop(name)).float()
        if transpose:
            value = value.t()
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(f"{name}: shape {tuple(value.shape)}, the model needs "
                             f"{tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(value)

    take("transformer.wte.weight", model.wte.weight)
    take("transformer.wpe.weight", model.wpe.weight)
    for i, block in enumerate(model.blocks):
        h = f"transformer.h.{i}."
        take(h + "ln_1.weight", block.ln1.weight)
        take(h + "ln_1.bias", block.ln1.bias)
        take(h + "attn.c_attn.weight", block.qkv.weight, transpose=True)
        take(h + "attn.c_attn.bias", block.qkv.bias)
        take(h + "attn.c_proj.weight", block.proj.weight, transpose=True)
        take(h + "attn.c_proj.bias", block.proj.bias)
        take(h + "ln_2.weight", block.ln2.weight)
        take(h + "ln_2.bias", block.ln2.bias)
        take(h + "mlp.c_fc.weight", block.fc.weight, transpose=True)
        take(h + "mlp.c_fc.bias", block.fc.bias)
        take(h + "mlp.c_proj.weight", block.fc_proj.weight, transpose=True)
        take(h + "mlp.c_proj.bias", block.fc_proj.bias)
    take("transformer.ln_f.weight", model.ln_f.weight)
    take("transformer.ln_f.bias", model.ln_f.bias)
    if model.lm_head.weight is not model.wte.weight:
        take("lm_head.weight", model.lm_head.weight)
    if left:
        raise ValueError(f"tensors the model has no place for: {sorted(left)}")
