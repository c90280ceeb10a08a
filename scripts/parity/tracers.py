"""The named tracers of composite blocks (feed-forwards, transformer blocks, spatial and temporal
transformers, resnets, mid blocks), which nest the tracers of their parts under the submodule
names, and ``TRACERS``: block id -> named tracer.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .trace_attention import (annotated_attention, diffusers_attention, diffusers_attention_1d, fastai_attention,
                              ldm_attn_block, ldm_cross_attention, linear_attention, lucidrains_attention,
                              openai_attention_block, textbook_attention, torch_mha)
from .trace_hooks import nest


# --- feed-forwards, transformer blocks --------------------------------------------------------


def _diffusers_geglu(m, h):
    h.out(m.proj, "proj_in")
    return lambda got: OrderedDict(proj_in=got["proj_in"])


def _feed_forward(m, h):
    """diffusers / ldm FeedForward: ``net = [act (its own Linear inside), Dropout, Linear, ...]``;
    ldm's non-GLU ``act`` is ``Sequential(Linear, GELU)``."""
    act = m.net[0]
    h.out(act.proj if hasattr(act, "proj") else act[0], "proj_in")
    h.out(act, "act")
    h.out(m.net[2], "proj")
    return lambda got: OrderedDict((k, got[k]) for k in ("proj_in", "act", "proj"))


def _transformer_block(attn):
    """diffusers (norm_type "layer_norm") / ldm BasicTransformerBlock: norm1, attn1, norm2, attn2,
    norm3, ff."""

    def make(m, h):
        h.out(m.norm1, "norm1")
        a1 = nest(h, "attn1", m.attn1, attn)
        h.out(getattr(m, "norm2", None), "norm2")
        a2 = nest(h, "attn2", getattr(m, "attn2", None), attn)
        h.out(m.norm3, "norm3")
        ff = nest(h, "ff", m.ff, _feed_forward)

        def finish(got):
            st = OrderedDict(norm1=got["norm1"])
            st.update(a1(got))
            if "norm2" in got:
                st["norm2"] = got["norm2"]
            st.update(a2(got))
            st["norm3"] = got["norm3"]
            st.update(ff(got))
            return st

        return finish

    return make


def _spatial_transformer(block):
    """diffusers Transformer2DModel (continuous input) / ldm SpatialTransformer: norm, proj_in,
    transformer_blocks.<i>, proj_out."""

    def make(m, h):
        h.out(m.norm, "norm")
        h.out(m.proj_in, "proj_in")
        blocks = [nest(h, f"transformer_blocks.{i}", b, block) for i, b in enumerate(m.transformer_blocks)]
        h.out(m.proj_out, "proj_out")

        def finish(got):
            st = OrderedDict(norm=got["norm"], proj_in=got["proj_in"])
            for f in blocks:
                st.update(f(got))
            st["proj_out"] = got["proj_out"]
            return st

        return finish

    return make


# --- resnets and mid blocks -------------------------------------------------------------------


def _resnet(**paths):
    """A resnet's stages from its submodules: stage name -> attribute path, in forward order (a
    missing submodule is skipped)."""

    def get(m, path):
        for part in path.split("."):
            if m is None:
                return None
            m = m[int(part)] if part.isdigit() else getattr(m, part, None)
        return m

    def make(m, h):
        for name, path in paths.items():
            h.out(get(m, path), name)
        return lambda got: OrderedDict((n, got[n]) for n in paths if n in got)

    return make


_diffusers_resnet = _resnet(norm1="norm1", conv1="conv1", temb="time_emb_proj", norm2="norm2", conv2="conv2",
                            shortcut="conv_shortcut")
# lucidrains: time_emb = mlp(time_emb) first; Block = (proj, norm, FiLM, act)
_ddpm_resnet = _resnet(temb="mlp", conv1="block1.proj", norm1="block1.norm", conv2="block2.proj",
                       norm2="block2.norm", shortcut="res_conv")
_ldm_resnet = _resnet(norm1="norm1", conv1="conv1", temb="temb_proj", norm2="norm2", conv2="conv2",
                      shortcut="nin_shortcut")
# guided diffusion ResBlock: in_layers = (norm, SiLU, conv), out_layers = (norm, SiLU, Dropout, conv)
_openai_resnet = _resnet(norm1="in_layers.0", conv1="in_layers.2", temb="emb_layers", norm2="out_layers.0",
                         conv2="out_layers.3", shortcut="skip_connection")


# diffusers TemporalConvLayer: convN = (GroupNorm, SiLU, [Dropout], Conv3d); stages (B, C, F, H, W)
_temporal_conv = _resnet(norm1="conv1.0", conv1="conv1.2", norm2="conv2.0", conv2="conv2.3", norm3="conv3.0",
                         conv3="conv3.3", norm4="conv4.0", conv4="conv4.3")


def _ldm_shortcut_fix(make):
    """ldm ResnetBlock's shortcut is ``conv_shortcut`` (3×3) or ``nin_shortcut`` (1×1)."""

    def wrapped(m, h):
        if getattr(m, "conv_shortcut", None) is not None and getattr(m, "nin_shortcut", None) is None:
            h.out(m.conv_shortcut, "shortcut")
        return make(m, h)

    return wrapped


def _sequence(children, ran_only=False):
    """A block that runs named submodules in order: each child's stages nested under its name.
    ``children(m)`` lists ``(name, submodule, tracer)``; a ``None`` tracer nests only ``output``.
    ``ran_only``: a child whose output was not recorded (a branch the forward's arguments skipped)
    has no stages (otherwise every child must run)."""

    def make(m, h):
        parts = [(name, nest(h, name, sub, tracer)) for name, sub, tracer in children(m)]

        def finish(got):
            st = OrderedDict()
            for name, f in parts:
                if not ran_only or f"{name}/output" in got:
                    st.update(f(got))
            return st

        return finish

    return make


def _by_class(m):
    """The tracer for a submodule of a mid block, by class."""
    name = type(m).__name__
    mod = type(m).__module__
    if name == "Attention" and mod.startswith("diffusers"):
        return diffusers_attention
    if name == "Attention" and mod.startswith("denoising_diffusion_pytorch"):
        return lucidrains_attention
    if name.startswith("DualTransformer2DModel"):
        return TRACERS["diffusers.DualTransformer2DModel"]
    if name.startswith("Transformer2DModel"):
        return TRACERS["diffusers.Transformer2DModel"]
    if name in ("TransformerTemporalModel", "AnimateDiffTransformer3D"):
        return TRACERS["diffusers.TransformerTemporalModel"]
    if name == "TemporalConvLayer":
        return _temporal_conv
    if name == "SpatioTemporalResBlock":
        return _sequence(_spatio_temporal_res)
    if name == "TransformerSpatioTemporalModel":
        return TRACERS["diffusers.TransformerSpatioTemporalModel"]
    if name.startswith("SpatialTransformer"):
        return TRACERS["ldm.SpatialTransformer"]
    if name == "AttnBlock":
        return ldm_attn_block
    if name in ("LinAttnBlock", "LinearAttention"):
        return linear_attention
    if name == "AttentionBlock":
        return openai_attention_block
    if name in ("ResnetBlock2D", "ResnetBlockCondNorm2D"):
        # ResnetBlockCondNorm2D ("spatial"): norm1/norm2 are SpatialNorms, no time_emb_proj
        return _diffusers_resnet
    if name == "ResBlock":
        return _openai_resnet
    if name == "ResnetBlock" and mod.startswith("denoising_diffusion_pytorch"):
        return _ddpm_resnet
    if name == "ResnetBlock":
        return _ldm_shortcut_fix(_ldm_resnet)
    if name == "Identity":
        return None
    raise KeyError(f"no stage tracer for a mid-block submodule of class {mod}.{name}")



# diffusers ResConvBlock (1-D): conv_1, group_norm_1, GELU, conv_2, group_norm_2, GELU, + conv_skip
_res_conv_1d = _resnet(conv1="conv_1", norm1="group_norm_1", conv2="conv_2", norm2="group_norm_2",
                       shortcut="conv_skip")


def _temporal_resnet_1d(m, h):
    """diffusers ResidualTemporalBlock1D: time_emb(mish(t)), Conv1dBlocks (conv, GroupNorm on the
    (B, C, 1, L) view, Mish), residual_conv when the channels change."""
    paths = dict(temb="time_emb", conv1="conv_in.conv1d", norm1="conv_in.group_norm", conv2="conv_out.conv1d",
                 norm2="conv_out.group_norm")
    if not isinstance(m.residual_conv, torch.nn.Identity):
        paths["shortcut"] = "residual_conv"
    return _resnet(**paths)(m, h)


def _diffusers_mid_1d_temporal(m):
    if hasattr(m, "res1"):  # ValueFunctionMidBlock1D
        return [("res1", m.res1, _temporal_resnet_1d), ("down1", m.down1, None), ("res2", m.res2, _temporal_resnet_1d),
                ("down2", m.down2, None)]
    out = [(f"resnets.{i}", r, _temporal_resnet_1d) for i, r in enumerate(m.resnets)]
    if m.upsample is not None:
        out.append(("upsample", m.upsample, None))
    if m.downsample is not None:
        out.append(("downsample", m.downsample, None))
    return out


def _diffusers_mid_1d(m):
    # forward: down, then (resnet, attention) pairs, then up
    out = [("down", m.down, None)]
    for i, (r, a) in enumerate(zip(m.resnets, m.attentions)):
        out += [(f"resnets.{i}", r, _res_conv_1d), (f"attentions.{i}", a, diffusers_attention_1d)]
    return out + [("up", m.up, None)]


def _children(names):
    return lambda m: [(n, getattr(m, n), _by_class(getattr(m, n))) for n in names]


def _diffusers_mid(m):
    # forward: resnets[0], then (attention, resnet) pairs
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, (a, r) in enumerate(zip(m.attentions, m.resnets[1:])):
        if a is not None:
            out.append((f"attentions.{i}", a, _by_class(a)))
        out.append((f"resnets.{i + 1}", r, _by_class(r)))
    return out


def _dual_transformers(m):
    # forward: transformers[transformer_index_for_condition[i]] for condition 0, then 1
    order = list(m.transformer_index_for_condition)
    if len(set(order)) != len(order):
        raise KeyError("DualTransformer2DModel with one transformer for both conditions: stages would repeat")
    return [(f"transformers.{i}", m.transformers[i], TRACERS["diffusers.Transformer2DModel"]) for i in order]


def _diffusers_mid_3d(m):
    # UNetMidBlock3DCrossAttn: resnets[0], temp_convs[0], then (attention, temporal attention, resnet,
    # temporal conv) per layer
    out = [(f"{n}.0", getattr(m, n)[0], _by_class(getattr(m, n)[0])) for n in ("resnets", "temp_convs")]
    for i, mods in enumerate(zip(m.attentions, m.temp_attentions, m.resnets[1:], m.temp_convs[1:])):
        names = (f"attentions.{i}", f"temp_attentions.{i}", f"resnets.{i + 1}", f"temp_convs.{i + 1}")
        out += [(n, sub, _by_class(sub)) for n, sub in zip(names, mods)]
    return out


def _diffusers_mid_motion(m):
    # UNetMidBlockCrossAttnMotion: resnets[0], then (attention, motion module, resnet) per layer
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, mods in enumerate(zip(m.attentions, m.motion_modules, m.resnets[1:])):
        names = (f"attentions.{i}", f"motion_modules.{i}", f"resnets.{i + 1}")
        out += [(n, sub, _by_class(sub)) for n, sub in zip(names, mods)]
    return out


_diffusers_btb = _transformer_block(diffusers_attention)
_ldm_btb = _transformer_block(ldm_cross_attention)

# Stable Video Diffusion. TemporalResnetBlock: stages (B, C, F, H, W), temb (B, F, C)
_temporal_resnet = _resnet(norm1="norm1", conv1="conv1", temb="time_emb_proj", norm2="norm2", conv2="conv2")


def _spatio_temporal_res(m):
    # SpatioTemporalResBlock: spatial_res_block (B*F, C, H, W), temporal_res_block and time_mixer (B, C, F, H, W)
    return [("spatial_res_block", m.spatial_res_block, _diffusers_resnet),
            ("temporal_res_block", m.temporal_res_block, _temporal_resnet), ("time_mixer", m.time_mixer, None)]


def _temporal_btb(m, h):
    """TemporalBasicTransformerBlock: ff_in, then a BasicTransformerBlock's stages on (B*H*W, F, C) tokens (its
    output is (B*F, H*W, C), as the block returns it)."""
    ff_in = nest(h, "ff_in", m.ff_in, _feed_forward)
    inner = _diffusers_btb(m, h)

    def finish(got):
        st = ff_in(got)
        st.update(inner(got))
        return st

    return finish


def _spatio_temporal_transformer(m, h):
    """TransformerSpatioTemporalModel: norm, proj_in, time_pos_embed, then per layer transformer_blocks.<i> and
    temporal_transformer_blocks.<i>, proj_out (time_mixer runs once per layer: not a stage)."""
    h.out(m.norm, "norm")
    h.out(m.proj_in, "proj_in")
    emb = nest(h, "time_pos_embed", m.time_pos_embed, None)
    parts = []
    for i, (b, t) in enumerate(zip(m.transformer_blocks, m.temporal_transformer_blocks)):
        parts.append(nest(h, f"transformer_blocks.{i}", b, _diffusers_btb))
        parts.append(nest(h, f"temporal_transformer_blocks.{i}", t, _temporal_btb))
    h.out(m.proj_out, "proj_out")

    def finish(got):
        st = OrderedDict(norm=got["norm"], proj_in=got["proj_in"])
        st.update(emb(got))
        for f in parts:
            st.update(f(got))
        st["proj_out"] = got["proj_out"]
        return st

    return finish


def _temporal_decoder_mid(m):
    # MidBlockTemporalDecoder: resnets[0], then zip(resnets[1:], attentions): attention, resnet
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, (r, a) in enumerate(zip(m.resnets[1:], m.attentions)):
        out += [(f"attentions.{i}", a, _by_class(a)), (f"resnets.{i + 1}", r, _by_class(r))]
    return out


TRACERS = {
    "diffusers.Attention": diffusers_attention,
    "diffusers.FeedForward": _feed_forward,
    "diffusers.GEGLU": _diffusers_geglu,
    "diffusers.BasicTransformerBlock": _diffusers_btb,
    "diffusers.Transformer2DModel": _spatial_transformer(_diffusers_btb),
    # Versatile Diffusion: each transformer's stages under transformers.<i>/, in the order they run
    "diffusers.DualTransformer2DModel": _sequence(_dual_transformers),
    "diffusers.ResnetBlock2D": _diffusers_resnet,
    "diffusers.UNetMidBlock2D": _sequence(_diffusers_mid),
    "diffusers.UNetMidBlock1D": _sequence(_diffusers_mid_1d),
    "diffusers.MidResTemporalBlock1D": _sequence(_diffusers_mid_1d_temporal),
    "diffusers.ValueFunctionMidBlock1D": _sequence(_diffusers_mid_1d_temporal),
    "diffusers.UNetMidBlock2DCrossAttn": _sequence(_diffusers_mid),
    "diffusers.UNetMidBlock2DSimpleCrossAttn": _sequence(_diffusers_mid),
    # TransformerTemporalModel: norm (B, C, F, H, W), proj_in / blocks / proj_out on (B*H*W, F, inner) tokens
    "diffusers.TransformerTemporalModel": _spatial_transformer(_diffusers_btb),
    "diffusers.TemporalConvLayer": _temporal_conv,
    "diffusers.UNetMidBlock3DCrossAttn": _sequence(_diffusers_mid_3d),
    "diffusers.TransformerSpatioTemporalModel": _spatio_temporal_transformer,
    "diffusers.SpatioTemporalResBlock": _sequence(_spatio_temporal_res),
    "diffusers.UNetMidBlockSpatioTemporal": _sequence(_diffusers_mid),
    "diffusers.MidBlockTemporalDecoder": _sequence(_temporal_decoder_mid),
    # AnimateDiff: the motion modules (AnimateDiffTransformer3D) trace as TransformerTemporalModel
    "diffusers.UNetMidBlockCrossAttnMotion": _sequence(_diffusers_mid_motion),
    # ControlNetModel: the mid block's stages under mid_block/, the zero conv's output (before
    # conditioning_scale and the pooling) as controlnet_mid_block/output
    "diffusers.ControlNetMidBlock": _sequence(lambda m: [("mid_block", m.mid_block, _sequence(_diffusers_mid)),
                                                         ("controlnet_mid_block", m.controlnet_mid_block, None)]),
    # UNetControlNetXSModel: the zero convs' outputs and both mid blocks' stages, in forward order; with
    # apply_control=False only base_midblock runs (the parts that did not run are left out)
    "diffusers.ControlNetXSCrossAttnMidBlock2D": _sequence(lambda m: [
        ("base_to_ctrl", m.base_to_ctrl, None), ("base_midblock", m.base_midblock, _sequence(_diffusers_mid)),
        ("ctrl_midblock", m.ctrl_midblock, _sequence(_diffusers_mid)), ("ctrl_to_base", m.ctrl_to_base, None)],
        ran_only=True),
    "denoising_diffusion_pytorch.Attention": lucidrains_attention,
    "denoising_diffusion_pytorch.LinearAttention": linear_attention,
    "denoising_diffusion_pytorch.MidBlock": _sequence(_children(("mid_block1", "mid_attn", "mid_block2"))),
    "annotated_diffusion.Attention": annotated_attention,
    "annotated_diffusion.LinearAttention": linear_attention,
    "ldm.LinearAttention": linear_attention,
    "ldm.LinAttnBlock": linear_attention,
    "ldm.CrossAttention": ldm_cross_attention,
    "ldm.BasicTransformerBlock": _ldm_btb,
    "ldm.SpatialTransformer": _spatial_transformer(_ldm_btb),
    "ldm.AttnBlock": ldm_attn_block,
    "ldm.SpatialSelfAttention": ldm_attn_block,
    "ldm.MidBlock": _sequence(_children(("block_1", "attn_1", "block_2"))),
    "openai.AttentionBlock": openai_attention_block,
    "openai.MiddleBlock": _sequence(lambda m: [(str(i), c, _by_class(c)) for i, c in enumerate(m)]),
    "fastai.SelfAttention": fastai_attention,
    "fastai.SelfAttentionMultiHead": fastai_attention,
    "torch.nn.MultiheadAttention": torch_mha,
    "textbook.SelfAttention": textbook_attention,
    "textbook.MultiHeadAttention": textbook_attention,
}
