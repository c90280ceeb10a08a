"""Builders of the diffusers 1-D U-Nets: Dance Diffusion's ``UNet1DModel`` and the RL
(trajectory / value function) ``UNet1DModel`` variants.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_
from .common import capture, Ctx, DIFF_BLOCKS, gen, randn, save_diffusers, sub_state, tensor_inputs, WEIGHTS


def diffusers_unet1d(ctx: Ctx):
    """``UNet1DModel`` (Dance Diffusion's audio U-Net, ``mid_block_type="UNetMidBlock1D"``): a
    fourier time embedding concatenated to the sample as 16 extra channels, two down and up
    blocks; the mid block runs at 32 channels (one SelfAttention1d head). A second, standalone
    ``UNetMidBlock1D(mid_channels=64, in_channels=32, out_channels=32)`` covers two heads and the
    ``conv_skip`` convolutions of the first and last ResConvBlock."""
    from diffusers import UNet1DModel
    from diffusers.models.unets.unet_1d_blocks import UNetMidBlock1D

    torch.manual_seed(0)
    model = UNet1DModel(sample_size=32, in_channels=2, out_channels=2, extra_in_channels=16, time_embedding_dim=16,
                        block_out_channels=(32, 32), down_block_types=("DownBlock1DNoSkip", "AttnDownBlock1D"),
                        up_block_types=("AttnUpBlock1D", "UpBlock1DNoSkip"), use_timestep_embedding=False,
                        flip_sin_to_cos=True, time_embedding_type="fourier", freq_shift=0.0)
    randomize_(model, 7601)
    model.eval()
    files = save_diffusers(model, "diffusers_unet1d")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7602)
    sample, t = randn(g, 2, 2, 32), torch.tensor([0.3, 0.7])
    ins, out = capture(model.mid_block, lambda: model(sample, t))
    c = model.config.block_out_channels[-1]
    cfg = dict(in_channels=c, mid_channels=c, out_channels=c)
    src = (DIFF_BLOCKS.format("UNetMidBlock1D").replace("unet_2d_blocks", "unet_1d_blocks")
           + f"; the mid_block of the whole UNet1DModel weights/{weights} (Dance Diffusion-like: fourier time "
           "embedding of 16 channels concatenated to the sample, block_out_channels (32, 32)), inputs captured by a "
           "forward pre-hook while the model ran on a random sample (2, 2, 32), timesteps [0.3, 0.7]")
    ctx.bundle("unet_mid_block_1d", "diffusers.UNetMidBlock1D", cfg, tensor_inputs(ins), out,
               state=sub_state(model.state_dict(), "mid_block."), source=src, half=True)
    ctx.bundle("unet_mid_block_1d_ref", "diffusers.UNetMidBlock1D", cfg, tensor_inputs(ins), out,
               ref=(weights, "mid_block."), source=src)
    torch.manual_seed(0)
    wide = dict(mid_channels=64, in_channels=32, out_channels=32)
    block = UNetMidBlock1D(**wide)
    randomize_(block, 7603)
    block.eval()
    x = randn(g, 2, 32, 7)  # odd length: the down- and upsampling round it to 6
    with torch.no_grad():
        y = block(x)
    ctx.bundle("unet_mid_block_1d_two_heads_conv_skip", "diffusers.UNetMidBlock1D", wide, OrderedDict(hidden_states=x),
               y, state=OrderedDict(block.state_dict()),
               source=DIFF_BLOCKS.format("UNetMidBlock1D").replace("unet_2d_blocks", "unet_1d_blocks")
               + "; UNetMidBlock1D(mid_channels=64, in_channels=32, out_channels=32) alone (random weights): two "
               "SelfAttention1d heads of 32 in attentions 0-4, one in attention 5, conv_skip in resnets 0 (32 -> 64) and "
               "5 (64 -> 32); random input (2, 32, 7), an odd length")


def diffusers_unet1d_rl(ctx: Ctx):
    """``UNet1DModel`` as the Diffuser planning models use it (``use_timestep_embedding``, Mish,
    ``DownResnetBlock1D``): the trajectory U-Net (``mid_block_type="MidResTemporalBlock1D"``) and the
    value function (``"ValueFunctionMidBlock1D"``). Their mid blocks have no attention."""
    from diffusers import UNet1DModel

    common = dict(in_channels=6, out_channels=6, extra_in_channels=0, time_embedding_type="positional",
                  flip_sin_to_cos=False, freq_shift=1, use_timestep_embedding=True, act_fn="mish",
                  norm_num_groups=8, layers_per_block=1, downsample_each_block=False)
    variants = [
        ("diffusers_unet1d_trajectory", dict(block_out_channels=(16, 32), mid_block_type="MidResTemporalBlock1D",
                                             down_block_types=("DownResnetBlock1D", "DownResnetBlock1D"),
                                             up_block_types=("UpResnetBlock1D",), out_block_type="OutConv1DBlock"),
         7701, 16, "mid_res_temporal_block_1d", "diffusers.MidResTemporalBlock1D",
         dict(in_channels=32, out_channels=32, embed_dim=16, num_layers=1, add_downsample=False)),
        ("diffusers_unet1d_value", dict(block_out_channels=(16, 32), mid_block_type="ValueFunctionMidBlock1D",
                                        down_block_types=("DownResnetBlock1D", "DownResnetBlock1D"), up_block_types=(),
                                        out_block_type="ValueFunction"),
         7702, 8, "value_function_mid_block_1d", "diffusers.ValueFunctionMidBlock1D",
         dict(in_channels=32, out_channels=32, embed_dim=16)),
    ]
    # the value function's OutValueFunctionBlock flattens what is left after the mid block's two
    # downsamplings: one step, so a horizon of 8 (8 -> 4 in the down blocks -> 2 -> 1)
    for name, kw, seed, horizon, stem, block, cfg in variants:
        torch.manual_seed(0)
        model = UNet1DModel(sample_size=horizon, **common, **kw)
        randomize_(model, seed)
        model.eval()
        files = save_diffusers(model, name)
        ctx.files += files
        weights = files[1].relative_to(WEIGHTS).as_posix()
        g = gen(seed + 1)
        sample, t = randn(g, 2, 6, horizon), torch.tensor([10, 90])
        ins, out = capture(model.mid_block, lambda: model(sample, t))
        src = (DIFF_BLOCKS.format(block.split(".")[1]).replace("unet_2d_blocks", "unet_1d_blocks")
               + f"; the mid_block of the whole UNet1DModel weights/{weights} (Diffuser-like: use_timestep_embedding, "
               "mish, block_out_channels (16, 32)), inputs captured by a forward pre-hook while the model ran on a "
               f"random sample (2, 6, {horizon}), timesteps [10, 90]")
        ctx.bundle(stem, block, cfg, tensor_inputs(ins), out, state=sub_state(model.state_dict(), "mid_block."),
                   source=src, half=True)
        ctx.bundle(f"{stem}_ref", block, cfg, tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src)
    # MidResTemporalBlock1D with its resampling: upsample (nearest x2 + Conv1d), then downsample (strided)
    from diffusers.models.unets.unet_1d_blocks import MidResTemporalBlock1D

    g = gen(7703)
    for resample in ("add_upsample", "add_downsample"):
        cfg = dict(in_channels=16, out_channels=24, embed_dim=8, num_layers=2, **{resample: True})
        torch.manual_seed(0)
        mid = MidResTemporalBlock1D(**cfg)
        randomize_(mid, 7704)
        mid.eval()
        x, temb = randn(g, 2, 16, 9), randn(g, 2, 8)
        with torch.no_grad():
            y = mid(x, temb)
        ctx.bundle(f"mid_res_temporal_block_1d_{resample}", "diffusers.MidResTemporalBlock1D", cfg,
                   OrderedDict(hidden_states=x, temb=temb), y, state=OrderedDict(mid.state_dict()),
                   source=DIFF_BLOCKS.format("MidResTemporalBlock1D").replace("unet_2d_blocks", "unet_1d_blocks")
                   + f"; MidResTemporalBlock1D(in_channels=16, out_channels=24, embed_dim=8, num_layers=2, {resample}="
                   "True) alone (random weights; residual_conv 16 -> 24 in resnets.0), random input (2, 16, 9) and "
                   "temb (2, 8)")
