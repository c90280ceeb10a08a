"""Builders of the text-conditioned diffusers ``UNet2DConditionModel`` family: the
``UNetMidBlock2DCrossAttn`` variants (SD 1.x / 2.x / XL, IF, Kandinsky), the
``UNetMidBlock2DSimpleCrossAttn`` ones and Versatile Diffusion's dual cross attention.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_, run_module
from .blocks import build_module, dual_attributes_, maskless_dual_, MASKLESS_NOTE
from .common import (capture, Ctx, DIFF_BLOCKS, DIFF_RESNET, gen, randn, save_diffusers, sub_state, tensor_inputs,
                     WEIGHTS)
from .configs import cross_attn_resnet0_config, unet2d_condition_mid_config, unet2d_condition_simple_cross_mid_config


def diffusers_unet2d_condition(ctx: Ctx):
    from diffusers import UNet2DConditionModel

    common = dict(in_channels=4, out_channels=4, layers_per_block=1, norm_num_groups=4)
    variants = [
        # SD 1.x-like: conv proj_in, attention_head_dim int = heads (the historical naming)
        ("diffusers_sd1", dict(sample_size=8, block_out_channels=(8, 16),
                               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=24,
                               attention_head_dim=2), 7201,
         "SD 1.x-like (conv proj_in/proj_out, attention_head_dim 2 = 2 heads)"),
        # SD 2.x-like: linear projections, attention_head_dim list = heads per level, upcast_attention
        ("diffusers_sd2", dict(sample_size=8, block_out_channels=(8, 16),
                               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                               attention_head_dim=(2, 4), use_linear_projection=True, upcast_attention=True), 7202,
         "SD 2.x-like (use_linear_projection, attention_head_dim [2, 4] = heads per level -> 4 heads at the mid, "
         "upcast_attention)"),
        # SDXL-like: 2 transformer layers at the mid, text_time added embedding
        ("diffusers_sdxl", dict(sample_size=8, block_out_channels=(8, 16),
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=24,
                                attention_head_dim=(1, 2), use_linear_projection=True,
                                transformer_layers_per_block=(1, 2), addition_embed_type="text_time",
                                addition_time_embed_dim=4, projection_class_embeddings_input_dim=8 + 6 * 4), 7203,
         "SDXL-like (use_linear_projection, transformer_layers_per_block [1, 2] -> 2 at the mid, attention_head_dim "
         "[1, 2] -> 2 heads at the mid, "
         "addition_embed_type text_time)"),
    ]
    for name, kw, seed, what in variants:
        torch.manual_seed(0)
        model = UNet2DConditionModel(**common, **kw)
        randomize_(model, seed)
        model.eval()
        files = save_diffusers(model, name)
        ctx.files += files
        weights = files[1].relative_to(WEIGHTS).as_posix()
        g = gen(seed + 1)
        sample, t = randn(g, 2, 4, 8, 12), torch.tensor([17, 503])
        ehs = randn(g, 2, 7, model.config.cross_attention_dim)
        added = None
        if name == "diffusers_sdxl":
            added = {"text_embeds": randn(g, 2, 8), "time_ids": torch.tensor([[16., 12., 0., 0., 16., 12.]] * 2)}

        def run(mask=None):
            return model(sample, t, encoder_hidden_states=ehs, added_cond_kwargs=added, encoder_attention_mask=mask)

        ins, out = capture(model.mid_block, run)
        cfg = unet2d_condition_mid_config(model)
        src = (DIFF_BLOCKS.format("UNetMidBlock2DCrossAttn") + f"; {what}: the mid_block of the whole "
               f"UNet2DConditionModel weights/{weights}, inputs captured by a forward pre-hook while the model ran on "
               "random sample (2, 4, 8, 12), timesteps [17, 503], encoder_hidden_states (2, 7, "
               f"{model.config.cross_attention_dim})" + (", text_embeds (2, 8), time_ids" if added else ""))
        short = name.replace("diffusers_", "")
        if name in ("diffusers_sd1", "diffusers_sd2"):
            ctx.bundle(f"unet_mid_block_2d_cross_attn_{short}", "diffusers.UNetMidBlock2DCrossAttn", cfg,
                       tensor_inputs(ins), out, state=sub_state(model.state_dict(), "mid_block."), source=src,
                       half=(name == "diffusers_sd1"))
        ctx.bundle(f"unet_mid_block_2d_cross_attn_{short}_ref", "diffusers.UNetMidBlock2DCrossAttn", cfg,
                   tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src)
        if name == "diffusers_sd1":
            _sd1_mask_bundles(ctx, model, run, cfg, src, weights)


def _sd1_mask_bundles(ctx: Ctx, model, run, cfg: dict, src: str, weights: str):
    """The SD 1.x-like U-Net's extra referencing bundles: its mid block given an encoder mask (as
    the UNet's additive bias and as a 2-D 1/0 mask) and its first resnet (``groups_out``)."""
    # the UNet turns a (B, S) 1/0 encoder_attention_mask into a (B, 1, S) additive bias
    # (1 - m) * -10000 before the mid block sees it
    keep = torch.tensor([[1., 1., 1., 1., 1., 0., 0.], [1., 1., 1., 0., 0., 0., 0.]])
    mins, mout = capture(model.mid_block, lambda: run(keep))
    assert mins["encoder_attention_mask"].shape == (2, 1, 7)
    ctx.bundle("unet_mid_block_2d_cross_attn_sd1_encoder_mask_bias_ref", "diffusers.UNetMidBlock2DCrossAttn",
               cfg, tensor_inputs(mins), mout, ref=(weights, "mid_block."),
               source=src + "; UNet2DConditionModel called with encoder_attention_mask [[1,1,1,1,1,0,0],"
               "[1,1,1,0,0,0,0]] (B, S), which it converts to the additive (B, 1, S) bias (1 - m) * -10000.0 "
               "the mid block receives (stored as captured)")
    # the same 1/0 mask given to the mid block directly as (B, S) floats: Transformer2DModel converts a
    # 2-D encoder_attention_mask itself, the same way
    dins = OrderedDict(tensor_inputs(mins))
    dins["encoder_attention_mask"] = keep
    standalone = build_module("diffusers.UNetMidBlock2DCrossAttn", cfg)
    standalone.load_state_dict(sub_state(model.state_dict(), "mid_block."), strict=True)
    standalone.eval()
    dout = run_module(standalone, dins)["output"]
    assert torch.equal(dout, mout), "2-D 1/0 mask and the UNet's bias disagree"
    ctx.bundle("unet_mid_block_2d_cross_attn_sd1_encoder_mask_2d_ref", "diffusers.UNetMidBlock2DCrossAttn",
               cfg, dins, mout, ref=(weights, "mid_block."),
               source=src + "; encoder_attention_mask [[1,1,1,1,1,0,0],[1,1,1,0,0,0,0]] (B, S) float 1 = keep, "
               "0 = discard, passed straight to the mid block (Transformer2DModel converts a 2-D mask to "
               "(1 - m) * -10000.0); output asserted equal to the whole model's mid block given the same mask")
    rins, rout = capture(model.mid_block.resnets[0], run)
    ctx.bundle("resnet_block_2d_sd1_groups_out_ref", "diffusers.ResnetBlock2D", cross_attn_resnet0_config(cfg),
               tensor_inputs(rins), rout, ref=(weights, "mid_block.resnets.0."),
               source=DIFF_RESNET + f"; mid_block.resnets.0 of the whole UNet2DConditionModel weights/{weights} "
               "(UNetMidBlock2DCrossAttn passes groups_out), inputs captured by a forward pre-hook while the "
               "model ran on random inputs")


def diffusers_unet2d_condition_simple_cross(ctx: Ctx):
    """``UNet2DConditionModel(mid_block_type="UNetMidBlock2DSimpleCrossAttn")``: the IF / Kandinsky /
    UnCLIP U-Net, whose mid block runs added key/value attention (``AttnAddedKVProcessor2_0``)."""
    from diffusers import UNet2DConditionModel

    common = dict(sample_size=8, layers_per_block=1, block_out_channels=(8, 16),
                  down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
                  up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
                  mid_block_type="UNetMidBlock2DSimpleCrossAttn", attention_head_dim=4, norm_num_groups=4,
                  resnet_time_scale_shift="scale_shift", resnet_skip_time_act=True, resnet_out_scale_factor=1.414)
    variants = [
        # DeepFloyd IF-like: GELU resnets, text_proj of a T5-like context, "text" added embedding,
        # group_norm cross norm (GroupNorm(32, cross_attention_dim))
        ("diffusers_if", dict(in_channels=3, out_channels=6, act_fn="gelu", cross_attention_dim=32,
                              encoder_hid_dim=24, encoder_hid_dim_type="text_proj", addition_embed_type="text",
                              addition_embed_type_num_heads=2, cross_attention_norm="group_norm"), 7401,
         "DeepFloyd IF-like (act_fn gelu, resnet_time_scale_shift scale_shift, resnet_skip_time_act, "
         "encoder_hid_dim_type text_proj 24 -> 32, addition_embed_type text, cross_attention_norm group_norm, "
         "attention_head_dim 4 = 4 heads of 4 at the mid, added_kv_proj_dim 32 != in_channels 16)"),
        # Kandinsky 2.2-like: image_proj context (32 image tokens), "image" added embedding; UnCLIP-style
        # only_cross_attention (a bool: the mid block takes it too) and layer_norm cross norm
        ("diffusers_kandinsky", dict(in_channels=4, out_channels=8, cross_attention_dim=16, encoder_hid_dim=20,
                                     encoder_hid_dim_type="image_proj", addition_embed_type="image",
                                     only_cross_attention=True, cross_attention_norm="layer_norm"), 7402,
         "Kandinsky 2.2-like (encoder_hid_dim_type image_proj 20 -> 32 image tokens of 16, addition_embed_type "
         "image, only_cross_attention True -> mid_block_only_cross_attention, cross_attention_norm layer_norm, "
         "resnet_time_scale_shift scale_shift, resnet_skip_time_act, attention_head_dim 4 = 4 heads of 4)"),
    ]
    for name, kw, seed, what in variants:
        torch.manual_seed(0)
        model = UNet2DConditionModel(**common, **kw)
        randomize_(model, seed)
        model.eval()
        files = save_diffusers(model, name)
        ctx.files += files
        weights = files[1].relative_to(WEIGHTS).as_posix()
        g = gen(seed + 1)
        sample, t = randn(g, 2, model.config.in_channels, 8, 12), torch.tensor([17, 503])
        if name == "diffusers_if":
            ehs, added = randn(g, 2, 7, 24), None
            inputs_what = "encoder_hidden_states (2, 7, 24)"
        else:
            ehs, added = randn(g, 2, 5, 16), {"image_embeds": randn(g, 2, 20)}
            inputs_what = "encoder_hidden_states (2, 5, 16) (unused by image_proj), image_embeds (2, 20)"

        def run(mask=None):
            return model(sample, t, encoder_hidden_states=ehs, added_cond_kwargs=added, encoder_attention_mask=mask)

        ins, out = capture(model.mid_block, run)
        cfg = unet2d_condition_simple_cross_mid_config(model)
        src = (DIFF_BLOCKS.format("UNetMidBlock2DSimpleCrossAttn") + f"; {what}: the mid_block of the whole "
               f"UNet2DConditionModel weights/{weights}, inputs captured by a forward pre-hook while the model ran on "
               f"random sample (2, {model.config.in_channels}, 8, 12), timesteps [17, 503], {inputs_what}; "
               "AttnAddedKVProcessor2_0 (the constructor's choice under torch >= 2)")
        short = name.replace("diffusers_", "")
        stem = f"unet_mid_block_2d_simple_cross_attn_{short}"
        state = sub_state(model.state_dict(), "mid_block.")
        ctx.bundle(stem, "diffusers.UNetMidBlock2DSimpleCrossAttn", cfg, tensor_inputs(ins), out, state=state,
                   source=src, half=True)
        ctx.bundle(f"{stem}_ref", "diffusers.UNetMidBlock2DSimpleCrossAttn", cfg, tensor_inputs(ins), out,
                   ref=(weights, "mid_block."), source=src)
        if name == "diffusers_if":
            _if_extra_bundles(ctx, model, run, cfg, src, stem, state)


def _if_extra_bundles(ctx: Ctx, model, run, cfg: dict, src: str, stem: str, state):
    """The IF-like U-Net's extra bundles: its mid block given an encoder mask, and run by
    ``AttnAddedKVProcessor`` (the processor torch < 2 gets) after ``model.set_attn_processor``."""
    from diffusers.models.attention_processor import AttnAddedKVProcessor

    # the UNet turns a (B, S) 1/0 encoder_attention_mask into a (B, 1, S) additive bias; the added-KV
    # processor pads it by the H*W self tokens (prepare_attention_mask), which the keys append
    keep = torch.tensor([[1., 1., 1., 1., 1., 0., 0.], [1., 1., 1., 0., 0., 0., 0.]])
    mins, mout = capture(model.mid_block, lambda: run(keep))
    assert mins["encoder_attention_mask"].shape == (2, 1, 7)
    ctx.bundle(f"{stem}_encoder_mask_bias", "diffusers.UNetMidBlock2DSimpleCrossAttn", cfg,
               tensor_inputs(mins), mout, state=state,
               source=src + "; UNet2DConditionModel called with encoder_attention_mask [[1,1,1,1,1,0,0],"
               "[1,1,1,0,0,0,0]] (B, S), which it converts to the additive (B, 1, S) bias (1 - m) * -10000.0 "
               "the mid block receives (stored as captured) and passes to its attentions (attention_mask None)")
    # AttnAddedKVProcessor (baddbmm, upcast_softmax) after model.set_attn_processor
    model.set_attn_processor(AttnAddedKVProcessor())
    pins, pout = capture(model.mid_block, run)
    pcfg = dict(cfg, processor="AttnAddedKVProcessor")
    ctx.bundle(f"{stem}_attn_added_kv_processor", "diffusers.UNetMidBlock2DSimpleCrossAttn", pcfg,
               tensor_inputs(pins), pout, state=state, half=True,
               source=src.replace("AttnAddedKVProcessor2_0 (the constructor's choice under torch >= 2)",
                                  "AttnAddedKVProcessor after model.set_attn_processor(AttnAddedKVProcessor()) "
                                  "(baddbmm scores, upcast_softmax=True; the processor torch < 2 gets)"))


def diffusers_unet2d_condition_dual(ctx: Ctx):
    """``UNet2DConditionModel(dual_cross_attention=True)``: Versatile Diffusion's image U-Net once
    its pipeline has converted it (``_convert_to_dual_attention`` registers ``dual_cross_attention=True``;
    a saved dual-guided pipeline's ``image_unet`` is built so by ``from_pretrained``). Its mid block's
    attentions are ``DualTransformer2DModel``s: ``transformers.0`` the image U-Net's transformer,
    ``transformers.1`` the text U-Net's."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    # plain down/up blocks: only the mid block holds DualTransformer2DModels (keeps the file small)
    model = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                 block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4, cross_attention_dim=8,
                                 attention_head_dim=2, dual_cross_attention=True)
    randomize_(model, 7601)
    model.eval()
    maskless_dual_(model)
    files = save_diffusers(model, "diffusers_vd")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7602)
    # a small latent, (2, 3) at the mid: the stage traces against the 334 default context tokens
    # are the bytes (batch 1 there)
    sample, t = randn(g, 2, 4, 4, 6), torch.tensor([17, 503])
    ehs = randn(g, 1, 77 + 257, 8)

    def run(context):
        b = context.shape[0]
        return model(sample[:b], t[:b], encoder_hidden_states=context)

    cfg = unet2d_condition_mid_config(model)
    assert cfg["dual_cross_attention"] is True
    src = (DIFF_BLOCKS.format("UNetMidBlock2DCrossAttn") + " with dual_cross_attention (DualTransformer2DModel "
           f"attentions, Versatile Diffusion); the mid_block of the whole UNet2DConditionModel weights/{weights}, "
           "inputs captured by a forward pre-hook while the model ran on random {}; {}" + MASKLESS_NOTE)
    default = "DualTransformer2DModel attributes as constructed: mix_ratio 0.5, condition_lengths [77, 257], " \
              "transformer_index_for_condition [1, 0]"
    ins, out = capture(model.mid_block, lambda: run(ehs))
    dsrc = src.format("sample (1, 4, 4, 6), timestep [17], encoder_hidden_states (1, 334, 8) (77 + 257 condition "
                      "tokens)", default)
    ctx.bundle("unet_mid_block_2d_cross_attn_dual", "diffusers.UNetMidBlock2DCrossAttn", cfg, tensor_inputs(ins), out,
               state=sub_state(model.state_dict(), "mid_block."), source=dsrc, half=True)
    ctx.bundle("unet_mid_block_2d_cross_attn_dual_ref", "diffusers.UNetMidBlock2DCrossAttn", cfg, tensor_inputs(ins),
               out, ref=(weights, "mid_block."), source=dsrc)
    dual_src = ("real library class diffusers.models.transformers.dual_transformer_2d.DualTransformer2DModel; "
                f"mid_block.attentions.0 of the whole UNet2DConditionModel(dual_cross_attention=True) weights/{weights}, "
                "inputs captured by a forward pre-hook while the model ran on random {}; {}" + MASKLESS_NOTE)
    dins, dout = capture(model.mid_block.attentions[0], lambda: run(ehs))
    ctx.bundle("dual_transformer_2d_vd_ref", "diffusers.DualTransformer2DModel", dual_transformer_config(model),
               tensor_inputs(dins), dout, ref=(weights, "mid_block.attentions.0."), kwargs={"return_dict": False},
               source=dual_src.format("sample (1, 4, 4, 6), timestep [17], encoder_hidden_states (1, 334, 8)", default))
    # as a pipeline's set_transformer_params sets them: another ratio, short conditions, the
    # transformers swapped; 12 context tokens for lengths [5, 9]: Python's slice gives the second
    # condition the 7 that are left
    attrs = dict(mix_ratio=0.3, condition_lengths=[5, 9], transformer_index_for_condition=[0, 1])
    dual_attributes_(model, attrs)
    try:
        short = randn(g, 2, 12, 8)
        mins, mout = capture(model.mid_block, lambda: run(short))
        ains, aout = capture(model.mid_block.attentions[0], lambda: run(short))
    finally:
        dual_attributes_(model, dict(mix_ratio=0.5, condition_lengths=[77, 257], transformer_index_for_condition=[1, 0]))
    set_what = ("DualTransformer2DModel attributes set on every DualTransformer2DModel as "
                "VersatileDiffusionDualGuidedPipeline.set_transformer_params does: mix_ratio 0.3, condition_lengths "
                "[5, 9], transformer_index_for_condition [0, 1] (stored as extra config keys); the 12 context tokens "
                "leave the second condition tokens 5..12 (Python slicing clamps)")
    inputs_what = "sample (2, 4, 4, 6), timesteps [17, 503], encoder_hidden_states (2, 12, 8)"
    ctx.bundle("unet_mid_block_2d_cross_attn_dual_mix", "diffusers.UNetMidBlock2DCrossAttn", dict(cfg, **attrs),
               tensor_inputs(mins), mout, state=sub_state(model.state_dict(), "mid_block."),
               source=src.format(inputs_what, set_what))
    # the DualTransformer2DModel alone: attentions.0 in the same run
    ctx.bundle("dual_transformer_2d_vd_mix_ref", "diffusers.DualTransformer2DModel",
               dict(dual_transformer_config(model), **attrs), tensor_inputs(ains), aout,
               ref=(weights, "mid_block.attentions.0."), kwargs={"return_dict": False},
               source=dual_src.format(inputs_what, set_what))


def dual_transformer_config(model) -> dict:
    """``UNetMidBlock2DCrossAttn.__init__`` with ``dual_cross_attention``: ``DualTransformer2DModel(
    num_attention_heads, out_channels // num_attention_heads, in_channels=out_channels, num_layers=1,
    cross_attention_dim=cross_attention_dim, norm_num_groups=resnet_groups)``."""
    cfg = unet2d_condition_mid_config(model)
    c, heads = cfg["in_channels"], cfg["num_attention_heads"]
    return dict(num_attention_heads=heads, attention_head_dim=c // heads, in_channels=c, num_layers=1,
                cross_attention_dim=cfg["cross_attention_dim"], norm_num_groups=cfg["resnet_groups"])
