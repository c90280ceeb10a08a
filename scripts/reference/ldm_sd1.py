"""Re-statement of the Stable Diffusion 1.x attention blocks (CompVis latent-diffusion's ``ldm`` tree).

Why a re-statement: no package ships the SD 1.x tree. ``stable-diffusion-sdkit`` ships the SD 2.x
tree (Stability-AI/stablediffusion, ``scripts/upstream.py``), whose ``CrossAttention``,
``BasicTransformerBlock`` and ``SpatialTransformer`` changed: q and k are cast to float32 before the
logits (which makes the SD 2.x classes unrunnable in float16 / bfloat16 on the CPU, so the
half-precision twins of these blocks come from here), ``disable_self_attn``, ``use_linear`` and a
per-depth ``context_dim`` list (an int ``context_dim`` with ``depth > 1`` fails there, works here).

Published source: CompVis/latent-diffusion ``ldm/modules/attention.py`` (HEAD a506df575647;
identical in CompVis/stable-diffusion 21f890f9da3c): ``CrossAttention``, ``BasicTransformerBlock``,
``SpatialTransformer`` -> here ``CrossAttentionSD1``, ``BasicTransformerBlockSD1``,
``SpatialTransformerSD1``. What the SD 2.x tree kept unchanged is imported from it, not re-stated:
``FeedForward`` (with ``GEGLU``), ``Normalize``, ``zero_module``, ``default``, ``exists`` from
``ldm.modules.attention``, and ``checkpoint`` from ``ldm.modules.diffusionmodules.util`` (SD 2.x's
``CheckpointFunction`` also records the CUDA autocast state for its backward; the forward is the
same). ``LinearAttention`` / ``LinAttnBlock``, which the SD 2.x tree removed, are in ``ldm.py``.

Semantics kept exactly (the parity bundles are produced by running these classes):

* CrossAttention: no biases on to_q/to_k/to_v, bias on to_out.0; heads split ``'b n (h d) ->
  (b h) n d'``; ``sim = einsum(q, k) * scale`` (scale AFTER the matmul, ``dim_head ** -0.5``);
  mask: ``rearrange(mask, 'b ... -> b (...)')``, ``repeat(mask, 'b j -> (b h) () j')``,
  ``sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)`` (True = keep; masked logits are the
  most negative finite value, not -inf); softmax over keys; no dtype casts.
* BasicTransformerBlock: pre-LayerNorm (eps 1e-5) residual blocks ``attn1`` (self-attention),
  ``attn2`` (context; self-attention if context is None), ``ff`` (GEGLU when ``gated_ff``).
* SpatialTransformer: GroupNorm(32, C, eps 1e-6) -> conv1x1 proj_in -> tokens
  ``'b c h w -> b (h w) c'`` -> blocks (each given the same ``context``, ``context_dim`` for every
  depth) -> back -> conv1x1 proj_out -> ``+ x_in``.
* The latent-diffusion HEAD wraps the SpatialTransformer forward in ``torch.cuda.amp.autocast()``
  in some copies; CompVis/stable-diffusion does not. It is a no-op for CPU tensors and is left out.
"""

import torch
from einops import rearrange, repeat
from torch import einsum, nn

from upstream import ldm_attention
from ldm.modules.diffusionmodules.util import checkpoint

FeedForward, Normalize, zero_module = ldm_attention.FeedForward, ldm_attention.Normalize, ldm_attention.zero_module
default, exists = ldm_attention.default, ldm_attention.exists


class CrossAttentionSD1(nn.Module):
    """``CrossAttention`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x)."""

    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)

        self.scale = dim_head ** -0.5
        self.heads = heads

        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)

        self.to_out = nn.Sequential(
            nn.Linear(inner_dim, query_dim),
            nn.Dropout(dropout)
        )

    def forward(self, x, context=None, mask=None):
        h = self.heads

        q = self.to_q(x)
        context = default(context, x)
        k = self.to_k(context)
        v = self.to_v(context)

        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> (b h) n d', h=h), (q, k, v))

        sim = einsum('b i d, b j d -> b i j', q, k) * self.scale

        if exists(mask):
            mask = rearrange(mask, 'b ... -> b (...)')
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = repeat(mask, 'b j -> (b h) () j', h=h)
            sim.masked_fill_(~mask, max_neg_value)

        # attention, what we cannot get enough of
        attn = sim.softmax(dim=-1)

        out = einsum('b i j, b j d -> b i d', attn, v)
        out = rearrange(out, '(b h) n d -> b n (h d)', h=h)
        return self.to_out(out)


class BasicTransformerBlockSD1(nn.Module):
    """``BasicTransformerBlock`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x)."""

    def __init__(self, dim, n_heads, d_head, dropout=0., context_dim=None, gated_ff=True, checkpoint=True):
        super().__init__()
        self.attn1 = CrossAttentionSD1(query_dim=dim, heads=n_heads, dim_head=d_head, dropout=dropout)  # is a self-attention
        self.ff = FeedForward(dim, dropout=dropout, glu=gated_ff)
        self.attn2 = CrossAttentionSD1(query_dim=dim, context_dim=context_dim,
                                       heads=n_heads, dim_head=d_head, dropout=dropout)  # is self-attn if context is none
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.checkpoint = checkpoint

    def forward(self, x, context=None):
        return checkpoint(self._forward, (x, context), self.parameters(), self.checkpoint)

    def _forward(self, x, context=None):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context=context) + x
        x = self.ff(self.norm3(x)) + x
        return x


class SpatialTransformerSD1(nn.Module):
    """``SpatialTransformer`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x): conv proj_in/out.

    Transformer block for image-like data. First, project the input (aka embedding)
    and reshape to b, t, d. Then apply standard transformer action. Finally, reshape to image.
    """

    def __init__(self, in_channels, n_heads, d_head, depth=1, dropout=0., context_dim=None):
        super().__init__()
        self.in_channels = in_channels
        inner_dim = n_heads * d_head
        self.norm = Normalize(in_channels)

        self.proj_in = nn.Conv2d(in_channels, inner_dim, kernel_size=1, stride=1, padding=0)

        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlockSD1(inner_dim, n_heads, d_head, dropout=dropout, context_dim=context_dim)
                for d in range(depth)]
        )

        self.proj_out = zero_module(nn.Conv2d(inner_dim, in_channels, kernel_size=1, stride=1, padding=0))

    def forward(self, x, context=None):
        # note: if no context is given, cross-attention defaults to self-attention
        b, c, h, w = x.shape
        x_in = x
        x = self.norm(x)
        x = self.proj_in(x)
        x = rearrange(x, 'b c h w -> b (h w) c')
        for block in self.transformer_blocks:
            x = block(x, context=context)
        x = rearrange(x, 'b (h w) c -> b c h w', h=h, w=w)
        x = self.proj_out(x)
        return x + x_in
