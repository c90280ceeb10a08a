"""Builders of the ldm checkpoints (stable-diffusion-sdkit): an SD-style ``.ckpt`` (``UNetModel``
+ first-stage ``Encoder`` / ``Decoder``) and a bare DDPM ``Model`` state dict, with the helpers
that capture and describe an ldm ``mid``.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import torch
from torch import nn

from parity_bundle import randomize_
from upstream import quietly
from .common import capture, Ctx, gen, LDM_MID, MODELS, OPENAI_MID, randn, SD_OPENAIMODEL, tensor_inputs, WEIGHTS


def ldm_mid_config(parent, temb_channels):
    """``LdmMidBlock``'s config for the ``mid`` of an ldm ``Model`` / ``Encoder`` / ``Decoder``."""
    attn = type(parent.mid.attn_1).__name__
    attn_type = {"AttnBlock": "vanilla", "LinAttnBlock": "linear", "Identity": "none"}[attn]
    return dict(in_channels=parent.mid.block_1.in_channels, temb_channels=temb_channels,
                dropout=float(parent.mid.block_1.dropout.p), attn_type=attn_type)


def ldm_mid_capture(parent, run):
    """(inputs, output) of ``parent.mid`` while ``run()`` runs: the input of ``mid.block_1`` (x, temb)
    and the output of ``mid.block_2`` (the parent's forward lines h = block_1(h, temb);
    h = attn_1(h); h = block_2(h, temb))."""
    ins, _ = capture(parent.mid.block_1, run)
    _, out = capture(parent.mid.block_2, run)
    return OrderedDict(x=ins["x"], temb=ins["temb"]), out


def sd_checkpoint(ctx: Ctx):
    """SD 1.x-style ``.ckpt`` of a LatentDiffusion: {'state_dict': {...}, 'global_step': N} holding a
    whole ``openaimodel.UNetModel`` under ``model.diffusion_model.`` (SD 1.x kwargs: SpatialTransformer
    with conv projections, one context) and the first-stage ``Encoder`` / ``Decoder`` with
    ``quant_conv`` / ``post_quant_conv`` under ``first_stage_model.`` (AutoencoderKL's modules; the
    class itself needs pytorch-lightning). All from the SD 2.x ldm tree (stable-diffusion-sdkit): no
    package ships the SD 1.x tree, and for these kwargs the two build the same keys and float32 math."""
    from ldm.modules.diffusionmodules.model import Decoder, Encoder
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    torch.manual_seed(0)
    ctx_dim = 24
    unet_kw = dict(image_size=8, in_channels=4, model_channels=32, out_channels=4, num_res_blocks=1,
                   attention_resolutions=(), channel_mult=(1,), num_heads=4, use_spatial_transformer=True,
                   transformer_depth=1, context_dim=ctx_dim, legacy=False)
    unet = UNetModel(**unet_kw)
    dd = dict(double_z=True, z_channels=4, resolution=8, in_channels=3, out_ch=3, ch=32, ch_mult=(1,),
              num_res_blocks=1, attn_resolutions=[], dropout=0.0)
    embed_dim = 4
    vae = nn.Module()
    vae.encoder, vae.decoder = quietly(Encoder, **dd), quietly(Decoder, **dd)
    vae.quant_conv = nn.Conv2d(2 * dd["z_channels"], 2 * embed_dim, 1)
    vae.post_quant_conv = nn.Conv2d(embed_dim, dd["z_channels"], 1)
    for i, m in enumerate((unet, vae)):
        randomize_(m, 7401 + i)
        m.eval()
    sd = OrderedDict()
    for prefix, m in (("model.diffusion_model.", unet), ("first_stage_model.", vae)):
        for k, v in m.state_dict().items():
            sd[prefix + k] = v
    folder = MODELS / "sd_v1_tiny"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sd_v1_tiny.ckpt"
    torch.save({"state_dict": sd, "global_step": 470000}, path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()

    g = gen(7410)
    x, t, context = randn(g, 2, 4, 6, 4), torch.tensor([17, 503]), randn(g, 2, 7, ctx_dim)
    ins, out = capture(unet.middle_block, lambda: unet(x, t, context))
    mid_cfg = dict(channels=32, emb_channels=unet.time_embed[0].out_features, dropout=0.0, dims=2,
                   use_scale_shift_norm=False, num_heads=4, num_head_channels=-1, use_new_attention_order=False,
                   use_spatial_transformer=True, transformer_depth=1, context_dim=ctx_dim,
                   use_linear_in_transformer=False, disable_middle_self_attn=False, legacy=False)
    ctx.bundle("openai_middle_block_sd1_spatial_transformer_ref", "openai.MiddleBlock", mid_cfg, tensor_inputs(ins),
               out, ref=(weights, "model.diffusion_model.middle_block.", "state_dict"),
               source=OPENAI_MID.format("SpatialTransformer") + f" of {SD_OPENAIMODEL}: the middle_block of the whole "
               f"UNetModel({json.dumps(unet_kw)}) (SD 1.x-style kwargs) in the SD-style checkpoint weights/{weights}; "
               "x, emb and context = the middle_block's inputs captured by a forward pre-hook while the UNetModel ran "
               "on random x (2, 4, 6, 4), timesteps [17, 503], context (2, 7, 24); expected output = its output in "
               "that run")
    z = randn(g, 2, 4, 6, 4)
    dins, dout = ldm_mid_capture(vae.decoder, lambda: vae.decoder(z))
    xe = randn(g, 2, 3, 4, 6)
    eins, eout = ldm_mid_capture(vae.encoder, lambda: vae.encoder(xe))
    def vae_src(cls, inp):
        return (f"; the mid of the whole first-stage {cls} (SD 2.x ldm tree, {json.dumps(dd)}) in the SD-style "
                f"checkpoint weights/{weights}; temb_channels 0 (no temb_proj, temb None); x = mid.block_1's input "
                f"captured by a forward pre-hook while the {cls} ran on random {inp}; expected output = "
                "mid.block_2's output in that run")

    ctx.bundle("ldm_mid_block_sd_vae_decoder_ref", "ldm.MidBlock", ldm_mid_config(vae.decoder, 0),
               tensor_inputs(dins), dout, ref=(weights, "first_stage_model.decoder.mid.", "state_dict"),
               source=LDM_MID + vae_src("Decoder", "z (2, 4, 6, 4)"))
    ctx.bundle("ldm_mid_block_sd_vae_encoder_ref", "ldm.MidBlock", ldm_mid_config(vae.encoder, 0),
               tensor_inputs(eins), eout, ref=(weights, "first_stage_model.encoder.mid.", "state_dict"),
               source=LDM_MID + vae_src("Encoder", "x (2, 3, 4, 6)"))


def ddpm_model_checkpoint(ctx: Ctx):
    """A whole ldm ``Model`` (the DDPM U-Net of ``ldm/modules/diffusionmodules/model.py``) saved as a
    bare state dict ``.pt``: ``temb.dense.*``, ``conv_in.*``, ``down.*``, ``mid.*`` (ResnetBlocks with
    temb_proj, vanilla AttnBlock), ``up.*``, ``norm_out.*``, ``conv_out.*``."""
    from ldm.modules.diffusionmodules.model import Model

    torch.manual_seed(0)
    kw = dict(ch=32, out_ch=3, ch_mult=(1,), num_res_blocks=1, attn_resolutions=[], in_channels=3, resolution=8)
    model = quietly(Model, **kw)
    randomize_(model, 7601)
    model.eval()
    folder = MODELS / "ldm_ddpm_tiny"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ldm_ddpm_tiny.pt"
    torch.save(model.state_dict(), path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()
    g = gen(7610)
    x, t = randn(g, 2, 3, 4, 6), torch.tensor([17, 503])
    ins, out = ldm_mid_capture(model, lambda: model(x, t))
    ctx.bundle("ldm_mid_block_ddpm_vanilla_ref", "ldm.MidBlock", ldm_mid_config(model, model.temb_ch), ins, out,
               ref=(weights, "mid."),
               source=LDM_MID + f"; the mid of the whole Model({json.dumps(kw)}) saved as a bare state dict "
               f"weights/{weights}; x and temb = mid.block_1's inputs captured by a forward pre-hook while the Model ran "
               "on random x (2, 3, 4, 6), t [17, 503] (temb = temb.dense[1](nonlinearity(temb.dense[0]("
               "get_timestep_embedding(t, 32))))); expected output = mid.block_2's output in that run")
