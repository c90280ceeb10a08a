"""Writing the bundles of the collected specs: the block rebuilt from block id + config (+ the
referenced checkpoint) must reproduce the whole model's block bit for bit; float16 / bfloat16
twins (guided-diffusion's ``convert_to_fp16`` form for ``openai.MiddleBlock``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from parity_bundle import (CONVERT_TO_FP16_MARK, convert_convs_to_half_, export_bundle, load_checkpoint_state_dict,
                           run_module)
from .blocks import build_module
from .builders import MODEL_BUILDERS
from .common import _diffusers_quiet, Ctx, HALF_DTYPES, MID, MODELS, WEIGHTS


def cast_module(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    if dtype != torch.float32:
        module.to(dtype)
    return module


def block_module(spec, dtype=torch.float32):
    """The block rebuilt from block id + config, loaded with the spec's weights (its own state, or
    the referenced checkpoint file read back from disk), cast to ``dtype``."""
    module = build_module(spec["block"], spec["config"])
    if spec["state"] is not None:
        state = spec["state"]
    else:
        rel, prefix, *key = spec["ref"]
        ckpt = load_checkpoint_state_dict(WEIGHTS / rel, key[0] if key else None)
        state = OrderedDict((k, ckpt[prefix + k]) for k in module.state_dict())
    cast_module(module, dtype)
    module.load_state_dict(state, strict=True)
    return module.eval()


def _checkpoint_dtypes(spec):
    """The dtypes of the floating tensors a referencing spec's block reads from its checkpoint."""
    rel, prefix, *key = spec["ref"]
    ckpt = load_checkpoint_state_dict(WEIGHTS / rel, key[0] if key else None)
    return {v.dtype for k, v in ckpt.items() if k.startswith(prefix) and v.is_floating_point()}


def _short(dtype):
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]


def half_twin_source(stem, dtype):
    return (f"{dtype} twin of weights/mid/{stem}.safetensors: same weights and inputs, module.to({dtype}), float "
            f"inputs cast to {dtype}, run by PyTorch on CPU in {dtype}; .float64 outputs from the float64 copy of the "
            f"{dtype}-rounded weights and inputs")


def convert_to_fp16_twin_source(stem, dtype):
    return (f"{dtype} twin of weights/mid/{stem}.safetensors in the {CONVERT_TO_FP16_MARK}: same weights and inputs; "
            f"as guided-diffusion's UNetModel.convert_to_fp16() (fp16_util.convert_module_to_f16 applied to "
            f"middle_block) only the Conv1d/Conv2d weights and biases are cast to {dtype}, the GroupNorm32 weights "
            f"and biases and the emb_layers Linear stay float32 (stored float32); x cast to {dtype} "
            f"(UNetModel.forward's h = x.type(self.dtype)), emb float32 (time_embed is not converted); run by PyTorch "
            f"on CPU; .float64 outputs from the float64 copy of that mixed-dtype module on x and emb upcast"
            + ("" if dtype == "float16" else "; guided-diffusion has no bfloat16 mode: the same conversion with "
               "bfloat16"))


def half_twin(spec, dtype):
    """(module, export_bundle keyword arguments) of the spec's half-precision twin: ``module.to(dtype)``;
    for an ``openai.MiddleBlock`` with an ``AttentionBlock`` guided-diffusion's ``convert_to_fp16`` form
    (``module.to(dtype)`` fails there: GroupNorm32 with a half weight); ``None`` for an
    ``openai.MiddleBlock`` with a ``SpatialTransformer``: ldm's ``openaimodel.py`` has no half form of
    its own (its ``convert_module_to_f16`` is a no-op) and ``module.to(dtype)`` fails the same way."""
    stem = Path(spec["path"]).stem
    if spec["block"] != "openai.MiddleBlock":
        return block_module(spec, dtype), dict(source=f"{spec['source']}; {half_twin_source(stem, str(dtype)[6:])}")
    if spec["config"].get("use_spatial_transformer"):
        return None
    module = convert_convs_to_half_(block_module(spec), dtype)
    return module, dict(source=f"{spec['source']}; {convert_to_fp16_twin_source(stem, str(dtype)[6:])}",
                        dtype=dtype, input_dtypes={"emb": torch.float32})


def export_all(ctx: Ctx, only=None):
    """Write every model and bundle (``only``: the named builders' files, leaving the rest as they are)."""
    MID.mkdir(parents=True, exist_ok=True)
    if only is None:
        for f in sorted(MID.glob("*.safetensors")):
            f.unlink()
        if MODELS.exists():
            shutil.rmtree(MODELS)
    MODELS.mkdir(parents=True, exist_ok=True)
    _diffusers_quiet()
    for builder in MODEL_BUILDERS:
        if only is None or builder.__name__ in only:
            builder(ctx)
    for f in ctx.files:
        print(f"wrote weights/{f.relative_to(WEIGHTS).as_posix()} ({f.stat().st_size} B)")
    results = []
    for spec in ctx.specs:
        module = block_module(spec)
        # the block rebuilt from block id + config + weights (for a referencing bundle: read back from
        # the checkpoint file) reproduces the whole model's block exactly on the same input tensors
        # (a tuple ``expected``: every output of a block with several, in order)
        expected = spec["expected"] if isinstance(spec["expected"], tuple) else (spec["expected"],)
        got = list(run_module(module, spec["raw_inputs"], spec["kwargs"]).values())
        assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected)), \
            f"{spec['path']}: the block rebuilt from config + weights differs from the whole model's mid block"
        strided = [k for k, v in spec["raw_inputs"].items() if not v.is_contiguous()]
        if strided:
            # the bundle stores contiguous copies; PyTorch's output on them is the bundle's output
            got_c = list(run_module(module, spec["inputs"], spec["kwargs"]).values())
            d = max(float((a - b).abs().max()) for a, b in zip(got_c, expected))
            spec["source"] += (f"; the whole model passed {', '.join(strided)} non-contiguous (strides "
                               f"{', '.join(str(spec['raw_inputs'][k].stride()) for k in strided)}); stored contiguous, "
                               f"and PyTorch's output on the contiguous copy (stored) differs from the in-model output by "
                               f"max {d:.3e}" + (" (bit-identical)" if d == 0 else " (layout-dependent rounding)"))
        ref = None
        if spec["ref"] is not None:
            rel, prefix, *key = spec["ref"]
            relp = os.path.relpath(WEIGHTS / rel, (WEIGHTS / spec["path"]).parent)
            ref = (relp, prefix, *key)
        info = export_bundle(module, spec["block"], spec["config"], spec["inputs"], WEIGHTS / spec["path"],
                             kwargs=spec["kwargs"], source=spec["source"], weights_ref=ref, trace=True)
        results.append(info)
        print(describe(spec, info, torch.float32))
        if spec["half"]:
            stem = Path(spec["path"]).stem
            for dname, suffix in HALF_DTYPES:
                dtype = getattr(torch, dname)
                hpath = WEIGHTS / f"mid/{stem}_{suffix}.safetensors"
                twin = half_twin(spec, dtype)
                if twin is None:
                    try:
                        run_module(block_module(spec, dtype), OrderedDict(
                            (k, v.to(dtype) if v.is_floating_point() else v) for k, v in spec["inputs"].items()),
                            spec["kwargs"])
                    except RuntimeError as e:
                        print(f"skipped weights/mid/{stem}_{suffix}.safetensors: PyTorch rejects module.to({dname}) "
                              f"({str(e).splitlines()[0]}): GroupNorm32 runs super().forward(x.float()) with the half "
                              "GroupNorm weight; ldm openaimodel.py's convert_module_to_f16 is a no-op, so SD's "
                              "UNetModel has no half-precision form of its own")
                        continue
                    raise RuntimeError(f"{hpath}: PyTorch now runs module.to({dname}) of this block")
                hmod, extra = twin
                # the twin of a referencing bundle in the dtype its checkpoint holds (a float16 checkpoint's
                # f16 twin) references it too: the same weights, no conversion. (Any other twin holds its weights:
                # a converted reference would differ where a block keeps a parameter in f32, e.g. GroupNorm's.)
                twin_ref = ref if ref is not None and _checkpoint_dtypes(spec) == {dtype} else None
                hinfo = export_bundle(hmod, spec["block"], spec["config"], spec["inputs"], hpath,
                                      kwargs=spec["kwargs"], trace=True, weights_ref=twin_ref, **extra)
                results.append(hinfo)
                print(describe(dict(spec, path=f"mid/{stem}_{suffix}.safetensors"), hinfo, dtype,
                               mixed="input_dtypes" in extra))
    total = sum(r["bytes"] for r in results) + sum(f.stat().st_size for f in ctx.files)
    print(f"{len(results)} bundles and {len(ctx.files)} checkpoint files, {total} bytes in total")


def describe(spec, info, dtype, mixed=False):
    ins = ", ".join(f"{k}{tuple(v.shape)}{':float32' if mixed and k == 'emb' else ''}"
                    for k, v in spec["inputs"].items())
    ref = ""
    if spec["ref"] is not None:
        rel, prefix, *key = spec["ref"]
        ref = f" weights=weights/{rel} prefix={prefix!r}" + (f" key={key[0]!r}" if key else "")
    diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
    tag = "" if dtype == torch.float32 else f" [{str(dtype).replace('torch.', '')}{', convert_to_fp16 form' if mixed else ''}]"
    return (f"wrote weights/{spec['path']} ({info['bytes']} B) {spec['block']}{tag} {json.dumps(spec['config'])} "
            f"inputs [{ins}]{ref} max|{_short(dtype)}-f64| {diffs}")
