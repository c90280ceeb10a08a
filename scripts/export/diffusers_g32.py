"""Tiny whole diffusers models whose widths divide by 32, for running candle-transformers 0.11.1's
whole ``UNet2DConditionModel`` and ``AutoEncoderKL`` next to ours (``examples/candle_transformers.rs``,
docs/candle-transformers.md "Whole models").

candle-transformers' ``DownBlock2D`` / ``UpBlock2D`` (and the VAE's encoder / decoder blocks)
build their resnets with 32 groups whatever the config says, so its whole models do not build on
the 4-group tiny models of ``weights/models/``. These have ``norm_num_groups`` 32 and widths
(32, 64): ``diffusers_sd1_g32`` (SD 1.x layout, 2 heads, a 32-wide context) and ``diffusers_vae_g32``.
No mid-block bundles: ``scripts/export_whole.py`` writes their whole-model bundles (and one of the
U-Net loaded with ``norm_num_groups`` 16, the same weights: GroupNorm's parameters do not depend on
the group count).
"""

from __future__ import annotations

import torch

from parity_bundle import randomize_
from .common import Ctx, save_diffusers


def diffusers_groups32(ctx: Ctx):
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, layers_per_block=1, norm_num_groups=32,
                                sample_size=8, block_out_channels=(32, 64),
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=2)
    randomize_(unet, 7211)
    ctx.files += save_diffusers(unet.eval(), "diffusers_sd1_g32")

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(32, 64),
                        layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=16)
    randomize_(vae, 7111)
    ctx.files += save_diffusers(vae.eval(), "diffusers_vae_g32")
