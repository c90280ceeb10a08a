"""Builders of the unconditional diffusers 2-D models: ``UNet2DModel`` (three variants),
``AutoencoderKL`` (encoder and decoder mid blocks) and the MoVQ ``VQModel``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_
from .common import (capture, Ctx, DIFF_BLOCKS, DIFF_RESNET, gen, randn, save_diffusers, sub_state, tensor_inputs,
                     WEIGHTS)
from .configs import mid2d_resnet_config, unet2d_mid_config, vae_mid_config


def diffusers_unet2d(ctx: Ctx):
    from diffusers import UNet2DModel

    variants = [
        # name, extra kwargs, seed, safetensors?
        ("diffusers_unet2d", dict(attention_head_dim=8), 7001, True),
        ("diffusers_unet2d_scale_shift", dict(attention_head_dim=8, resnet_time_scale_shift="scale_shift"), 7002, True),
        ("diffusers_unet2d_bin", dict(attention_head_dim=None, norm_eps=1e-6), 7003, False),
    ]
    for name, extra, seed, safe in variants:
        torch.manual_seed(0)
        model = UNet2DModel(sample_size=(12, 8), in_channels=3, out_channels=3, layers_per_block=1,
                            block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                            up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, **extra)
        randomize_(model, seed)
        model.eval()
        files = save_diffusers(model, name, safe)
        ctx.files += files
        weights = files[1].relative_to(WEIGHTS).as_posix()
        g = gen(seed + 1)
        sample, t = randn(g, 2, 3, 12, 8), torch.tensor([17, 503])
        ins, out = capture(model.mid_block, lambda: model(sample, t))
        mid_cfg = unet2d_mid_config(model)
        src = (DIFF_BLOCKS.format("UNetMidBlock2D") + f"; the mid_block of the whole UNet2DModel weights/{weights}, "
               "inputs captured by a forward pre-hook while the UNet2DModel ran on random sample (2, 3, 12, 8), "
               "timesteps [17, 503]")
        state = sub_state(model.state_dict(), "mid_block.")
        tag = {"diffusers_unet2d": "unet2d", "diffusers_unet2d_scale_shift": "unet2d_scale_shift",
               "diffusers_unet2d_bin": "unet2d_bin_one_head"}[name]
        if name == "diffusers_unet2d":
            ctx.bundle("unet_mid_block_2d_unet2d", "diffusers.UNetMidBlock2D", mid_cfg, tensor_inputs(ins), out,
                       state=state, source=src, module=model.mid_block, half=True)
        note = ""
        if name == "diffusers_unet2d_scale_shift":
            note = ("; resnet_time_scale_shift scale_shift with attn_norm_num_groups None: UNetMidBlock2D passes "
                    "attn_groups=None, so the Attention has no group_norm")
        if name == "diffusers_unet2d_bin":
            note = ("; attention_head_dim None -> block_out_channels[-1] (one head); checkpoint saved with "
                    "save_pretrained(safe_serialization=False) (zip torch.save pickle)")
        ctx.bundle(f"unet_mid_block_2d_{tag}_ref", "diffusers.UNetMidBlock2D", mid_cfg, tensor_inputs(ins), out,
                   ref=(weights, "mid_block."), source=src + note)

        # ResnetBlock2D: resnets.0 of the default model, resnets.1 of the scale-shift model
        if name in ("diffusers_unet2d", "diffusers_unet2d_scale_shift"):
            i = 0 if name == "diffusers_unet2d" else 1
            res = model.mid_block.resnets[i]
            rins, rout = capture(res, lambda: model(sample, t))
            rcfg = mid2d_resnet_config(mid_cfg)
            ctx.bundle(f"resnet_block_2d_{tag}", "diffusers.ResnetBlock2D", rcfg, tensor_inputs(rins), rout,
                       state=sub_state(model.state_dict(), f"mid_block.resnets.{i}."),
                       source=DIFF_RESNET + f"; mid_block.resnets.{i} of the whole UNet2DModel weights/{weights}, inputs "
                       "captured by a forward pre-hook while the UNet2DModel ran on random sample (2, 3, 12, 8), "
                       "timesteps [17, 503]", half=(i == 0))


def diffusers_vae(ctx: Ctx):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    model = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                          up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16),
                          layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16)
    randomize_(model, 7101)
    model.eval()
    files = save_diffusers(model, "diffusers_vae")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7102)
    x = randn(g, 2, 3, 16, 12)

    def run():
        return model(x)  # encode -> posterior mode -> decode

    src = (DIFF_BLOCKS.format("UNetMidBlock2D") + "; the {}.mid_block of the whole AutoencoderKL weights/" + weights
           + ", inputs captured by a forward pre-hook while AutoencoderKL.forward ran on a random sample (2, 3, 16, 12) "
           "(encode, posterior mode, decode); the VAE passes temb=None")
    for part in ("encoder", "decoder"):
        mid = getattr(model, part).mid_block
        ins, out = capture(mid, run)
        cfg = vae_mid_config(model, part)
        ctx.bundle(f"unet_mid_block_2d_vae_{part}_ref", "diffusers.UNetMidBlock2D", cfg, tensor_inputs(ins), out,
                   ref=(weights, f"{part}.mid_block."), source=src.format(part))
        if part == "decoder":
            ctx.bundle("unet_mid_block_2d_vae_decoder", "diffusers.UNetMidBlock2D", cfg, tensor_inputs(ins), out,
                       state=sub_state(model.state_dict(), "decoder.mid_block."), source=src.format(part))
            rins, rout = capture(mid.resnets[1], run)
            ctx.bundle("resnet_block_2d_vae_decoder_no_temb_ref", "diffusers.ResnetBlock2D", mid2d_resnet_config(cfg),
                       tensor_inputs(rins), rout, ref=(weights, "decoder.mid_block.resnets.1."), kwargs={"temb": None},
                       source=DIFF_RESNET + f"; decoder.mid_block.resnets.1 of the whole AutoencoderKL weights/{weights} "
                       "(temb_channels None: no time_emb_proj, temb=None), inputs captured by a forward pre-hook while "
                       "AutoencoderKL.forward ran on a random sample (2, 3, 16, 12)")


def diffusers_vq_movq(ctx: Ctx):
    """``VQModel(norm_type="spatial")``: Kandinsky 2.x's MoVQ. Its decoder's mid block is a
    ``UNetMidBlock2D(resnet_time_scale_shift="spatial", temb_channels=latent_channels)``:
    ``ResnetBlockCondNorm2D`` resnets and an ``Attention`` with ``spatial_norm``, all conditioned on
    the quantized latent (``VQModel.decode`` passes ``quant`` as ``latent_embeds``)."""
    from diffusers import VQModel

    torch.manual_seed(0)
    # SpatialNorm's GroupNorm has 32 groups: every decoder width a multiple of 32
    model = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(32, 32),
                    layers_per_block=1, latent_channels=4, num_vq_embeddings=32, norm_num_groups=8, sample_size=16,
                    norm_type="spatial")
    randomize_(model, 7501)
    model.eval()
    files = save_diffusers(model, "diffusers_movq")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7502)
    x = randn(g, 2, 3, 16, 12)

    def run():
        return model(x)  # encode -> quantize (codebook lookup) -> decode(post_quant_conv(quant), quant)

    src = (DIFF_BLOCKS.format("UNetMidBlock2D") + "; the {}.mid_block of the whole VQModel(norm_type=\"spatial\") "
           "weights/" + weights + ", inputs captured by a forward pre-hook while VQModel.forward ran on a random sample "
           "(2, 3, 16, 12) (encode, vector quantization, decode){}")
    zq_note = ("; the decoder's mid block is UNetMidBlock2D(resnet_time_scale_shift=\"spatial\", temb_channels=4): "
               "ResnetBlockCondNorm2D resnets and a spatial_norm Attention, temb = the quantized latent (2, 4, 8, 6)")
    enc = vae_mid_config(model, "encoder")
    dec = dict(enc, resnet_time_scale_shift="spatial", temb_channels=model.config.latent_channels)
    for part, cfg, note in (("encoder", enc, "; the encoder's mid block as AutoencoderKL's"), ("decoder", dec, zq_note)):
        ins, out = capture(getattr(model, part).mid_block, run)
        ctx.bundle(f"unet_mid_block_2d_movq_{part}_ref", "diffusers.UNetMidBlock2D", cfg, tensor_inputs(ins), out,
                   ref=(weights, f"{part}.mid_block."), source=src.format(part, note))
    ins, out = capture(model.decoder.mid_block, run)
    state = sub_state(model.state_dict(), "decoder.mid_block.")
    ctx.bundle("unet_mid_block_2d_movq_decoder", "diffusers.UNetMidBlock2D", dec, tensor_inputs(ins), out, state=state,
               source=src.format("decoder", zq_note), half=True)
    # zq at another resolution than the features (3 x 5 -> 8 x 6: F.interpolate nearest, non-integer ratios)
    mid = model.decoder.mid_block
    zq = randn(g, 2, 4, 3, 5)
    with torch.no_grad():
        zout = mid(ins["hidden_states"], zq)
    ctx.bundle("unet_mid_block_2d_movq_decoder_zq_resized", "diffusers.UNetMidBlock2D", dec,
               OrderedDict(hidden_states=ins["hidden_states"], temb=zq), zout, state=state,
               source=DIFF_BLOCKS.format("UNetMidBlock2D") + f"; decoder.mid_block of the whole VQModel weights/{weights} "
               "run alone on the hidden_states captured from VQModel.forward and a random zq (2, 4, 3, 5), which every "
               "SpatialNorm resizes to 8 x 6 with F.interpolate(mode=\"nearest\")")
