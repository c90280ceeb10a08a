"""Recording a bundle's stages in either mode (``trace_module``), the mode ``export_bundle(trace=...)``
asks for (``resolve_mode``), and re-recording a loaded bundle's stages against the stored ones
(``verify_traces``).
"""

from __future__ import annotations

import json
from collections import OrderedDict

import torch

from .files import float64_delta
from .run import run_module
from .trace_hooks import STAGES, Hooks
from .trace_modules import trace_modules
from .tracers import TRACERS


def _base(name):
    return name.rsplit("/", 1)[-1].rstrip("0123456789")


# Trace modes: the named tracers of ``TRACERS`` ("named"), or every submodule's output under its
# module path ("modules").
NAMED, MODULES = "named", "modules"
# Metadata key of a bundle's trace mode (written for "modules" only; absent means "named").
TRACE_MODE_KEY = "parity.trace_mode"


def resolve_mode(block, trace):
    """The mode ``export_bundle(trace=...)`` records: ``True`` -> the block's named tracer if
    ``TRACERS`` has one, else "modules"; "named" / "modules" as given; ``False`` -> ``None``."""
    if trace is False or trace is None:
        return None
    if trace is True:
        return NAMED if block in TRACERS else MODULES
    if trace not in (NAMED, MODULES):
        raise ValueError(f"trace={trace!r}: True, False, {NAMED!r} or {MODULES!r}")
    return trace


def trace_module(block, module, inputs, kwargs=None, output_names=None, mode=NAMED):
    """Run ``module`` with stage hooks: ``(outputs, stages)``; ``stages`` is ``None`` when the
    block has no tracer (mode "named"). ``stages`` holds contiguous copies, in forward order.
    ``mode="modules"``: every submodule's output under its module path (``trace_modules``)."""
    if mode == MODULES:
        return trace_modules(module, inputs, kwargs, output_names)
    if mode != NAMED:
        raise ValueError(f"trace mode {mode!r}: {NAMED!r} or {MODULES!r}")
    make = TRACERS.get(block)
    hooks = Hooks()
    finish = make(module, hooks) if make is not None else None
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        hooks.remove()
    if finish is None:
        return outs, None
    got = finish(hooks.got)
    unknown = sorted(k for k in got if _base(k) not in STAGES or k == "output")
    if unknown:
        raise KeyError(f"{block}: stages {unknown} are not stage names ({sorted(STAGES)})")
    stages = OrderedDict((k, v.detach().cpu().clone().contiguous()) for k, v in got.items())
    return outs, stages


def verify_traces(path, bundle, module, inputs, module64, inputs64, kwargs=None, output_names=None):
    """Re-record a loaded bundle's stages (``parity_bundle.load_bundle``) with the hooks and check
    they are the stored ones bit for bit: the module's stages, and for a half-precision bundle the
    float64 copy's. Every block with a tracer must carry traces."""
    meta = bundle["metadata"]
    mode = meta.get(TRACE_MODE_KEY, NAMED)
    _, stages = trace_module(bundle["block"], module, inputs, kwargs, output_names, mode)
    if stages is None:
        assert "parity.trace" not in meta and not bundle["trace"], f"{path}: unexpected traces"
        return
    want = json.loads(meta.get("parity.trace", "null"))
    assert want == list(stages) + ["output"], f"{path}: parity.trace {want}, hooks give {list(stages)}"
    for n, t in stages.items():
        assert t.dtype == bundle["trace"][n].dtype and torch.equal(t, bundle["trace"][n]), f"{path}: trace {n} differs"
    if meta["parity.dtype"] in ("float16", "bfloat16", "float32"):
        _, stages64 = trace_module(bundle["block"], module64, inputs64, kwargs, output_names, mode)
        assert list(bundle["trace_f64"]) == list(stages64), f"{path}: float64 stages {list(bundle['trace_f64'])}"
        for n, t in stages64.items():
            if meta["parity.dtype"] == "float32":
                stored = bundle["trace"][n]
                want = stored.double() + float64_delta(stored, t).double()
            else:
                want = t.double()
            assert torch.equal(want, bundle["trace_f64"][n]), f"{path}: float64 trace {n} differs"
    else:
        assert not bundle["trace_f64"], f"{path}: float64 stages in a {meta['parity.dtype']} bundle"
