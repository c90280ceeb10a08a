"""Running a block on named inputs, as every bundle writer and checker does: ``run_module`` (the
forward under ``torch.no_grad()``, outputs named), the inputs' casts (``cast_inputs``), list
inputs stored as ``<name>.0``, ``<name>.1``, ... and the dtype helpers ``export_bundle`` uses.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import torch
from torch import nn


def module_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of the module's first floating parameter or buffer (float32 if it has none)."""
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def floating_dtypes(module: nn.Module) -> set:
    """Every dtype the module's floating parameters and buffers are held in."""
    return {t.dtype for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()}


def module_in_dtype(module: nn.Module, dtype: torch.dtype) -> tuple:
    """``(module to run, converted?)`` for ``export_bundle(..., dtype=dtype)``.

    A module whose floating parameters and buffers are all in one dtype other than ``dtype`` is
    converted: a deep copy ``.to(dtype)`` (the caller's module is left as it is), so that the
    weights, the inputs (cast by ``export_bundle``) and the float64 copy (made from the
    ``dtype``-rounded weights) agree. A module already in ``dtype``, or a mixed-dtype module
    that holds some tensors in ``dtype`` (e.g. after ``convert_convs_to_half_``: the caller chose
    which parts stay float32), runs as given. A mixed-dtype module with nothing in ``dtype``, or
    a non-floating ``dtype``, is a ``TypeError``: which parts to convert is not this function's
    guess to make."""
    if not dtype.is_floating_point:
        raise TypeError(f"dtype={dtype}: a bundle's dtype is a floating dtype (float16, bfloat16, float32, float64)")
    held = floating_dtypes(module)
    if not held or held == {dtype} or (len(held) > 1 and dtype in held):
        return module, False
    if len(held) > 1:
        raise TypeError(f"dtype={dtype}: the {type(module).__name__} holds floating tensors in "
                        f"{', '.join(sorted(dtype_name(d) for d in held))} and none in {dtype_name(dtype)}; convert "
                        f"the parts that should run in {dtype_name(dtype)} yourself (e.g. convert_convs_to_half_) and "
                        "pass the module with dtype=")
    return copy.deepcopy(module).to(dtype), True


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_LIST_ITEM = re.compile(r"^(.+)\.(\d+)$")


def flatten_list_inputs(inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """A list/tuple of tensors passed as input ``name`` becomes ``name.0``, ``name.1``, ..."""
    out = OrderedDict()
    for name, value in inputs.items():
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                out[f"{name}.{i}"] = item
        else:
            out[name] = value
    return out


def group_list_inputs(inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Inverse of ``flatten_list_inputs``: inputs named ``name.0`` ... ``name.{n-1}`` are passed
    to the forward as one list argument ``name`` (at the position of ``name.0``)."""
    groups: dict[str, list[tuple[int, Any]]] = {}
    for key, value in inputs.items():
        m = _LIST_ITEM.match(key)
        if m:
            groups.setdefault(m.group(1), []).append((int(m.group(2)), value))
    out = OrderedDict()
    for key, value in inputs.items():
        m = _LIST_ITEM.match(key)
        if not m:
            out[key] = value
            continue
        base = m.group(1)
        items = sorted(groups[base], key=lambda t: t[0])
        if [i for i, _ in items] != list(range(len(items))) or base in inputs:
            raise ValueError(f"list input {base!r}: items {[i for i, _ in items]} are not 0..n-1")
        if base not in out:
            out[base] = [v for _, v in items]
    return out


def with_forward_defaults(module: nn.Module, inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Inputs the forward would otherwise need, filled from others (same tensor object).

    ``torch.nn.MultiheadAttention``: a missing ``key`` is the ``query`` and a missing ``value``
    is the ``key`` (self-attention), passed as the same object so torch's ``query is key``
    self-attention path is taken.
    """
    call = group_list_inputs(inputs)
    if isinstance(module, nn.MultiheadAttention) and "query" in call:
        if "key" not in call:
            call["key"] = call["query"]
        if "value" not in call:
            call["value"] = call["key"]
    return call


def cast_inputs(inputs: Mapping[str, Any], dtype: torch.dtype,
                 input_dtypes: Mapping[str, torch.dtype] | None = None) -> "OrderedDict[str, Any]":
    """Cast floating tensors to ``dtype`` (or to ``input_dtypes[name]`` where given); other values
    unchanged. Aliasing is preserved (an input that is the same object as another, cast to the same
    dtype, stays the same object)."""
    memo: dict[tuple[int, torch.dtype], Any] = {}
    out = OrderedDict()
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            want = (input_dtypes or {}).get(name, dtype)
            if (id(value), want) not in memo:
                memo[(id(value), want)] = value.to(want) if value.is_floating_point() else value
            out[name] = memo[(id(value), want)]
        else:
            out[name] = value
    return out


def default_output_names(module: nn.Module, n: int) -> list[str]:
    """Names for ``n`` outputs when the caller gives none."""
    if isinstance(module, nn.MultiheadAttention):
        return ["attn_output", "attn_weights"][:n]
    if getattr(module, "output_names", None) is not None:
        # a wrapper that names its outputs (scripts/reference/mid_blocks.py ControlNetMidBlock)
        return list(module.output_names)[:n]
    if n == 1:
        return ["output"]
    return [f"output{i}" for i in range(n)]


def run_module(
    module: nn.Module,
    inputs: Mapping[str, Any],
    kwargs: Mapping[str, Any] | None = None,
    output_names: Sequence[str] | None = None,
) -> "OrderedDict[str, torch.Tensor]":
    """Run ``module(**inputs, **kwargs)`` under ``torch.no_grad()`` and name the outputs.

    Tuple outputs are matched position by position with ``output_names``; ``None`` entries
    (e.g. the weights of MultiheadAttention when ``need_weights=False``) are dropped together
    with their names.
    """
    call = with_forward_defaults(module, OrderedDict((k, v) for k, v in inputs.items() if v is not None))
    with torch.no_grad():
        result = module(**call, **dict(kwargs or {}))
    seq = list(result) if isinstance(result, (tuple, list)) else [result]
    names = list(output_names) if output_names is not None else default_output_names(module, len(seq))
    if len(names) < len(seq):
        raise ValueError(f"{len(seq)} outputs but only output_names {names}")
    out = OrderedDict()
    for name, value in zip(names, seq):
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            hint = ""
            if "return_dict" in inspect.signature(module.forward).parameters:
                hint = "; this forward takes return_dict: pass kwargs={'return_dict': False}"
            raise TypeError(f"output {name!r} is a {type(value).__name__}, not a tensor{hint}")
        out[name] = value
    return out
