"""The plumbing the named stage tracers share: ``Hooks`` (the forward hooks of one traced run),
``nest`` (a submodule's stages under ``<name>/``), ``attention_stages`` (q, k, v, probs, attn, proj
in order), and ``STAGES``, the stage names a tracer may use.

A tracer is a function ``tracer(module, hooks)`` that registers its hooks and returns
``finish(got)``, which turns what the hooks recorded into the ordered stages.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

PROBS_MAX_ELEMENTS = 1 << 16
# Stage names (the last path component, without a trailing digit); a tracer may not invent others.
STAGES = {"spatial_norm", "norm", "q", "k", "v", "probs", "context", "attn", "proj", "proj_in", "act",
          "proj_out", "conv", "temb", "shortcut", "output"}


class Hooks:
    """Forward hooks of one traced run; ``sub(name)`` gives the view a nested tracer registers
    through (its names prefixed ``name/``)."""

    def __init__(self, handles=None, got=None, prefix=""):
        self.handles = [] if handles is None else handles
        self.got = {} if got is None else got
        self.prefix = prefix

    def sub(self, name):
        return Hooks(self.handles, self.got, f"{self.prefix}{name}/")

    def out(self, mod, name):
        if mod is not None:
            key = self.prefix + name
            self.handles.append(mod.register_forward_hook(lambda m, a, o: self.got.setdefault(key, o)))

    def inp(self, mod, name):
        if mod is not None:
            key = self.prefix + name
            self.handles.append(mod.register_forward_pre_hook(lambda m, a: self.got.setdefault(key, a)))

    def call(self, mod, name):
        """The positional and keyword arguments ``mod`` is called with: ``(args, kwargs)``."""
        key = self.prefix + name
        self.handles.append(mod.register_forward_pre_hook(
            lambda m, a, kw: self.got.setdefault(key, (a, kw)) and None, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()


def _view(got, prefix):
    """The entries a nested tracer registered under ``prefix/``, without the prefix."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in got.items() if k.startswith(prefix + "/")}


def nest(h, name, mod, make):
    """Trace submodule ``mod`` (attribute path ``name``) with tracer ``make``: returns a finish
    function giving its stages as ``name/<stage>``, ending with ``name/output``."""
    if mod is None:
        return lambda got: OrderedDict()
    sub = h.sub(name)
    sub.out(mod, "output")
    inner = make(mod, sub) if make is not None else None

    def finish(got):
        mine = _view(got, name)
        st = OrderedDict()
        if inner is not None:
            st.update(inner(mine))
        out = mine["output"]
        # Transformer2DModel(return_dict=False) returns a 1-tuple, otherwise an output dataclass
        out = out[0] if isinstance(out, tuple) else getattr(out, "sample", out)
        st["output"] = out
        return OrderedDict((f"{name}/{k}", v) for k, v in st.items())

    return finish


def call_arg(h_got, key, name, pos):
    """Argument ``name`` (or positional ``pos``) of a call recorded with ``Hooks.call``."""
    args, kwargs = h_got[key]
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else None


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


def out_proj(h, mod):
    """Hook a block's output projection: its input is the stage ``attn``, its output ``proj``."""
    h.inp(mod, "_attn")
    h.out(mod, "proj")


def attention_stages(got, q, k, v, first=(), probs=True, extra=(), **scales):
    """The stage dict in order: `first` (norms), q, k, v, probs (unless `probs` is False or it is
    too large), `extra` (linear attention's context), attn and proj (from ``out_proj``, when the
    block has an output projection)."""
    st = OrderedDict(first)
    st["q"], st["k"], st["v"] = q, k, v
    p = _probs(q, k, **scales) if probs else None
    if p is not None:
        st["probs"] = p
    st.update(extra)
    if "_attn" in got:
        st["attn"] = got["_attn"][0]
        st["proj"] = got["proj"]
    return st
