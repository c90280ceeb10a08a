#!/usr/bin/env python3
"""Add the float64 run's stages to committed float32 bundles that lack them, leaving every other
tensor and the metadata as they are.

    python scripts/add_trace_twins.py [BUNDLE ...]     # default: every float32 bundle under weights/

Each bundle is first rebuilt from its metadata and verified by its exporter's own check
(``export_models.verify_bundle``, in ``scripts/export/verify.py``, for ``weights/mid``, ``weights/accuracy`` and ``weights/own``,
``export_reference.verify_file``, in ``scripts/attention_bundles/verify.py``, for the family folders): outputs, float64 outputs and stages
bit-identical to the stored ones. The float64 copy the check builds is then run with the stage
hooks, and its stages are stored as ``parity.trace.<stage>.float64_delta``
(``parity_trace.float64_delta``: bfloat16 deltas from the float32 stage). The rewritten file is
read back: every tensor it held before is there, bit for bit, the metadata is unchanged, and each
float32 stage is within rounding of its float64 twin (the bound ``check_reference`` puts on outputs).

PyTorch's results depend on the CPU's kernels: bundles exported on another CPU do not rerun
bit-identically everywhere. The check then sees the stored outputs (``float32_as_stored``), prints
the difference, and requires the float64 run to agree to 1e-10 of the output's scale; the float64
stages are computed from the stored weights and inputs, so they do not depend on where the float32
run was made.
"""

import argparse
import os
import sys
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from attention_bundles import verify as attention_verify  # noqa: E402
from attention_bundles.common import FAMILIES  # noqa: E402
from export import verify as export_verify  # noqa: E402
from parity.files import canonicalize_header  # noqa: E402
from parity_trace import DELTA_SUFFIX, NAMED, TRACE_MODE_KEY, float64_delta, trace_module  # noqa: E402

WEIGHTS = HERE.parent / "weights"


def verifier(path: Path):
    """The exporter module and check function that own ``path``."""
    family = path.relative_to(WEIGHTS).parts[0]
    if family in ("mid", "accuracy", "own"):
        # the module whose globals (verify_traces, run_module) verify_bundle calls
        return export_verify, export_verify.verify_bundle
    if family in FAMILIES:
        return attention_verify, attention_verify.verify_file
    raise SystemExit(f"{path}: no exporter owns weights/{family}")


def float64_stages(path: Path) -> dict:
    """Verify ``path`` with its exporter's check, capturing the float64 copy's stages as deltas."""
    owner, check = verifier(path)
    got = {}
    original = owner.verify_traces

    def capture(p, bundle, module, inputs, module64, inputs64, kwargs=None, output_names=None):
        mode = bundle["metadata"].get(TRACE_MODE_KEY, NAMED)
        _, stages = trace_module(bundle["block"], module, inputs, kwargs, output_names, mode)
        assert stages is not None and list(stages) == list(bundle["trace"]), f"{p}: stages {list(stages or [])}"
        _, stages64 = trace_module(bundle["block"], module64, inputs64, kwargs, output_names, mode)
        assert list(stages64) == list(stages), f"{p}: float64 stages {list(stages64)}"
        stored = bundle["trace"]
        got.update((n, float64_delta(stored[n], t)) for n, t in stages64.items())

    owner.verify_traces = capture
    try:
        with float32_as_stored(owner, path):
            check(path)
    finally:
        owner.verify_traces = original
    return got


@contextmanager
def float32_as_stored(owner, path: Path):
    """PyTorch's results depend on the CPU's kernels (and, in float64, on summation order at the
    1e-16 level): a bundle exported on another CPU may not rerun bit-identically here. Within this
    block the exporter's check sees the stored outputs, the difference this CPU makes is printed,
    and a float64 difference beyond rounding (1e-10 of the output's scale) is an error."""
    from parity_bundle import load_bundle

    run = owner.run_module
    b = load_bundle(path)

    def as_stored(module, inputs, kwargs=None, output_names=None):
        out = run(module, inputs, kwargs, output_names)
        f64 = any(t.dtype == torch.float64 for t in out.values())
        stored = b["expected_f64"] if f64 else b["expected"]
        if list(out) != list(stored):
            return out
        for n, t in out.items():
            if not torch.equal(t, stored[n]):
                d = float((t.double() - stored[n].double()).abs().max())
                scale = max(1.0, float(stored[n].double().abs().max()))
                assert not f64 or d <= 1e-10 * scale, f"{path}: float64 output {n} differs by {d:.2e}"
                print(f"  {path.relative_to(WEIGHTS)}: this CPU's {t.dtype} output {n} differs from the stored "
                      f"one by up to {d:.2e} (exported on another CPU)")
        return OrderedDict((n, stored[n]) for n in out)

    owner.run_module = as_stored
    try:
        yield
    finally:
        owner.run_module = run


def add_twins(path: Path) -> int:
    """Add the deltas to ``path``; the bytes added."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if meta.get("parity.dtype") != "float32" or "parity.trace" not in meta:
        return 0
    before = load_file(str(path))
    if any(k.endswith(DELTA_SUFFIX) for k in before):
        return 0
    deltas = float64_stages(path)
    size = path.stat().st_size
    tensors = dict(before)
    for n, d in deltas.items():
        tensors[f"parity.trace.{n}{DELTA_SUFFIX}"] = d
    save_file(tensors, str(path), metadata=meta)
    canonicalize_header(str(path))
    after = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        assert dict(f.metadata() or {}) == meta, f"{path}: metadata changed"
    for k, t in before.items():
        assert after[k].dtype == t.dtype and torch.equal(after[k], t), f"{path}: tensor {k} changed"
    assert set(after) - set(before) == {f"parity.trace.{n}{DELTA_SUFFIX}" for n in deltas}, path
    from parity_bundle import load_bundle

    b = load_bundle(path)
    assert list(b["trace_f64"]) == list(b["trace"]), f"{path}: float64 stages {list(b['trace_f64'])}"
    for n, t in b["trace"].items():
        # the same computation: PyTorch's float32 stage within rounding of the float64 one
        scale = max(1.0, float(t.double().abs().max()))
        err = float((b["trace_f64"][n] - t.double()).abs().max())
        assert err <= 100 * 1.3e-6 * scale, f"{path}: stage {n}: float32 and float64 differ by {err:.2e}"
    return path.stat().st_size - size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="*", type=Path)
    args = ap.parse_args(argv)
    # as the exporters ran: one thread, deterministic kernels
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    paths = [p.resolve() for p in args.bundles] or sorted(
        p for p in WEIGHTS.rglob("*.safetensors") if p.relative_to(WEIGHTS).parts[0] != "models")
    total = 0
    for p in paths:
        added = add_twins(p)
        total += added
        print(f"{p.relative_to(WEIGHTS)}: +{added} bytes", flush=True)
    print(f"added {total} bytes to {len(paths)} bundles")


if __name__ == "__main__":
    main(os.sys.argv[1:])
