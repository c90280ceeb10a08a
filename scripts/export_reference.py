#!/usr/bin/env python3
"""Regenerate every reference parity bundle in ``weights/`` (format "1", see parity_bundle.py).

    python scripts/export_reference.py            # delete the owned bundles, export them all
    python scripts/export_reference.py --verify   # export, then reload and re-check every file
    python scripts/export_reference.py --verify-only   # only re-check the files on disk

Blocks come from the real libraries where they are pip packages
(denoising-diffusion-pytorch, diffusers, torch.nn.MultiheadAttention, SD 2.x's ``ldm`` tree from
stable-diffusion-sdkit, OpenAI's ``guided_diffusion`` from guided-diffusion-sdk; see upstream.py) and
from the faithful re-statements in ``scripts/reference/`` where no package ships the class. Everything is deterministic (fixed seeds,
single-threaded CPU PyTorch).

``--verify`` reloads each bundle with safetensors, rebuilds the module from the stored
``parity.block`` + ``parity.config`` + state dict alone in the stored ``parity.dtype``, reruns it
(in that dtype and as the float64 copy) and asserts the outputs are bit-identical to the stored
ones; a float16 / bfloat16 twin must also hold exactly its float32 bundle's weights and inputs
rounded to its dtype (see ``HALF_FROM``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from parity_bundle import (CONVERT_TO_FP16_MARK, _cast_inputs, _flatten_list_inputs, convert_convs_to_half_,  # noqa: E402
                           export_bundle, float64_copy, load_bundle, randomize_, run_module)
from parity_trace import TRACERS, verify_traces  # noqa: E402
from export_models import MAX_WEIGHTS_BYTES  # noqa: E402
from reference import annotated_diffusion, fastai, ldm, ldm_sd1, textbook  # noqa: E402
from upstream import gd_unet, ldm_attention, ldm_model  # noqa: E402

REPO = HERE.parent
WEIGHTS = REPO / "weights"
# weights/<family>/ folders whose *.safetensors this script owns (stale ones are deleted)
FAMILIES = ["denoising_diffusion_pytorch", "annotated_diffusion", "ldm", "diffusers", "fastai", "torch", "textbook",
            "openai"]

LEGACY_DIFFUSERS_KEYS = [("to_q.", "query."), ("to_k.", "key."), ("to_v.", "value."), ("to_out.0.", "proj_attn.")]
# diffusers Attention projections that ldm->diffusers converted checkpoints sometimes keep as 1x1 convs
CONV_SHAPED_DIFFUSERS_KEYS = ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")
# marker in parity.source telling the published SD 2.x classes from the SD 1.x re-statements (same
# kwargs for ldm.CrossAttention)
SD2_MARK = "Stability-AI/stablediffusion"
DIFFUSERS_PROCESSORS = ("AttnProcessor", "AttnProcessor2_0", "AttnAddedKVProcessor", "AttnAddedKVProcessor2_0")


# --------------------------------------------------------------------------------------------
# building a block from (block id, config, state-dict keys) alone


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


# --------------------------------------------------------------------------------------------
# the bundles


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def padding_mask(gen, batch, seq, p=0.3):
    """bool (batch, seq), True = ignored; never a whole row."""
    m = torch.rand(batch, seq, generator=gen) < p
    for b in range(batch):
        if m[b].all():
            m[b, torch.randint(0, seq, (1,), generator=gen)] = False
    return m


def bool_attn_mask(gen, shape, p=0.3):
    """bool (..., L, S), True = not allowed; never a whole row."""
    m = torch.rand(*shape, generator=gen) < p
    flat = m.view(-1, shape[-1])
    for r in range(flat.shape[0]):
        if flat[r].all():
            flat[r, torch.randint(0, shape[-1], (1,), generator=gen)] = False
    return m


def diffusers_cross_mask():
    """Additive float mask (B=2, 1, S=7): 0.0 kept, -10000.0 masked (as diffusers pipelines pass)."""
    m = torch.zeros(2, 1, 7)
    m[0, 0, [1, 4]] = -10000.0
    m[1, 0, [0, 5, 6]] = -10000.0
    return m


def diffusers_mask(batch, seq, masked):
    """Additive float mask (batch, 1, seq): 0.0 kept, -10000.0 at ``masked[b]`` positions."""
    m = torch.zeros(batch, 1, seq)
    for b, cols in masked.items():
        m[b, 0, cols] = -10000.0
    return m


def diffusers_self_mask():
    """Additive float self-attention mask (B=2, 1, N=9)."""
    return diffusers_mask(2, 9, {0: [3], 1: [0, 7, 8]})


def keep_mask_bool(batch, seq, lengths):
    """bool (batch, seq), True = keep: the first lengths[b] tokens, the rest padding."""
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def keep_mask_float(batch, seq, lengths):
    """float (batch, seq), 1.0 = keep, 0.0 = discard (trailing padding)."""
    return keep_mask_bool(batch, seq, lengths).float()


def mha_float_mask(gen):
    """Additive float attn_mask (L=5, S=6): a random bias with a few -10000 entries."""
    m = 0.5 * randn(gen, 5, 6)
    m[0, 2] = -10000.0
    m[3, 0] = -10000.0
    m[3, 5] = -10000.0
    return m


LUCID = "real library class denoising_diffusion_pytorch.denoising_diffusion_pytorch.{}"
AD_SRC = ("re-statement scripts/reference/annotated_diffusion.py of huggingface/blog annotated-diffusion.md "
          "(commit fd0b6566b04f) {}")
LDM_SRC = ("re-statement scripts/reference/ldm.py of CompVis/latent-diffusion ldm/modules/attention.py "
           "(commit a506df575647) LinearAttention{}")
FASTAI_SRC = "re-statement scripts/reference/fastai.py of fastai/course22p2 nbs/27_attention.ipynb (commit df9323235bc3) {}"
TEXTBOOK_SRC = "re-statement scripts/reference/textbook.py of the seed-003 textbook notes {}"
DIFF_SRC = "real library class diffusers.models.attention_processor.Attention"
DIFF_FF_SRC = "real library class diffusers.models.attention.{}"
DIFF_ACT_SRC = "real library class diffusers.models.activations.{}"
DIFF_T2D_SRC = "real library class diffusers.models.transformers.transformer_2d.Transformer2DModel"
SD1_SRC = ("re-statement scripts/reference/ldm_sd1.py of CompVis/latent-diffusion ldm/modules/attention.py "
           "(commit a506df575647 = CompVis/stable-diffusion 21f890f9da3c, SD 1.x; no package ships the SD 1.x tree) {}")
SDKIT = "as shipped by stable-diffusion-sdkit"
SD2_SRC = "published class ldm.modules.attention.{} of " + SD2_MARK + " (SD 2.x ldm tree, " + SDKIT + ")"
LDM_MODEL_SRC = ("published class ldm.modules.diffusionmodules.model.{} of " + SD2_MARK + " (SD 2.x ldm tree, " +
                 SDKIT + "; unchanged from CompVis/latent-diffusion)")
LIN_ATTN_SRC = ("re-statement scripts/reference/ldm.py of CompVis/latent-diffusion ldm/modules/diffusionmodules/model.py "
                "(commit a506df575647) LinAttnBlock (= LinearAttention(dim=C, heads=1, dim_head=C); the SD 2.x tree "
                "dropped it)")
OPENAI_SRC = ("published class guided_diffusion.unet.AttentionBlock of openai/guided-diffusion "
              "(as shipped by guided-diffusion-sdk){}")

VAE_MID = dict(query_dim=32, heads=1, dim_head=32, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=8,
               spatial_norm_dim=None, residual_connection=True, bias=True, upcast_softmax=True,
               _from_deprecated_attn_block=True)


def bundle_specs():
    """Every bundle: (relative path, block id, config, seed, make_inputs(gen), kwargs, source, extra)."""
    S = []

    def add(path, block, config, seed, make_inputs, kwargs=None, source=None, **extra):
        S.append(dict(path=path, block=block, config=config, seed=seed, make_inputs=make_inputs,
                      kwargs=kwargs, source=source, **extra))

    # lucidrains/denoising-diffusion-pytorch 2.3.4
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 100 if cls == "Attention" else 200
        add(f"denoising_diffusion_pytorch/{short}_dim24_h3_d8_mem4.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=24, heads=3, dim_head=8, num_mem_kv=4), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LUCID.format(cls))
        add(f"denoising_diffusion_pytorch/{short}_dim20_h2_d12_mem1.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=20, heads=2, dim_head=12, num_mem_kv=1), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=LUCID.format(cls))

    # Hugging Face annotated diffusion (GroupNorm(1) derivative of lucidrains)
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 300 if cls == "Attention" else 400
        add(f"annotated_diffusion/{short}_dim24_h3_d8.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=24, heads=3, dim_head=8), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=AD_SRC.format(cls))
        add(f"annotated_diffusion/{short}_dim20_h2_d12.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=20, heads=2, dim_head=12), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=AD_SRC.format(cls))

    # CompVis latent-diffusion LinearAttention (+ the LinAttnBlock case heads=1, dim_head=dim)
    add("ldm/linear_attention_dim24_h3_d8.safetensors", "ldm.LinearAttention",
        dict(dim=24, heads=3, dim_head=8), 501, lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LDM_SRC.format(""))
    add("ldm/lin_attn_block_dim20.safetensors", "ldm.LinearAttention",
        dict(dim=20, heads=1, dim_head=20), 502, lambda g: {"x": randn(g, 3, 20, 6, 3)},
        source=LDM_SRC.format(" (the LinAttnBlock(in_channels=20) configuration)"))

    # diffusers 0.42.1 Attention
    add("diffusers/attention_vae_mid.safetensors", "diffusers.Attention", dict(VAE_MID), 601,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE UNetMidBlock2D-style kwargs")
    add("diffusers/attention_unet2d_mid.safetensors", "diffusers.Attention",
        dict(query_dim=48, heads=3, dim_head=16, rescale_output_factor=2.0, eps=1e-5, norm_num_groups=4,
             residual_connection=True, bias=True, upcast_softmax=True, _from_deprecated_attn_block=True), 602,
        lambda g: {"hidden_states": randn(g, 3, 48, 6, 3)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), UNet2DModel UNetMidBlock2D-style kwargs")
    add("diffusers/attention_vae_mid_legacy_keys.safetensors", "diffusers.Attention", dict(VAE_MID), 603,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE-style kwargs; state dict stored under the legacy "
        "AttentionBlock key names (to_q->query, to_k->key, to_v->value, to_out.0->proj_attn; group_norm unchanged) "
        "as in diffusers <= 0.16 checkpoints",
        legacy_keys=True)
    add("diffusers/attention_cross.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=5, dim_head=8, bias=False), 604,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention")
    add("diffusers/attention_cross_mask.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=2, dim_head=16, bias=True), 605,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24),
                   "attention_mask": diffusers_cross_mask()},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, 1, S) mask")
    add("diffusers/attention_self_tokens_attnprocessor.safetensors", "diffusers.Attention",
        dict(query_dim=30, heads=3, dim_head=10, out_bias=False, processor="AttnProcessor"), 606,
        lambda g: {"hidden_states": randn(g, 2, 9, 30)},
        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); token self-attention')

    # fast.ai course22p2 nb 27
    add("fastai/self_attention_groupnorm_ni24.safetensors", "fastai.SelfAttention", dict(ni=24), 701,
        lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 9 SelfAttention (GroupNorm(1), q/k/v/proj)"))
    add("fastai/self_attention_batchnorm_fused_ni20.safetensors", "fastai.SelfAttention", dict(ni=20), 702,
        lambda g: {"inp": randn(g, 3, 20, 6, 3)},
        source=FASTAI_SRC.format("cell 19 SelfAttention (BatchNorm2d, fused qkv; class SelfAttentionFused here)"),
        fused=True)
    add("fastai/self_attention_multihead_ni24_h4.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=24, nheads=4),
        703, lambda g: {"inp": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))
    add("fastai/self_attention_multihead_ni30_h3.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=30, nheads=3),
        704, lambda g: {"inp": randn(g, 3, 30, 6, 3)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))

    # torch.nn.MultiheadAttention
    def mha2(g):
        return {"query": randn(g, 6, 3, 20), "key": randn(g, 8, 3, 12), "value": randn(g, 8, 3, 7),
                "key_padding_mask": padding_mask(g, 3, 8)}

    def mha3(g):
        kv = randn(g, 2, 6, 16)
        # key and value are the same tensor object (torch's "key is value" path); both stored
        return {"query": randn(g, 2, 5, 16), "key": kv, "value": kv, "attn_mask": mha_float_mask(g)}

    def mha4(g):
        return {"query": randn(g, 4, 2, 18), "key": randn(g, 7, 2, 18), "value": randn(g, 7, 2, 18),
                "attn_mask": bool_attn_mask(g, (2 * 3, 4, 7))}

    add("torch/mha_self_batch_first.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=24, num_heads=3, batch_first=True), 801, lambda g: {"query": randn(g, 2, 9, 24)},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention (key = value = query, same tensor)")
    add("torch/mha_kdim_vdim_key_padding_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=20, num_heads=4, kdim=12, vdim=7, bias=False), 802, mha2,
        kwargs=dict(need_weights=True, average_attn_weights=False),
        source="torch.nn.MultiheadAttention with kdim/vdim, bool key_padding_mask (True = ignored)")
    add("torch/mha_bias_kv_zero_attn_float_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=16, num_heads=2, add_bias_kv=True, add_zero_attn=True, batch_first=True), 803, mha3,
        kwargs=dict(need_weights=False),
        source="torch.nn.MultiheadAttention add_bias_kv + add_zero_attn, additive float attn_mask, key is value")
    add("torch/mha_bool_attn_mask_3d.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=18, num_heads=3), 804, mha4, kwargs=dict(need_weights=True),
        source="torch.nn.MultiheadAttention with a bool (N*num_heads, L, S) attn_mask (True = not allowed)")

    # textbook (seed 003)
    add("textbook/self_attention_dx6_d5_dv7.safetensors", "textbook.SelfAttention", dict(Dx=6, D=5, Dv=7), 901,
        lambda g: {"x": randn(g, 2, 9, 6)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/self_attention_dx10_d12_dv4.safetensors", "textbook.SelfAttention", dict(Dx=10, D=12, Dv=4), 902,
        lambda g: {"x": randn(g, 3, 5, 10)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/multihead_attention_in7_nh3_dh5.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=7, nh=3, dh=5), 903, lambda g: {"x": randn(g, 2, 9, 7)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, nh, dh) (first form)"))
    add("textbook/multihead_attention_in10_dall12_nh4.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=10, d_all=12, nh=4), 904, lambda g: {"x": randn(g, 3, 6, 10)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, d_all, nh) (second form; "
                                   "class MultiHead_Attention_DAll here)"))
    # Edge cases a port gets wrong: no memory tokens, out_dim, 2-D masks, scale_qk=False
    # (diffusers then defaults to AttnProcessor with scale 1), unbatched / causal / even-head MHA.
    add("denoising_diffusion_pytorch/attention_dim16_h2_d8_nomem.safetensors", "denoising_diffusion_pytorch.Attention",
        dict(dim=16, heads=2, dim_head=8, num_mem_kv=0), 103,
        lambda g: {"x": randn(g, 2, 16, 3, 5)}, source=LUCID.format("Attention") + ", num_mem_kv=0")
    add("diffusers/attention_out_dim.safetensors", "diffusers.Attention",
        dict(query_dim=32, heads=4, dim_head=8, out_dim=24, bias=True), 607,
        lambda g: {"hidden_states": randn(g, 2, 6, 32)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), out_dim given (heads = out_dim // dim_head)")
    add("diffusers/attention_cross_mask_2d.safetensors", "diffusers.Attention",
        dict(query_dim=24, cross_attention_dim=10, heads=3, dim_head=8), 608,
        lambda g: {"hidden_states": randn(g, 2, 7, 24), "encoder_hidden_states": randn(g, 2, 5, 10),
                   "attention_mask": torch.tensor([[0.0, -10000.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -10000.0, -10000.0]])},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, S) mask")
    add("diffusers/attention_no_scale_qk.safetensors", "diffusers.Attention",
        dict(query_dim=24, heads=3, dim_head=8, scale_qk=False), 609,
        lambda g: {"hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " scale_qk=False (diffusers then picks AttnProcessor, scale 1.0)")
    add("torch/mha_unbatched.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2), 805,
        lambda g: {"query": randn(g, 5, 12), "key": randn(g, 6, 12), "value": randn(g, 6, 12)},
        kwargs=dict(need_weights=True), source="torch.nn.MultiheadAttention on unbatched (L, E) inputs")
    add("torch/mha_causal.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2, batch_first=True), 806,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(5)},
        kwargs=dict(need_weights=False, is_causal=True),
        source="torch.nn.MultiheadAttention self-attention with is_causal=True and its causal attn_mask")
    add("torch/mha_even_heads_float_padding.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=4, batch_first=True), 807,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "key_padding_mask": torch.tensor([[0.0, 0.0, float("-inf"), 0.0, 0.0], [0.0] * 5])},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention, even head count, additive float key_padding_mask")

    # ---------------------------------------------------------------------------------------
    # Stable Diffusion family: diffusers 0.42.1 (real library), ldm SD 2.x (stable-diffusion-sdkit), SD 1.x
    # (re-stated in reference/ldm_sd1.py) and OpenAI guided-diffusion (guided-diffusion-sdk).

    # diffusers.Attention: more configurations
    add("diffusers/attention_spatial_norm_movq.safetensors", "diffusers.Attention",
        dict(query_dim=32, heads=2, dim_head=16, norm_num_groups=None, spatial_norm_dim=6, residual_connection=True,
             bias=True, upcast_softmax=True, _from_deprecated_attn_block=True), 610,
        lambda g: {"hidden_states": randn(g, 2, 32, 6, 4), "temb": randn(g, 2, 6, 3, 2)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), MoVQ-style VAE-decoder mid attention with SpatialNorm: "
        "temb is the zq map, forwarded by Attention.forward(**cross_attention_kwargs) to the processor, "
        "interpolated (nearest) to the (H, W) of hidden_states inside SpatialNorm")
    add("diffusers/attention_cross_norm_layer_norm.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=20, heads=2, dim_head=20, cross_attention_norm="layer_norm"), 611,
        lambda g: {"hidden_states": randn(g, 2, 9, 40), "encoder_hidden_states": randn(g, 2, 6, 20)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), cross_attention_norm="layer_norm" on encoder_hidden_states')
    add("diffusers/attention_cross_norm_group_norm.safetensors", "diffusers.Attention",
        dict(query_dim=30, cross_attention_dim=20, heads=3, dim_head=10, bias=True, cross_attention_norm="group_norm",
             cross_attention_norm_num_groups=4), 612,
        lambda g: {"hidden_states": randn(g, 3, 7, 30), "encoder_hidden_states": randn(g, 3, 5, 20)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), cross_attention_norm="group_norm" (GroupNorm(4, 20, eps 1e-5) '
        "over the feature axis of encoder_hidden_states)")
    add("diffusers/attention_qk_norm_layer_norm.safetensors", "diffusers.Attention",
        dict(query_dim=36, heads=3, dim_head=12, qk_norm="layer_norm", eps=1e-6), 613,
        lambda g: {"hidden_states": randn(g, 2, 7, 36)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default, which applies norm_q/norm_k per head), qk_norm="layer_norm"')
    add("diffusers/attention_qk_norm_rms_norm.safetensors", "diffusers.Attention",
        dict(query_dim=36, cross_attention_dim=14, heads=3, dim_head=12, bias=True, qk_norm="rms_norm"), 614,
        lambda g: {"hidden_states": randn(g, 2, 7, 36), "encoder_hidden_states": randn(g, 2, 5, 14)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), qk_norm="rms_norm" (diffusers RMSNorm, eps 1e-5; its '
        "float32 variance cast is switched off in the float64 copy), cross-attention")
    add("diffusers/attention_qk_norm_l2.safetensors", "diffusers.Attention",
        dict(query_dim=30, heads=2, dim_head=15, qk_norm="l2"), 615,
        lambda g: {"hidden_states": randn(g, 3, 6, 30)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), qk_norm="l2" (LpNorm = F.normalize(p=2, dim=-1, eps=1e-5))')
    for i, (proc, extra, short) in enumerate((
            ("AttnAddedKVProcessor2_0", {}, "attn_added_kv_2_0"),
            ("AttnAddedKVProcessor2_0", {"only_cross_attention": True}, "attn_added_kv_2_0_only_cross"),
            ("AttnAddedKVProcessor", {}, "attn_added_kv"),
            ("AttnAddedKVProcessor2_0", {"cross_attention_norm": "group_norm", "cross_attention_norm_num_groups": 4},
             "attn_added_kv_2_0_cross_group_norm"))):
        cfg = dict(query_dim=24, cross_attention_dim=24, heads=2, dim_head=12, added_kv_proj_dim=12,
                   norm_num_groups=8, bias=True, upcast_softmax=True, only_cross_attention=False,
                   cross_attention_norm=None)
        cfg.update(extra)
        cfg["processor"] = proc
        add(f"diffusers/attention_{short}.safetensors", "diffusers.Attention", cfg, 616 + i,
            lambda g: {"hidden_states": randn(g, 2, 24, 5, 3), "encoder_hidden_states": randn(g, 2, 7, 12)},
            source=DIFF_SRC + f' built without "processor", then set_processor({proc}()); '
            "UNetMidBlock2DSimpleCrossAttn-style kwargs (added_kv_proj_dim: text keys/values prepended to the "
            "image keys/values)")
    add("diffusers/attention_vae_mid_conv_weights.safetensors", "diffusers.Attention", dict(VAE_MID), 620,
        lambda g: {"hidden_states": randn(g, 3, 32, 3, 5)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE-style kwargs; to_q/to_k/to_v/to_out.0 weights stored "
        "as (C, C, 1, 1) conv kernels (as in some ldm->diffusers converted checkpoints); squeeze them to (C, C)",
        conv_weights=True)
    add("diffusers/attention_attnprocessor_upcast_cross_mask.safetensors", "diffusers.Attention",
        dict(query_dim=80, cross_attention_dim=24, heads=2, dim_head=40, upcast_attention=True, upcast_softmax=True,
             processor="AttnProcessor"), 621,
        lambda g: {"hidden_states": randn(g, 2, 9, 80), "encoder_hidden_states": randn(g, 2, 7, 24),
                   "attention_mask": diffusers_cross_mask()},
        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); upcast_attention and '
        "upcast_softmax (switched off in the float64 copy), additive (B, 1, S) mask")

    # diffusers FeedForward / GEGLU / BasicTransformerBlock / Transformer2DModel
    for i, (act, dim, dim_out, mult, final_dropout, inner_dim, bias, shape) in enumerate((
            ("geglu", 20, None, 4, False, None, True, (2, 7, 20)),
            ("gelu", 24, 10, 2, False, None, False, (3, 5, 24)),
            ("gelu-approximate", 20, None, 4, True, 36, True, (2, 9, 20)),
            ("geglu-approximate", 18, 14, 3, False, None, True, (2, 5, 18)))):
        add(f"diffusers/feed_forward_{act.replace('-', '_')}.safetensors", "diffusers.FeedForward",
            dict(dim=dim, dim_out=dim_out, mult=mult, dropout=0.0, activation_fn=act, final_dropout=final_dropout,
                 inner_dim=inner_dim, bias=bias), 630 + i,
            lambda g, shape=shape: {"hidden_states": randn(g, *shape)},
            source=DIFF_FF_SRC.format("FeedForward") + f' activation_fn="{act}"')
    add("diffusers/geglu_in20_out24.safetensors", "diffusers.GEGLU", dict(dim_in=20, dim_out=24, bias=True), 640,
        lambda g: {"hidden_states": randn(g, 2, 7, 20)}, source=DIFF_ACT_SRC.format("GEGLU"))
    add("diffusers/geglu_in14_out10_nobias.safetensors", "diffusers.GEGLU", dict(dim_in=14, dim_out=10, bias=False),
        641, lambda g: {"hidden_states": randn(g, 3, 5, 14)}, source=DIFF_ACT_SRC.format("GEGLU") + ", bias=False")
    add("diffusers/basic_transformer_block_sd.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=24, num_attention_heads=2, attention_head_dim=12, dropout=0.0, cross_attention_dim=20,
             activation_fn="geglu", attention_bias=True, norm_type="layer_norm"), 650,
        lambda g: {"hidden_states": randn(g, 2, 9, 24), "encoder_hidden_states": randn(g, 2, 7, 20),
                   "attention_mask": diffusers_self_mask(), "encoder_attention_mask": diffusers_cross_mask()},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " SD-style (self-attn, cross-attn, GEGLU FF); masks "
        "are additive (B, 1, S) biases passed through unchanged to attn1 / attn2")
    add("diffusers/basic_transformer_block_only_cross.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=20, num_attention_heads=2, attention_head_dim=10, cross_attention_dim=12, attention_bias=False,
             only_cross_attention=True, upcast_attention=True), 651,
        lambda g: {"hidden_states": randn(g, 3, 5, 20), "encoder_hidden_states": randn(g, 3, 6, 12),
                   "attention_mask": diffusers_mask(3, 6, {0: [5], 2: [0, 4]})},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " only_cross_attention=True (attn1 attends to "
        "encoder_hidden_states with attention_mask; attn2 too, without a mask)")
    add("diffusers/basic_transformer_block_double_self.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=20, num_attention_heads=2, attention_head_dim=10, double_self_attention=True, attention_bias=True), 652,
        lambda g: {"hidden_states": randn(g, 2, 7, 20)},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " double_self_attention=True, no cross_attention_dim "
        "(attn2 is a second self-attention)")
    add("diffusers/transformer_2d_conv_sd1.safetensors", "diffusers.Transformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=12, in_channels=16, num_layers=1, cross_attention_dim=20,
             norm_num_groups=4, use_linear_projection=False, attention_bias=False, upcast_attention=False,
             only_cross_attention=False), 660,
        lambda g: {"hidden_states": randn(g, 2, 16, 5, 3), "encoder_hidden_states": randn(g, 2, 7, 20),
                   "encoder_attention_mask": keep_mask_float(2, 7, [5, 7])},
        kwargs={"return_dict": False},
        source=DIFF_T2D_SRC + " SD1-style (conv proj_in/proj_out, in_channels != inner_dim); 2-D "
        "encoder_attention_mask (1 = keep, 0 = discard) converted to a (1 - m) * -10000 bias")
    add("diffusers/transformer_2d_linear_2layers.safetensors", "diffusers.Transformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=10, in_channels=20, num_layers=2, cross_attention_dim=12,
             norm_num_groups=5, use_linear_projection=True, attention_bias=True, upcast_attention=True,
             only_cross_attention=False), 661,
        lambda g: {"hidden_states": randn(g, 2, 20, 3, 5), "encoder_hidden_states": randn(g, 2, 6, 12),
                   "encoder_attention_mask": keep_mask_float(2, 6, [6, 3])},
        kwargs={"return_dict": False},
        source=DIFF_T2D_SRC + " SD2/XL-style (linear proj_in/proj_out), 2 layers, upcast_attention (ignored by "
        "AttnProcessor2_0)")

    # ldm (SD 1.x / SD 2.x) attention.py
    add("ldm/cross_attention_sd1_mask.safetensors", "ldm.CrossAttention",
        dict(query_dim=40, context_dim=24, heads=2, dim_head=20, dropout=0.0), 510,
        lambda g: {"x": randn(g, 2, 9, 40), "context": randn(g, 2, 7, 24), "mask": keep_mask_bool(2, 7, [5, 7])},
        source=SD1_SRC.format("CrossAttention (class CrossAttentionSD1 here)") + "; bool mask (B, S), True = keep, "
        "masked logits filled with -finfo(float32).max")
    add("ldm/cross_attention_sd1_self.safetensors", "ldm.CrossAttention",
        dict(query_dim=24, context_dim=None, heads=3, dim_head=10, dropout=0.0), 511,
        lambda g: {"x": randn(g, 2, 7, 24)},
        source=SD1_SRC.format("CrossAttention (class CrossAttentionSD1 here)") + "; self-attention (context None)")
    add("ldm/cross_attention_sd2_mask.safetensors", "ldm.CrossAttention",
        dict(query_dim=36, context_dim=20, heads=3, dim_head=12, dropout=0.0), 512,
        lambda g: {"x": randn(g, 3, 5, 36), "context": randn(g, 3, 6, 20), "mask": keep_mask_bool(3, 6, [4, 6, 2])},
        source=SD2_SRC.format("CrossAttention") + '; ATTN_PRECISION "fp32" (q, k upcast; .float() '
        "keeps float64 in the float64 copy); bool mask (B, S), True = keep")
    add("ldm/basic_transformer_block_sd1.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=24, n_heads=2, d_head=12, dropout=0.0, context_dim=20, gated_ff=True, checkpoint=True), 520,
        lambda g: {"x": randn(g, 2, 9, 24), "context": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("BasicTransformerBlock (class BasicTransformerBlockSD1 here)"))
    add("ldm/basic_transformer_block_sd1_plain_ff_self.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=20, n_heads=2, d_head=10, dropout=0.0, context_dim=None, gated_ff=False, checkpoint=False), 521,
        lambda g: {"x": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("BasicTransformerBlock (class BasicTransformerBlockSD1 here)") + "; gated_ff=False "
        "(Linear + GELU feed-forward, keys ff.net.0.0.*), no context (attn2 is a self-attention)")
    add("ldm/basic_transformer_block_sd2_disable_self_attn.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=20, n_heads=2, d_head=10, dropout=0.0, context_dim=12, gated_ff=True, checkpoint=True,
             disable_self_attn=True), 522,
        lambda g: {"x": randn(g, 3, 5, 20), "context": randn(g, 3, 6, 12)},
        source=SD2_SRC.format("BasicTransformerBlock") + "; disable_self_attn "
        "(attn1 is a cross-attention over context too)")
    add("ldm/spatial_transformer_sd1.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=12, depth=1, dropout=0.0, context_dim=20), 530,
        lambda g: {"x": randn(g, 2, 32, 5, 3), "context": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("SpatialTransformer (class SpatialTransformerSD1 here)") + "; conv proj_in/proj_out, "
        "in_channels != inner_dim")
    add("ldm/spatial_transformer_sd2_linear_depth2.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=16, depth=2, dropout=0.0, context_dim=[20, 12],
             disable_self_attn=False, use_linear=True, use_checkpoint=True), 531,
        lambda g: {"x": randn(g, 2, 32, 3, 5), "context": [randn(g, 2, 7, 20), randn(g, 2, 5, 12)]},
        source=SD2_SRC.format("SpatialTransformer") + "; use_linear (proj_out = "
        "Linear(in_channels, inner_dim), in == inner), depth 2 with one context per block: the forward takes a "
        "list, stored as inputs context.0 / context.1 (block i gets context.i)")
    add("ldm/spatial_transformer_sd2_disable_self_attn.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=10, depth=1, dropout=0.0, context_dim=12,
             disable_self_attn=True, use_linear=False, use_checkpoint=True), 532,
        lambda g: {"x": randn(g, 2, 32, 3, 5), "context": randn(g, 2, 6, 12)},
        source=SD2_SRC.format("SpatialTransformer") + "; conv proj_in/proj_out, "
        "disable_self_attn, int context_dim (wrapped into a list), single context tensor")
    add("ldm/spatial_self_attention_c32.safetensors", "ldm.SpatialSelfAttention", dict(in_channels=32), 540,
        lambda g: {"x": randn(g, 2, 32, 3, 5)}, source=SD2_SRC.format("SpatialSelfAttention") + "; unchanged from SD 1.x")
    add("ldm/spatial_self_attention_c64.safetensors", "ldm.SpatialSelfAttention", dict(in_channels=64), 541,
        lambda g: {"x": randn(g, 2, 64, 3, 3)}, source=SD2_SRC.format("SpatialSelfAttention") + "; unchanged from SD 1.x")

    # ldm diffusionmodules/model.py
    add("ldm/attn_block_c32.safetensors", "ldm.AttnBlock", dict(in_channels=32), 550,
        lambda g: {"x": randn(g, 2, 32, 5, 3)}, source=LDM_MODEL_SRC.format("AttnBlock"))
    add("ldm/attn_block_c64.safetensors", "ldm.AttnBlock", dict(in_channels=64), 551,
        lambda g: {"x": randn(g, 3, 64, 3, 3)}, source=LDM_MODEL_SRC.format("AttnBlock"))
    add("ldm/lin_attn_block_c12.safetensors", "ldm.LinAttnBlock", dict(in_channels=12), 552,
        lambda g: {"x": randn(g, 2, 12, 5, 7)},
        source=LIN_ATTN_SRC)
    add("ldm/lin_attn_block_c20.safetensors", "ldm.LinAttnBlock", dict(in_channels=20), 553,
        lambda g: {"x": randn(g, 3, 20, 6, 3)},
        source=LIN_ATTN_SRC)

    # OpenAI guided-diffusion AttentionBlock
    add("openai/attention_block_legacy_c32_h2.safetensors", "openai.AttentionBlock",
        dict(channels=32, num_heads=2, num_head_channels=-1, use_checkpoint=False, use_new_attention_order=False),
        560, lambda g: {"x": randn(g, 2, 32, 5, 3)},
        source=OPENAI_SRC.format(" with QKVAttentionLegacy (split heads before q/k/v)"))
    add("openai/attention_block_new_order_c32_hc16.safetensors", "openai.AttentionBlock",
        dict(channels=32, num_heads=1, num_head_channels=16, use_checkpoint=False, use_new_attention_order=True),
        561, lambda g: {"x": randn(g, 3, 32, 3, 5)},
        source=OPENAI_SRC.format(" with QKVAttention (split q/k/v before heads); num_head_channels=16 -> 2 heads"))
    add("openai/attention_block_legacy_1d_c64_hc8.safetensors", "openai.AttentionBlock",
        dict(channels=64, num_heads=1, num_head_channels=8, use_checkpoint=True, use_new_attention_order=False),
        562, lambda g: {"x": randn(g, 2, 64, 7)},
        source=OPENAI_SRC.format(" with QKVAttentionLegacy on a 1-D (B, C, T) input; num_head_channels=8 -> 8 heads"))

    add_half_precision_specs(S)
    return S


# --------------------------------------------------------------------------------------------
# half precision (float16 / bfloat16) bundles

# (parity.dtype, file-name suffix)
HALF_DTYPES = (("float16", "f16"), ("bfloat16", "bf16"))

# One float32 bundle per block id (diffusers.Attention: four; torch MHA: need_weights true and
# false) gets a float16 and a bfloat16 twin "<same name>_f16" / "<same name>_bf16": same seed,
# weights and inputs, then module.to(dtype) and the float inputs cast (bool masks unchanged).
HALF_FROM = (
    "denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4",
    "denoising_diffusion_pytorch/linear_attention_dim24_h3_d8_mem4",
    "annotated_diffusion/attention_dim24_h3_d8",
    "annotated_diffusion/linear_attention_dim24_h3_d8",
    "ldm/linear_attention_dim24_h3_d8",
    "ldm/cross_attention_sd1_mask",
    "ldm/basic_transformer_block_sd1",
    "ldm/spatial_transformer_sd1",
    "ldm/attn_block_c32",
    "ldm/spatial_self_attention_c32",
    "ldm/lin_attn_block_c12",
    "diffusers/attention_vae_mid",
    "diffusers/attention_cross",
    "diffusers/attention_qk_norm_layer_norm",
    "diffusers/feed_forward_geglu",
    "diffusers/geglu_in20_out24",
    "diffusers/basic_transformer_block_sd",
    "diffusers/transformer_2d_conv_sd1",
    "fastai/self_attention_groupnorm_ni24",
    "fastai/self_attention_multihead_ni24_h4",
    "torch/mha_self_batch_first",
    "torch/mha_bias_kv_zero_attn_float_mask",
    "textbook/self_attention_dx6_d5_dv7",
    "textbook/multihead_attention_in7_nh3_dh5",
)

# float32 bundles whose half-precision twin PyTorch (CPU, module.to(dtype)) cannot run: not
# exported; export_all re-runs them and fails loudly if PyTorch starts accepting them.
HALF_REJECTED = {
    "diffusers/attention_attnprocessor_upcast_cross_mask":
        "AttnProcessor + upcast_attention: Attention.get_attention_scores upcasts query/key to float32 but passes "
        "the half attention_mask as baddbmm's input (torch.baddbmm: 'Input dtypes must be the same'); the same "
        "configuration without the mask is exported as attention_attnprocessor_upcast_cross_nomask_{f16,bf16}",
    "openai/attention_block_legacy_c32_h2":
        "module.to(dtype): GroupNorm32 runs super().forward(x.float()) with the half GroupNorm weight (CPU "
        "group_norm: 'mixed dtype (CPU): expect parameter to have scalar type of Float'); this twin is exported in "
        "guided-diffusion's own half-precision form instead (HALF_CONVERT_TO_FP16)",
}

# float32 bundles whose twins are made the way guided-diffusion runs in half precision
# (UNetModel.convert_to_fp16 -> fp16_util.convert_module_to_f16): only the Conv1d/2d/3d weights and
# biases are cast (parity_bundle.convert_convs_to_half_), the GroupNorm32 parameters stay float32;
# x is given in the half dtype. bfloat16: the same conversion with bfloat16 (guided-diffusion has no
# bf16 mode). Same paths as the module.to(dtype) twins HALF_REJECTED lists for them.
HALF_CONVERT_TO_FP16 = (
    "openai/attention_block_legacy_c32_h2",
)


def half_source(f32_path, dtype):
    return (f"{dtype} twin of weights/{f32_path}.safetensors: same seed, weights and inputs, module.to({dtype}), "
            f"float inputs cast to {dtype} (bool inputs unchanged), run by PyTorch on CPU in {dtype}; .float64 "
            f"outputs from the float64 copy of the {dtype}-rounded weights and inputs")


def convert_to_fp16_source(f32_path, dtype):
    return (f"{dtype} twin of weights/{f32_path}.safetensors in the {CONVERT_TO_FP16_MARK}: same seed, weights and "
            f"inputs; as guided-diffusion's UNetModel.convert_to_fp16() (fp16_util.convert_module_to_f16) only the "
            f"Conv1d weights and biases are cast to {dtype}, the GroupNorm32 weight and bias stay float32 (stored "
            f"float32); x cast to {dtype} (UNetModel.forward's h = x.type(self.dtype)); run by PyTorch on CPU; "
            f".float64 outputs from the float64 copy of that mixed-dtype module on x upcast"
            + ("" if dtype == "float16" else "; guided-diffusion has no bfloat16 mode: the same conversion with "
               "bfloat16"))


def add_half_precision_specs(S):
    by_path = {s["path"]: s for s in S}
    new = []
    for stem in HALF_CONVERT_TO_FP16:
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, f32_twin=base["path"],
                            convert_to_fp16=True, source=f"{base['source']}; {convert_to_fp16_source(stem, dtype)}"))
    for stem in HALF_FROM:
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, f32_twin=base["path"],
                            source=f"{base['source']}; {half_source(stem, dtype)}"))
    for stem, why in HALF_REJECTED.items():
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, rejected=why))

    # Substitute for the rejected AttnProcessor + upcast + mask twin: same config, seed, weights and
    # hidden_states / encoder_hidden_states, no attention_mask.
    stem = "diffusers/attention_attnprocessor_upcast_cross_mask"
    base = by_path[f"{stem}.safetensors"]

    def no_mask(g, make=base["make_inputs"]):
        inputs = make(g)
        del inputs["attention_mask"]
        return inputs

    for dtype, suffix in HALF_DTYPES:
        new.append(dict(base, path=f"diffusers/attention_attnprocessor_upcast_cross_nomask_{suffix}.safetensors",
                        make_inputs=no_mask, dtype=dtype, f32_twin=base["path"],
                        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); '
                        "upcast_attention and upcast_softmax (switched off in the float64 copy), no mask; "
                        + half_source(stem, dtype).replace(" and inputs,", " and inputs except attention_mask "
                                                           "(left out: with a mask PyTorch rejects this configuration "
                                                           "in half precision),")))

    # Large activations as trained SD VAE decoders produce them in the mid-block attention: std ~100,
    # a few channels offset by ~500 (GroupNorm statistics and the residual add must not overflow).
    cfg = dict(VAE_MID, query_dim=64, heads=1, dim_head=64, norm_num_groups=32)

    def large(g):
        x = 100.0 * randn(g, 1, 64, 16, 16)
        x[:, [3, 17, 40]] += torch.tensor([500.0, -450.0, 550.0])[None, :, None, None]
        return {"hidden_states": x}

    for dtype, suffix in HALF_DTYPES:
        new.append(dict(path=f"diffusers/attention_vae_mid_c64_large_activations_{suffix}.safetensors",
                        block="diffusers.Attention", config=cfg, seed=690, make_inputs=large, kwargs=None,
                        dtype=dtype, large_activations=True,
                        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE UNetMidBlock2D-style kwargs (64 channels, "
                        "32 groups, 1 head) on large activations like a trained SD VAE decoder's: hidden_states = "
                        "100 * N(0, 1) with channels 3, 17, 40 offset by +500, -450, +550; run by PyTorch on CPU in "
                        f"{dtype} (module.to({dtype})); .float64 outputs from the float64 copy of the "
                        f"{dtype}-rounded weights and inputs"))
    S.extend(new)


# --------------------------------------------------------------------------------------------


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


def _short_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}[dtype]


def make_module_and_inputs(spec):
    """The spec's module (randomized with its seed, then cast to its dtype) and its inputs (float32
    as made by the spec; export_bundle casts the float ones to the module's dtype)."""
    keys = ("qkv.weight",) if spec.get("fused") else ()
    module = build_module(spec["block"], spec["config"], keys, spec["source"])
    randomize_(module, spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"] + 100_000)
    inputs = spec["make_inputs"](gen)
    if spec.get("convert_to_fp16"):
        convert_convs_to_half_(module, getattr(torch, spec["dtype"]))
    else:
        cast_module(module, getattr(torch, spec.get("dtype", "float32")))
    return module, inputs


def exported_specs(specs):
    return [s for s in specs if not s.get("rejected")]


def traced_spec(spec) -> bool:
    """Which bundles carry stage traces (``parity.trace.*``): every one whose block ``parity_trace``
    has a tracer for (all of them; half-precision twins also hold the float64 copy's stages)."""
    return spec["block"] in TRACERS


def export_all(specs):
    for fam in FAMILIES:
        d = WEIGHTS / fam
        if d.is_dir():
            for f in sorted(d.glob("*.safetensors")):
                f.unlink()
    results = []
    for spec in specs:
        module, inputs = make_module_and_inputs(spec)
        dtype = getattr(torch, spec.get("dtype", "float32"))
        if spec.get("rejected"):
            try:
                run_module(module, _cast_inputs(_flatten_list_inputs(inputs), dtype), spec["kwargs"])
            except RuntimeError as e:
                print(f"skipped weights/{spec['path']} as module.to({spec['dtype']}): PyTorch rejects it "
                      f"({str(e).splitlines()[0]}): "
                      f"{spec['rejected']}")
                continue
            raise RuntimeError(f"{spec['path']}: PyTorch now runs this half-precision twin; move it from "
                               f"HALF_REJECTED to HALF_FROM")
        source = spec["source"]
        if spec.get("large_activations"):
            own = run_module(module, _cast_inputs(_flatten_list_inputs(inputs), dtype), spec["kwargs"])
            if all(bool(torch.isfinite(t).all()) for t in own.values()):
                source += f"; PyTorch's own {spec['dtype']} output is finite"
            else:
                own64 = run_module(float64_copy(module),
                                   _cast_inputs(_cast_inputs(_flatten_list_inputs(inputs), dtype), torch.float64),
                                   spec["kwargs"])
                assert all(bool(torch.isfinite(t).all()) for t in own64.values()), \
                    f"{spec['path']}: the float64 output is not finite either"
                source += (f"; PyTorch's own {spec['dtype']} output overflows (non-finite entries); only the "
                           ".float64 outputs are a reference")
        sd = to_legacy_diffusers_keys(module.state_dict()) if spec.get("legacy_keys") else None
        if spec.get("conv_weights"):
            sd = to_conv_shaped_diffusers_weights(module.state_dict())
        info = export_bundle(module, spec["block"], spec["config"], inputs, WEIGHTS / spec["path"],
                             kwargs=spec["kwargs"], source=source, state_dict=sd, dtype=dtype,
                             trace=traced_spec(spec))
        diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
        flat = OrderedDict()
        for k, v in inputs.items():
            for i, item in enumerate(v) if isinstance(v, (list, tuple)) else [(None, v)]:
                flat[k if i is None else f"{k}.{i}"] = item
        stored = _cast_inputs(OrderedDict((k, v) for k, v in flat.items() if v is not None), dtype)
        ins = ", ".join(f"{k}{tuple(v.shape)}{'' if v.dtype == dtype else ':' + str(v.dtype).replace('torch.', '')}"
                        for k, v in stored.items())
        tag = "" if dtype == torch.float32 else f" [{spec['dtype']}{', convert_to_fp16 form' if spec.get('convert_to_fp16') else ''}]"
        print(f"wrote weights/{spec['path']} ({info['bytes']} B) {spec['block']}{tag} {json.dumps(spec['config'])} "
              f"inputs [{ins}] max|{_short_dtype(dtype)}-f64| {diffs}")
        results.append(info)
    total = sum(r["bytes"] for r in results)
    print(f"{len(results)} bundles, {total} bytes in total")
    return results


def verify_file(path: Path) -> str:
    """Rebuild the block from the bundle alone (in the stored ``parity.dtype``), rerun it and its
    float64 copy, assert bit-identical outputs; returns "name max|out - out.float64|, ..."."""
    b = load_bundle(path)
    meta = b["metadata"]
    for key in ("parity.format", "parity.block", "parity.config", "parity.inputs", "parity.outputs",
                "parity.dtype", "parity.source"):
        assert key in meta, f"{path}: missing metadata {key}"
    sd = b["state_dict"]
    if b["block"] == "diffusers.Attention" and any(k.startswith("query.") for k in sd):
        sd = from_legacy_diffusers_keys(sd)
    if b["block"] == "diffusers.Attention" and any(k in CONV_SHAPED_DIFFUSERS_KEYS and v.dim() == 4 for k, v in sd.items()):
        sd = from_conv_shaped_diffusers_weights(sd)
    want_dtype = getattr(torch, meta["parity.dtype"])
    module = build_module(b["block"], b["config"], sd.keys(), meta["parity.source"])
    # a half-precision bundle: cast first, so load_state_dict copies the stored values unchanged
    mixed = CONVERT_TO_FP16_MARK in meta["parity.source"]
    if mixed:
        assert want_dtype in (torch.float16, torch.bfloat16), f"{path}: {CONVERT_TO_FP16_MARK} of {want_dtype}"
        convert_convs_to_half_(module, want_dtype)
    else:
        cast_module(module, want_dtype)
    held = {k: v.dtype for k, v in module.state_dict().items()}
    missing, unexpected = module.load_state_dict(sd, strict=True)
    module.eval()
    if mixed:
        # exactly the dtypes PyTorch held: conv parameters half, the rest float32, x half
        for name, t in sd.items():
            assert t.dtype == held[name], f"{path}: {name} is {t.dtype}, PyTorch holds it in {held[name]}"
        assert {held[k] for k in held} == {want_dtype, torch.float32}, f"{path}: not a mixed-dtype module"
        for name, t in list(b["inputs"].items()) + list(b["expected"].items()):
            assert t.dtype == want_dtype, f"{path}: {name} is {t.dtype}, not {want_dtype}"
    else:
        assert all(p.dtype == want_dtype for p in module.parameters()), f"{path}: dtype mismatch"
    if want_dtype != torch.float32 and not mixed:
        for name, t in list(sd.items()) + list(b["inputs"].items()) + list(b["expected"].items()):
            assert not t.is_floating_point() or t.dtype == want_dtype, f"{path}: {name} is {t.dtype}, not {want_dtype}"
    for name, t in list(b["inputs"].items()) + list(b["expected"].items()) + list(sd.items()):
        assert t.is_contiguous(), f"{path}: {name} not contiguous"
    inputs = OrderedDict(b["inputs"])
    # inputs stored twice because they were the same object (MHA key is value): rebuild the aliasing
    if "key" in inputs and "value" in inputs and torch.equal(inputs["key"], inputs["value"]):
        inputs["value"] = inputs["key"]
    names = list(b["expected"])
    out_names = ["attn_output", "attn_weights"] if isinstance(module, nn.MultiheadAttention) else None
    got = run_module(module, inputs, b["kwargs"], out_names)
    assert list(got) == names, f"{path}: outputs {list(got)} != stored {names}"
    for n in names:
        assert got[n].dtype == b["expected"][n].dtype and torch.equal(got[n], b["expected"][n]), \
            f"{path}: output {n} differs from the stored one"
    m64 = float64_copy(module)
    in64 = OrderedDict()
    memo = {}
    for k, v in inputs.items():
        if id(v) not in memo:
            memo[id(v)] = v.double() if v.is_floating_point() else v
        in64[k] = memo[id(v)]
    got64 = run_module(m64, in64, b["kwargs"], out_names)
    for n in names:
        assert got64[n].dtype == torch.float64 and torch.equal(got64[n], b["expected_f64"][n]), \
            f"{path}: float64 output {n} differs from the stored one"
    # stage traces: re-recorded with the hooks, bit-identical (and the float64 copy's, half bundles)
    verify_traces(path, b, module, inputs, m64, in64, b["kwargs"], out_names)
    if "output is finite" in meta["parity.source"]:
        assert all(bool(torch.isfinite(t).all()) for t in b["expected"].values()), f"{path}: output not finite"
    diffs = {n: float((b["expected"][n].double() - b["expected_f64"][n]).abs().max()) for n in names}
    return ", ".join(f"{n} {d:.3e}" for n, d in diffs.items())


def verify_half_twin(path: Path, f32_path: Path) -> None:
    """A half-precision twin holds exactly its float32 bundle's block, config, kwargs, state dict and
    inputs, floating tensors rounded to its dtype (bool / integer ones unchanged); an input the twin
    leaves out (the no-mask substitute) is allowed, an extra one is not."""
    h, f = load_bundle(path), load_bundle(f32_path)
    dtype = getattr(torch, h["metadata"]["parity.dtype"])
    assert dtype in (torch.float16, torch.bfloat16), f"{path}: parity.dtype {dtype}"
    assert f["metadata"]["parity.dtype"] == "float32", f"{f32_path}: not a float32 bundle"
    assert (h["block"], h["config"], h["kwargs"]) == (f["block"], f["config"], f["kwargs"]), \
        f"{path}: block/config/kwargs differ from {f32_path}"
    # (sorted: safetensors orders the tensors of a mixed-dtype file by dtype first)
    assert sorted(h["state_dict"]) == sorted(f["state_dict"]), f"{path}: state-dict keys differ from {f32_path}"
    assert set(h["inputs"]) <= set(f["inputs"]), f"{path}: inputs not a subset of {f32_path}'s"
    mixed = CONVERT_TO_FP16_MARK in h["metadata"]["parity.source"]
    if mixed:
        # the dtype each weight has after guided-diffusion's conversion of the float32 block
        module = build_module(f["block"], f["config"], f["state_dict"].keys(), f["metadata"]["parity.source"])
        held = {k: v.dtype for k, v in convert_convs_to_half_(module, dtype).state_dict().items()}
    pairs = [(k, h["state_dict"][k], v) for k, v in f["state_dict"].items()]
    pairs += [(k, v, f["inputs"][k]) for k, v in h["inputs"].items()]
    for k, half, full in pairs:
        to = held.get(k, dtype) if mixed else dtype
        want = full.to(to) if full.is_floating_point() else full
        assert half.dtype == want.dtype and torch.equal(half, want), f"{path}: {k} is not {f32_path}'s cast to {dtype}"


def verify_all(specs):
    specs = exported_specs(specs)
    paths = [WEIGHTS / s["path"] for s in specs]
    on_disk = sorted(p for fam in FAMILIES for p in (WEIGHTS / fam).glob("*.safetensors"))
    extra = sorted(set(on_disk) - set(paths))
    assert not extra, f"stale bundles on disk: {extra}"
    for spec, p in zip(specs, paths):
        diffs = verify_file(p)
        twin = ""
        if spec.get("f32_twin"):
            verify_half_twin(p, WEIGHTS / spec["f32_twin"])
            what = "Conv1d weights/biases and x" if spec.get("convert_to_fp16") else "weights and inputs"
            twin = f", same weights and inputs as weights/{spec['f32_twin']}, {what} rounded to {spec['dtype']}"
        short = _short_dtype(getattr(torch, spec.get("dtype", "float32")))
        print(f"verified {p.relative_to(REPO)}: rebuilt from metadata, outputs bit-identical{twin} "
              f"(max|{short}-f64| {diffs})")
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    print(f"verified {len(paths)} bundles; weights/ holds {total} bytes")
    assert total < MAX_WEIGHTS_BYTES, f"weights/ exceeds {MAX_WEIGHTS_BYTES} bytes"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="after exporting, reload and re-check every bundle")
    ap.add_argument("--verify-only", action="store_true", help="only re-check the bundles on disk")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    specs = bundle_specs()
    if not args.verify_only:
        export_all(specs)
    if args.verify or args.verify_only:
        verify_all(specs)


if __name__ == "__main__":
    main()
