"""Module-path stages (mode "modules"): every submodule's output under a name made from its
qualified module path (``resnets.0.norm1`` -> ``resnets.0/norm1``), for any ``nn.Module``; the
rules are in ``parity_trace``'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from .run import run_module


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


def trace_modules(module, inputs, kwargs=None, output_names=None):
    """Run ``module`` recording every submodule's output under its module path (mode "modules",
    rules in the module docstring): ``(outputs, stages)``, stages as contiguous CPU copies taken
    when each call returns."""
    got, calls, handles = OrderedDict(), {}, []

    def hook(name):
        def record(mod, args, out):
            n = calls[name] = calls.get(name, 0) + 1
            t = _first_tensor(out)
            if t is not None:
                got[name if n == 1 else f"{name}#{n}"] = t.detach().cpu().clone().contiguous()
        return record

    for path, sub in module.named_modules():
        if not path:
            continue
        name = module_stage_name(path)
        if name == "output":
            raise KeyError(f"{type(module).__name__}: submodule {path!r} would be the stage 'output' (the block's "
                           "own output)")
        handles.append(sub.register_forward_hook(hook(name)))
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        for h in handles:
            h.remove()
    return outs, got
