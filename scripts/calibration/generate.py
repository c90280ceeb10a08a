"""One calibration bundle per index: the recipe (template, dtype, condition) drawn from the index's
own random stream, the block randomized and run, the bundle written with ``export_bundle``, the
planted bugs' outputs written beside it, one manifest line appended.

Everything about bundle ``i`` comes from ``random.Random(f"{seed}/{i}")``, so a bundle does not
depend on which other bundles were made, in which process or order (``--shard``, resuming).
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from collections import OrderedDict
from pathlib import Path

import torch

from attention_bundles.blocks import cast_module
from parity.export import _inputs_to_store
from parity.run import run_module
from parity_bundle import convert_convs_to_half_, export_bundle, randomize_

from .bugs import run_bugs
from .inputs import apply_offset, apply_outlier, candidate_plans, elements, make_inputs, shrink

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CONDITIONS = (("normal", 0.5), ("outlier", 0.25), ("ill", 0.25))
ATTEMPTS = 3


def bundle_id(index: int) -> str:
    return f"c{index:05d}"


def pick(rng, weighted):
    r, acc = rng.random(), 0.0
    for value, w in weighted:
        acc += w
        if r < acc:
            return value
    return weighted[-1][0]


def recipe(templates, seed: int, index: int) -> dict:
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
    condition = pick(rng, CONDITIONS)
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


def resolve_shapes(template, module32, dtype, rng, seed, max_elements):
    """(plan, inputs, module in dtype, input dtypes, outputs): the first candidate plan the block runs
    on (shrunk while its outputs exceed ``max_elements``)."""
    module, input_dtypes = in_dtype(module32, template, dtype)
    last = None
    for plan in candidate_plans(template, rng, max_elements):
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


def apply_condition(r, template, module32, inputs, dtype, module, input_dtypes, outs):
    """(module, inputs, outputs, detail) under the recipe's condition, weakened until PyTorch's output
    in ``dtype`` is finite; ``None`` if it never is."""
    rng, cond = r["rng"], r["condition"]
    gen = torch.Generator().manual_seed(r["seed"] + 2)
    if cond == "normal":
        return (module, inputs, outs, "") if _finite(outs) else None
    if cond == "outlier":
        strength = 10 ** rng.uniform(2, 4)
        for _ in range(ATTEMPTS):
            new, what = apply_outlier(template, inputs, rng, gen, strength)
            outs = _run(module, template, new, dtype, input_dtypes)
            if _finite(outs):
                return module, new, outs, what
            strength /= 10
        return None
    if rng.random() < 0.5:
        factor = rng.uniform(3, 10)
        for _ in range(ATTEMPTS):
            m32 = scale_weights_(copy.deepcopy(module32), factor)
            m, idt = in_dtype(m32, template, dtype)
            outs = _run(m, template, inputs, dtype, idt)
            if _finite(outs):
                return m, inputs, outs, f"weights (>= 2-D) x {factor:.3g}"
            factor = 1 + (factor - 1) / 3
        return None
    offset = rng.choice([-1, 1]) * 10 ** rng.uniform(1, 2)
    for _ in range(ATTEMPTS):
        new, what = apply_offset(template, inputs, offset)
        outs = _run(module, template, new, dtype, input_dtypes)
        if _finite(outs):
            return module, new, outs, what
        offset /= 4
    return None


def write_bugs(path, found) -> list:
    from safetensors.torch import save_file

    tensors = OrderedDict()
    for bug, outs in found.items():
        for name, t in outs.items():
            tensors[f"{bug}/{name}"] = t.detach().contiguous().clone()
    save_file(tensors, str(path), metadata={"bugs": json.dumps(list(found))})
    return list(found)


def generate_one(out_dir: Path, templates, seed: int, index: int, max_elements: int) -> dict:
    """Write bundle ``index`` and its bugs file; returns its manifest entry."""
    t0 = time.perf_counter()
    r = recipe(templates, seed, index)
    template, dtype = r["template"], DTYPES[r["dtype"]]
    bid = bundle_id(index)
    entry = OrderedDict(id=bid, block=template.block, template=template.name, dtype=r["dtype"], seed=r["seed"],
                        condition=r["condition"], half="calibrate" if index % 2 == 0 else "validate")
    module32 = template.build()
    randomize_(module32, r["seed"])
    module32.eval()
    plan, inputs, module, input_dtypes, outs = resolve_shapes(template, module32, dtype, r["rng"], r["seed"],
                                                              max_elements)
    done = apply_condition(r, template, module32, inputs, dtype, module, input_dtypes, outs)
    if done is None:
        entry["skipped"] = "non-finite output in the bundle dtype"
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        return entry
    module, inputs, outs, detail = done
    entry["condition_detail"] = detail
    entry["plan"] = {"batch": plan["batch"], "sizes": {str(d): n for d, n in plan["sizes"].items()}}
    final, part = out_dir / f"{bid}.safetensors", out_dir / f"{bid}.safetensors.part"
    bugs_final, bugs_part = out_dir / f"{bid}.bugs.safetensors", out_dir / f"{bid}.bugs.safetensors.part"
    info = export_bundle(module, template.block, template.config, inputs, part, kwargs=template.kwargs,
                         source=f"{template.source}; calibration bundle {bid} from template {template.name}",
                         dtype=dtype, input_dtypes=input_dtypes, trace=True,
                         extra_metadata={"calibration.template": template.name,
                                         "calibration.condition": r["condition"],
                                         "calibration.condition_detail": detail,
                                         "calibration.seed": str(r["seed"])})
    honest, found = run_bugs(module, dtype, lambda: _run(module, template, inputs, dtype, input_dtypes))
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
