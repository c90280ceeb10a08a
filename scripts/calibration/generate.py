"""One calibration bundle per index: the recipe (template, dtype, condition) drawn from the index's
own random stream, the block randomized and run, the bundle written with ``export_bundle``, the
planted bugs' outputs written beside it, one manifest line appended.

Everything about bundle ``i`` comes from ``random.Random(f"{seed}/{i}")``, so a bundle does not
depend on which other bundles were made, in which process or order (``--shard``, resuming).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import time
from collections import OrderedDict
from pathlib import Path

import torch

from attention_bundles.blocks import cast_module
from parity.export import _inputs_to_store
from parity.float64 import float64_copy
from parity.run import cast_inputs, run_module
from parity_bundle import convert_convs_to_half_, export_bundle, randomize_

from .bugs import run_bugs
from .inputs import (apply_offset, apply_outlier, candidate_plans, elements, large_masks, make_inputs, mask_inputs,
                     mean_shift, near_constant, scale_channels, shrink)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# normal: the exporters' weights and inputs; outlier: massive activations (a few elements or one
# channel at 1e2-1e4 std); ill: weights x 3-10 or an input offset of +-10-100; heavy: Student-t
# weights (2.5-5 degrees of freedom, same std); wscale: weights x 0.05-20 (log-uniform); mean50:
# an input mean of +-30-70; flat: near-constant inputs; channels: 1-3 input channels x 100-1000;
# long: 200-600 positions; masks: additive masks redrawn with large finite values (templates
# without one fall back to normal).
CONDITIONS = (("normal", 0.30), ("outlier", 0.12), ("ill", 0.12), ("heavy", 0.10), ("wscale", 0.10),
              ("mean50", 0.06), ("flat", 0.06), ("channels", 0.06), ("long", 0.05), ("masks", 0.03))
# the conditions of the calibration before 2026-12 (--conditions classic)
CLASSIC_CONDITIONS = (("normal", 0.5), ("outlier", 0.25), ("ill", 0.25))
ATTEMPTS = 3
# the share of bundles whose float64 twin keeps the published forward's float32 casts (plain .double())
TWIN_CASTS_KEPT = 0.25


def bundle_id(index: int) -> str:
    return f"c{index:05d}"


def pick(rng, weighted):
    r, acc = rng.random(), 0.0
    for value, w in weighted:
        acc += w
        if r < acc:
            return value
    return weighted[-1][0]


def recipe(templates, seed: int, index: int, conditions=CONDITIONS) -> dict:
    """The index's template (a block id uniformly, then one of its templates), dtype (float32 half
    the time, float16 / bfloat16 a quarter each where the block has a half form), condition and
    seed."""
    rng = random.Random(f"{seed}/{index}")
    blocks = sorted({t.block for t in templates})
    block = rng.choice(blocks)
    template = rng.choice([t for t in templates if t.block == block])
    dtype = pick(rng, (("float32", 0.5), ("float16", 0.25), ("bfloat16", 0.25)))
    if template.half is None:
        dtype = "float32"
    condition = pick(rng, conditions)
    return dict(template=template, dtype=dtype, condition=condition, seed=rng.randrange(2 ** 31), rng=rng)


def in_dtype(module32, template, dtype):
    """A copy of the float32 module as PyTorch runs it in ``dtype`` (``module.to`` or guided-diffusion's
    ``convert_to_fp16`` form) and the ``input_dtypes`` for ``export_bundle``."""
    m = copy.deepcopy(module32)
    if dtype == torch.float32:
        return m.eval(), None
    if template.half == "convert":
        return convert_convs_to_half_(m, dtype).eval(), template.half_input_dtypes
    return cast_module(m, dtype).eval(), None


def _run(module, template, inputs, dtype, input_dtypes):
    return run_module(module, _inputs_to_store(inputs, dtype, input_dtypes), template.kwargs)


def _finite(outs) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in outs.values() if t.is_floating_point())


def resolve_shapes(template, module32, dtype, rng, seed, max_elements, long=False):
    """(plan, inputs, module in dtype, input dtypes, outputs): the first candidate plan the block runs
    on (shrunk while its outputs exceed ``max_elements``)."""
    module, input_dtypes = in_dtype(module32, template, dtype)
    last = None
    for plan in candidate_plans(template, rng, max_elements, long=long):
        while plan is not None:
            inputs = make_inputs(template, plan, torch.Generator().manual_seed(seed + 1))
            try:
                outs = _run(module, template, inputs, dtype, input_dtypes)
            except Exception as e:  # the block refuses this size: next plan
                last = e
                break
            if elements(outs) <= max_elements:
                return plan, inputs, module, input_dtypes, outs
            plan = shrink(plan)
    raise RuntimeError(f"no input size runs: {type(last).__name__}: {str(last).splitlines()[0] if last else ''}")


def scale_weights_(module, factor):
    """Every floating parameter with two or more dims (linear / conv / projection weights) x factor."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.dim() >= 2:
                p.mul_(factor)
    return module


def student_t_weights_(module, seed, df):
    """Every floating parameter with two or more dims redrawn from a Student-t distribution with
    ``df`` degrees of freedom, scaled to the parameter's own standard deviation (heavy-tailed weights:
    a few entries many std out)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.dim() >= 2 and p.numel() > 1:
                std = float(p.double().std()) or 1.0
                t = torch.from_numpy(rng.standard_t(df, size=tuple(p.shape)))
                p.copy_((t / float(t.std()) * std).to(p.dtype))
    return module


def _weights_condition(r, template, module32, inputs, dtype, change, describe):
    """Rebuild the module in ``dtype`` from a float32 copy changed by ``change(copy, attempt)``, weakened
    over the attempts until PyTorch's output is finite."""
    for attempt in range(ATTEMPTS):
        m32 = change(copy.deepcopy(module32), attempt)
        m, idt = in_dtype(m32, template, dtype)
        outs = _run(m, template, inputs, dtype, idt)
        if _finite(outs):
            return m, inputs, outs, describe(attempt), idt
    return None


def _inputs_condition(module, template, inputs, dtype, input_dtypes, attempts):
    """The first of ``attempts`` (callables giving ``(inputs, description)``) whose outputs are finite."""
    for make in attempts:
        new, what = make()
        outs = _run(module, template, new, dtype, input_dtypes)
        if _finite(outs):
            return module, new, outs, what, input_dtypes
    return None


def apply_condition(r, template, module32, inputs, dtype, module, input_dtypes, outs):
    """(module, inputs, outputs, detail, input dtypes) under the recipe's condition, weakened until
    PyTorch's output in ``dtype`` is finite; ``None`` if it never is."""
    rng, cond = r["rng"], r["condition"]
    gen = torch.Generator().manual_seed(r["seed"] + 2)
    if cond in ("normal", "long") or (cond == "masks" and not mask_inputs(inputs)):
        return (module, inputs, outs, "", input_dtypes) if _finite(outs) else None
    if cond == "outlier":
        strengths = [10 ** rng.uniform(2, 4)]
        strengths += [strengths[0] / 10, strengths[0] / 100]
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda s=s: apply_outlier(template, inputs, rng, gen, s) for s in strengths])
    if cond == "ill" and rng.random() < 0.5:
        factor = rng.uniform(3, 10)
        f = lambda a: 1 + (factor - 1) / 3 ** a  # noqa: E731
        return _weights_condition(r, template, module32, inputs, dtype, lambda m, a: scale_weights_(m, f(a)),
                                  lambda a: f"weights (>= 2-D) x {f(a):.3g}")
    if cond == "ill":
        offset = rng.choice([-1, 1]) * 10 ** rng.uniform(1, 2)
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda o=offset / 4 ** a: apply_offset(template, inputs, o) for a in range(ATTEMPTS)])
    if cond == "wscale":
        factor = 10 ** rng.uniform(math.log10(0.05), math.log10(20))
        f = lambda a: factor ** (1 / 2 ** a)  # noqa: E731
        return _weights_condition(r, template, module32, inputs, dtype, lambda m, a: scale_weights_(m, f(a)),
                                  lambda a: f"weights (>= 2-D) x {f(a):.3g}")
    if cond == "heavy":
        df = rng.choice([2.5, 3.0, 4.0, 5.0])
        return _weights_condition(r, template, module32, inputs, dtype,
                                  lambda m, a: student_t_weights_(m, r["seed"] + 3 + a, df + 3 * a),
                                  lambda a: f"weights (>= 2-D) Student-t, {df + 3 * a:g} degrees of freedom")
    if cond == "mean50":
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda: mean_shift(template, inputs, rng, gen)] * ATTEMPTS)
    if cond == "flat":
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda: near_constant(template, inputs, rng, gen)] * ATTEMPTS)
    if cond == "channels":
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda: scale_channels(template, inputs, rng, gen)] * ATTEMPTS)
    if cond == "masks":
        return _inputs_condition(module, template, inputs, dtype, input_dtypes,
                                 [lambda: large_masks(template, inputs, rng, gen, dtype)] * ATTEMPTS)
    raise ValueError(f"unknown condition {cond!r}")


def write_bugs(path, found) -> list:
    from safetensors.torch import save_file

    tensors = OrderedDict()
    for bug, outs in found.items():
        for name, t in outs.items():
            tensors[f"{bug}/{name}"] = t.detach().contiguous().clone()
    save_file(tensors, str(path), metadata={"bugs": json.dumps(list(found))})
    return list(found)


def generate_one(out_dir: Path, templates, seed: int, index: int, max_elements: int,
                 conditions=CONDITIONS) -> dict:
    """Write bundle ``index`` and its bugs file; returns its manifest entry."""
    t0 = time.perf_counter()
    r = recipe(templates, seed, index, conditions)
    template, dtype = r["template"], DTYPES[r["dtype"]]
    if template.kwargs and "timestep" in template.kwargs:
        # a whole U-Net: a timestep of its own
        template = dataclasses.replace(template, kwargs={**template.kwargs,
                                                          "timestep": round(r["rng"].uniform(0, 999), 2)})
    bid = bundle_id(index)
    entry = OrderedDict(id=bid, block=template.block, template=template.name, dtype=r["dtype"], seed=r["seed"],
                        condition=r["condition"], half="calibrate" if index % 2 == 0 else "validate")
    module32 = template.build()
    if template.trained is None:
        randomize_(module32, r["seed"])
    module32.eval()
    plan, inputs, module, input_dtypes, outs = resolve_shapes(template, module32, dtype, r["rng"], r["seed"],
                                                              max_elements, long=r["condition"] == "long")
    done = apply_condition(r, template, module32, inputs, dtype, module, input_dtypes, outs)
    if done is None:
        entry["skipped"] = "non-finite output in the bundle dtype"
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        return entry
    module, inputs, outs, detail, input_dtypes = done
    entry["condition_detail"] = detail
    # a quarter of the twins as a plain .double() makes them (the published .float() casts kept), from
    # a stream of their own so that the recipe's draws do not depend on it
    casts = "kept" if random.Random(f"{seed}/{index}/twin").random() < TWIN_CASTS_KEPT else "off"
    entry["float64_casts"] = casts
    entry["plan"] = {"batch": plan["batch"], "sizes": {str(d): n for d, n in plan["sizes"].items()}}
    final, part = out_dir / f"{bid}.safetensors", out_dir / f"{bid}.safetensors.part"
    bugs_final, bugs_part = out_dir / f"{bid}.bugs.safetensors", out_dir / f"{bid}.bugs.safetensors.part"
    def export(casts):
        return export_bundle(module, template.block, template.config, inputs, part, kwargs=template.kwargs,
                             source=f"{template.source}; calibration bundle {bid} from template {template.name}",
                             dtype=dtype, input_dtypes=input_dtypes, trace=True,
                             extra_metadata={"calibration.template": template.name,
                                             "calibration.condition": r["condition"],
                                             "calibration.condition_detail": detail,
                                             "calibration.seed": str(r["seed"]),
                                             "calibration.float64_casts": casts},
                             float64_casts=casts)

    try:
        info = export(casts)
    except RuntimeError:
        if casts != "kept":
            raise
        # PyTorch cannot run this block's published casts in float64 (GroupNorm32's float32 input
        # against float64 weights, einsum of float32 and float64): its twin is made as the exporters do
        casts = entry["float64_casts"] = "off"
        info = export(casts)
    m64 = float64_copy(module, casts=casts)
    ins64 = cast_inputs(_inputs_to_store(inputs, dtype, input_dtypes), torch.float64)
    honest, found = run_bugs(module, dtype, lambda: _run(module, template, inputs, dtype, input_dtypes), m64,
                             lambda: run_module(m64, ins64, template.kwargs))
    for k, t in honest.items():
        if not torch.equal(t, outs[k]):
            raise RuntimeError(f"rerun of output {k!r} is not bit-identical")
    bugs = write_bugs(bugs_part, found)
    os.replace(bugs_part, bugs_final)
    os.replace(part, final)
    entry.update(path=str(final), bugs=bugs, elements=elements(outs),
                 inputs={k: list(v.shape) for k, v in _inputs_to_store(inputs, dtype, input_dtypes).items()},
                 outputs={k: list(v) for k, v in info["outputs"].items()},
                 max_abs_diff_f64={k: v for k, v in info["max_abs_diff_f64"].items()},
                 max_abs_output={k: float(t.double().abs().max()) if t.numel() else 0.0 for k, t in outs.items()},
                 bytes=info["bytes"], seconds=round(time.perf_counter() - t0, 3))
    return entry


def short_line(entry) -> str:
    if "error" in entry:
        return f"{entry['id']} ERROR {entry.get('template', '')} {entry.get('dtype', '')}: {entry['error'][:160]}"
    if "skipped" in entry:
        return f"{entry['id']} skipped {entry['block']} {entry['dtype']} {entry['condition']}: {entry['skipped']}"
    diff = max(entry["max_abs_diff_f64"].values()) if entry["max_abs_diff_f64"] else 0.0
    return (f"{entry['id']} {entry['template']} {entry['dtype']} {entry['condition']} {entry['elements']} el "
            f"err {diff:.2e} bugs [{','.join(entry['bugs'])}] {entry['seconds']:.2f}s")
