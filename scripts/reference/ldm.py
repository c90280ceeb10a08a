"""Re-statement of ``LinearAttention`` from CompVis latent-diffusion.

Why a re-statement: no package ships it. The SD 2.x ldm tree (stable-diffusion-sdkit) removed
``LinearAttention`` from ``ldm/modules/attention.py`` and ``LinAttnBlock`` (``make_attn``'s
"linear") from ``ldm/modules/diffusionmodules/model.py``; the SD 1.x tree that has them is not
a package.

Published source: CompVis/latent-diffusion ``ldm/modules/attention.py`` (HEAD a506df575647;
identical in CompVis/stable-diffusion 21f890f9da3c; removed from Stability-AI/stablediffusion).
``ldm/modules/diffusionmodules/model.py`` defines ``LinAttnBlock(in_channels)`` as
``LinearAttention(dim=in_channels, heads=1, dim_head=in_channels)``.

Semantics kept exactly: channel split ``'b (qkv heads c) h w -> qkv b heads c (h w)'``,
k softmax over tokens only, NO q softmax, NO scale, NO norm, NO residual.

State-dict keys: ``to_qkv.weight`` (3*hidden, dim, 1, 1) (no bias), ``to_out.weight``
(dim, hidden, 1, 1), ``to_out.bias`` (dim,).
"""

import torch
from torch import nn
from einops import rearrange


class LinearAttention(nn.Module):
    def __init__(self, dim, heads=4, dim_head=32):
        super().__init__()
        self.heads = heads
        hidden_dim = dim_head * heads
        self.to_qkv = nn.Conv2d(dim, hidden_dim * 3, 1, bias=False)
        self.to_out = nn.Conv2d(hidden_dim, dim, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.to_qkv(x)
        q, k, v = rearrange(qkv, 'b (qkv heads c) h w -> qkv b heads c (h w)', heads=self.heads, qkv=3)
        k = k.softmax(dim=-1)
        context = torch.einsum('bhdn,bhen->bhde', k, v)
        out = torch.einsum('bhde,bhdn->bhen', context, q)
        out = rearrange(out, 'b heads c (h w) -> b (heads c) h w', heads=self.heads, h=h, w=w)
        return self.to_out(out)


class LinAttnBlock(LinearAttention):
    """to match AttnBlock usage (ldm/modules/diffusionmodules/model.py)"""

    def __init__(self, in_channels):
        super().__init__(dim=in_channels, heads=1, dim_head=in_channels)
