"""Module-path stages (mode "modules"): every submodule's output under a name made from its
qualified module path (``resnets.0.norm1`` -> ``resnets.0/norm1``), for any ``nn.Module``, and
the inner stages of each attention module (``attn1/q``, ``attn1/probs``, ``attn1/attn``); the rules
are in ``parity_trace``'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from .run import run_module
from .trace_attention import (diffusers_attention, diffusers_attention_1d, ldm_attn_block, ldm_cross_attention,
                              linear_attention, lucidrains_attention, openai_attention_block)
from .trace_hooks import Hooks

# The stages an attention module's processor computes without a module of its own (rule 7); its
# norms and output projection are submodules and record their outputs anyway.
INNER_STAGES = ("q", "k", "v", "probs", "context", "attn")


def module_stage_name(path: str) -> str:
    """The stage name of the submodule at qualified path ``path`` (module docstring, rules 1-3):
    ``resnets.0.norm1`` -> ``resnets.0/norm1``."""
    if not path:
        raise ValueError("the top module has no stage name of its own (its output is the stage 'output')")
    levels = []
    for part in path.split("."):
        if levels and part.isdigit() and part.isascii():
            levels[-1] += "." + part
        else:
            levels.append(part)
    return "/".join(levels)


def attention_tracer(m):
    """The named tracer of an attention module (by class), or ``None`` for any other module."""
    name, mod = type(m).__name__, type(m).__module__
    if name == "Attention" and mod.startswith("diffusers"):
        return diffusers_attention
    if name == "SelfAttention1d" and mod.startswith("diffusers"):
        return diffusers_attention_1d
    if name == "Attention" and mod.startswith("denoising_diffusion_pytorch"):
        return lucidrains_attention
    if name in ("AttnBlock", "SpatialSelfAttention"):
        return ldm_attn_block
    if name in ("LinAttnBlock", "LinearAttention"):
        return linear_attention
    if name == "AttentionBlock":
        return openai_attention_block
    if name == "CrossAttention":
        return ldm_cross_attention
    return None


def _first_tensor(out):
    """The tensor a module stage records of output ``out`` (rule 5), or ``None``."""
    if isinstance(out, torch.Tensor):
        items = [out]
    elif isinstance(out, (tuple, list)):
        items = list(out)
    elif isinstance(out, dict):  # diffusers BaseOutput is an OrderedDict of its non-None fields
        items = list(out.values())
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [getattr(out, f.name) for f in dataclasses.fields(out)]
    else:
        items = []
    t = next((x for x in items if isinstance(x, torch.Tensor)), None)
    return t if t is not None and t.is_floating_point() else None


class _InnerHooks(Hooks):
    """The hooks of one attention module's tracer (rule 7), which also note where in the module
    stages its output projection starts: the inner stages go just before that projection's stage."""

    def __init__(self, module_stages, prefix):
        super().__init__(prefix=prefix)
        self.module_stages = module_stages
        self.position = None

    def inp(self, mod, name):
        super().inp(mod, name)
        if mod is not None and name == "_attn":
            def note(m, a):
                if self.position is None:
                    self.position = len(self.module_stages)
            self.handles.append(mod.register_forward_pre_hook(note))


def _insert(stages, position, extra):
    """``stages`` with the entries of ``extra`` inserted before its ``position``-th entry."""
    items = list(stages.items())
    stages.clear()
    stages.update(items[:position] + list(extra.items()) + items[position:])


def _inner(module, path, name, got, taken):
    """Register the inner-stage hooks of ``module`` (at ``path``, stage name ``name``) if it is an
    attention module: a function to call when it returns, which inserts its inner stages into
    ``got`` in forward order, or ``None``."""
    make = attention_tracer(module)
    if make is None:
        return None
    prefix = f"{name}/" if path else ""
    hooks = _InnerHooks(got, prefix)
    finish = make(module, hooks)
    if finish is None:  # a processor the tracer does not know (e.g. xformers): module stages only
        hooks.remove()
        return None
    view = lambda: {k[len(prefix):]: v for k, v in hooks.got.items()}

    def done():
        if not hooks.got:
            return
        stages = finish(view())
        # rule 7: only the stages no submodule records, and none whose name a submodule's stage has
        extra = OrderedDict((prefix + k, v.detach().cpu().clone().contiguous()) for k, v in stages.items()
                            if k in INNER_STAGES and prefix + k not in taken)
        hooks.got.clear()
        _insert(got, len(got) if hooks.position is None else hooks.position, extra)
        hooks.position = None

    return hooks, done


def trace_modules(module, inputs, kwargs=None, output_names=None):
    """Run ``module`` recording every submodule's output under its module path, and the inner
    stages of each attention module (mode "modules", rules in the module docstring):
    ``(outputs, stages)``, stages as contiguous CPU copies taken when each call returns."""
    got, calls, handles, inner = OrderedDict(), {}, [], []
    taken = {module_stage_name(p) for p, _ in module.named_modules() if p}

    def hook(name, done):
        def record(mod, args, out):
            n = calls[name] = calls.get(name, 0) + 1
            if done is not None and n == 1:
                done()
            t = _first_tensor(out)
            if t is not None and name:
                got[name if n == 1 else f"{name}#{n}"] = t.detach().cpu().clone().contiguous()
        return record

    for path, sub in module.named_modules():
        name = module_stage_name(path) if path else ""
        if name == "output":
            raise KeyError(f"{type(module).__name__}: submodule {path!r} would be the stage 'output' (the block's "
                           "own output)")
        found = _inner(sub, path, name, got, taken)
        if found is not None:
            inner.append(found[0])
        if path or found is not None:
            handles.append(sub.register_forward_hook(hook(name, found and found[1])))
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        for h in handles:
            h.remove()
        for h in inner:
            h.remove()
    return outs, got
