"""Re-statement of the self-attention classes of the fast.ai course (Part 2, 2022/23).

Why a re-statement: the classes are defined in a course notebook; no package ships them.

Published source: fastai/course22p2 ``nbs/27_attention.ipynb`` (HEAD df9323235bc3), as also
transcribed in the user's notes (seed 001):

* cell 9  ``SelfAttention(ni)``: GroupNorm(1, ni), separate q/k/v/proj Linear layers,
  ``forward(self, x)``. Exported under block id ``fastai.SelfAttention``.
* cell 19 ``SelfAttention(ni)``: BatchNorm2d(ni), fused ``qkv = Linear(ni, 3*ni)`` chunked
  [Q | K | V], ``forward(self, inp)``. The notebook re-uses the name ``SelfAttention``; here it
  is ``SelfAttentionFused`` so both can live in one module. Also exported under block id
  ``fastai.SelfAttention`` (told apart by the ``qkv.*`` / ``norm.running_mean`` keys).
* cell 29 ``SelfAttentionMultiHead(ni, nheads)``: BatchNorm2d, fused qkv split into heads
  BEFORE the q/k/v chunk (per-head [q_h | k_h | v_h] layout), ``forward(self, inp)``.

Quirks kept exactly: scores are DIVIDED by ``math.sqrt(ni)`` (``math.sqrt(ni / nheads)`` for the
multi-head class) after the matmul; the residual is added inside the block.
"""

import math

import torch
from torch import nn
from einops import rearrange


class SelfAttention(nn.Module):
    """nbs/27_attention.ipynb cell 9 (GroupNorm, separate q/k/v)."""

    def __init__(self, ni):
        super().__init__()
        self.scale = math.sqrt(ni)
        self.norm = nn.GroupNorm(1, ni)
        self.q = nn.Linear(ni, ni)
        self.k = nn.Linear(ni, ni)
        self.v = nn.Linear(ni, ni)
        self.proj = nn.Linear(ni, ni)

    def forward(self, x):
        inp = x
        n, c, h, w = x.shape
        x = self.norm(x)
        x = x.view(n, c, -1).transpose(1, 2)
        q = self.q(x)
        k = self.k(x)
        v = self.v(x)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = self.proj(x)
        x = x.transpose(1, 2).reshape(n, c, h, w)
        return x + inp


class SelfAttentionFused(nn.Module):
    """nbs/27_attention.ipynb cell 19 (published as ``SelfAttention``: BatchNorm2d, fused qkv)."""

    def __init__(self, ni):
        super().__init__()
        self.scale = math.sqrt(ni)
        self.norm = nn.BatchNorm2d(ni)
        self.qkv = nn.Linear(ni, ni * 3)
        self.proj = nn.Linear(ni, ni)

    def forward(self, inp):
        n, c, h, w = inp.shape
        x = self.norm(inp).view(n, c, -1).transpose(1, 2)
        q, k, v = torch.chunk(self.qkv(x), 3, dim=-1)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = self.proj(x).transpose(1, 2).reshape(n, c, h, w)
        return x + inp


class SelfAttentionMultiHead(nn.Module):
    """nbs/27_attention.ipynb cell 29."""

    def __init__(self, ni, nheads):
        super().__init__()
        self.nheads = nheads
        self.scale = math.sqrt(ni / nheads)
        self.norm = nn.BatchNorm2d(ni)
        self.qkv = nn.Linear(ni, ni * 3)
        self.proj = nn.Linear(ni, ni)

    def forward(self, inp):
        n, c, h, w = inp.shape
        x = self.norm(inp).view(n, c, -1).transpose(1, 2)
        x = self.qkv(x)
        x = rearrange(x, 'n s (h d) -> (n h) s d', h=self.nheads)
        q, k, v = torch.chunk(x, 3, dim=-1)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = rearrange(x, '(n h) s d -> n s (h d)', h=self.nheads)
        x = self.proj(x).transpose(1, 2).reshape(n, c, h, w)
        return x + inp
