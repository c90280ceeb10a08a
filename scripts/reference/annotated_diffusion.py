"""Re-statement of the attention blocks of Hugging Face's "The Annotated Diffusion Model".

Why a re-statement: the classes live in a blog post, not in any package (denoising-diffusion-pytorch,
which it ports, has since changed them).

Published source: huggingface/blog ``annotated-diffusion.md`` (current revision, commit
fd0b6566b04f), itself a port of lucidrains/denoising-diffusion-pytorch (~0.27.x). The same
code is quoted in the user's notes (seed 002, "copied from simple_diffusion.py").

Semantics kept exactly:
* ``Attention``: q scaled by ``dim_head ** -0.5`` BEFORE the q.k product, the (detached) row
  max is subtracted from the logits before the softmax, no norm and no residual inside
  (the U-Net wraps it as ``Residual(PreNorm(dim, Attention(dim)))``).
* ``LinearAttention``: q softmax over the feature axis (-2), k softmax over tokens (-1),
  q scaled AFTER its softmax, ``to_out = Sequential(Conv2d(hidden, dim, 1), GroupNorm(1, dim))``.

State-dict keys: ``to_qkv.weight`` (3*hidden, dim, 1, 1) (no bias), ``to_out.weight``/``to_out.bias``
(Attention) or ``to_out.0.weight``/``to_out.0.bias``/``to_out.1.weight``/``to_out.1.bias``
(LinearAttention).
"""

import torch
from torch import einsum, nn
from einops import rearrange


class Attention(nn.Module):
    def __init__(self, dim, heads=4, dim_head=32):
        super().__init__()
        self.scale = dim_head**-0.5
        self.heads = heads
        hidden_dim = dim_head * heads
        self.to_qkv = nn.Conv2d(dim, hidden_dim * 3, 1, bias=False)
        self.to_out = nn.Conv2d(hidden_dim, dim, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.to_qkv(x).chunk(3, dim=1)
        q, k, v = map(
            lambda t: rearrange(t, "b (h c) x y -> b h c (x y)", h=self.heads), qkv
        )
        q = q * self.scale

        sim = einsum("b h d i, b h d j -> b h i j", q, k)
        sim = sim - sim.amax(dim=-1, keepdim=True).detach()
        attn = sim.softmax(dim=-1)

        out = einsum("b h i j, b h d j -> b h i d", attn, v)
        out = rearrange(out, "b h (x y) d -> b (h d) x y", x=h, y=w)
        return self.to_out(out)


class LinearAttention(nn.Module):
    def __init__(self, dim, heads=4, dim_head=32):
        super().__init__()
        self.scale = dim_head**-0.5
        self.heads = heads
        hidden_dim = dim_head * heads
        self.to_qkv = nn.Conv2d(dim, hidden_dim * 3, 1, bias=False)
        self.to_out = nn.Sequential(nn.Conv2d(hidden_dim, dim, 1), nn.GroupNorm(1, dim))

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.to_qkv(x).chunk(3, dim=1)
        q, k, v = map(
            lambda t: rearrange(t, "b (h c) x y -> b h c (x y)", h=self.heads), qkv
        )

        q = q.softmax(dim=-2)
        k = k.softmax(dim=-1)

        q = q * self.scale
        context = torch.einsum("b h d n, b h e n -> b h d e", k, v)

        out = torch.einsum("b h d e, b h d n -> b h e n", context, q)
        out = rearrange(out, "b h c (x y) -> b (h c) x y", h=self.heads, x=h, y=w)
        return self.to_out(out)
