"""Re-statement of the first-stage / DDPM building blocks of ``ldm/modules/diffusionmodules/model.py``.

Published source: CompVis/latent-diffusion ``ldm/modules/diffusionmodules/model.py`` (HEAD
a506df575647; identical in CompVis/stable-diffusion 21f890f9da3c; the SD 2.x copy in
Stability-AI/stablediffusion keeps ``ResnetBlock`` and ``AttnBlock`` unchanged). Re-stated here:
``get_timestep_embedding``, ``nonlinearity``, ``Normalize``, ``ResnetBlock``, ``make_attn`` (the
attention classes come from ``ldm_sd.AttnBlock`` and ``ldm.LinAttnBlock``).

Semantics kept exactly (the parity bundles are produced by running these functions):

* ``nonlinearity(x) = x * torch.sigmoid(x)`` (written out, not ``F.silu``);
* ``Normalize(C) = GroupNorm(32, C, eps=1e-6, affine=True)``;
* ``ResnetBlock(*, in_channels, out_channels=None, conv_shortcut=False, dropout, temb_channels=512)``:
  ``norm1, conv1 (3x3, pad 1), temb_proj = Linear(temb_channels, out)`` only when
  ``temb_channels > 0``, ``norm2, dropout, conv2 (3x3)``, and for ``in != out`` a 3x3
  ``conv_shortcut`` or a 1x1 ``nin_shortcut``. forward(x, temb):
  ``h = conv1(nonlinearity(norm1(x)))``; ``if temb is not None: h = h + temb_proj(nonlinearity(temb))[:, :, None, None]``;
  ``h = conv2(dropout(nonlinearity(norm2(h))))``; ``return shortcut(x) + h``;
* ``make_attn(C, attn_type)``: ``"vanilla"`` -> ``AttnBlock(C)``, ``"linear"`` -> ``LinAttnBlock(C)``,
  ``"none"`` -> ``nn.Identity(C)`` (the published function also prints a line; left out);
* ``get_timestep_embedding(t, dim)``: ``half = dim // 2``, ``e = ln(10000) / (half - 1)``,
  ``freqs = exp(arange(half, float32) * -e)``, ``emb = t.float()[:, None] * freqs[None]``,
  ``cat(sin, cos)``, zero pad for an odd ``dim``.
"""

import math

import torch
from torch import nn

from .ldm import LinAttnBlock
from .ldm_sd import AttnBlock


def get_timestep_embedding(timesteps, embedding_dim):
    assert len(timesteps.shape) == 1
    half_dim = embedding_dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = torch.exp(torch.arange(half_dim, dtype=torch.float32) * -step).to(device=timesteps.device)
    args = timesteps.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


def nonlinearity(x):
    return x * torch.sigmoid(x)


def Normalize(in_channels, num_groups=32):
    return nn.GroupNorm(num_groups=num_groups, num_channels=in_channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, *, in_channels, out_channels=None, conv_shortcut=False, dropout, temb_channels=512):
        super().__init__()
        self.in_channels = in_channels
        out_channels = in_channels if out_channels is None else out_channels
        self.out_channels = out_channels
        self.use_conv_shortcut = conv_shortcut

        self.norm1 = Normalize(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if temb_channels > 0:
            self.temb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = Normalize(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        if self.in_channels != self.out_channels:
            if self.use_conv_shortcut:
                self.conv_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
            else:
                self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x, temb):
        h = self.conv1(nonlinearity(self.norm1(x)))
        if temb is not None:
            h = h + self.temb_proj(nonlinearity(temb))[:, :, None, None]
        h = self.conv2(self.dropout(nonlinearity(self.norm2(h))))
        if self.in_channels != self.out_channels:
            x = self.conv_shortcut(x) if self.use_conv_shortcut else self.nin_shortcut(x)
        return x + h


def make_attn(in_channels, attn_type="vanilla"):
    assert attn_type in ["vanilla", "linear", "none"], f"attn_type {attn_type} unknown"
    if attn_type == "vanilla":
        return AttnBlock(in_channels)
    if attn_type == "none":
        return nn.Identity(in_channels)
    return LinAttnBlock(in_channels)
