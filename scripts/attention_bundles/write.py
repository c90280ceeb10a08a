"""Writing the attention bundles (``export_all``): every spec's module randomized with its seed and
cast to its dtype, exported with ``export_bundle``, one line printed per bundle (and one
``skipped`` line per half-precision twin PyTorch cannot run).
"""

from __future__ import annotations

import json
from collections import OrderedDict

import torch

from parity.run import cast_inputs, flatten_list_inputs
from parity_bundle import convert_convs_to_half_, export_bundle, float64_copy, randomize_, run_module
from parity_trace import TRACERS

from .blocks import build_module, cast_module, to_conv_shaped_diffusers_weights, to_legacy_diffusers_keys
from .common import FAMILIES, WEIGHTS, short_dtype


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


def export_all(specs, delete_owned=True):
    """Delete the owned bundles (unless ``delete_owned`` is false: a subset rewrites only its own
    files), then write every spec's bundle; returns ``export_bundle``'s results."""
    if delete_owned:
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
            _still_rejected(spec, module, inputs, dtype)
            continue
        source = spec["source"]
        if spec.get("large_activations"):
            source += _finite_note(spec, module, inputs, dtype)
        sd = to_legacy_diffusers_keys(module.state_dict()) if spec.get("legacy_keys") else None
        if spec.get("conv_weights"):
            sd = to_conv_shaped_diffusers_weights(module.state_dict())
        info = export_bundle(module, spec["block"], spec["config"], inputs, WEIGHTS / spec["path"],
                             kwargs=spec["kwargs"], source=source, state_dict=sd, dtype=dtype,
                             trace=traced_spec(spec))
        print(_wrote_line(spec, info, inputs, dtype))
        results.append(info)
    total = sum(r["bytes"] for r in results)
    print(f"{len(results)} bundles, {total} bytes in total")
    return results


def _still_rejected(spec, module, inputs, dtype) -> None:
    """A twin in ``HALF_REJECTED``: print its ``skipped`` line if PyTorch still refuses to run it,
    fail if it now runs."""
    try:
        run_module(module, cast_inputs(flatten_list_inputs(inputs), dtype), spec["kwargs"])
    except RuntimeError as e:
        print(f"skipped weights/{spec['path']} as module.to({spec['dtype']}): PyTorch rejects it "
              f"({str(e).splitlines()[0]}): "
              f"{spec['rejected']}")
        return
    raise RuntimeError(f"{spec['path']}: PyTorch now runs this half-precision twin; move it from "
                       f"HALF_REJECTED to HALF_FROM")


def _finite_note(spec, module, inputs, dtype) -> str:
    """The ``parity.source`` note of a large-activation bundle: whether PyTorch's own half-precision
    output is finite (if not, the float64 one must be)."""
    own = run_module(module, cast_inputs(flatten_list_inputs(inputs), dtype), spec["kwargs"])
    if all(bool(torch.isfinite(t).all()) for t in own.values()):
        return f"; PyTorch's own {spec['dtype']} output is finite"
    own64 = run_module(float64_copy(module),
                       cast_inputs(cast_inputs(flatten_list_inputs(inputs), dtype), torch.float64),
                       spec["kwargs"])
    assert all(bool(torch.isfinite(t).all()) for t in own64.values()), \
        f"{spec['path']}: the float64 output is not finite either"
    return (f"; PyTorch's own {spec['dtype']} output overflows (non-finite entries); only the "
            ".float64 outputs are a reference")


def _wrote_line(spec, info, inputs, dtype) -> str:
    """The line printed for a written bundle: path, size, block id, dtype, config, inputs and
    PyTorch's own error."""
    diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
    flat = OrderedDict()
    for k, v in inputs.items():
        for i, item in enumerate(v) if isinstance(v, (list, tuple)) else [(None, v)]:
            flat[k if i is None else f"{k}.{i}"] = item
    stored = cast_inputs(OrderedDict((k, v) for k, v in flat.items() if v is not None), dtype)
    ins = ", ".join(f"{k}{tuple(v.shape)}{'' if v.dtype == dtype else ':' + str(v.dtype).replace('torch.', '')}"
                    for k, v in stored.items())
    tag = "" if dtype == torch.float32 else f" [{spec['dtype']}{', convert_to_fp16 form' if spec.get('convert_to_fp16') else ''}]"
    return (f"wrote weights/{spec['path']} ({info['bytes']} B) {spec['block']}{tag} {json.dumps(spec['config'])} "
            f"inputs [{ins}] max|{short_dtype(dtype)}-f64| {diffs}")
