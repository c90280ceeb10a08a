"""Stage traces for parity bundles, recorded with forward hooks (the reference classes are never
edited).

``trace_module(block, module, inputs, kwargs, output_names)`` runs ``module`` once with hooks on
its submodules and returns ``(outputs, stages)``: the outputs of that run (the caller asserts they
equal the untraced run's, bit for bit) and an ordered dict stage name -> tensor, or ``None`` for
a block (or processor) without a tracer. Stages that are not a submodule's input or output
(q/k/v after the head split, the attention weights) are computed here from hooked tensors, with
the block's own reshapes.

Stage layouts (the same on the Rust side, ``unet_attention::trace``):

* ``norm``: the input norm's output, as the norm module returns it;
  ``spatial_norm``: diffusers ``spatial_norm`` output;
* ``q``, ``k``, ``v``: ``(B, heads, tokens, head_dim)`` after the head split, before any scale;
  ``k``/``v`` include memory key/values (lucidrains); after ``norm_q``/``norm_k`` (diffusers
  ``qk_norm``) where present;
* ``probs``: ``(B, heads, Lq, Lk)`` = ``softmax(q·kᵀ·scale)`` in float32 with the block's own
  scale; only without an attention mask and when it has at most ``PROBS_MAX_ELEMENTS`` elements;
* ``attn``: the input of the output projection; ``proj``: its output (before any residual);
* ``output``: the block's output; not stored twice (it is ``parity.output.<first output>``).

Bundles store stage ``s`` as ``parity.trace.<s>`` and the metadata ``parity.trace`` = JSON list of
the stage names in forward order (``output`` last).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

PROBS_MAX_ELEMENTS = 1 << 16
ORDER = ("spatial_norm", "norm", "q", "k", "v", "probs", "attn", "proj")


class _Hooks:
    def __init__(self):
        self.handles = []
        self.got = {}

    def out(self, mod, name):
        if mod is not None:
            self.handles.append(mod.register_forward_hook(lambda m, a, o: self.got.setdefault(name, o)))

    def inp(self, mod, name):
        if mod is not None:
            self.handles.append(mod.register_forward_pre_hook(lambda m, a: self.got.setdefault(name, a)))

    def remove(self):
        for h in self.handles:
            h.remove()


def _probs(q, k, scale_q=1.0, scale_k=1.0, scale=1.0):
    """softmax over keys of (q·scale_q)(k·scale_k)ᵀ·scale, float32 (q, k: (B, H, N, D))."""
    if q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] > PROBS_MAX_ELEMENTS:
        return None
    q, k = q.float(), k.float()
    if scale_q != 1.0:
        q = q * scale_q
    if scale_k != 1.0:
        k = k * scale_k
    w = q @ k.transpose(-1, -2)
    if scale != 1.0:
        w = w * scale
    return torch.softmax(w, dim=-1)

def _stages(got, q, k, v, first=(), probs=True, **scales):
    """The stage dict in order: `first` (norms), q, k, v, probs (unless `probs` is False or it is
    too large), attn (the output projection's input), proj (its output)."""
    st = OrderedDict(first)
    st["q"], st["k"], st["v"] = q, k, v
    p = _probs(q, k, **scales) if probs else None
    if p is not None:
        st["probs"] = p
    st["attn"] = got["_attn"][0]
    st["proj"] = got["proj"]
    return st


def _diffusers(m, h, inputs):
    if type(m.processor).__name__ not in ("AttnProcessor2_0", "AttnProcessor"):
        return None
    h.out(getattr(m, "spatial_norm", None), "spatial_norm")
    h.out(m.group_norm, "norm")
    h.out(m.to_q, "_q")
    h.out(m.to_k, "_k")
    h.out(m.to_v, "_v")
    h.out(getattr(m, "norm_q", None), "_qn")
    h.out(getattr(m, "norm_k", None), "_kn")
    h.inp(m.to_out[0], "_attn")
    h.out(m.to_out[0], "proj")

    def finish(got):
        heads = m.heads

        def split(t):
            b = t.shape[0]
            return t.reshape(b, -1, heads, t.shape[-1] // heads).transpose(1, 2)

        norms = [(name, got[name]) for name in ("spatial_norm", "norm") if name in got]
        q, k, v = split(got["_q"]), split(got["_k"]), split(got["_v"])
        # AttnProcessor2_0 applies norm_q/norm_k to the split (B, heads, N, D) tensors.
        if "_qn" in got and got["_qn"].dim() == 4:
            q = got["_qn"]
        if "_kn" in got and got["_kn"].dim() == 4:
            k = got["_kn"]
        return _stages(got, q, k, v, norms, probs=inputs.get("attention_mask") is None, scale=m.scale)

    return finish


def _ddpm(m, h, inputs):
    h.out(m.norm, "norm")
    h.inp(m.attend, "_qkv")
    h.inp(m.to_out, "_attn")
    h.out(m.to_out, "proj")

    def finish(got):
        q, k, v = got["_qkv"][:3]
        scale = m.attend.scale if m.attend.scale is not None else q.shape[-1] ** -0.5
        return _stages(got, q, k, v, [("norm", got["norm"])], scale=scale)

    return finish


def _ldm_attn_block(m, h, inputs):
    h.out(m.norm, "norm")
    for n in ("q", "k", "v"):
        h.out(getattr(m, n), "_" + n)
    h.inp(m.proj_out, "_attn")
    h.out(m.proj_out, "proj")

    def finish(got):
        b, c, hh, ww = got["_q"].shape
        # 'b c h w -> b 1 (h w) c': one head of c channels
        tok = lambda t: t.reshape(b, c, hh * ww).transpose(1, 2).unsqueeze(1)
        q, k, v = tok(got["_q"]), tok(got["_k"]), tok(got["_v"])
        return _stages(got, q, k, v, [("norm", got["norm"])], scale=int(c) ** (-0.5))

    return finish


def _openai(m, h, inputs):
    h.out(m.norm, "norm")
    h.inp(m.attention, "_qkv")
    h.inp(m.proj_out, "_attn")
    h.out(m.proj_out, "proj")

    def finish(got):
        qkv = got["_qkv"][0]
        bs, width, length = qkv.shape
        heads = m.attention.n_heads
        ch = width // (3 * heads)
        if type(m.attention).__name__ == "QKVAttentionLegacy":
            # qkv.reshape(bs * n_heads, ch * 3, length).split(ch, dim=1)
            parts = qkv.reshape(bs * heads, ch * 3, length).split(ch, dim=1)
        else:
            # q, k, v = qkv.chunk(3, dim=1); each .view(bs * n_heads, ch, length)
            parts = [t.reshape(bs * heads, ch, length) for t in qkv.chunk(3, dim=1)]
        q, k, v = (t.reshape(bs, heads, ch, length).transpose(2, 3) for t in parts)
        s = 1 / math.sqrt(math.sqrt(ch))
        return _stages(got, q, k, v, [("norm", got["norm"])], scale_q=s, scale_k=s)

    return finish


def _annotated(m, h, inputs):
    h.out(m.to_qkv, "_qkv")
    h.inp(m.to_out, "_attn")
    h.out(m.to_out, "proj")

    def finish(got):
        qkv = got["_qkv"]
        b, _, hh, ww = qkv.shape
        # 'b (h c) x y -> b h c (x y)', then (B, H, N, D); q before `q * self.scale`
        q, k, v = (t.reshape(b, m.heads, -1, hh * ww).transpose(2, 3) for t in qkv.chunk(3, dim=1))
        return _stages(got, q, k, v, scale_q=m.scale)

    return finish


def _ldm_cross(m, h, inputs):
    h.out(m.to_q, "_q")
    h.out(m.to_k, "_k")
    h.out(m.to_v, "_v")
    h.inp(m.to_out[0], "_attn")
    h.out(m.to_out[0], "proj")

    def finish(got):
        # rearrange(t, 'b n (h d) -> (b h) n d') = (B, H, N, D) with the batch and head axes merged
        split = lambda t: t.reshape(t.shape[0], t.shape[1], m.heads, -1).transpose(1, 2)
        q, k, v = split(got["_q"]), split(got["_k"]), split(got["_v"])
        return _stages(got, q, k, v, probs=inputs.get("mask") is None, scale=m.scale)

    return finish


TRACERS = {
    "diffusers.Attention": _diffusers,
    "denoising_diffusion_pytorch.Attention": _ddpm,
    "ldm.AttnBlock": _ldm_attn_block,
    "ldm.SpatialSelfAttention": _ldm_attn_block,
    "annotated_diffusion.Attention": _annotated,
    "ldm.CrossAttention": _ldm_cross,
    "openai.AttentionBlock": _openai,
}


def trace_module(block, module, inputs, kwargs=None, output_names=None):
    """Run ``module`` with stage hooks: ``(outputs, stages)``; ``stages`` is ``None`` when the
    block has no tracer. ``stages`` holds contiguous copies in :data:`ORDER`."""
    from parity_bundle import run_module

    make = TRACERS.get(block)
    hooks = _Hooks()
    finish = make(module, hooks, inputs) if make is not None else None
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        hooks.remove()
    if finish is None:
        return outs, None
    got = finish(hooks.got)
    stages = OrderedDict((k, got[k].detach().cpu().clone().contiguous()) for k in ORDER if k in got)
    unknown = set(got) - set(ORDER)
    if unknown:
        raise KeyError(f"{block}: stages {sorted(unknown)} not in ORDER")
    return outs, stages
