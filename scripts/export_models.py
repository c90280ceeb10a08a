#!/usr/bin/env python3
"""Small whole checkpoints of the real libraries (``weights/models/``) and mid-block ("bottleneck")
parity bundles checked against them (``weights/mid/``).

    python scripts/export_models.py            # delete weights/mid/*.safetensors and weights/models/, write all
    python scripts/export_models.py --verify   # export, then reload and re-check every file
    python scripts/export_models.py --verify-only

Checkpoints: tiny randomly initialised WHOLE models saved as their libraries save them (diffusers
``save_pretrained``; lucidrains ``Trainer.save``'s dict; an SD-style ``.ckpt`` of an ldm ``UNetModel``
+ first-stage ``Encoder`` / ``Decoder``, a bare ldm ``Model`` and a bare guided-diffusion ``UNetModel``
state dict, built from stable-diffusion-sdkit and guided-diffusion-sdk).

Bundles (format "1", see parity_bundle.py) for the block ids ``diffusers.ResnetBlock2D``,
``diffusers.UNetMidBlock2D``, ``diffusers.UNetMidBlock2DCrossAttn`` (``dual_cross_attention`` too),
``diffusers.DualTransformer2DModel``, ``diffusers.UNetMidBlock2DSimpleCrossAttn``, ``diffusers.UNetMidBlock3DCrossAttn``,
``diffusers.UNetMidBlockCrossAttnMotion``,
``diffusers.UNetMidBlock1D``, ``diffusers.MidResTemporalBlock1D``, ``diffusers.ValueFunctionMidBlock1D``, ``diffusers.ControlNetMidBlock``,
``denoising_diffusion_pytorch.MidBlock``, ``ldm.MidBlock``, ``openai.MiddleBlock``. Inputs of
the blocks inside a whole model are captured with a forward pre-hook while the whole model runs
on random inputs, and the block rebuilt from its config + weights must reproduce the output the
whole model's block produced, bit for bit (asserted). A *referencing* bundle holds no weights:
``parity.weights`` names the checkpoint (relative to the bundle's folder), ``parity.prefix`` the
key prefix and ``parity.weights_key`` (pickles with a top-level dict only) the entry holding the
state dict.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import json
import os
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from parity_bundle import (CONVERT_TO_FP16_MARK, convert_convs_to_half_, export_bundle, float64_copy,  # noqa: E402
                           load_bundle, load_checkpoint_state_dict, randomize_, resolve_weights, run_module)
from parity_trace import verify_traces  # noqa: E402
from reference import mid_blocks  # noqa: E402
from upstream import quietly  # noqa: E402

REPO = HERE.parent
WEIGHTS = REPO / "weights"
MODELS = WEIGHTS / "models"
MID = WEIGHTS / "mid"
# 28 MiB. 10 MiB before stage traces (issue 8); the float32 traces of 32 attention bundles made it
# 10,769,551 bytes; traces in all 173 bundles, the half-precision ones with their float64 copy's
# stages (half of the trace bytes), make it about 26.3 MB. 56 MiB since the accuracy bundles
# (weights/accuracy/, 15.5 MB) and the IF / Kandinsky / ControlNet models and bundles (issue 17,
# 5.5 MB) made it 47.4 MB: below the GPU machine's 64 MiB of working tree (the kit carries
# weights/ apart, scripts/gpu_kit.sh), with room for a few more small models.
# 60 MiB since issue 17's MoVQ, 1-D, dual-cross-attention and video models and bundles (about 9 MB)
# made it 62.4 MB. The GPU machine takes 64 MiB of working tree in all (tracked files and what
# is carried): the kit's CUDA binary (about 7 MB compressed) no longer fits beside the tree, so a
# GPU run must first make room (see scripts/gpu_kit.sh).
# Plus 2,943,914 bytes for Stable Video Diffusion's two tiny float16 models and 8 bundles (issue 17): 32 channels is
# the least these blocks take (GroupNorm(32) hard-coded), a 3 x 2 latent the least that keeps those norms well
# conditioned, and the half-precision twins carry float64 stages.
# Plus 1,315,362 bytes for issue 17's AnimateDiff UNetMotionModel and I2VGenXLUNet models and bundles.
# Plus 789,459 bytes for the tiny UNetControlNetXSModel and its ControlNetXSCrossAttnMidBlock2D bundles.
# Plus 9,694,004 bytes (issue 31) for the float64 stages of the 160 float32 bundles, stored as bfloat16 deltas
# (scripts/add_trace_twins.py): a stage is judged against PyTorch's own error, as an output is.
# Plus the outlier bundles of weights/outlier (issue 32, scripts/export_outliers.py), with their float64 stages.
MAX_WEIGHTS_BYTES = 60 * 1024 * 1024 + 2_943_914 + 1_315_362 + 789_459 + 9_694_004 + 1_500_000

HALF_DTYPES = (("float16", "f16"), ("bfloat16", "bf16"))

DIFF_BLOCKS = "real library class diffusers.models.unets.unet_2d_blocks.{}"
DIFF_RESNET = "real library class diffusers.models.resnet.ResnetBlock2D"
LUCID_MID = ("wrapper scripts/reference/mid_blocks.py LucidrainsMidBlock holding the real "
             "denoising_diffusion_pytorch.denoising_diffusion_pytorch ResnetBlock / Attention / ResnetBlock "
             "(Unet.mid_block1, mid_attn, mid_block2; forward = the Unet.forward lines x = mid_block1(x, t); "
             "x = mid_attn(x) + x; x = mid_block2(x, t))")
LDM_MID = ("wrapper scripts/reference/mid_blocks.py LdmMidBlock holding the published ldm.modules.diffusionmodules.model "
           "ResnetBlock / make_attn of Stability-AI/stablediffusion (SD 2.x ldm tree, as shipped by stable-diffusion-sdkit; "
           "unchanged from CompVis/latent-diffusion) mid.block_1 -> mid.attn_1 -> mid.block_2")
LDM_MID_LINEAR = ("; attn_1 = LinAttnBlock, re-stated in scripts/reference/ldm.py from CompVis/latent-diffusion "
                  "ldm/modules/diffusionmodules/model.py (commit a506df575647): the SD 2.x make_attn has no \"linear\"")
OPENAI_MID = ("scripts/reference/mid_blocks.py openai_middle_block: the published "
              "TimestepEmbedSequential(ResBlock, {}, ResBlock) of UNetModel.middle_block")
GUIDED = "guided_diffusion.unet of openai/guided-diffusion (as shipped by guided-diffusion-sdk)"
SD_OPENAIMODEL = ("ldm.modules.diffusionmodules.openaimodel of Stability-AI/stablediffusion (SD 2.x ldm tree, as shipped "
                  "by stable-diffusion-sdkit)")


def _diffusers_quiet():
    from diffusers.utils import logging as dlogging

    dlogging.set_verbosity_error()


# --------------------------------------------------------------------------------------------
# building a block from (block id, config) alone


def build_module(block: str, config: dict) -> nn.Module:
    cfg = dict(config)
    if block == "diffusers.ResnetBlock2D":
        from diffusers.models.resnet import ResnetBlock2D

        return ResnetBlock2D(**cfg)
    if block == "diffusers.UNetMidBlock2D":
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2D

        return UNetMidBlock2D(**cfg)
    if block == "diffusers.UNetMidBlock1D":
        from diffusers.models.unets.unet_1d_blocks import UNetMidBlock1D

        return UNetMidBlock1D(**cfg)
    if block in ("diffusers.MidResTemporalBlock1D", "diffusers.ValueFunctionMidBlock1D"):
        from diffusers.models.unets import unet_1d_blocks

        return getattr(unet_1d_blocks, block.split(".")[1])(**cfg)
    if block == "diffusers.UNetMidBlock2DCrossAttn":
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2DCrossAttn

        # the DualTransformer2DModel attributes are not constructor arguments (see dual_attributes_)
        attrs = {k: cfg.pop(k) for k in DUAL_ATTRIBUTES if k in cfg}
        module = UNetMidBlock2DCrossAttn(**cfg)
        if cfg.get("dual_cross_attention"):
            dual_attributes_(module, attrs)
            maskless_dual_(module)
        return module
    if block == "diffusers.DualTransformer2DModel":
        from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

        attrs = {k: cfg.pop(k) for k in DUAL_ATTRIBUTES if k in cfg}
        module = DualTransformer2DModel(**cfg)
        dual_attributes_(module, attrs)
        return module
    if block == "diffusers.UNetMidBlock2DSimpleCrossAttn":
        from diffusers.models import attention_processor
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2DSimpleCrossAttn

        # ``processor`` is not a constructor argument: the processor class the attentions run
        # (the constructor picks AttnAddedKVProcessor2_0 under torch >= 2)
        processor = cfg.pop("processor", None)
        module = UNetMidBlock2DSimpleCrossAttn(**cfg)
        if processor is not None:
            for attn in module.attentions:
                attn.set_processor(getattr(attention_processor, processor)())
        return module
    if block == "diffusers.UNetMidBlock3DCrossAttn":
        from diffusers.models.unets.unet_3d_blocks import UNetMidBlock3DCrossAttn

        return UNetMidBlock3DCrossAttn(**cfg)
    if block in ("diffusers.UNetMidBlockSpatioTemporal", "diffusers.MidBlockTemporalDecoder"):
        from diffusers.models.unets import unet_3d_blocks

        return getattr(unet_3d_blocks, block.split(".")[1])(**cfg)
    if block == "diffusers.UNetMidBlockCrossAttnMotion":
        from diffusers.models.unets.unet_motion_model import UNetMidBlockCrossAttnMotion

        return UNetMidBlockCrossAttnMotion(**cfg)
    if block == "diffusers.ControlNetMidBlock":
        return mid_blocks.ControlNetMidBlock(**cfg)
    if block == "diffusers.ControlNetXSCrossAttnMidBlock2D":
        from diffusers.models.controlnets.controlnet_xs import ControlNetXSCrossAttnMidBlock2D

        module = ControlNetXSCrossAttnMidBlock2D(**cfg)
        # the real class returns the tuple (h_base, h_ctrl): its outputs named after the forward's locals
        module.output_names = ("h_base", "h_ctrl")
        return module
    if block == "denoising_diffusion_pytorch.MidBlock":
        return mid_blocks.LucidrainsMidBlock(**cfg)
    if block == "ldm.MidBlock":
        return mid_blocks.LdmMidBlock(**cfg)
    if block == "openai.MiddleBlock":
        return mid_blocks.openai_middle_block(**cfg)
    raise KeyError(f"unknown block id {block!r}")


# ---- Versatile Diffusion's DualTransformer2DModel

# Attributes a pipeline sets on every DualTransformer2DModel (VersatileDiffusionDualGuidedPipeline
# .set_transformer_params), not constructor arguments: bundles carry them as extra config keys.
DUAL_ATTRIBUTES = ("mix_ratio", "condition_lengths", "transformer_index_for_condition")


def dual_attributes_(module: nn.Module, attrs: dict):
    """Set ``attrs`` (a subset of ``DUAL_ATTRIBUTES``) on every DualTransformer2DModel in ``module``
    (itself included), as ``set_transformer_params`` does."""
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    for m in module.modules():
        if isinstance(m, DualTransformer2DModel):
            for k, v in attrs.items():
                setattr(m, k, list(v) if isinstance(v, (list, tuple)) else v)


def _maskless_dual_class():
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    class DualTransformer2DModelMaskless(DualTransformer2DModel):
        """diffusers 0.42.1's UNetMidBlock2DCrossAttn / CrossAttnDownBlock2D call their attentions with
        ``encoder_attention_mask=...``, which DualTransformer2DModel.forward does not take: every call
        raises TypeError (diffusers issue #13651). This forward takes it (None only) and runs
        DualTransformer2DModel.forward unchanged."""

        def forward(self, hidden_states, encoder_hidden_states, timestep=None, attention_mask=None,
                    cross_attention_kwargs=None, return_dict: bool = True, encoder_attention_mask=None):
            assert encoder_attention_mask is None, "DualTransformer2DModel takes no encoder_attention_mask"
            return super().forward(hidden_states, encoder_hidden_states, timestep=timestep,
                                   attention_mask=attention_mask, cross_attention_kwargs=cross_attention_kwargs,
                                   return_dict=return_dict)

    return DualTransformer2DModelMaskless


def maskless_dual_(module: nn.Module):
    """Give every DualTransformer2DModel in ``module`` the forward that accepts the
    ``encoder_attention_mask=None`` its parent block passes (same weights, same arithmetic)."""
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    cls = _maskless_dual_class()
    for m in module.modules():
        if type(m) is DualTransformer2DModel:
            m.__class__ = cls
    return module


MASKLESS_NOTE = ("; diffusers 0.42.1's UNetMidBlock2DCrossAttn.forward passes encoder_attention_mask=None to "
                 "DualTransformer2DModel.forward, which has no such parameter (TypeError on every call, diffusers "
                 "issue #13651): the export gives each DualTransformer2DModel a subclass whose forward also takes "
                 "encoder_attention_mask=None and runs DualTransformer2DModel.forward unchanged")


# --------------------------------------------------------------------------------------------
# the kwargs each parent passes to its mid block (transcribed from diffusers 0.42.1)


def unet2d_mid_config(model) -> dict:
    """``UNet2DModel.__init__``: ``UNetMidBlock2D(in_channels=block_out_channels[-1],
    temb_channels=time_embed_dim, dropout, resnet_eps=norm_eps, resnet_act_fn=act_fn,
    output_scale_factor=mid_block_scale_factor, resnet_time_scale_shift, attention_head_dim=
    attention_head_dim if not None else block_out_channels[-1], resnet_groups=norm_num_groups,
    attn_groups=attn_norm_num_groups, add_attention)``."""
    c = model.config
    return dict(in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, resnet_time_scale_shift=c.resnet_time_scale_shift,
                attention_head_dim=c.attention_head_dim if c.attention_head_dim is not None else c.block_out_channels[-1],
                resnet_groups=c.norm_num_groups, attn_groups=c.attn_norm_num_groups, add_attention=c.add_attention)


def vae_mid_config(model, part: str) -> dict:
    """``Encoder`` / ``Decoder`` (autoencoders/vae.py) with ``norm_type="group"``:
    ``UNetMidBlock2D(in_channels=block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn=act_fn,
    output_scale_factor=1, resnet_time_scale_shift="default", attention_head_dim=block_out_channels[-1],
    resnet_groups=norm_num_groups, temb_channels=None, add_attention=mid_block_add_attention)``."""
    c = model.config
    assert part in ("encoder", "decoder")
    return dict(in_channels=c.block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn=c.act_fn, output_scale_factor=1,
                resnet_time_scale_shift="default", attention_head_dim=c.block_out_channels[-1],
                resnet_groups=c.norm_num_groups, temb_channels=None, add_attention=c.mid_block_add_attention)


def _per_block(value, n):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def unet2d_condition_mid_config(model) -> dict:
    """``UNet2DConditionModel.__init__`` -> ``get_mid_block("UNetMidBlock2DCrossAttn", ...)`` ->
    ``UNetMidBlock2DCrossAttn(transformer_layers_per_block, in_channels, temb_channels, dropout,
    resnet_eps, resnet_act_fn, output_scale_factor, resnet_time_scale_shift, cross_attention_dim,
    num_attention_heads, resnet_groups, dual_cross_attention, use_linear_projection,
    upcast_attention, attention_type)`` with the per-block lists' last entries and
    ``num_attention_heads = num_attention_heads or attention_head_dim``."""
    c = model.config
    assert c.mid_block_type == "UNetMidBlock2DCrossAttn"
    n = len(c.down_block_types)
    heads = c.num_attention_heads or c.attention_head_dim
    return dict(transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, resnet_time_scale_shift=c.resnet_time_scale_shift,
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(heads, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=c.dual_cross_attention, use_linear_projection=c.use_linear_projection,
                upcast_attention=c.upcast_attention, attention_type=c.attention_type)


def unet2d_condition_simple_cross_mid_config(model) -> dict:
    """``UNet2DConditionModel.__init__`` -> ``get_mid_block("UNetMidBlock2DSimpleCrossAttn", ...)`` ->
    ``UNetMidBlock2DSimpleCrossAttn(in_channels, temb_channels, dropout, resnet_eps, resnet_act_fn,
    output_scale_factor, cross_attention_dim, attention_head_dim, resnet_groups, resnet_time_scale_shift,
    skip_time_act=resnet_skip_time_act, only_cross_attention=mid_block_only_cross_attention,
    cross_attention_norm)`` with ``cross_attention_dim[-1]``, ``attention_head_dim[-1]`` and
    ``mid_block_only_cross_attention`` None -> ``only_cross_attention`` if a bool, else False."""
    c = model.config
    assert c.mid_block_type == "UNetMidBlock2DSimpleCrossAttn"
    n = len(c.down_block_types)
    only = c.mid_block_only_cross_attention
    if only is None:
        only = c.only_cross_attention if isinstance(c.only_cross_attention, bool) else False
    return dict(in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                attention_head_dim=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                resnet_time_scale_shift=c.resnet_time_scale_shift, skip_time_act=c.resnet_skip_time_act,
                only_cross_attention=only, cross_attention_norm=c.cross_attention_norm)


def unet3d_condition_mid_config(model) -> dict:
    """``UNet3DConditionModel.__init__`` (unets/unet_3d_condition.py): ``num_attention_heads`` must be None
    (NotImplementedError otherwise), ``num_attention_heads = num_attention_heads or attention_head_dim`` made
    per-block, ``time_embed_dim = block_out_channels[0] * 4``, then ``UNetMidBlock3DCrossAttn(in_channels=
    block_out_channels[-1], temb_channels=time_embed_dim, resnet_eps=norm_eps, resnet_act_fn=act_fn,
    output_scale_factor=mid_block_scale_factor, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False)``."""
    c = model.config
    assert c.num_attention_heads is None
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, cross_attention_dim=c.cross_attention_dim,
                num_attention_heads=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False)


def controlnet_mid_config(model) -> dict:
    """``ControlNetModel.__init__`` (controlnets/controlnet.py): ``time_embed_dim = block_out_channels[0] * 4``,
    ``num_attention_heads = num_attention_heads or attention_head_dim`` (made per-block), then for
    ``mid_block_type="UNetMidBlock2DCrossAttn"`` ``UNetMidBlock2DCrossAttn(transformer_layers_per_block=
    transformer_layers_per_block[-1], in_channels=block_out_channels[-1], temb_channels=time_embed_dim,
    resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
    resnet_time_scale_shift, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, use_linear_projection, upcast_attention)`` (no dropout, attention_type or
    resnet_groups_out: their defaults), for ``"UNetMidBlock2D"`` ``UNetMidBlock2D(in_channels, temb_channels,
    num_layers=0, resnet_eps, resnet_act_fn, output_scale_factor, resnet_groups, resnet_time_scale_shift,
    add_attention=False)``; ``controlnet_mid_block = Conv2d(block_out_channels[-1], block_out_channels[-1], 1)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    common = dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps,
                  resnet_act_fn=c.act_fn, output_scale_factor=c.mid_block_scale_factor,
                  resnet_time_scale_shift=c.resnet_time_scale_shift, resnet_groups=c.norm_num_groups)
    if c.mid_block_type == "UNetMidBlock2DCrossAttn":
        heads = c.num_attention_heads or c.attention_head_dim
        mid = dict(common, transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                   cross_attention_dim=c.cross_attention_dim, num_attention_heads=_per_block(heads, n)[-1],
                   use_linear_projection=c.use_linear_projection, upcast_attention=c.upcast_attention)
    else:
        assert c.mid_block_type == "UNetMidBlock2D"
        mid = dict(common, num_layers=0, add_attention=False)
    return dict(mid_block_type=c.mid_block_type, mid_block=mid, global_pool_conditions=c.global_pool_conditions)


def mid2d_resnet_config(mid_cfg: dict) -> dict:
    """``UNetMidBlock2D.__init__``'s ``ResnetBlock2D(in_channels=in_channels, out_channels=in_channels,
    temb_channels, eps=resnet_eps, groups=resnet_groups, dropout, time_embedding_norm=
    resnet_time_scale_shift, non_linearity=resnet_act_fn, output_scale_factor, pre_norm=resnet_pre_norm)``
    (the same for every resnet; ``resnet_groups`` None -> ``min(in_channels // 4, 32)``)."""
    c = mid_cfg["in_channels"]
    groups = mid_cfg.get("resnet_groups", 32)
    groups = groups if groups is not None else min(c // 4, 32)
    return dict(in_channels=c, out_channels=c, temb_channels=mid_cfg["temb_channels"],
                eps=mid_cfg.get("resnet_eps", 1e-6), groups=groups, dropout=mid_cfg.get("dropout", 0.0),
                time_embedding_norm=mid_cfg.get("resnet_time_scale_shift", "default"),
                non_linearity=mid_cfg.get("resnet_act_fn", "swish"),
                output_scale_factor=mid_cfg.get("output_scale_factor", 1.0), pre_norm=mid_cfg.get("resnet_pre_norm", True))


def cross_attn_resnet0_config(mid_cfg: dict) -> dict:
    """``UNetMidBlock2DCrossAttn.__init__``'s first ``ResnetBlock2D(in_channels, out_channels, temb_channels,
    eps=resnet_eps, groups=resnet_groups, groups_out=resnet_groups_out, dropout, time_embedding_norm,
    non_linearity, output_scale_factor, pre_norm)`` (``resnet_groups_out = resnet_groups_out or resnet_groups``)."""
    cfg = mid2d_resnet_config(mid_cfg)
    cfg["out_channels"] = mid_cfg.get("out_channels") or mid_cfg["in_channels"]
    cfg["groups_out"] = mid_cfg.get("resnet_groups_out") or cfg["groups"]
    keys = ["in_channels", "out_channels", "temb_channels", "eps", "groups", "groups_out", "dropout",
            "time_embedding_norm", "non_linearity", "output_scale_factor", "pre_norm"]
    return {k: cfg[k] for k in keys}


# --------------------------------------------------------------------------------------------
# capturing a submodule's inputs and output while the whole model runs


def capture(module: nn.Module, run, names=None, all_outputs=False):
    """Run ``run()`` and return (inputs, output) of the (single) call of ``module`` during it:
    inputs = OrderedDict forward-parameter name -> value (bound by the forward's signature; cloned);
    output: the first of a tuple, or (``all_outputs``) the tuple of every output."""
    rec = []

    def pre(mod, args, kwargs):
        rec.append([args, kwargs, None])

    def post(mod, args, kwargs, out):
        # cloned now: the model may update the returned tensors in place later (UNetControlNetXSModel's
        # up blocks add into h_base)
        rec[-1][2] = (tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out)
                      if isinstance(out, (tuple, list)) else out.detach().clone())

    h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = module.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        h1.remove()
        h2.remove()
    assert len(rec) == 1, f"{type(module).__name__} called {len(rec)} times"
    args, kwargs, out = rec[0]
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    ins = OrderedDict()
    for name, value in bound.arguments.items():
        if names is not None:
            name = names.get(name, name)
        # clone() keeps the strides the whole model gave (e.g. a channels-last-strided hidden_states
        # after an attention block): the in-model check reruns on exactly these, the bundle stores
        # contiguous copies (see Ctx.bundle)
        ins[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    if isinstance(out, (tuple, list)):
        if all_outputs:
            return ins, tuple(o.detach().clone() for o in out)
        out = out[0]
    return ins, out.detach().clone()


def tensor_inputs(ins, drop=()):
    """Forward inputs as stored in a bundle: tensors only (None and non-tensor arguments left out)."""
    return OrderedDict((k, v) for k, v in ins.items() if isinstance(v, torch.Tensor) and k not in drop)


def sub_state(state: dict, prefix: str) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((k[len(prefix):], v) for k, v in state.items() if k.startswith(prefix))


# --------------------------------------------------------------------------------------------
# the whole models


class Ctx:
    """Collects checkpoint files and bundle specs."""

    def __init__(self):
        self.files = []     # written checkpoint files (Path)
        self.specs = []     # bundle specs

    def bundle(self, name, block, config, inputs, expected, *, state=None, ref=None, source="", module=None,
               half=False, note="", kwargs=None):
        """``state``: the block's own weights (self-contained bundle); ``ref``: (checkpoint path
        relative to weights/, prefix[, key]) (referencing bundle). ``expected``: the output of the
        block inside the whole model (or of the module that produced the checkpoint)."""
        assert (state is None) != (ref is None)
        raw = inputs
        inputs = OrderedDict((k, v.contiguous()) for k, v in inputs.items())
        self.specs.append(dict(path=f"mid/{name}.safetensors", block=block, config=config, inputs=inputs,
                               expected=expected, state=state, ref=ref, source=source, half=half, note=note,
                               kwargs=kwargs, raw_inputs=raw))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def save_diffusers(model, name, safe=True):
    folder = MODELS / name
    model.save_pretrained(folder, safe_serialization=safe)
    out = [folder / "config.json", folder / ("diffusion_pytorch_model.safetensors" if safe else "diffusion_pytorch_model.bin")]
    for p in out:
        assert p.is_file(), p
    return out


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
    from diffusers.models.attention_processor import AttnAddedKVProcessor

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


def diffusers_unet3d(ctx: Ctx):
    """``UNet3DConditionModel``: the ModelScope / Zeroscope text-to-video U-Net, whose mid block
    ``UNetMidBlock3DCrossAttn`` adds a ``TemporalConvLayer`` after each resnet and a
    ``TransformerTemporalModel`` after each spatial transformer, on ``(batch * num_frames, C, H, W)``.
    ``randomize_`` also replaces the zero init of each ``TemporalConvLayer.conv4`` conv."""
    from diffusers import UNet3DConditionModel

    torch.manual_seed(0)
    model = UNet3DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                                 down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                 up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), block_out_channels=(8, 16),
                                 layers_per_block=1, norm_num_groups=4, cross_attention_dim=8, attention_head_dim=4)
    randomize_(model, 7601)
    model.eval()
    assert all(bool(tc.conv4[-1].weight.detach().abs().max() > 0) for tc in model.mid_block.temp_convs)
    files = save_diffusers(model, "diffusers_unet3d")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7602)
    frames = 3
    sample, t, ehs = randn(g, 2, 4, frames, 4, 4), torch.tensor([17, 503]), randn(g, 2, 5, 8)

    def run():
        return model(sample, t, encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins["attention_mask"] is None
    cfg = unet3d_condition_mid_config(model)
    kwargs = {"num_frames": frames}
    src = (DIFF_BLOCKS.format("UNetMidBlock3DCrossAttn") + f"; the mid_block of the whole UNet3DConditionModel "
           f"weights/{weights} (block_out_channels (8, 16), attention_head_dim 4 -> the mid block's "
           "num_attention_heads 4 = 4 heads of width 4, norm_num_groups 4, cross_attention_dim 8; every TemporalConvLayer "
           "conv4 randomized, not zero), inputs captured by a forward pre-hook while the model ran on random sample "
           f"(2, 4, {frames}, 4, 4) (batch 2, {frames} frames), timesteps [17, 503], encoder_hidden_states (2, 5, 8); "
           f"the mid block sees (batch * frames, C, H, W) and num_frames={frames} (parity.kwargs), temb and "
           "encoder_hidden_states repeated per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_3d_cross_attn_unet3d"
    ctx.bundle(stem, "diffusers.UNetMidBlock3DCrossAttn", cfg, tensor_inputs(ins), out, state=state, source=src,
               half=True, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", "diffusers.UNetMidBlock3DCrossAttn", cfg, tensor_inputs(ins), out,
               ref=(weights, "mid_block."), source=src, kwargs=kwargs)
    # UNetMidBlock3DCrossAttn.forward takes attention_mask and passes it to nothing: the same output bit for
    # bit (asserted here, not stored: tests/checkpoints.rs adds such a mask to the bundle and it still passes)
    bias = torch.zeros(2 * frames, 1, 5)
    bias[:, :, 3:] = -10000.0
    with torch.no_grad():
        assert torch.equal(model.mid_block(**tensor_inputs(ins), attention_mask=bias, **kwargs), out)


def svd_unet_mid_config(model) -> dict:
    """``UNetSpatioTemporalConditionModel.__init__`` (unets/unet_spatio_temporal_condition.py): per-block
    ``num_attention_heads``, ``cross_attention_dim``, ``transformer_layers_per_block``, ``time_embed_dim =
    block_out_channels[0] * 4``, then ``UNetMidBlockSpatioTemporal(block_out_channels[-1], temb_channels=
    time_embed_dim, transformer_layers_per_block=transformer_layers_per_block[-1], cross_attention_dim=
    cross_attention_dim[-1], num_attention_heads=num_attention_heads[-1])``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb,
                transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(c.num_attention_heads, n)[-1])


def svd_vae_mid_config(model, part: str) -> dict:
    """``AutoencoderKLTemporalDecoder.__init__`` (autoencoders/autoencoder_kl_temporal_decoder.py): the encoder is
    vae.py's ``Encoder`` with its defaults (``act_fn="silu"``, ``norm_num_groups=32``, ``mid_block_add_attention=True``):
    ``UNetMidBlock2D(in_channels=block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn="silu", output_scale_factor=1,
    resnet_time_scale_shift="default", attention_head_dim=block_out_channels[-1], resnet_groups=32, temb_channels=None,
    add_attention=True)``; the decoder (``TemporalDecoder``) builds ``MidBlockTemporalDecoder(num_layers=
    layers_per_block, in_channels=block_out_channels[-1], out_channels=block_out_channels[-1],
    attention_head_dim=block_out_channels[-1])``."""
    c = model.config
    last = c.block_out_channels[-1]
    if part == "decoder":
        return dict(num_layers=c.layers_per_block, in_channels=last, out_channels=last, attention_head_dim=last)
    return dict(in_channels=last, resnet_eps=1e-6, resnet_act_fn="silu", output_scale_factor=1,
                resnet_time_scale_shift="default", attention_head_dim=last, resnet_groups=32, temb_channels=None,
                add_attention=True)


def mix_factors_(model, seed):
    """Every ``AlphaBlender.mix_factor`` set to a distinct value away from its init (0.5 in the U-Net, 0.0 in the
    VAE decoder), so that sigmoid(mix_factor) weighs the spatial and temporal paths unequally and differently per
    blender (``randomize_`` has no rule for it)."""
    from diffusers.models.resnet import AlphaBlender

    g = gen(seed)
    blenders = [m for m in model.modules() if isinstance(m, AlphaBlender)]
    with torch.no_grad():
        for m in blenders:
            m.mix_factor.copy_(torch.empty(1).uniform_(-1.5, 1.5, generator=g))
    assert blenders and all(abs(float(m.mix_factor.detach())) > 0.05 for m in blenders)


def svd_model_(ctx: Ctx, model, name, seed):
    """``randomize_`` (seed) and ``mix_factors_`` (seed + 1) ``model``, then ``save_diffusers`` of ``model.half()``
    (as Stability publishes SVD's fp16 variants; half the bytes), leaving the model in float32 holding exactly those
    float16 values: the whole model's float32 run that the bundles capture uses the weights the checkpoint holds, and
    a float32 block built on the checkpoint converts them exactly. Returns the weights' path relative to weights/."""
    randomize_(model, seed)
    mix_factors_(model, seed + 1)
    model.eval().half()
    files = save_diffusers(model, name)
    model.float()
    ctx.files += files
    return files[1].relative_to(WEIGHTS).as_posix()


def diffusers_svd_unet(ctx: Ctx):
    """``UNetSpatioTemporalConditionModel``: Stable Video Diffusion's U-Net, whose mid block
    ``UNetMidBlockSpatioTemporal`` runs ``SpatioTemporalResBlock``s and a ``TransformerSpatioTemporalModel`` on
    ``(batch * num_frames, C, H, W)``. One level (``GroupNorm(32)`` is hard-coded in these blocks, so 32 channels is
    the smallest width), resnet-only down / up blocks, every ``mix_factor`` random."""
    from diffusers import UNetSpatioTemporalConditionModel

    torch.manual_seed(0)
    model = UNetSpatioTemporalConditionModel(sample_size=4, in_channels=8, out_channels=4,
                                             down_block_types=("DownBlockSpatioTemporal",),
                                             up_block_types=("UpBlockSpatioTemporal",), block_out_channels=(32,),
                                             addition_time_embed_dim=4, projection_class_embeddings_input_dim=12,
                                             layers_per_block=1, cross_attention_dim=8, num_attention_heads=2,
                                             num_frames=2)
    weights = svd_model_(ctx, model, "diffusers_svd", 7701)
    g = gen(7713)
    frames = 2
    cfg = svd_unet_mid_config(model)
    # 3 x 2 is about the smallest latent that keeps GroupNorm(32) over 32 channels well conditioned (at 2 x 1 each
    # group holds 2 values and float32 stages differ from PyTorch's by more than the tolerance)
    sample, ehs, added = randn(g, 1, frames, 8, 3, 2), randn(g, 1, 4, 8), randn(g, 1, 3)
    ins, _ = capture(model.mid_block, lambda: model(sample, torch.tensor([321.0]), encoder_hidden_states=ehs,
                                                    added_time_ids=added))
    assert ins["image_only_indicator"].shape == (1, frames) and not ins["image_only_indicator"].any()
    # The U-Net passes image_only_indicator zeros and the same temb / context for every frame: here [[0, 1]] (frame 1
    # an image: the learned_with_images mixers take it from the spatial path) and per-frame temb / context (the
    # temporal blocks take frame 0's context, the temporal resnets each frame's temb), output by the same mid block.
    mixed = OrderedDict(ins)
    mixed["image_only_indicator"] = torch.tensor([[0.0, 1.0]])
    mixed["temb"] = ins["temb"] + 0.5 * randn(g, *ins["temb"].shape)
    mixed["encoder_hidden_states"] = randn(g, *ins["encoder_hidden_states"].shape)
    with torch.no_grad():
        mout = model.mid_block(**tensor_inputs(mixed))
    src = (DIFF_BLOCKS.replace("unet_2d_blocks", "unet_3d_blocks").format("UNetMidBlockSpatioTemporal")
           + f"; the mid_block of the whole UNetSpatioTemporalConditionModel weights/{weights} (saved in float16; "
           "block_out_channels (32,), num_attention_heads 2 (2 heads of 16), cross_attention_dim 8, "
           "transformer_layers_per_block 1; every AlphaBlender mix_factor random); hidden_states captured by a forward "
           f"pre-hook while the float32 model ran on a random sample (1, {frames}, 8, 3, 2) (batch 1, {frames} frames), "
           "timestep 321, encoder_hidden_states (1, 4, 8), added_time_ids (1, 3); the U-Net's temb plus 0.5 * N(0, 1) "
           "noise and encoder_hidden_states N(0, 1) per frame (the U-Net repeats them per frame), image_only_indicator "
           "[[0, 1]] (the U-Net passes zeros); the output is model.mid_block's on these inputs")
    ctx.bundle("unet_mid_block_spatio_temporal_svd_mixed_ref", "diffusers.UNetMidBlockSpatioTemporal", cfg,
               tensor_inputs(mixed), mout, ref=(weights, "mid_block."), source=src, half=True)


def diffusers_svd_vae(ctx: Ctx):
    """``AutoencoderKLTemporalDecoder``: Stable Video Diffusion's VAE. Its encoder's mid block is a plain
    ``UNetMidBlock2D``; its decoder's is ``MidBlockTemporalDecoder`` (``layers_per_block`` 2: ``resnets.0``,
    ``attentions.0``, ``resnets.1``). One level of 32 channels, every ``mix_factor`` random."""
    from diffusers import AutoencoderKLTemporalDecoder

    torch.manual_seed(0)
    model = AutoencoderKLTemporalDecoder(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                                         block_out_channels=(32,), layers_per_block=2, latent_channels=4,
                                         sample_size=4)
    weights = svd_model_(ctx, model, "diffusers_svd_vae", 7801)
    g = gen(7803)
    frames = 2
    x = randn(g, frames, 3, 3, 2)

    def run():
        return model(x, num_frames=frames)  # encode -> posterior mode -> decode(num_frames)

    src = ("real library class diffusers.models.unets.{} ; the {}.mid_block of the whole AutoencoderKLTemporalDecoder "
           f"weights/{weights} (saved in float16; block_out_channels (32,), layers_per_block 2; every AlphaBlender "
           f"mix_factor random), inputs captured by a forward pre-hook while the float32 AutoencoderKLTemporalDecoder.forward ran on a random sample "
           f"({frames}, 3, 3, 2) with num_frames={frames} (encode, posterior mode, decode)")
    ins, out = capture(model.encoder.mid_block, run)
    ctx.bundle("unet_mid_block_2d_svd_vae_encoder_ref", "diffusers.UNetMidBlock2D", svd_vae_mid_config(model, "encoder"),
               tensor_inputs(ins), out, ref=(weights, "encoder.mid_block."),
               source=src.format("unet_2d_blocks.UNetMidBlock2D", "encoder") + "; the VAE passes temb=None")
    ins, out = capture(model.decoder.mid_block, run)
    assert ins["image_only_indicator"].shape == (1, frames)
    cfg = svd_vae_mid_config(model, "decoder")
    dsrc = src.format("unet_3d_blocks.MidBlockTemporalDecoder", "decoder") + "; the decoder passes image_only_indicator zeros"
    ctx.bundle("mid_block_temporal_decoder_svd_ref", "diffusers.MidBlockTemporalDecoder", cfg, tensor_inputs(ins), out,
               ref=(weights, "decoder.mid_block."), source=dsrc, half=True)
    # One video of 3 frames (the learned mixers do not read image_only_indicator's values, only its frame count)
    z = randn(g, 3, 4, 2, 3)
    ins, out = capture(model.decoder.mid_block, lambda: model.decode(z, num_frames=3))
    ctx.bundle("mid_block_temporal_decoder_svd_3_frames_ref", "diffusers.MidBlockTemporalDecoder", cfg,
               tensor_inputs(ins), out, ref=(weights, "decoder.mid_block."),
               source=("real library class diffusers.models.unets.unet_3d_blocks.MidBlockTemporalDecoder; the "
                       f"decoder.mid_block of the whole AutoencoderKLTemporalDecoder weights/{weights}, inputs captured "
                       "by a forward pre-hook while AutoencoderKLTemporalDecoder.decode ran on a random latent (3, 4, 2, 3) "
                       "with num_frames=3 (one video of 3 frames); the decoder passes image_only_indicator zeros (1, 3)"))


def lucidrains(ctx: Ctx):
    from denoising_diffusion_pytorch.version import __version__
    from denoising_diffusion_pytorch import GaussianDiffusion, Unet
    from ema_pytorch import EMA

    torch.manual_seed(0)
    unet = Unet(dim=6, dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8))
    diffusion = GaussianDiffusion(unet, image_size=(8, 12), timesteps=100)
    randomize_(diffusion.model, 7301)
    # as Trainer.__init__ builds them: Adam over the diffusion parameters, EMA(diffusion, beta=ema_decay,
    # update_every=ema_update_every) with the Trainer defaults
    opt = torch.optim.Adam(diffusion.parameters(), lr=1e-4, betas=(0.9, 0.99))
    ema = EMA(diffusion, beta=0.995, update_every=10)
    ema.update()  # first call: copies the online weights into the EMA model (initted, step 1)
    # "training": new online weights, then one moving-average step (decay 0.5) so EMA != online
    randomize_(diffusion.model, 7302)
    ema.update_moving_average(ema.ema_model, ema.online_model, current_decay=0.5)
    diffusion.eval()
    ema.ema_model.eval()
    data = {"step": 1, "model": diffusion.state_dict(), "opt": opt.state_dict(), "ema": ema.state_dict(),
            "scaler": None, "version": __version__}
    folder = MODELS / "lucidrains_ddpm"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-1.pt"
    torch.save(data, path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()
    g = gen(7303)
    x, time = randn(g, 2, 3, 8, 12), torch.tensor([3, 71])
    for entry, net, prefix in (("model", diffusion.model, "model."), ("ema", ema.ema_model.model, "ema_model.model.")):
        wrapper = mid_blocks.LucidrainsMidBlock.of(net)
        ins, _ = capture(net.mid_block1, lambda: net(x, time), names={"t": "time_emb"})
        _, out = capture(net.mid_block2, lambda: net(x, time))
        cfg = mid_blocks.LucidrainsMidBlock.config_of(net)
        assert torch.equal(run_module(wrapper, tensor_inputs(ins))["output"], out)
        src = (LUCID_MID + f"; the Unet of the Trainer.save checkpoint weights/{weights}, entry '{entry}' "
               f"({'GaussianDiffusion.state_dict()' if entry == 'model' else 'ema_pytorch EMA.state_dict(); EMA != online weights'}), "
               "prefix " + prefix + "; x = the Unet's mid_block1 input and time_emb = time_mlp(time) captured by a "
               "forward pre-hook while the Unet ran on random x (2, 3, 8, 12), time [3, 71]; expected output = "
               "mid_block2's output in that run")
        ctx.bundle(f"lucidrains_mid_block_{entry}", "denoising_diffusion_pytorch.MidBlock", cfg, tensor_inputs(ins), out,
                   state=wrapper.state_dict(), source=src, half=(entry == "model"))
        ctx.bundle(f"lucidrains_mid_block_{entry}_ref", "denoising_diffusion_pytorch.MidBlock", cfg, tensor_inputs(ins),
                   out, ref=(weights, prefix, entry), source=src)


# ---- ldm (SD 2.x tree, stable-diffusion-sdkit) and OpenAI (guided-diffusion-sdk) whole models


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


def guided_diffusion_checkpoint(ctx: Ctx):
    """guided-diffusion's own checkpoint format, a bare ``UNetModel.state_dict()`` ``.pt``, of a whole
    ``guided_diffusion.unet.UNetModel`` (AttentionBlock with QKVAttentionLegacy, 4 heads,
    use_scale_shift_norm)."""
    from guided_diffusion.unet import UNetModel

    torch.manual_seed(0)
    unet_kw = dict(image_size=8, in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                   attention_resolutions=(), channel_mult=(1,), num_heads=4, use_scale_shift_norm=True)
    unet = UNetModel(**unet_kw)
    randomize_(unet, 7501)
    unet.eval()
    folder = MODELS / "guided_tiny"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "guided_tiny.pt"
    torch.save(unet.state_dict(), path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()
    cfg = dict(channels=32, emb_channels=unet.time_embed[0].out_features, dropout=0.0, dims=2,
               use_scale_shift_norm=True, num_heads=4, num_head_channels=-1, use_new_attention_order=False,
               use_spatial_transformer=False, transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
               disable_middle_self_attn=False, legacy=True)
    g = gen(7510)
    x, t = randn(g, 2, 3, 5, 3), torch.tensor([17, 503])
    ins, out = capture(unet.middle_block, lambda: unet(x, t))
    ctx.bundle("openai_middle_block_guided_legacy_scale_shift_ref", "openai.MiddleBlock", cfg, tensor_inputs(ins), out,
               ref=(weights, "middle_block."),
               source=OPENAI_MID.format("AttentionBlock (QKVAttentionLegacy, 4 heads)") + f" of {GUIDED}: the "
               f"middle_block of the whole UNetModel({json.dumps(unet_kw)}) saved as its bare state dict weights/{weights}; "
               "x and emb = the middle_block's inputs captured by a forward pre-hook while the UNetModel ran on random "
               "x (2, 3, 5, 3), timesteps [17, 503]; expected output = its output in that run")


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


def standalone_restated(ctx: Ctx):
    """Self-contained ldm.MidBlock / openai.MiddleBlock bundles (random weights and inputs)."""
    # ldm: LinAttnBlock mid (DDPM Model with use_linear_attn / attn_type "linear"), with temb
    for name, cfg, seed, shape, half in (
            ("ldm_mid_block_linear", dict(in_channels=32, temb_channels=24, dropout=0.0, attn_type="linear"), 7701,
             (2, 32, 5, 3), True),
            ("ldm_mid_block_vae_vanilla", dict(in_channels=32, temb_channels=0, dropout=0.0, attn_type="vanilla"),
             7702, (1, 32, 6, 4), False)):
        torch.manual_seed(0)
        m = mid_blocks.LdmMidBlock(**cfg)
        randomize_(m, seed)
        m.eval()
        g = gen(seed + 100)
        ins = OrderedDict(x=randn(g, *shape))
        if cfg["temb_channels"]:
            ins["temb"] = randn(g, shape[0], cfg["temb_channels"])
        out = run_module(m, ins)["output"]
        what = {"linear": "LinAttnBlock (no norm, no residual)", "vanilla": "AttnBlock, VAE-style temb_channels 0",
                "none": "attn_type none (nn.Identity)"}[cfg["attn_type"]]
        ctx.bundle(name, "ldm.MidBlock", cfg, ins, out, state=m.state_dict(),
                   source=LDM_MID + (LDM_MID_LINEAR if cfg["attn_type"] == "linear" else "") +
                   f"; {what}; random weights and inputs (x, temb N(0, 1))", half=half)
    # openai: SD 2.x linear SpatialTransformer middle; AttentionBlock with the new qkv order
    for name, cfg, seed, shape, what in (
            ("openai_middle_block_sd2_linear",
             dict(channels=32, emb_channels=32, dropout=0.0, dims=2, use_scale_shift_norm=False, num_heads=-1,
                  num_head_channels=8, use_new_attention_order=False, use_spatial_transformer=True, transformer_depth=1,
                  context_dim=20, use_linear_in_transformer=True, disable_middle_self_attn=False, legacy=False),
             7711, (2, 32, 4, 5), "SpatialTransformer (use_linear; num_head_channels 8 -> 4 heads of 8) from " + SD_OPENAIMODEL),
            ("openai_middle_block_new_order",
             dict(channels=32, emb_channels=24, dropout=0.0, dims=2, use_scale_shift_norm=False, num_heads=-1,
                  num_head_channels=16, use_new_attention_order=True, use_spatial_transformer=False,
                  transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
                  disable_middle_self_attn=False, legacy=False),
             7712, (2, 32, 3, 5), "AttentionBlock (QKVAttention, new order; num_head_channels 16 -> 2 heads) from " + GUIDED)):
        torch.manual_seed(0)
        m = mid_blocks.openai_middle_block(**cfg)
        randomize_(m, seed)
        m.eval()
        g = gen(seed + 100)
        ins = OrderedDict(x=randn(g, *shape), emb=randn(g, shape[0], cfg["emb_channels"]))
        if cfg["use_spatial_transformer"]:
            ins["context"] = randn(g, shape[0], 6, cfg["context_dim"])
        out = run_module(m, ins)["output"]
        ctx.bundle(name, "openai.MiddleBlock", cfg, ins, out, state=m.state_dict(),
                   source=OPENAI_MID.format(what) + "; random weights and inputs (x, emb, context N(0, 1))",
                   half=True)


def diffusers_controlnet(ctx: Ctx):
    """``ControlNetModel`` (diffusers 0.42.1 controlnets/controlnet.py): its ``mid_block`` and the
    ``controlnet_mid_block`` zero convolution (random non-zero weights here, so a port that drops or
    misreads it fails), checked as ``diffusers.ControlNetMidBlock`` against the outputs of the whole
    model's forward: the mid block's ``sample`` (captured by a forward hook) and the returned
    ``mid_block_res_sample``."""
    from diffusers import ControlNetModel

    common = dict(in_channels=4, conditioning_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), norm_num_groups=4, cross_attention_dim=24,
                  conditioning_embedding_out_channels=(4, 8))
    variants = [
        # name (None: not saved as a model), extra kwargs, seed, conditioning_scale, what
        ("diffusers_controlnet", dict(attention_head_dim=(1, 2), use_linear_projection=True,
                                      transformer_layers_per_block=(1, 2), upcast_attention=True,
                                      mid_block_scale_factor=1.25), 7501, 0.7,
         "SD 2.x / XL-like ControlNet (attention_head_dim [1, 2] -> 2 heads at the mid, use_linear_projection, "
         "transformer_layers_per_block [1, 2] -> 2 at the mid, upcast_attention, mid_block_scale_factor 1.25)"),
        ("global_pool", dict(attention_head_dim=2, resnet_time_scale_shift="scale_shift", global_pool_conditions=True),
         7502, 0.5, "SD 1.x-like ControlNet with global_pool_conditions (conv projections, attention_head_dim 2 = "
         "2 heads, resnet_time_scale_shift scale_shift; the residual mean-pooled over H, W)"),
        ("unet_mid_block_2d", dict(attention_head_dim=2, mid_block_type="UNetMidBlock2D"), 7503, 1.0,
         "ControlNet with mid_block_type UNetMidBlock2D (one ResNet: num_layers 0, add_attention False)"),
    ]
    for name, kw, seed, scale, what in variants:
        torch.manual_seed(0)
        model = ControlNetModel(**common, **kw)
        randomize_(model, seed)
        model.eval()
        assert model.controlnet_mid_block.weight.abs().min() > 0, "the zero conv must be randomised"
        g = gen(seed + 1)
        sample, t = randn(g, 2, 4, 8, 12), torch.tensor([17, 503])
        ehs, cond = randn(g, 2, 7, 24), randn(g, 2, 3, 16, 24)

        def run():
            return model(sample, t, encoder_hidden_states=ehs, controlnet_cond=cond, conditioning_scale=scale,
                         return_dict=False)

        ins, mid_out = capture(model.mid_block, run)
        with torch.no_grad():
            res = run()[1]
        cfg = controlnet_mid_config(model)
        kwargs = {"conditioning_scale": scale}
        stem = "controlnet_mid_block" + ("" if name == "diffusers_controlnet" else f"_{name}")
        inputs_what = (f"random sample (2, 4, 8, 12), timesteps [17, 503], encoder_hidden_states (2, 7, 24), "
                       f"controlnet_cond (2, 3, 16, 24), conditioning_scale {scale}")
        if name == "diffusers_controlnet":
            files = save_diffusers(model, name)
            ctx.files += files
            weights = files[1].relative_to(WEIGHTS).as_posix()
            src = (f"wrapper scripts/reference/mid_blocks.py ControlNetMidBlock holding the real diffusers "
                   f"UNetMidBlock2DCrossAttn and nn.Conv2d of the whole ControlNetModel weights/{weights} (mid_block, "
                   f"controlnet_mid_block); {what}; inputs captured by a forward pre-hook while the model ran on "
                   f"{inputs_what}; outputs: the model's mid_block_res_sample and the mid block's output")
        else:
            src = (f"wrapper scripts/reference/mid_blocks.py ControlNetMidBlock holding the real diffusers "
                   f"{cfg['mid_block_type']} and nn.Conv2d of a whole ControlNetModel (not saved); {what}; inputs "
                   f"captured by a forward pre-hook while the model ran on {inputs_what}; outputs: the model's "
                   "mid_block_res_sample and the mid block's output")
        # the wrapper on the captured inputs gives the whole model's outputs bit for bit (asserted in export_all)
        state = OrderedDict((k, v) for k, v in model.state_dict().items()
                            if k.startswith(("mid_block.", "controlnet_mid_block.")))
        ctx.bundle(stem, "diffusers.ControlNetMidBlock", cfg, tensor_inputs(ins), (res, mid_out), state=state,
                   source=src, half=(name == "diffusers_controlnet"), kwargs=kwargs)
        if name == "diffusers_controlnet":
            ctx.bundle(f"{stem}_ref", "diffusers.ControlNetMidBlock", cfg, tensor_inputs(ins), (res, mid_out),
                       ref=(weights, ""), source=src, kwargs=kwargs)

def controlnet_xs_mid_config(model) -> dict:
    """``UNetControlNetXSModel.__init__`` (controlnets/controlnet_xs.py): ``time_embed_dim = block_out_channels[0] * 4``,
    ``transformer_layers_per_block``, ``cross_attention_dim``, ``num_attention_heads`` and ``ctrl_num_attention_heads``
    made per-block, then ``ControlNetXSCrossAttnMidBlock2D(base_channels=block_out_channels[-1],
    ctrl_channels=ctrl_block_out_channels[-1], temb_channels=time_embed_dim, norm_num_groups, ctrl_max_norm_num_groups,
    transformer_layers_per_block[-1], base_num_attention_heads=num_attention_heads[-1],
    ctrl_num_attention_heads=ctrl_num_attention_heads[-1], cross_attention_dim[-1], upcast_attention,
    use_linear_projection)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.base_time_embedding.linear_2.out_features
    return dict(base_channels=c.block_out_channels[-1], ctrl_channels=c.ctrl_block_out_channels[-1], temb_channels=temb,
                norm_num_groups=c.norm_num_groups, ctrl_max_norm_num_groups=c.ctrl_max_norm_num_groups,
                transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                base_num_attention_heads=_per_block(c.num_attention_heads, n)[-1],
                ctrl_num_attention_heads=_per_block(c.ctrl_num_attention_heads, n)[-1],
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1], upcast_attention=c.upcast_attention,
                use_linear_projection=c.use_linear_projection)


def diffusers_controlnet_xs(ctx: Ctx):
    """``UNetControlNetXSModel`` (diffusers 0.42.1 controlnets/controlnet_xs.py): a U-Net fused with a ControlNet-XS
    adapter, whose mid block ``ControlNetXSCrossAttnMidBlock2D`` runs the base and the control mid blocks side by
    side, joined by the ``base_to_ctrl`` / ``ctrl_to_base`` zero convolutions (random non-zero weights here, so a
    port that drops either fails). Bundles from the real class's mid block inside the whole model's forward, with
    ``conditioning_scale`` 0.6 and, once, ``apply_control=False`` (the model's own path that leaves the control
    stream out: the mid block then returns the control input as it came)."""
    from diffusers import UNetControlNetXSModel

    torch.manual_seed(0)
    model = UNetControlNetXSModel(
        sample_size=8, down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"), block_out_channels=(4, 8), norm_num_groups=4,
        cross_attention_dim=12, transformer_layers_per_block=(1, 2), num_attention_heads=(1, 2),
        ctrl_conditioning_embedding_out_channels=(4, 8), ctrl_block_out_channels=(4, 4), ctrl_num_attention_heads=(1, 2),
        ctrl_max_norm_num_groups=3, ctrl_learn_time_embedding=True, time_embedding_mix=0.75)
    randomize_(model, 7601)
    model.eval()
    for conv in (model.mid_block.base_to_ctrl, model.mid_block.ctrl_to_base):
        assert conv.weight.abs().min() > 0, "the zero convs must be randomised"
    assert model.mid_block.ctrl_midblock.resnets[0].norm1.num_groups == 2  # find_largest_factor(gcd(4, 12), 3)
    files = save_diffusers(model, "diffusers_controlnet_xs")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    cfg = controlnet_xs_mid_config(model)
    g = gen(7602)
    sample, t = randn(g, 2, 4, 4, 6), torch.tensor([17, 503])
    ehs, cond = randn(g, 2, 5, 12), randn(g, 2, 3, 8, 12)
    what = ("tiny UNetControlNetXSModel (block_out_channels [4, 8], ctrl_block_out_channels [4, 4], DownBlock2D / UpBlock2D "
            "around the mid, 2 base and 2 ctrl heads and 2 transformer layers at the mid, use_linear_projection, "
            "upcast_attention, ctrl_max_norm_num_groups 3 -> 2 groups in ctrl_midblock (find_largest_factor(gcd(4, 12), 3)), "
            "ctrl_learn_time_embedding with time_embedding_mix 0.75)")
    for stem, scale, apply in (("controlnet_xs_mid_block", 0.6, True), ("controlnet_xs_mid_block_no_control_ref", 0.6, False)):
        def run():
            return model(sample, t, encoder_hidden_states=ehs, controlnet_cond=cond, conditioning_scale=scale,
                         apply_control=apply, return_dict=False)

        ins, outs = capture(model.mid_block, run, all_outputs=True)
        kwargs = {"conditioning_scale": scale, "apply_control": apply}
        src = (f"real library class diffusers.models.controlnets.controlnet_xs.ControlNetXSCrossAttnMidBlock2D: the "
               f"mid_block of the whole UNetControlNetXSModel weights/{weights}; {what}; inputs captured by a forward "
               f"pre-hook while the model ran on random sample (2, 4, 4, 6), timesteps [17, 503], encoder_hidden_states "
               f"(2, 5, 12), controlnet_cond (2, 3, 8, 12), conditioning_scale {scale}, apply_control {apply}; outputs: "
               f"the mid block's (h_base, h_ctrl)")
        block = "diffusers.ControlNetXSCrossAttnMidBlock2D"
        if apply:
            state = sub_state(model.state_dict(), "mid_block.")
            ctx.bundle(stem, block, cfg, tensor_inputs(ins), outs, state=state, source=src, half=True, kwargs=kwargs)
        # referencing (weightless): the checkpoint's mid_block.*
        ctx.bundle(f"{stem}_ref" if apply else stem, block, cfg, tensor_inputs(ins), outs, ref=(weights, "mid_block."),
                   source=src, kwargs=kwargs)

# --- AnimateDiff (UNetMotionModel) and I2VGenXLUNet --------------------------------------------


def unet_motion_mid_config(model) -> dict:
    """``UNetMotionModel.__init__`` (unets/unet_motion_model.py), ``use_motion_mid_block=True``:
    ``UNetMidBlockCrossAttnMotion(in_channels=block_out_channels[-1], temb_channels=block_out_channels[0] * 4,
    resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
    cross_attention_dim=cross_attention_dim[-1], num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False, use_linear_projection, num_layers=mid_block_layers,
    temporal_num_attention_heads=motion_num_attention_heads[-1], temporal_max_seq_length=motion_max_seq_length,
    transformer_layers_per_block=transformer_layers_per_mid_block (None: transformer_layers_per_block[-1] when an
    int, else 1), temporal_transformer_layers_per_block=temporal_transformer_layers_per_mid_block)``."""
    c = model.config
    n = len(c.down_block_types)
    tl = c.transformer_layers_per_mid_block
    if tl is None:
        last = _per_block(c.transformer_layers_per_block, n)[-1]
        tl = last if isinstance(last, int) else 1
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor,
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(c.num_attention_heads, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False, use_linear_projection=c.use_linear_projection, num_layers=c.mid_block_layers,
                temporal_num_attention_heads=_per_block(c.motion_num_attention_heads, n)[-1],
                temporal_max_seq_length=c.motion_max_seq_length, transformer_layers_per_block=tl,
                temporal_transformer_layers_per_block=c.temporal_transformer_layers_per_mid_block)


def diffusers_unet_motion(ctx: Ctx):
    """``UNetMotionModel``: AnimateDiff's U-Net, whose mid block ``UNetMidBlockCrossAttnMotion`` adds an
    ``AnimateDiffTransformer3D`` motion module (attention over the frames, sinusoidal positional embedding)
    after each spatial transformer, on ``(batch * num_frames, C, H, W)``. One down and one up block without
    cross-attention (the mid block is what is checked; the rest only has to be a real model, kept small).
    ``randomize_`` also replaces every ``pos_embed.pe`` buffer (persistent, saved with the weights) with random
    values: a port that recomputes the sinusoid instead of loading the checkpoint's table fails."""
    from diffusers import UNetMotionModel

    torch.manual_seed(0)
    model = UNetMotionModel(sample_size=4, in_channels=4, out_channels=4, down_block_types=("DownBlockMotion",),
                            up_block_types=("UpBlockMotion",), block_out_channels=(8,), layers_per_block=1,
                            norm_num_groups=4, cross_attention_dim=8, num_attention_heads=2,
                            motion_num_attention_heads=2, motion_max_seq_length=6)
    randomize_(model, 7701)
    model.eval()
    pe = model.mid_block.motion_modules[0].transformer_blocks[0].pos_embed.pe
    assert "mid_block.motion_modules.0.transformer_blocks.0.pos_embed.pe" in model.state_dict()
    assert tuple(pe.shape) == (1, 6, 8)
    files = save_diffusers(model, "diffusers_unet_motion")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7702)
    frames = 3
    # AnimateDiffPipeline repeats the prompt per frame before it calls the U-Net
    sample, t, ehs = randn(g, 2, 4, frames, 2, 2), torch.tensor([17, 503]), randn(g, 2, 5, 8)
    ehs = ehs.repeat_interleave(frames, dim=0)

    def run():
        return model(sample, t, encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins["attention_mask"] is None
    cfg = unet_motion_mid_config(model)
    kwargs = {"num_frames": frames}
    src = ("real library class diffusers.models.unets.unet_motion_model.UNetMidBlockCrossAttnMotion; the mid_block of "
           f"the whole UNetMotionModel weights/{weights} (block_out_channels (8,), num_attention_heads 2, "
           "motion_num_attention_heads 2, motion_max_seq_length 6, norm_num_groups 4, cross_attention_dim 8; every "
           "pos_embed.pe buffer randomized, as saved), inputs captured by a forward pre-hook while the model ran on "
           f"random sample (2, 4, {frames}, 2, 2) (batch 2, {frames} frames), timesteps [17, 503], encoder_hidden_states "
           f"(2, 5, 8) repeated per frame as AnimateDiffPipeline does; the mid block sees (batch * frames, C, H, W) and "
           f"num_frames={frames} (parity.kwargs), temb repeated per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_cross_attn_motion"
    block = "diffusers.UNetMidBlockCrossAttnMotion"
    ctx.bundle(stem, block, cfg, tensor_inputs(ins), out, state=state, source=src, half=True, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", block, cfg, tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src,
               kwargs=kwargs)


def i2vgen_xl_mid_config(model) -> dict:
    """``I2VGenXLUNet.__init__`` (unets/unet_i2vgen_xl.py): ``num_attention_heads = attention_head_dim`` (the config's
    ``num_attention_heads`` is ignored) made per-block, ``time_embed_dim = block_out_channels[0] * 4``, then
    ``UNetMidBlock3DCrossAttn(in_channels=block_out_channels[-1], temb_channels=time_embed_dim, resnet_eps=1e-05,
    resnet_act_fn="silu", output_scale_factor=1, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=1e-05, resnet_act_fn="silu",
                output_scale_factor=1, cross_attention_dim=c.cross_attention_dim,
                num_attention_heads=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False)


def diffusers_i2vgen_xl(ctx: Ctx):
    """``I2VGenXLUNet``: the image-to-video U-Net of I2VGen-XL, whose mid block is ``UNetMidBlock3DCrossAttn`` (built
    with fixed eps 1e-5 and SiLU, ``attention_head_dim`` as its per-head width). One down and one up block without
    cross-attention; the context the mid block attends to is the text, the image latents' context embedding (an
    AdaptiveAvgPool2d to 32 x 32, two stride-2 convs: 64 tokens) and the image embedding's ``in_channels`` tokens.
    ``randomize_`` also replaces the zero init of each ``TemporalConvLayer.conv4`` conv."""
    from diffusers import I2VGenXLUNet

    torch.manual_seed(0)
    model = I2VGenXLUNet(sample_size=4, in_channels=4, out_channels=4, down_block_types=("DownBlock3D",),
                         up_block_types=("UpBlock3D",), block_out_channels=(8,), layers_per_block=1,
                         norm_num_groups=4, cross_attention_dim=8, attention_head_dim=2)
    randomize_(model, 7801)
    model.eval()
    assert all(bool(tc.conv4[-1].weight.detach().abs().max() > 0) for tc in model.mid_block.temp_convs)
    files = save_diffusers(model, "diffusers_i2vgen_xl")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7802)
    frames = 3
    sample, t, ehs = randn(g, 2, 4, frames, 2, 2), torch.tensor([17, 503]), randn(g, 2, 5, 8)
    fps, image_latents, image_embeddings = torch.tensor([8, 16]), randn(g, 2, 4, frames, 2, 2), randn(g, 2, 8)

    def run():
        return model(sample, t, fps=fps, image_latents=image_latents, image_embeddings=image_embeddings,
                     encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins.get("attention_mask") is None
    cfg = i2vgen_xl_mid_config(model)
    kwargs = {"num_frames": frames}
    ctx_len = ins["encoder_hidden_states"].shape[1]
    src = (DIFF_BLOCKS.format("UNetMidBlock3DCrossAttn").replace("unet_2d_blocks", "unet_3d_blocks")
           + f"; the mid_block of the whole I2VGenXLUNet weights/{weights} (block_out_channels (8,), "
           "attention_head_dim 2 -> the mid block's num_attention_heads 2 = 4 heads of width 2, norm_num_groups 4, "
           "cross_attention_dim 8; every TemporalConvLayer conv4 randomized, not zero), inputs captured by a forward "
           f"pre-hook while the model ran on random sample (2, 4, {frames}, 2, 2) (batch 2, {frames} frames), "
           "timesteps [17, 503], fps [8, 16], image_latents (2, 4, 3, 2, 2), image_embeddings (2, 8), "
           f"encoder_hidden_states (2, 5, 8); the mid block sees (batch * frames, C, H, W), num_frames={frames} "
           f"(parity.kwargs), temb and the {ctx_len}-token context (text, image latents, image embedding) repeated "
           "per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_3d_cross_attn_i2vgen_xl"
    block = "diffusers.UNetMidBlock3DCrossAttn"
    # the same class as UNet3DConditionModel's mid block, whose bundles have the f16 / bf16 twins: f32 here
    ctx.bundle(stem, block, cfg, tensor_inputs(ins), out, state=state, source=src, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", block, cfg, tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src,
               kwargs=kwargs)


MODEL_BUILDERS = (diffusers_unet2d, diffusers_vae, diffusers_vq_movq, diffusers_unet1d, diffusers_unet1d_rl, diffusers_unet2d_condition, diffusers_unet2d_condition_simple_cross,
                  diffusers_unet2d_condition_dual, diffusers_controlnet, diffusers_controlnet_xs, diffusers_unet3d, diffusers_svd_unet,
                  diffusers_svd_vae, diffusers_unet_motion, diffusers_i2vgen_xl, lucidrains, sd_checkpoint,
                  guided_diffusion_checkpoint,
                  ddpm_model_checkpoint, standalone_restated)


# --------------------------------------------------------------------------------------------
# export


def cast_module(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    if dtype != torch.float32:
        module.to(dtype)
    return module


def block_module(spec, dtype=torch.float32):
    """The block rebuilt from block id + config, loaded with the spec's weights (its own state, or
    the referenced checkpoint file read back from disk), cast to ``dtype``."""
    module = build_module(spec["block"], spec["config"])
    if spec["state"] is not None:
        state = spec["state"]
    else:
        rel, prefix, *key = spec["ref"]
        ckpt = load_checkpoint_state_dict(WEIGHTS / rel, key[0] if key else None)
        state = OrderedDict((k, ckpt[prefix + k]) for k in module.state_dict())
    cast_module(module, dtype)
    module.load_state_dict(state, strict=True)
    return module.eval()


def _checkpoint_dtypes(spec):
    """The dtypes of the floating tensors a referencing spec's block reads from its checkpoint."""
    rel, prefix, *key = spec["ref"]
    ckpt = load_checkpoint_state_dict(WEIGHTS / rel, key[0] if key else None)
    return {v.dtype for k, v in ckpt.items() if k.startswith(prefix) and v.is_floating_point()}


def _short(dtype):
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]


def half_twin_source(stem, dtype):
    return (f"{dtype} twin of weights/mid/{stem}.safetensors: same weights and inputs, module.to({dtype}), float "
            f"inputs cast to {dtype}, run by PyTorch on CPU in {dtype}; .float64 outputs from the float64 copy of the "
            f"{dtype}-rounded weights and inputs")


def convert_to_fp16_twin_source(stem, dtype):
    return (f"{dtype} twin of weights/mid/{stem}.safetensors in the {CONVERT_TO_FP16_MARK}: same weights and inputs; "
            f"as guided-diffusion's UNetModel.convert_to_fp16() (fp16_util.convert_module_to_f16 applied to "
            f"middle_block) only the Conv1d/Conv2d weights and biases are cast to {dtype}, the GroupNorm32 weights "
            f"and biases and the emb_layers Linear stay float32 (stored float32); x cast to {dtype} "
            f"(UNetModel.forward's h = x.type(self.dtype)), emb float32 (time_embed is not converted); run by PyTorch "
            f"on CPU; .float64 outputs from the float64 copy of that mixed-dtype module on x and emb upcast"
            + ("" if dtype == "float16" else "; guided-diffusion has no bfloat16 mode: the same conversion with "
               "bfloat16"))


def half_twin(spec, dtype):
    """(module, export_bundle keyword arguments) of the spec's half-precision twin: ``module.to(dtype)``;
    for an ``openai.MiddleBlock`` with an ``AttentionBlock`` guided-diffusion's ``convert_to_fp16`` form
    (``module.to(dtype)`` fails there: GroupNorm32 with a half weight); ``None`` for an
    ``openai.MiddleBlock`` with a ``SpatialTransformer``: ldm's ``openaimodel.py`` has no half form of
    its own (its ``convert_module_to_f16`` is a no-op) and ``module.to(dtype)`` fails the same way."""
    stem = Path(spec["path"]).stem
    if spec["block"] != "openai.MiddleBlock":
        return block_module(spec, dtype), dict(source=f"{spec['source']}; {half_twin_source(stem, str(dtype)[6:])}")
    if spec["config"].get("use_spatial_transformer"):
        return None
    module = convert_convs_to_half_(block_module(spec), dtype)
    return module, dict(source=f"{spec['source']}; {convert_to_fp16_twin_source(stem, str(dtype)[6:])}",
                        dtype=dtype, input_dtypes={"emb": torch.float32})


def export_all(ctx: Ctx, only=None):
    """Write every model and bundle (``only``: the named builders' files, leaving the rest as they are)."""
    MID.mkdir(parents=True, exist_ok=True)
    if only is None:
        for f in sorted(MID.glob("*.safetensors")):
            f.unlink()
        if MODELS.exists():
            shutil.rmtree(MODELS)
    MODELS.mkdir(parents=True, exist_ok=True)
    _diffusers_quiet()
    for builder in MODEL_BUILDERS:
        if only is None or builder.__name__ in only:
            builder(ctx)
    for f in ctx.files:
        print(f"wrote weights/{f.relative_to(WEIGHTS).as_posix()} ({f.stat().st_size} B)")
    results = []
    for spec in ctx.specs:
        module = block_module(spec)
        # the block rebuilt from block id + config + weights (for a referencing bundle: read back from
        # the checkpoint file) reproduces the whole model's block exactly on the same input tensors
        # (a tuple ``expected``: every output of a block with several, in order)
        expected = spec["expected"] if isinstance(spec["expected"], tuple) else (spec["expected"],)
        got = list(run_module(module, spec["raw_inputs"], spec["kwargs"]).values())
        assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected)), \
            f"{spec['path']}: the block rebuilt from config + weights differs from the whole model's mid block"
        strided = [k for k, v in spec["raw_inputs"].items() if not v.is_contiguous()]
        if strided:
            # the bundle stores contiguous copies; PyTorch's output on them is the bundle's output
            got_c = list(run_module(module, spec["inputs"], spec["kwargs"]).values())
            d = max(float((a - b).abs().max()) for a, b in zip(got_c, expected))
            spec["source"] += (f"; the whole model passed {', '.join(strided)} non-contiguous (strides "
                               f"{', '.join(str(spec['raw_inputs'][k].stride()) for k in strided)}); stored contiguous, "
                               f"and PyTorch's output on the contiguous copy (stored) differs from the in-model output by "
                               f"max {d:.3e}" + (" (bit-identical)" if d == 0 else " (layout-dependent rounding)"))
        ref = None
        if spec["ref"] is not None:
            rel, prefix, *key = spec["ref"]
            relp = os.path.relpath(WEIGHTS / rel, (WEIGHTS / spec["path"]).parent)
            ref = (relp, prefix, *key)
        info = export_bundle(module, spec["block"], spec["config"], spec["inputs"], WEIGHTS / spec["path"],
                             kwargs=spec["kwargs"], source=spec["source"], weights_ref=ref, trace=True)
        results.append(info)
        print(describe(spec, info, torch.float32))
        if spec["half"]:
            stem = Path(spec["path"]).stem
            for dname, suffix in HALF_DTYPES:
                dtype = getattr(torch, dname)
                hpath = WEIGHTS / f"mid/{stem}_{suffix}.safetensors"
                twin = half_twin(spec, dtype)
                if twin is None:
                    try:
                        run_module(block_module(spec, dtype), OrderedDict(
                            (k, v.to(dtype) if v.is_floating_point() else v) for k, v in spec["inputs"].items()),
                            spec["kwargs"])
                    except RuntimeError as e:
                        print(f"skipped weights/mid/{stem}_{suffix}.safetensors: PyTorch rejects module.to({dname}) "
                              f"({str(e).splitlines()[0]}): GroupNorm32 runs super().forward(x.float()) with the half "
                              "GroupNorm weight; ldm openaimodel.py's convert_module_to_f16 is a no-op, so SD's "
                              "UNetModel has no half-precision form of its own")
                        continue
                    raise RuntimeError(f"{hpath}: PyTorch now runs module.to({dname}) of this block")
                hmod, extra = twin
                # the twin of a referencing bundle in the dtype its checkpoint holds (a float16 checkpoint's
                # f16 twin) references it too: the same weights, no conversion. (Any other twin holds its weights:
                # a converted reference would differ where a block keeps a parameter in f32, e.g. GroupNorm's.)
                twin_ref = ref if ref is not None and _checkpoint_dtypes(spec) == {dtype} else None
                hinfo = export_bundle(hmod, spec["block"], spec["config"], spec["inputs"], hpath,
                                      kwargs=spec["kwargs"], trace=True, weights_ref=twin_ref, **extra)
                results.append(hinfo)
                print(describe(dict(spec, path=f"mid/{stem}_{suffix}.safetensors"), hinfo, dtype,
                               mixed="input_dtypes" in extra))
    total = sum(r["bytes"] for r in results) + sum(f.stat().st_size for f in ctx.files)
    print(f"{len(results)} bundles and {len(ctx.files)} checkpoint files, {total} bytes in total")


def describe(spec, info, dtype, mixed=False):
    ins = ", ".join(f"{k}{tuple(v.shape)}{':float32' if mixed and k == 'emb' else ''}"
                    for k, v in spec["inputs"].items())
    ref = ""
    if spec["ref"] is not None:
        rel, prefix, *key = spec["ref"]
        ref = f" weights=weights/{rel} prefix={prefix!r}" + (f" key={key[0]!r}" if key else "")
    diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
    tag = "" if dtype == torch.float32 else f" [{str(dtype).replace('torch.', '')}{', convert_to_fp16 form' if mixed else ''}]"
    return (f"wrote weights/{spec['path']} ({info['bytes']} B) {spec['block']}{tag} {json.dumps(spec['config'])} "
            f"inputs [{ins}]{ref} max|{_short(dtype)}-f64| {diffs}")


# --------------------------------------------------------------------------------------------
# verify


def verify_bundle(path: Path) -> str:
    b = load_bundle(path)
    meta = b["metadata"]
    dtype = getattr(torch, meta["parity.dtype"])
    module = build_module(b["block"], b["config"])
    state = resolve_weights(path, b, list(module.state_dict()))
    if b["weights_ref"] is not None:
        # weightless; float32, or the half-precision twin of a referencing float32 bundle in the dtype its
        # checkpoint holds (no conversion)
        assert not b["state_dict"] and (dtype == torch.float32 or (path.stem.endswith(("_f16", "_bf16")) and all(
            v.dtype == dtype for v in state.values() if v.is_floating_point()))), \
            f"{path}: referencing bundles are weightless, float32 or a twin in the checkpoint's own dtype"
        assert (path.parent / b["weights_ref"][0]).resolve().is_relative_to(MODELS.resolve()), path
    mixed = CONVERT_TO_FP16_MARK in meta["parity.source"]
    if mixed:
        # guided-diffusion's convert_to_fp16: exactly the dtypes PyTorch held (conv parameters and x
        # half, norm and emb Linear parameters and emb float32)
        assert dtype in (torch.float16, torch.bfloat16), path
        convert_convs_to_half_(module, dtype)
        held = {k: v.dtype for k, v in module.state_dict().items()}
        assert set(held.values()) == {dtype, torch.float32}, f"{path}: not a mixed-dtype module"
        for k, v in state.items():
            assert v.dtype == held[k], f"{path}: {k} is {v.dtype}, PyTorch holds it in {held[k]}"
        for k, v in list(b["inputs"].items()) + list(b["expected"].items()):
            assert v.dtype == (torch.float32 if k == "emb" else dtype), f"{path}: {k} is {v.dtype}"
    else:
        cast_module(module, dtype)
    module.load_state_dict(state, strict=True)
    module.eval()
    names = list(b["expected"])
    # fresh copies: the loaded inputs are views at arbitrary offsets of the file's buffer, and
    # PyTorch's CPU kernels round differently on unaligned data (a 2e-6 difference seen on a
    # Linear); the export ran on freshly allocated tensors
    b["inputs"] = OrderedDict((k, v.clone()) for k, v in b["inputs"].items())
    got = run_module(module, b["inputs"], b["kwargs"])
    assert list(got) == names, f"{path}: outputs {list(got)} != {names}"
    for n in names:
        assert got[n].dtype == b["expected"][n].dtype and torch.equal(got[n], b["expected"][n]), \
            f"{path}: output {n} differs from the stored one"
    m64 = float64_copy(module)
    in64 = OrderedDict((k, v.double() if v.is_floating_point() else v) for k, v in b["inputs"].items())
    got64 = run_module(m64, in64, b["kwargs"])
    for n in names:
        assert torch.equal(got64[n], b["expected_f64"][n]), f"{path}: float64 output {n} differs"
    verify_traces(path, b, module, b["inputs"], m64, in64, b["kwargs"])
    return ", ".join(f"{n} {float((b['expected'][n].double() - b['expected_f64'][n]).abs().max()):.3e}" for n in names)


def verify_half_twin(path: Path, f32_path: Path):
    h, f = load_bundle(path), load_bundle(f32_path)
    dtype = getattr(torch, h["metadata"]["parity.dtype"])
    assert (h["block"], h["config"]) == (f["block"], f["config"]), path
    if f["weights_ref"] is not None and h["weights_ref"] is None:
        # the self-contained twin of a referencing bundle holds the checkpoint's weights, cast
        f = dict(f, state_dict=resolve_weights(f32_path, f, list(build_module(f["block"], f["config"]).state_dict())))
    else:
        assert h["weights_ref"] == f["weights_ref"], path
    # (sorted: safetensors orders the tensors of a mixed-dtype file by dtype first)
    assert sorted(h["state_dict"]) == sorted(f["state_dict"]) and list(h["inputs"]) == list(f["inputs"]), path
    held = {}
    if CONVERT_TO_FP16_MARK in h["metadata"]["parity.source"]:
        # guided-diffusion's convert_to_fp16 of the float32 block: conv parameters rounded, the rest
        # (and emb) float32
        module = convert_convs_to_half_(build_module(f["block"], f["config"]), dtype)
        held = {k: v.dtype for k, v in module.state_dict().items()}
        held["emb"] = torch.float32
    for k, v in list(f["state_dict"].items()) + list(f["inputs"].items()):
        hv = h["state_dict"].get(k, h["inputs"].get(k))
        want = v.to(held.get(k, dtype)) if v.is_floating_point() else v
        assert hv.dtype == want.dtype and torch.equal(hv, want), f"{path}: {k} is not the f32 twin's cast"


def verify_models():
    """Every checkpoint loads with its library's own loader."""
    from diffusers import (AutoencoderKL, AutoencoderKLTemporalDecoder, ControlNetModel, I2VGenXLUNet, UNet1DModel,
                           UNet2DConditionModel, UNet2DModel, UNet3DConditionModel, UNetControlNetXSModel, UNetMotionModel,
                           UNetSpatioTemporalConditionModel, VQModel)

    _diffusers_quiet()
    classes = {"diffusers_unet2d": UNet2DModel, "diffusers_unet2d_scale_shift": UNet2DModel,
               "diffusers_unet2d_bin": UNet2DModel, "diffusers_vae": AutoencoderKL, "diffusers_sd1": UNet2DConditionModel,
               "diffusers_sd2": UNet2DConditionModel, "diffusers_sdxl": UNet2DConditionModel,
               "diffusers_if": UNet2DConditionModel, "diffusers_kandinsky": UNet2DConditionModel,
               "diffusers_vd": UNet2DConditionModel,
               "diffusers_controlnet": ControlNetModel, "diffusers_unet3d": UNet3DConditionModel,
               "diffusers_svd": UNetSpatioTemporalConditionModel, "diffusers_svd_vae": AutoencoderKLTemporalDecoder,
               "diffusers_movq": VQModel, "diffusers_unet1d": UNet1DModel, "diffusers_unet1d_trajectory": UNet1DModel,
               "diffusers_unet1d_value": UNet1DModel, "diffusers_unet_motion": UNetMotionModel,
               "diffusers_i2vgen_xl": I2VGenXLUNet, "diffusers_controlnet_xs": UNetControlNetXSModel}
    for name, cls in classes.items():
        m = cls.from_pretrained(MODELS / name)
        files = {p.name for p in (MODELS / name).iterdir()}
        weights = "diffusion_pytorch_model.bin" if name.endswith("_bin") else "diffusion_pytorch_model.safetensors"
        assert files == {"config.json", weights}, (name, files)
        sd = load_checkpoint_state_dict(MODELS / name / weights)
        msd = m.state_dict()
        assert list(sd) != [] and set(sd) == set(msd) and all(torch.equal(sd[k], msd[k]) for k in sd), name
        print(f"verified weights/models/{name}: {cls.__name__}.from_pretrained loads it ({len(sd)} tensors)")
    # lucidrains: as Trainer.load does
    from denoising_diffusion_pytorch import GaussianDiffusion, Unet
    from ema_pytorch import EMA

    data = torch.load(MODELS / "lucidrains_ddpm" / "model-1.pt", map_location="cpu", weights_only=True)
    assert set(data) == {"step", "model", "opt", "ema", "scaler", "version"}
    unet = Unet(dim=6, dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8))
    diffusion = GaussianDiffusion(unet, image_size=(8, 12), timesteps=100)
    diffusion.load_state_dict(data["model"])
    ema = EMA(diffusion, beta=0.995, update_every=10)
    ema.load_state_dict(data["ema"])
    assert not torch.equal(ema.ema_model.model.mid_attn.to_qkv.weight, diffusion.model.mid_attn.to_qkv.weight)
    print("verified weights/models/lucidrains_ddpm/model-1.pt: GaussianDiffusion and EMA load_state_dict "
          "(as Trainer.load); EMA weights differ from the online ones")
    for rel, key in (("sd_v1_tiny/sd_v1_tiny.ckpt", "state_dict"), ("guided_tiny/guided_tiny.pt", None),
                     ("ldm_ddpm_tiny/ldm_ddpm_tiny.pt", None)):
        sd = load_checkpoint_state_dict(MODELS / rel, key)
        print(f"verified weights/models/{rel}: torch.load(weights_only=True) ({len(sd)} tensors)")
    for p in MODELS.rglob("*"):
        if p.suffix in (".pt", ".ckpt", ".bin"):
            import zipfile

            assert zipfile.is_zipfile(p), f"{p}: not a zip-format torch.save file"


def verify_all(ctx: Ctx | None):
    verify_models()
    paths = sorted(MID.glob("*.safetensors"))
    if ctx is not None:
        want = set()
        for s in ctx.specs:
            want.add(WEIGHTS / s["path"])
        twins = {p for p in paths if p.stem.endswith(("_f16", "_bf16"))}
        assert set(paths) - twins == want, f"stale or missing bundles: {sorted(set(paths) ^ want - twins)}"
    for p in paths:
        diffs = verify_bundle(p)
        twin = ""
        for suffix in ("_f16", "_bf16"):
            if p.stem.endswith(suffix):
                f32 = p.with_name(p.stem[: -len(suffix)] + ".safetensors")
                verify_half_twin(p, f32)
                twin = f", same weights and inputs as {f32.relative_to(REPO)} rounded"
        print(f"verified {p.relative_to(REPO)}: rebuilt from metadata{' + referenced checkpoint' if 'parity.weights' in load_bundle(p)['metadata'] else ''}, "
              f"outputs bit-identical{twin} (max|out-f64| {diffs})")
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    print(f"verified {len(paths)} bundles; weights/ holds {total} bytes")
    assert total < MAX_WEIGHTS_BYTES, f"weights/ exceeds {MAX_WEIGHTS_BYTES} bytes"


def digest():
    h = hashlib.sha256()
    for p in sorted(list(MID.rglob("*")) + list(MODELS.rglob("*"))):
        if p.is_file():
            h.update(p.relative_to(WEIGHTS).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="after exporting, reload and re-check every file")
    ap.add_argument("--verify-only", action="store_true", help="only re-check the files on disk")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--only", nargs="+", choices=[b.__name__ for b in MODEL_BUILDERS],
                    help="export only these builders' models and bundles (nothing else is deleted or rewritten; "
                    "--verify then checks only their bundles)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    ctx = None
    if not args.verify_only:
        ctx = Ctx()
        export_all(ctx, args.only)
    if args.only and args.verify:
        for spec in ctx.specs:
            for suffix in ("", "_f16", "_bf16") if spec["half"] else ("",):
                if suffix and half_twin(spec, torch.float16) is None:
                    continue  # no twin (skipped when exported)
                p = WEIGHTS / spec["path"].replace(".safetensors", f"{suffix}.safetensors")
                diffs = verify_bundle(p)
                if suffix:
                    verify_half_twin(p, WEIGHTS / spec["path"])
                print(f"verified {p.relative_to(REPO)} (max|out-f64| {diffs})")
    elif args.verify or args.verify_only:
        verify_all(ctx)
    print(f"sha256 of weights/mid + weights/models: {digest()}")


if __name__ == "__main__":
    main()
