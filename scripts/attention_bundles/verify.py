"""Re-checking the attention bundles (``export_reference.py --verify`` / ``--verify-only``): each
block rebuilt from its bundle alone and rerun (``verify_file``), each half-precision twin held
against its float32 bundle (``verify_half_twin``), no stale bundle, the size budget (``verify_all``).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from export.common import MAX_WEIGHTS_BYTES
from parity_bundle import CONVERT_TO_FP16_MARK, convert_convs_to_half_, float64_copy, load_bundle, run_module
from parity_trace import verify_traces

from .blocks import (CONV_SHAPED_DIFFUSERS_KEYS, build_module, cast_module, from_conv_shaped_diffusers_weights,
                     from_legacy_diffusers_keys)
from .common import FAMILIES, REPO, WEIGHTS, short_dtype
from .write import exported_specs


def verify_file(path: Path) -> str:
    """Rebuild the block from the bundle alone (in the stored ``parity.dtype``), rerun it and its
    float64 copy, assert bit-identical outputs; returns "name max|out - out.float64|, ..."."""
    b = load_bundle(path)
    meta = b["metadata"]
    for key in ("parity.format", "parity.block", "parity.config", "parity.inputs", "parity.outputs",
                "parity.dtype", "parity.source"):
        assert key in meta, f"{path}: missing metadata {key}"
    module, sd = _rebuilt_module(path, b)
    for name, t in list(b["inputs"].items()) + list(b["expected"].items()) + list(sd.items()):
        assert t.is_contiguous(), f"{path}: {name} not contiguous"
    inputs = OrderedDict(b["inputs"])
    # inputs stored twice because they were the same object (MHA key is value): rebuild the aliasing
    if "key" in inputs and "value" in inputs and torch.equal(inputs["key"], inputs["value"]):
        inputs["value"] = inputs["key"]
    names = list(b["expected"])
    out_names = ["attn_output", "attn_weights"] if isinstance(module, nn.MultiheadAttention) else None
    got = run_module(module, inputs, b["kwargs"], out_names)
    assert list(got) == names, f"{path}: outputs {list(got)} != stored {names}"
    for n in names:
        assert got[n].dtype == b["expected"][n].dtype and torch.equal(got[n], b["expected"][n]), \
            f"{path}: output {n} differs from the stored one"
    m64 = float64_copy(module)
    in64 = OrderedDict()
    memo = {}
    for k, v in inputs.items():
        if id(v) not in memo:
            memo[id(v)] = v.double() if v.is_floating_point() else v
        in64[k] = memo[id(v)]
    got64 = run_module(m64, in64, b["kwargs"], out_names)
    for n in names:
        assert got64[n].dtype == torch.float64 and torch.equal(got64[n], b["expected_f64"][n]), \
            f"{path}: float64 output {n} differs from the stored one"
    # stage traces: re-recorded with the hooks, bit-identical (and the float64 copy's, half bundles)
    verify_traces(path, b, module, inputs, m64, in64, b["kwargs"], out_names)
    if "output is finite" in meta["parity.source"]:
        assert all(bool(torch.isfinite(t).all()) for t in b["expected"].values()), f"{path}: output not finite"
    diffs = {n: float((b["expected"][n].double() - b["expected_f64"][n]).abs().max()) for n in names}
    return ", ".join(f"{n} {d:.3e}" for n, d in diffs.items())


def _rebuilt_module(path: Path, b: dict):
    """``(module, state dict)``: the block built from the bundle ``b`` alone in its stored dtype (cast
    before loading, so the stored half values load unchanged; guided-diffusion's half form rebuilt
    with ``convert_convs_to_half_``), the stored weights loaded, every stored tensor's dtype checked
    against the dtype PyTorch holds it in."""
    meta = b["metadata"]
    sd = b["state_dict"]
    if b["block"] == "diffusers.Attention" and any(k.startswith("query.") for k in sd):
        sd = from_legacy_diffusers_keys(sd)
    if b["block"] == "diffusers.Attention" and any(k in CONV_SHAPED_DIFFUSERS_KEYS and v.dim() == 4 for k, v in sd.items()):
        sd = from_conv_shaped_diffusers_weights(sd)
    want_dtype = getattr(torch, meta["parity.dtype"])
    module = build_module(b["block"], b["config"], sd.keys(), meta["parity.source"])
    # a half-precision bundle: cast first, so load_state_dict copies the stored values unchanged
    mixed = CONVERT_TO_FP16_MARK in meta["parity.source"]
    if mixed:
        assert want_dtype in (torch.float16, torch.bfloat16), f"{path}: {CONVERT_TO_FP16_MARK} of {want_dtype}"
        convert_convs_to_half_(module, want_dtype)
    else:
        cast_module(module, want_dtype)
    held = {k: v.dtype for k, v in module.state_dict().items()}
    missing, unexpected = module.load_state_dict(sd, strict=True)
    module.eval()
    if mixed:
        # exactly the dtypes PyTorch held: conv parameters half, the rest float32, x half
        for name, t in sd.items():
            assert t.dtype == held[name], f"{path}: {name} is {t.dtype}, PyTorch holds it in {held[name]}"
        assert {held[k] for k in held} == {want_dtype, torch.float32}, f"{path}: not a mixed-dtype module"
        for name, t in list(b["inputs"].items()) + list(b["expected"].items()):
            assert t.dtype == want_dtype, f"{path}: {name} is {t.dtype}, not {want_dtype}"
    else:
        assert all(p.dtype == want_dtype for p in module.parameters()), f"{path}: dtype mismatch"
    if want_dtype != torch.float32 and not mixed:
        for name, t in list(sd.items()) + list(b["inputs"].items()) + list(b["expected"].items()):
            assert not t.is_floating_point() or t.dtype == want_dtype, f"{path}: {name} is {t.dtype}, not {want_dtype}"
    return module, sd


def verify_half_twin(path: Path, f32_path: Path) -> None:
    """A half-precision twin holds exactly its float32 bundle's block, config, kwargs, state dict and
    inputs, floating tensors rounded to its dtype (bool / integer ones unchanged); an input the twin
    leaves out (the no-mask substitute) is allowed, an extra one is not."""
    h, f = load_bundle(path), load_bundle(f32_path)
    dtype = getattr(torch, h["metadata"]["parity.dtype"])
    assert dtype in (torch.float16, torch.bfloat16), f"{path}: parity.dtype {dtype}"
    assert f["metadata"]["parity.dtype"] == "float32", f"{f32_path}: not a float32 bundle"
    assert (h["block"], h["config"], h["kwargs"]) == (f["block"], f["config"], f["kwargs"]), \
        f"{path}: block/config/kwargs differ from {f32_path}"
    # (sorted: safetensors orders the tensors of a mixed-dtype file by dtype first)
    assert sorted(h["state_dict"]) == sorted(f["state_dict"]), f"{path}: state-dict keys differ from {f32_path}"
    assert set(h["inputs"]) <= set(f["inputs"]), f"{path}: inputs not a subset of {f32_path}'s"
    mixed = CONVERT_TO_FP16_MARK in h["metadata"]["parity.source"]
    if mixed:
        # the dtype each weight has after guided-diffusion's conversion of the float32 block
        module = build_module(f["block"], f["config"], f["state_dict"].keys(), f["metadata"]["parity.source"])
        held = {k: v.dtype for k, v in convert_convs_to_half_(module, dtype).state_dict().items()}
    pairs = [(k, h["state_dict"][k], v) for k, v in f["state_dict"].items()]
    pairs += [(k, v, f["inputs"][k]) for k, v in h["inputs"].items()]
    for k, half, full in pairs:
        to = held.get(k, dtype) if mixed else dtype
        want = full.to(to) if full.is_floating_point() else full
        assert half.dtype == want.dtype and torch.equal(half, want), f"{path}: {k} is not {f32_path}'s cast to {dtype}"


def verify_all(specs, whole=True):
    """Re-check every spec's bundle on disk; with ``whole`` (every spec, not a subset) also fail
    on bundles no spec writes."""
    specs = exported_specs(specs)
    paths = [WEIGHTS / s["path"] for s in specs]
    on_disk = sorted(p for fam in FAMILIES for p in (WEIGHTS / fam).glob("*.safetensors"))
    extra = sorted(set(on_disk) - set(paths))
    assert not (whole and extra), f"stale bundles on disk: {extra}"
    for spec, p in zip(specs, paths):
        diffs = verify_file(p)
        twin = ""
        if spec.get("f32_twin"):
            verify_half_twin(p, WEIGHTS / spec["f32_twin"])
            what = "Conv1d weights/biases and x" if spec.get("convert_to_fp16") else "weights and inputs"
            twin = f", same weights and inputs as weights/{spec['f32_twin']}, {what} rounded to {spec['dtype']}"
        short = short_dtype(getattr(torch, spec.get("dtype", "float32")))
        print(f"verified {p.relative_to(REPO)}: rebuilt from metadata, outputs bit-identical{twin} "
              f"(max|{short}-f64| {diffs})")
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    print(f"verified {len(paths)} bundles; weights/ holds {total} bytes")
    assert total < MAX_WEIGHTS_BYTES, f"weights/ exceeds {MAX_WEIGHTS_BYTES} bytes"
