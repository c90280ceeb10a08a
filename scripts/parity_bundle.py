"""Write PyTorch -> Candle parity bundles (format "1") for your own attention modules.

A bundle is one ``.safetensors`` file holding

* the module's ``state_dict()`` under its own keys, unchanged (buffers included);
* ``parity.input.<name>`` for every forward input (dtype kept, bool masks stay bool);
* ``parity.output.<name>`` for every output, computed by PyTorch in the module's dtype;
* ``parity.output.<name>.float64``: the same block run by PyTorch in float64 (a deep copy
  ``.double()``-ed, float inputs upcast, bool inputs unchanged, in-block float32 upcasts such
  as diffusers' ``upcast_softmax`` / ``upcast_attention`` switched off in that copy);

and string metadata: ``parity.format`` ("1"), ``parity.block`` (block id), ``parity.config``
(JSON of the constructor kwargs), ``parity.inputs`` / ``parity.outputs`` (JSON name lists),
optional ``parity.kwargs`` (JSON of non-tensor forward arguments), ``parity.dtype`` and
``parity.source`` (library versions / provenance).

Usage::

    import torch
    from diffusers.models.attention_processor import Attention
    from parity_bundle import export_bundle, randomize_

    config = dict(query_dim=64, heads=4, dim_head=16, norm_num_groups=8,
                  residual_connection=True, bias=True, upcast_softmax=True,
                  _from_deprecated_attn_block=True)
    attn = Attention(**config)
    randomize_(attn, seed=0)          # or load your trained weights
    x = torch.randn(2, 64, 5, 7)
    export_bundle(attn, "diffusers.Attention", config, {"hidden_states": x},
                  "weights/mine/mid_attn.safetensors")

    # torch.nn.MultiheadAttention, self-attention: pass only the query; key and value
    # default to the very same tensor (so torch takes its self-attention path).
    mha = torch.nn.MultiheadAttention(embed_dim=24, num_heads=3, batch_first=True)
    export_bundle(mha, "torch.nn.MultiheadAttention",
                  dict(embed_dim=24, num_heads=3, batch_first=True),
                  {"query": torch.randn(2, 9, 24)}, "weights/mine/mha.safetensors",
                  kwargs={"need_weights": True, "average_attn_weights": True})

Half precision: cast the module first (``attn.to(torch.float16)`` / ``torch.bfloat16``); the
float inputs are cast to the module's dtype, the outputs are PyTorch's run in that dtype, and the
``.float64`` outputs come from the float64 copy of the cast module, i.e. from the half-rounded
weights and inputs upcast exactly to float64.

Mixed precision (guided-diffusion's ``convert_to_fp16``: convolutions in float16, norms and the
time-embedding ``Linear`` in float32, ``x`` float16 and ``emb`` float32)::

    convert_convs_to_half_(middle_block, torch.float16)
    export_bundle(middle_block, "openai.MiddleBlock", config, {"x": x, "emb": emb}, path,
                  dtype=torch.float16, input_dtypes={"emb": torch.float32})

Each tensor is stored in the dtype PyTorch held it in; the float64 copy upcasts all of them.

The module is called as ``module(**inputs, **kwargs)``, so the input names must be the
forward's parameter names (a list argument is stored as ``<name>.0``, ``<name>.1``, ...).
``config`` must be exactly the keyword arguments the module was constructed with (the Rust side
rebuilds the block from it).
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
import warnings
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

FORMAT = "1"

__all__ = [
    "FORMAT",
    "export_bundle",
    "randomize_",
    "load_bundle",
    "run_module",
    "float64_copy",
    "convert_convs_to_half_",
    "CONVERT_TO_FP16_MARK",
    "library_versions",
    "load_checkpoint_state_dict",
    "resolve_weights",
]


# --------------------------------------------------------------------------------------------
# helpers


def _module_dtype(module: nn.Module) -> torch.dtype:
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def _floating_dtypes(module: nn.Module) -> set:
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
    held = _floating_dtypes(module)
    if not held or held == {dtype} or (len(held) > 1 and dtype in held):
        return module, False
    if len(held) > 1:
        raise TypeError(f"dtype={dtype}: the {type(module).__name__} holds floating tensors in "
                        f"{', '.join(sorted(_dtype_name(d) for d in held))} and none in {_dtype_name(dtype)}; convert "
                        f"the parts that should run in {_dtype_name(dtype)} yourself (e.g. convert_convs_to_half_) and "
                        "pass the module with dtype=")
    return copy.deepcopy(module).to(dtype), True


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_LIST_ITEM = re.compile(r"^(.+)\.(\d+)$")


def _flatten_list_inputs(inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """A list/tuple of tensors passed as input ``name`` becomes ``name.0``, ``name.1``, ..."""
    out = OrderedDict()
    for name, value in inputs.items():
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                out[f"{name}.{i}"] = item
        else:
            out[name] = value
    return out


def _group_list_inputs(inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Inverse of ``_flatten_list_inputs``: inputs named ``name.0`` ... ``name.{n-1}`` are passed
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


def _with_forward_defaults(module: nn.Module, inputs: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """Inputs the forward would otherwise need, filled from others (same tensor object).

    ``torch.nn.MultiheadAttention``: a missing ``key`` is the ``query`` and a missing ``value``
    is the ``key`` (self-attention), passed as the same object so torch's ``query is key``
    self-attention path is taken.
    """
    call = _group_list_inputs(inputs)
    if isinstance(module, nn.MultiheadAttention) and "query" in call:
        if "key" not in call:
            call["key"] = call["query"]
        if "value" not in call:
            call["value"] = call["key"]
    return call


def _cast_inputs(inputs: Mapping[str, Any], dtype: torch.dtype,
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


# the phrase a bundle's ``parity.source`` contains when it was made with ``convert_convs_to_half_``
# (the export scripts' --verify rebuild the mixed-dtype module from it)
CONVERT_TO_FP16_MARK = "guided-diffusion convert_to_fp16 form"


def convert_convs_to_half_(module: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """guided-diffusion's half-precision mode, in place: ``UNetModel.convert_to_fp16()`` applies
    ``fp16_util.convert_module_to_f16`` to ``input_blocks``, ``middle_block`` and ``output_blocks``,
    which converts the weight and bias of every ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d`` to
    float16 (``l.weight.data = l.weight.data.half()``) and nothing else: the ``GroupNorm32``
    parameters and the ``nn.Linear`` of ``ResBlock.emb_layers`` stay float32. (openai/guided-diffusion
    22e0df818350 ``guided_diffusion/fp16_util.py``, same in improved-diffusion; ldm's
    ``openaimodel.py`` replaces ``convert_module_to_f16`` by a no-op.) ``dtype=torch.bfloat16``
    applies the same conversion with bfloat16, which guided-diffusion itself does not offer.
    Returns ``module``."""
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)
    return module


def _rms_norm_forward_keep_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """diffusers ``RMSNorm.forward`` without its ``.to(torch.float32)`` of the variance."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
    if self.weight is not None:
        hidden_states = hidden_states * self.weight
        if self.bias is not None:
            hidden_states = hidden_states + self.bias
    return hidden_states


# Published forwards with a hard-coded ``.float()`` cast: (module, class) -> what is cast.
_FLOAT_CASTS = {
    ("guided_diffusion.unet", "QKVAttentionLegacy"): "softmax(weight.float())",
    ("guided_diffusion.unet", "QKVAttention"): "softmax(weight.float())",
    ("ldm.modules.diffusionmodules.openaimodel", "QKVAttentionLegacy"): "softmax(weight.float())",
    ("ldm.modules.diffusionmodules.openaimodel", "QKVAttention"): "softmax(weight.float())",
    ("ldm.modules.attention", "CrossAttention"): 'q.float(), k.float() when ATTN_PRECISION is "fp32"',
}


def _float_keeps_float64(forward: Callable) -> Callable:
    """``forward`` run with ``Tensor.float()`` returning a float64 tensor unchanged (every other
    dtype is cast as usual), so a published forward's float32 cast does not downcast the float64
    copy; the forward's own code runs unchanged."""

    def run(*args, **kwargs):
        cast = torch.Tensor.float

        def keep_float64(t, *a, **k):
            return t if t.dtype == torch.float64 else cast(t, *a, **k)

        torch.Tensor.float = keep_float64
        try:
            return forward(*args, **kwargs)
        finally:
            torch.Tensor.float = cast

    return run


def _disable_upcasts(module: nn.Module) -> None:
    """Switch off in-block float32 upcasts (they would downcast a float64 run).

    * any boolean ``upcast_softmax`` / ``upcast_attention`` attribute is set to False (diffusers
      ``Attention``);
    * a ``GroupNorm32`` (OpenAI / ldm ``openaimodel``: ``super().forward(x.float())``) runs as a
      plain ``nn.GroupNorm``;
    * the published OpenAI ``QKVAttention`` / ``QKVAttentionLegacy`` (softmax of ``weight.float()``)
      and SD 2.x ``CrossAttention`` (``q.float()``, ``k.float()``) run their own forward with
      ``.float()`` keeping float64 tensors (``_FLOAT_CASTS``);
    * a diffusers ``RMSNorm`` (variance computed ``.to(torch.float32)``) keeps the input dtype.
    """
    import types

    for sub in module.modules():
        for attr in ("upcast_softmax", "upcast_attention"):
            # instance attributes only (diffusers ModelMixin forwards unknown attributes to its config)
            if isinstance(vars(sub).get(attr), bool):
                setattr(sub, attr, False)
        cls = type(sub)
        if cls.__name__ == "GroupNorm32" and isinstance(sub, nn.GroupNorm):
            sub.forward = types.MethodType(nn.GroupNorm.forward, sub)
        elif (cls.__module__, cls.__name__) in _FLOAT_CASTS:
            sub.forward = _float_keeps_float64(sub.forward)
        elif cls.__name__ == "RMSNorm" and cls.__module__.startswith("diffusers."):
            sub.forward = types.MethodType(_rms_norm_forward_keep_dtype, sub)


def float64_copy(module: nn.Module, prepare: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """Deep copy of ``module`` in float64 with in-block float32 upcasts disabled."""
    m64 = copy.deepcopy(module).double().eval()
    _disable_upcasts(m64)
    if prepare is not None:
        prepare(m64)
    return m64


def _default_output_names(module: nn.Module, n: int) -> list[str]:
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
    call = _with_forward_defaults(module, OrderedDict((k, v) for k, v in inputs.items() if v is not None))
    with torch.no_grad():
        result = module(**call, **dict(kwargs or {}))
    seq = list(result) if isinstance(result, (tuple, list)) else [result]
    names = list(output_names) if output_names is not None else _default_output_names(module, len(seq))
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


_DIST_FOR_PACKAGE = {
    "denoising_diffusion_pytorch": "denoising-diffusion-pytorch",
    "ldm": "stable-diffusion-sdkit",
    "guided_diffusion": "guided-diffusion-sdk",
}


def library_versions(module: nn.Module | None = None) -> str:
    """``"torch X; <package of the module's class> Y; einops Z; safetensors W"``."""
    from importlib import metadata

    names = ["torch"]
    if module is not None:
        top = type(module).__module__.split(".")[0]
        if top not in ("torch", "__main__", "builtins"):
            names.append(_DIST_FOR_PACKAGE.get(top, top))
    names += ["einops", "safetensors"]
    parts = []
    for name in dict.fromkeys(names):
        try:
            version = torch.__version__ if name == "torch" else metadata.version(name)
        except Exception:
            continue
        parts.append(f"{name} {version}")
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# export


def export_bundle(
    module: nn.Module,
    block: str,
    config: Mapping[str, Any],
    inputs: Mapping[str, Any],
    path: str | os.PathLike,
    kwargs: Mapping[str, Any] | None = None,
    output_names: Sequence[str] | None = None,
    source: str | None = None,
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    prepare_float64: Callable[[nn.Module], None] | None = None,
    weights_ref: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    input_dtypes: Mapping[str, torch.dtype] | None = None,
    trace: bool | str = True,
    extra_metadata: Mapping[str, str] | None = None,
) -> dict:
    """Run ``module`` on ``inputs`` and write a format-"1" parity bundle to ``path``.

    Args:
        module: the PyTorch block (put in ``eval()`` here).
        block: block id, e.g. ``"diffusers.Attention"``.
        config: the constructor keyword arguments, by their Python names (JSON-serialisable).
        inputs: ordered mapping forward-parameter name -> tensor; ``None`` values are skipped.
            Floating inputs are cast to the module's dtype; other dtypes (bool masks) are kept.
            A list/tuple of tensors (e.g. the SD2 ``SpatialTransformer`` per-block ``context``)
            is stored as inputs ``<name>.0``, ``<name>.1``, ... and passed back to the forward as
            one list argument ``<name>``.
        path: output ``.safetensors`` file (parent folders are created).
        kwargs: non-tensor forward arguments (e.g. ``{"need_weights": False}``), stored as
            ``parity.kwargs``.
        output_names: names for the outputs (tuple positions); default ``["output"]`` for a
            single tensor, ``["attn_output", "attn_weights"]`` for MultiheadAttention.
        source: free text appended to the library versions in ``parity.source`` (e.g. which
            published code a re-stated class copies).
        state_dict: tensors to store instead of ``module.state_dict()`` (e.g. the same weights
            under legacy key names).
        prepare_float64: called on the float64 copy before it runs (to switch off other
            in-block upcasts).
        weights_ref: ``(relpath, prefix)`` or ``(relpath, prefix, key)``: write a *referencing*
            bundle that holds no state dict. The weights live in the checkpoint file ``relpath``
            (relative to the bundle's folder; safetensors, or a zip-format ``torch.save`` pickle)
            under the keys ``prefix + <the block's own key>``; ``key`` names the entry of a pickled
            top-level dict that holds that state dict (e.g. ``"state_dict"`` in an SD ``.ckpt``,
            ``"model"`` / ``"ema"`` in a lucidrains Trainer checkpoint); without it the file's top
            level is the state dict. Stored as metadata ``parity.weights``, ``parity.prefix`` and
            (when given) ``parity.weights_key``. The module must already hold those weights.
        dtype: the bundle's ``parity.dtype``, the dtype PyTorch runs the block in; default the
            module's dtype (of its first floating parameter or buffer). A module held in one other
            floating dtype is converted first (``module_in_dtype``: a deep copy ``.to(dtype)``; the
            float inputs are cast as always), so a float32 module exports as a float16 bundle with
            ``dtype=torch.float16``; a run that PyTorch then refuses is a ``RuntimeError`` saying so.
            Give it too for a module holding mixed dtypes, e.g. ``torch.float16`` after
            ``convert_convs_to_half_`` (whose first parameter, a GroupNorm32 weight, stays float32):
            such a module runs as given. Converting is refused with ``weights_ref`` or
            ``state_dict`` (they would describe weights other than the ones PyTorch ran).
        input_dtypes: input name -> dtype for floating inputs PyTorch is given in another dtype
            than ``dtype`` (guided-diffusion's half mode: ``{"emb": torch.float32}``); stored in
            that dtype.
        trace: (default on) also run the block with the stage hooks of ``parity_trace`` so that
            ``unet-parity check --trace`` can name the first stage that diverges: ``True`` uses the
            block's named tracer (``parity_trace.TRACERS``) and, for a block id without one, the
            module stages (every submodule's output under its module path, ``resnets.0/norm1``;
            the naming rules are in ``parity_trace``'s docstring; metadata ``parity.trace_mode`` =
            ``"modules"``); ``"named"`` only the named tracer (no traces without one);
            ``"modules"`` the module stages whatever the block; ``trace=False`` none (large
            benchmark bundles). The hooks
            store the stages as ``parity.trace.<stage>`` with metadata ``parity.trace`` (the stage
            names in order, ``output`` last = the first output). The traced run must give outputs
            bit-identical to the untraced one; the other tensors of the bundle are unchanged. A
            float16 / bfloat16 bundle also stores the float64 copy's stages as
            ``parity.trace.<stage>.float64``.
        extra_metadata: more string metadata to store as is (e.g. ``{"bench.case": "..."}`` for
            ``scripts/bench_torch.py``); keys must not start with ``parity.``.

    The module's dtype (of its first floating parameter or buffer) is the bundle's
    ``parity.dtype``: for a float16 / bfloat16 bundle pass a module cast with ``.to(dtype)``; its
    float64 copy then starts from the half-rounded weights.

    Returns:
        dict with ``path``, ``bytes``, ``outputs`` (name -> shape) and ``max_abs_diff_f64``
        (name -> max |output - output.float64|, PyTorch's own rounding error).
    """
    kwargs = dict(kwargs or {})
    if dtype is None:
        dtype = _module_dtype(module)
        converted = False
    else:
        held = ", ".join(sorted(_dtype_name(d) for d in _floating_dtypes(module)))
        module, converted = module_in_dtype(module, dtype)
        if converted and (weights_ref is not None or state_dict is not None):
            raise ValueError(f"dtype={dtype} would convert the module's {held} weights: weights_ref / state_dict "
                             "would then describe other weights than the ones PyTorch ran; convert the module "
                             "yourself (module.to(dtype)) and pass weights that match it")
    module.eval()
    clean = OrderedDict((k, v) for k, v in _flatten_list_inputs(inputs).items() if v is not None)
    for name, value in clean.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"input {name!r} is not a tensor; pass non-tensor arguments via kwargs")
    unknown = sorted(set(input_dtypes or {}) - set(clean))
    if unknown:
        raise KeyError(f"input_dtypes names inputs {unknown} that are not among {list(clean)}")
    ins = _cast_inputs(clean, dtype, input_dtypes)
    try:
        outs = run_module(module, ins, kwargs, output_names)
    except RuntimeError as e:
        if not converted:
            raise
        raise RuntimeError(f"{block}: PyTorch cannot run this module after module.to({dtype}): "
                           f"{str(e).splitlines()[0]}; convert it yourself, keeping the parts that must stay "
                           "float32 (e.g. convert_convs_to_half_ for guided-diffusion's GroupNorm32), and pass the "
                           "module with dtype=") from e

    m64 = float64_copy(module, prepare_float64)
    outs64 = run_module(m64, _cast_inputs(ins, torch.float64), kwargs, output_names)
    if list(outs64) != list(outs):
        raise RuntimeError(f"float64 run gave outputs {list(outs64)}, expected {list(outs)}")

    tensors: dict[str, torch.Tensor] = {}

    def put(key: str, t: torch.Tensor) -> None:
        if key in tensors:
            raise KeyError(f"duplicate tensor key {key!r}")
        # clone: safetensors refuses tensors sharing storage (e.g. key is value)
        tensors[key] = t.detach().cpu().clone().contiguous()

    sd = module.state_dict() if state_dict is None else state_dict
    if weights_ref is not None:
        if state_dict is not None:
            raise ValueError("weights_ref and state_dict are exclusive")
        sd = {}
    for key, t in sd.items():
        if key.startswith("parity."):
            raise KeyError(f"state-dict key {key!r} collides with the parity namespace")
        put(key, t)
    for name, t in ins.items():
        put(f"parity.input.{name}", t)
    diffs = {}
    for name, t in outs.items():
        put(f"parity.output.{name}", t)
        put(f"parity.output.{name}.float64", outs64[name])
        d = (t.double() - outs64[name]).abs()
        diffs[name] = float(d.max()) if d.numel() else 0.0

    trace_names = None
    if trace:
        from parity_trace import DELTA_SUFFIX, MODULES, TRACE_MODE_KEY, float64_delta, resolve_mode, trace_module

        mode = resolve_mode(block, trace)
        traced, stages = trace_module(block, module, ins, kwargs, output_names, mode)
        for name, t in outs.items():
            if not torch.equal(traced[name], t):
                raise RuntimeError(f"{path}: the traced run changed output {name!r}")
        if stages is not None:
            for name, t in stages.items():
                put(f"parity.trace.{name}", t)
            trace_names = list(stages) + ["output"]
            if dtype in (torch.float16, torch.bfloat16, torch.float32):
                # the float64 copy's stages: the reference a stage is judged by (float32 bundles store
                # them as bfloat16 deltas from the stage, see parity_trace.float64_delta)
                traced64, stages64 = trace_module(block, m64, _cast_inputs(ins, torch.float64), kwargs, output_names,
                                                  mode)
                for name, t in outs64.items():
                    if not torch.equal(traced64[name], t):
                        raise RuntimeError(f"{path}: the traced float64 run changed output {name!r}")
                if list(stages64) != list(stages):
                    raise RuntimeError(f"{path}: float64 stages {list(stages64)} differ from {list(stages)}")
                for name, t in stages64.items():
                    if dtype == torch.float32:
                        put(f"parity.trace.{name}{DELTA_SUFFIX}", float64_delta(stages[name], t))
                    else:
                        put(f"parity.trace.{name}.float64", t.double())

    src = library_versions(module)
    if source:
        src = f"{src}; {source}"
    metadata = {
        "parity.format": FORMAT,
        "parity.block": block,
        "parity.config": json.dumps(dict(config)),
        "parity.inputs": json.dumps(list(ins)),
        "parity.outputs": json.dumps(list(outs)),
        "parity.dtype": _dtype_name(dtype),
        "parity.source": src,
    }
    if kwargs:
        metadata["parity.kwargs"] = json.dumps(kwargs)
    if trace_names is not None:
        metadata["parity.trace"] = json.dumps(trace_names)
        if mode == MODULES:
            metadata[TRACE_MODE_KEY] = MODULES
    for key, value in (extra_metadata or {}).items():
        if key.startswith("parity.") or not isinstance(value, str):
            raise ValueError(f"extra_metadata {key!r}: keys outside parity.*, string values only")
        metadata[key] = value
    if weights_ref is not None:
        ref = list(weights_ref)
        if len(ref) not in (2, 3) or not all(isinstance(x, str) for x in ref):
            raise ValueError(f"weights_ref must be (relpath, prefix[, key]), got {weights_ref!r}")
        if os.path.isabs(ref[0]):
            raise ValueError(f"weights_ref path {ref[0]!r} must be relative to the bundle's folder")
        metadata["parity.weights"] = ref[0].replace(os.sep, "/")
        metadata["parity.prefix"] = ref[1]
        if len(ref) == 3:
            metadata["parity.weights_key"] = ref[2]

    from safetensors.torch import save_file

    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    save_file(tensors, path, metadata=metadata)
    _canonicalize_header(path)
    return {
        "path": path,
        "bytes": os.path.getsize(path),
        "outputs": {k: tuple(v.shape) for k, v in outs.items()},
        "max_abs_diff_f64": diffs,
    }


def _canonicalize_header(path: str) -> None:
    """Make the file byte-reproducible: safetensors writes ``__metadata__`` in hash-map order,
    so rewrite the JSON header with the metadata keys sorted (tensor entries and data unchanged;
    the header is re-padded with spaces to a multiple of 8 bytes, as safetensors does)."""
    import struct

    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"), object_pairs_hook=OrderedDict)
    out = OrderedDict()
    if "__metadata__" in header:
        out["__metadata__"] = OrderedDict(sorted(header["__metadata__"].items()))
    for k, v in header.items():
        if k != "__metadata__":
            out[k] = v
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _trace_f64(meta: dict, tensors: dict) -> "OrderedDict[str, torch.Tensor]":
    """Stage name -> the float64 run's stage, for the stages that have one."""
    out = OrderedDict()
    for n in json.loads(meta.get("parity.trace", "[]")):
        if f"parity.trace.{n}.float64" in tensors:
            out[n] = tensors[f"parity.trace.{n}.float64"]
        elif f"parity.trace.{n}.float64_delta" in tensors:
            out[n] = tensors[f"parity.trace.{n}"].double() + tensors[f"parity.trace.{n}.float64_delta"].double()
    return out


def load_bundle(path: str | os.PathLike) -> dict:
    """Read a bundle back: ``{"metadata", "block", "config", "inputs", "outputs", "kwargs",
    "state_dict", "expected", "expected_f64"}`` (inputs/expected in stored order)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(os.fspath(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    tensors = load_file(os.fspath(path))
    if meta.get("parity.format") != FORMAT:
        raise ValueError(f"{path}: parity.format {meta.get('parity.format')!r}, expected {FORMAT!r}")
    in_names = json.loads(meta["parity.inputs"])
    out_names = json.loads(meta["parity.outputs"])
    return {
        "metadata": meta,
        "block": meta["parity.block"],
        "config": json.loads(meta["parity.config"]),
        "kwargs": json.loads(meta.get("parity.kwargs", "{}")),
        "inputs": OrderedDict((n, tensors[f"parity.input.{n}"]) for n in in_names),
        "expected": OrderedDict((n, tensors[f"parity.output.{n}"]) for n in out_names),
        "expected_f64": OrderedDict((n, tensors[f"parity.output.{n}.float64"]) for n in out_names),
        "state_dict": OrderedDict((k, v) for k, v in tensors.items() if not k.startswith("parity.")),
        # stage name -> tensor (``output`` excluded: it is the first expected output), in order
        "trace": OrderedDict((n, tensors[f"parity.trace.{n}"]) for n in json.loads(meta.get("parity.trace", "[]"))
                             if n != "output"),
        # the float64 run's stages: stored as they are (half-precision bundles), or as bfloat16 deltas
        # from the float32 stage (``parity.trace.<stage>.float64_delta``, float32 bundles)
        "trace_f64": _trace_f64(meta, tensors),
        # referencing bundle: (checkpoint path relative to the bundle's folder, prefix, entry key or None)
        "weights_ref": ((meta["parity.weights"], meta.get("parity.prefix", ""), meta.get("parity.weights_key"))
                        if "parity.weights" in meta else None),
    }


def load_checkpoint_state_dict(path: str | os.PathLike, key: str | None = None) -> "OrderedDict[str, torch.Tensor]":
    """The state dict stored in a checkpoint file: a ``.safetensors`` file, or a ``torch.save``
    pickle (loaded with ``weights_only=True``) whose top level is the state dict, or, with ``key``,
    a dict whose entry ``key`` is."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        if key is not None:
            raise ValueError(f"{path}: a safetensors file has no entry {key!r}")
        from safetensors.torch import load_file

        return OrderedDict(load_file(path))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if key is not None:
        obj = obj[key]
    return OrderedDict((k, v) for k, v in obj.items() if isinstance(v, torch.Tensor))


def resolve_weights(bundle_path: str | os.PathLike, bundle: dict, keys: Sequence[str]) -> "OrderedDict[str, torch.Tensor]":
    """The block's state dict for ``bundle`` (from ``load_bundle``): its own tensors, or for a
    referencing bundle ``checkpoint[prefix + k]`` for every key ``k`` in ``keys`` (the module's
    own state-dict keys; a missing one is an error, other checkpoint keys are ignored)."""
    if bundle["weights_ref"] is None:
        return bundle["state_dict"]
    if bundle["state_dict"]:
        raise ValueError(f"{bundle_path}: a referencing bundle must not hold weights")
    rel, prefix, key = bundle["weights_ref"]
    ckpt = load_checkpoint_state_dict(os.path.join(os.path.dirname(os.fspath(bundle_path)), rel), key)
    missing = [prefix + k for k in keys if prefix + k not in ckpt]
    if missing:
        raise KeyError(f"{bundle_path}: {rel} lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return OrderedDict((k, ckpt[prefix + k]) for k in keys)


# --------------------------------------------------------------------------------------------
# random weights


_NORM_TYPES = (
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def _is_norm(mod: nn.Module) -> bool:
    return isinstance(mod, _NORM_TYPES) or "norm" in type(mod).__name__.lower()


def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Set EVERY parameter and buffer of ``module`` to deterministic random values, in place.

    * weights (ndim >= 2): N(0, std = 1/sqrt(fan_in)), fan_in = prod(shape[1:]), so
      activations stay O(1) (Linear, Conv, MHA in/q/k/v projections);
    * Linear/Conv/projection biases: 0.2 * N(0, 1);
    * norm weights / gains (``weight`` of GroupNorm, LayerNorm, BatchNorm, ..., and any ``g``,
      e.g. lucidrains RMSNorm): 1 + 0.2 * N(0, 1); norm biases: 0.1 * N(0, 1);
    * BatchNorm ``running_mean``: 0.2 * N(0, 1); ``running_var``: U(0.5, 1.5);
      ``num_batches_tracked``: a random int;
    * ``mem_kv`` (lucidrains memory key/values), MHA ``bias_k``/``bias_v``: N(0, 1);
    * anything else: floating -> 0.2 * N(0, 1) (with a warning); integer buffers -> random int.
    Returns ``module``.
    """
    gen = torch.Generator().manual_seed(int(seed))

    def randn(t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)

    def rand(t: torch.Tensor) -> torch.Tensor:
        return torch.rand(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)

    with torch.no_grad():
        for mod_name, mod in module.named_modules():
            norm = _is_norm(mod)
            for name, p in mod.named_parameters(recurse=False):
                full = f"{mod_name}.{name}" if mod_name else name
                if not p.is_floating_point():
                    continue
                if name == "g" or (norm and name in ("weight", "gamma", "scale")):
                    p.copy_(1.0 + 0.2 * randn(p))
                elif norm and name in ("bias", "b", "beta"):
                    p.copy_(0.1 * randn(p))
                elif name in ("mem_kv", "bias_k", "bias_v"):
                    p.copy_(randn(p))
                elif p.dim() >= 2:
                    fan_in = math.prod(p.shape[1:])
                    p.copy_(randn(p) / math.sqrt(max(fan_in, 1)))
                elif "bias" in name:
                    p.copy_(0.2 * randn(p))
                else:
                    warnings.warn(f"randomize_: no rule for parameter {full!r}; using 0.2*N(0,1)")
                    p.copy_(0.2 * randn(p))
            for name, b in mod.named_buffers(recurse=False):
                full = f"{mod_name}.{name}" if mod_name else name
                if name == "running_mean":
                    b.copy_(0.2 * randn(b))
                elif name == "running_var":
                    b.copy_(0.5 + rand(b))
                elif name == "num_batches_tracked" or not (b.is_floating_point() or b.dtype == torch.bool):
                    b.copy_(torch.randint(1, 10_000, b.shape, generator=gen).to(b.dtype))
                elif b.is_floating_point():
                    warnings.warn(f"randomize_: no rule for buffer {full!r}; using 0.2*N(0,1)")
                    b.copy_(0.2 * randn(b))
                else:
                    warnings.warn(f"randomize_: bool buffer {full!r} left unchanged")
    return module
