"""``export_bundle``: run a block and write its format-"1" parity bundle (state dict, inputs, PyTorch's
outputs in the block's dtype and in float64, stage traces, metadata). The steps are the helpers
below, in the order ``export_bundle`` calls them.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from .files import DELTA_SUFFIX, FORMAT, float64_delta, library_versions, write_bundle
from .float64 import float64_copy
from .run import cast_inputs, dtype_name, flatten_list_inputs, floating_dtypes, module_dtype, module_in_dtype, run_module
from .tracing import MODULES, TRACE_MODE_KEY, resolve_mode, trace_module


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
    float64_casts: str = "off",
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
        float64_casts: ``"off"`` (default): the float64 copy runs with its in-block float32 casts
            switched off (``parity.float64.float64_copy``; docs/bundle-format.md, "The float64
            twin"); ``"kept"``: a plain ``copy.deepcopy(module).double()``, the published forward's
            ``.float()`` casts left in (what a user who calls ``.double()`` gets). ``check`` confirms
            either convention.
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
    module, dtype, converted = _module_to_run(module, dtype, weights_ref, state_dict)
    module.eval()
    ins = _inputs_to_store(inputs, dtype, input_dtypes)
    outs = _run_in_dtype(module, block, ins, kwargs, output_names, dtype, converted)
    m64 = float64_copy(module, prepare_float64, casts=float64_casts)
    outs64 = run_module(m64, cast_inputs(ins, torch.float64), kwargs, output_names)
    if list(outs64) != list(outs):
        raise RuntimeError(f"float64 run gave outputs {list(outs64)}, expected {list(outs)}")

    tensors = _Tensors()
    _put_weights(tensors, module, state_dict, weights_ref)
    diffs = _put_inputs_and_outputs(tensors, ins, outs, outs64)
    mode = resolve_mode(block, trace) if trace else None
    trace_names = None
    if mode is not None:
        trace_names = _put_traces(tensors, path, block, (module, ins, outs), (m64, outs64), kwargs, output_names,
                                  dtype, mode)

    metadata = _metadata(module, block, config, ins, outs, dtype, kwargs, source, trace_names, mode)
    _add_extra_metadata(metadata, extra_metadata)
    _add_weights_ref(metadata, weights_ref)
    path = os.fspath(path)
    write_bundle(tensors.by_key, metadata, path)
    return {
        "path": path,
        "bytes": os.path.getsize(path),
        "outputs": {k: tuple(v.shape) for k, v in outs.items()},
        "max_abs_diff_f64": diffs,
    }


def _module_to_run(module, dtype, weights_ref, state_dict):
    """``(module, dtype, converted?)``: the module as given in its own dtype, or in ``dtype``
    (``module_in_dtype``); converting is refused where ``weights_ref`` / ``state_dict`` would then
    describe other weights than the ones PyTorch ran."""
    if dtype is None:
        return module, module_dtype(module), False
    held = ", ".join(sorted(dtype_name(d) for d in floating_dtypes(module)))
    module, converted = module_in_dtype(module, dtype)
    if converted and (weights_ref is not None or state_dict is not None):
        raise ValueError(f"dtype={dtype} would convert the module's {held} weights: weights_ref / state_dict "
                         "would then describe other weights than the ones PyTorch ran; convert the module "
                         "yourself (module.to(dtype)) and pass weights that match it")
    return module, dtype, converted


def _inputs_to_store(inputs, dtype, input_dtypes):
    """The inputs as stored and run: list inputs flattened, ``None`` ones dropped, floating ones cast
    to ``dtype`` (or ``input_dtypes[name]``); a non-tensor input is a ``TypeError``."""
    clean = OrderedDict((k, v) for k, v in flatten_list_inputs(inputs).items() if v is not None)
    for name, value in clean.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"input {name!r} is not a tensor; pass non-tensor arguments via kwargs")
    unknown = sorted(set(input_dtypes or {}) - set(clean))
    if unknown:
        raise KeyError(f"input_dtypes names inputs {unknown} that are not among {list(clean)}")
    return cast_inputs(clean, dtype, input_dtypes)


def _run_in_dtype(module, block, ins, kwargs, output_names, dtype, converted):
    """PyTorch's run in the bundle's dtype; a module this function converted that PyTorch then
    refuses to run is a ``RuntimeError`` saying so."""
    try:
        return run_module(module, ins, kwargs, output_names)
    except RuntimeError as e:
        if not converted:
            raise
        raise RuntimeError(f"{block}: PyTorch cannot run this module after module.to({dtype}): "
                           f"{str(e).splitlines()[0]}; convert it yourself, keeping the parts that must stay "
                           "float32 (e.g. convert_convs_to_half_ for guided-diffusion's GroupNorm32), and pass the "
                           "module with dtype=") from e


class _Tensors:
    """The bundle's tensors by key, each a contiguous CPU copy; a key may be put once."""

    def __init__(self):
        self.by_key: dict[str, torch.Tensor] = {}

    def put(self, key: str, t: torch.Tensor) -> None:
        if key in self.by_key:
            raise KeyError(f"duplicate tensor key {key!r}")
        # clone: safetensors refuses tensors sharing storage (e.g. key is value)
        self.by_key[key] = t.detach().cpu().clone().contiguous()


def _put_weights(tensors, module, state_dict, weights_ref) -> None:
    """The state dict (``module.state_dict()`` or the caller's ``state_dict``; none for a referencing
    bundle) under its own keys."""
    sd = module.state_dict() if state_dict is None else state_dict
    if weights_ref is not None:
        if state_dict is not None:
            raise ValueError("weights_ref and state_dict are exclusive")
        sd = {}
    for key, t in sd.items():
        if key.startswith("parity."):
            raise KeyError(f"state-dict key {key!r} collides with the parity namespace")
        tensors.put(key, t)


def _put_inputs_and_outputs(tensors, ins, outs, outs64) -> dict:
    """``parity.input.*``, ``parity.output.*`` and ``parity.output.*.float64``; returns max
    |output - float64 output| per output."""
    for name, t in ins.items():
        tensors.put(f"parity.input.{name}", t)
    diffs = {}
    for name, t in outs.items():
        tensors.put(f"parity.output.{name}", t)
        tensors.put(f"parity.output.{name}.float64", outs64[name])
        d = (t.double() - outs64[name]).abs()
        diffs[name] = float(d.max()) if d.numel() else 0.0
    return diffs


def _put_traces(tensors, path, block, run, run64, kwargs, output_names, dtype, mode):
    """Record the stages of the run ``(module, inputs, outputs)`` and of its float64 copy
    ``(module64, outputs64)`` and put them; returns the stage names with ``output`` last, or
    ``None`` for a block without a tracer (mode "named"). The traced runs must give the untraced
    outputs bit for bit."""
    module, ins, outs = run
    m64, outs64 = run64
    traced, stages = trace_module(block, module, ins, kwargs, output_names, mode)
    for name, t in outs.items():
        if not torch.equal(traced[name], t):
            raise RuntimeError(f"{path}: the traced run changed output {name!r}")
    if stages is None:
        return None
    for name, t in stages.items():
        tensors.put(f"parity.trace.{name}", t)
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        # the float64 copy's stages: the reference a stage is judged by (float32 bundles store
        # them as bfloat16 deltas from the stage, see float64_delta)
        traced64, stages64 = trace_module(block, m64, cast_inputs(ins, torch.float64), kwargs, output_names, mode)
        for name, t in outs64.items():
            if not torch.equal(traced64[name], t):
                raise RuntimeError(f"{path}: the traced float64 run changed output {name!r}")
        if list(stages64) != list(stages):
            raise RuntimeError(f"{path}: float64 stages {list(stages64)} differ from {list(stages)}")
        for name, t in stages64.items():
            if dtype == torch.float32:
                tensors.put(f"parity.trace.{name}{DELTA_SUFFIX}", float64_delta(stages[name], t))
            else:
                tensors.put(f"parity.trace.{name}.float64", t.double())
    return list(stages) + ["output"]


def _metadata(module, block, config, ins, outs, dtype, kwargs, source, trace_names, mode) -> dict:
    """The ``parity.*`` metadata of the bundle (without ``parity.weights*``)."""
    src = library_versions(module)
    if source:
        src = f"{src}; {source}"
    metadata = {
        "parity.format": FORMAT,
        "parity.block": block,
        "parity.config": json.dumps(dict(config)),
        "parity.inputs": json.dumps(list(ins)),
        "parity.outputs": json.dumps(list(outs)),
        "parity.dtype": dtype_name(dtype),
        "parity.source": src,
    }
    if kwargs:
        metadata["parity.kwargs"] = json.dumps(kwargs)
    if trace_names is not None:
        metadata["parity.trace"] = json.dumps(trace_names)
        if mode == MODULES:
            metadata[TRACE_MODE_KEY] = MODULES
    return metadata


def _add_extra_metadata(metadata: dict, extra_metadata) -> None:
    for key, value in (extra_metadata or {}).items():
        if key.startswith("parity.") or not isinstance(value, str):
            raise ValueError(f"extra_metadata {key!r}: keys outside parity.*, string values only")
        metadata[key] = value


def _add_weights_ref(metadata: dict, weights_ref) -> None:
    """``parity.weights``, ``parity.prefix`` and ``parity.weights_key`` of a referencing bundle."""
    if weights_ref is None:
        return
    ref = list(weights_ref)
    if len(ref) not in (2, 3) or not all(isinstance(x, str) for x in ref):
        raise ValueError(f"weights_ref must be (relpath, prefix[, key]), got {weights_ref!r}")
    if os.path.isabs(ref[0]):
        raise ValueError(f"weights_ref path {ref[0]!r} must be relative to the bundle's folder")
    metadata["parity.weights"] = ref[0].replace(os.sep, "/")
    metadata["parity.prefix"] = ref[1]
    if len(ref) == 3:
        metadata["parity.weights_key"] = ref[2]
