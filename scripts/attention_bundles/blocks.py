"""A block from its bundle's metadata alone (``build_module``: block id + config, with the
state-dict keys and ``parity.source`` telling apart classes published under one block id), the
diffusers state-dict forms some checkpoints use (pre-0.17 key names, projection weights as 1x1
conv kernels), and ``cast_module``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from reference import annotated_diffusion, fastai, ldm, ldm_sd1, textbook
from upstream import gd_unet, ldm_attention, ldm_model

from .sources import SD2_MARK

LEGACY_DIFFUSERS_KEYS = [("to_q.", "query."), ("to_k.", "key."), ("to_v.", "value."), ("to_out.0.", "proj_attn.")]
# diffusers Attention projections that ldm->diffusers converted checkpoints sometimes keep as 1x1 convs
CONV_SHAPED_DIFFUSERS_KEYS = ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")
DIFFUSERS_PROCESSORS = ("AttnProcessor", "AttnProcessor2_0", "AttnAddedKVProcessor", "AttnAddedKVProcessor2_0")


def build_module(block: str, config: dict, state_keys=(), source: str = "") -> nn.Module:
    """Construct the PyTorch block for ``block`` from its stored constructor kwargs.

    ``state_keys`` tells apart classes published under one block id (fast.ai SelfAttention
    GroupNorm vs BatchNorm/fused-qkv variant); ``source`` (``parity.source``) tells the SD 2.x
    ldm classes (Stability-AI/stablediffusion, published) from the SD 1.x ones (re-stated)."""
    cfg = dict(config)
    keys = set(state_keys)
    sd2 = SD2_MARK in (source or "")
    if block == "denoising_diffusion_pytorch.Attention":
        from denoising_diffusion_pytorch.denoising_diffusion_pytorch import Attention

        return Attention(**cfg)
    if block == "denoising_diffusion_pytorch.LinearAttention":
        from denoising_diffusion_pytorch.denoising_diffusion_pytorch import LinearAttention

        return LinearAttention(**cfg)
    if block == "annotated_diffusion.Attention":
        return annotated_diffusion.Attention(**cfg)
    if block == "annotated_diffusion.LinearAttention":
        return annotated_diffusion.LinearAttention(**cfg)
    if block == "ldm.LinearAttention":
        return ldm.LinearAttention(**cfg)
    if block.startswith("diffusers."):
        return _build_diffusers(block, cfg)
    if block == "ldm.CrossAttention":
        return (ldm_attention.CrossAttention if sd2 else ldm_sd1.CrossAttentionSD1)(**cfg)
    if block == "ldm.BasicTransformerBlock":
        return (ldm_attention.BasicTransformerBlock if sd2 else ldm_sd1.BasicTransformerBlockSD1)(**cfg)
    if block == "ldm.SpatialTransformer":
        return (ldm_attention.SpatialTransformer if sd2 else ldm_sd1.SpatialTransformerSD1)(**cfg)
    if block == "ldm.AttnBlock":
        return ldm_model.AttnBlock(**cfg)
    if block == "ldm.SpatialSelfAttention":
        return ldm_attention.SpatialSelfAttention(**cfg)
    if block == "ldm.LinAttnBlock":
        return ldm.LinAttnBlock(**cfg)
    if block == "openai.AttentionBlock":
        return gd_unet.AttentionBlock(**cfg)
    if block == "fastai.SelfAttention":
        if "qkv.weight" in keys or "norm.running_mean" in keys:
            return fastai.SelfAttentionFused(**cfg)
        return fastai.SelfAttention(**cfg)
    if block == "fastai.SelfAttentionMultiHead":
        return fastai.SelfAttentionMultiHead(**cfg)
    if block == "torch.nn.MultiheadAttention":
        return nn.MultiheadAttention(**cfg)
    if block == "textbook.SelfAttention":
        return textbook.Self_Attention(**cfg)
    if block == "textbook.MultiHeadAttention":
        if "d_all" in cfg:
            return textbook.MultiHead_Attention_DAll(**cfg)
        return textbook.MultiHead_Attention(**cfg)
    raise KeyError(f"unknown block id {block!r}")


def _build_diffusers(block: str, cfg: dict) -> nn.Module:
    """The diffusers blocks of ``build_module``; a ``"processor"`` entry of the config is set with
    ``set_processor`` after construction."""
    if block == "diffusers.Attention":
        from diffusers.models import attention_processor as ap

        processor = cfg.pop("processor", None)
        m = ap.Attention(**cfg)
        if processor is not None:
            if processor not in DIFFUSERS_PROCESSORS:
                raise KeyError(f"diffusers.Attention: unknown processor {processor!r}")
            m.set_processor(getattr(ap, processor)())
        return m
    if block == "diffusers.FeedForward":
        from diffusers.models.attention import FeedForward

        return FeedForward(**cfg)
    if block == "diffusers.GEGLU":
        from diffusers.models.activations import GEGLU

        return GEGLU(**cfg)
    if block == "diffusers.BasicTransformerBlock":
        from diffusers.models.attention import BasicTransformerBlock

        return BasicTransformerBlock(**cfg)
    if block == "diffusers.Transformer2DModel":
        from diffusers.models.transformers.transformer_2d import Transformer2DModel

        return Transformer2DModel(**cfg)
    raise KeyError(f"unknown block id {block!r}")


def to_legacy_diffusers_keys(sd):
    out = OrderedDict()
    for k, v in sd.items():
        for new, old in LEGACY_DIFFUSERS_KEYS:
            if k.startswith(new):
                k = old + k[len(new):]
                break
        out[k] = v
    return out


def to_conv_shaped_diffusers_weights(sd):
    """The same state dict with the q/k/v/out projection weights as (out, in, 1, 1) conv kernels."""
    return OrderedDict((k, v[:, :, None, None] if k in CONV_SHAPED_DIFFUSERS_KEYS else v) for k, v in sd.items())


def from_conv_shaped_diffusers_weights(sd):
    return OrderedDict((k, v[:, :, 0, 0].contiguous() if k in CONV_SHAPED_DIFFUSERS_KEYS and v.dim() == 4 else v)
                       for k, v in sd.items())


def from_legacy_diffusers_keys(sd):
    out = OrderedDict()
    for k, v in sd.items():
        for new, old in LEGACY_DIFFUSERS_KEYS:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


def cast_module(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``module.to(dtype)`` (in place; a no-op for float32). diffusers' ModelMixin.to logs a
    "should be kept in float32: []" notice for Transformer2DModel, silenced here."""
    if dtype == torch.float32:
        return module
    if type(module).__module__.startswith("diffusers."):
        from diffusers.utils import logging as dlogging

        level = dlogging.get_verbosity()
        dlogging.set_verbosity_error()
        try:
            module.to(dtype)
        finally:
            dlogging.set_verbosity(level)
    else:
        module.to(dtype)
    return module
