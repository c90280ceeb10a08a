#!/usr/bin/env python3
"""Was PyTorch's run lucky? Where our output is further from the float64 output than PyTorch's is,
this script puts both errors among PyTorch's own errors on nearby problems.

    python scripts/accuracy_spread.py BUNDLE OURS [--trials 300] [--seed 0]

BUNDLE is a float32 calibration bundle (``scripts/calibrate_bundles.py``: its metadata names the
template the block was built from); OURS a safetensors file with our output of it as
``ours/<output>``: ``cargo run --release -p unet-parity --example calibrate -- DIR --only ID --dump``
writes it beside the bundle, as ``ID.ours.default.safetensors``.
The block is rebuilt from the bundle's weights and run ``--trials`` times in float32 and in float64
(the twin made as the bundle's was, ``float64_casts``) on its float inputs each multiplied by
``1 + u``, ``u`` uniform in ±2⁻²³ (one float32 rounding): the same conditioning, other rounding
draws. It prints the spread of PyTorch's error (RMS against its own float64 output) and where the
stored PyTorch output and ours lie in it. A block whose error is dominated by a few sensitive
directions (ill-conditioned logits, one large weight) has a wide spread: a stored output at its 4th
percentile against ours at its 80th is luck, not a less accurate port.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibration.templates import all_templates  # noqa: E402
from parity.float64 import float64_copy  # noqa: E402
from parity.run import run_module  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("ours", type=Path)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def quiet() -> None:
    """The templates' construction warns about every randomised parameter and diffusers about
    ``.to()``: neither matters here."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.set_verbosity_error()
    except ImportError:
        pass


def rebuild(bundle: Path):
    """The bundle's block in float32 with its weights, its float64 twin, inputs, kwargs, outputs."""
    meta = safe_open(str(bundle), "pt").metadata()
    if meta.get("parity.dtype", "float32") != "float32":
        raise SystemExit(f"{bundle}: a float32 bundle is needed (found {meta.get('parity.dtype')})")
    name = meta.get("calibration.template")
    if name is None:
        raise SystemExit(f"{bundle}: no calibration.template in its metadata (not a calibration bundle)")
    template = next((t for t in all_templates() if t.name == name), None)
    if template is None:
        raise SystemExit(f"{bundle}: template {name!r} is not among scripts/calibration's templates")
    tensors = load_file(str(bundle))
    module = template.build()
    module.load_state_dict({k: v for k, v in tensors.items() if not k.startswith("parity.")}, strict=True)
    module.eval()
    twin = float64_copy(module, casts=meta.get("calibration.float64_casts", "off"))
    inputs = OrderedDict((n, tensors[f"parity.input.{n}"]) for n in json.loads(meta["parity.inputs"]))
    outputs = json.loads(meta["parity.outputs"])
    return module, twin, inputs, template.kwargs, outputs, tensors


def as64(inputs):
    return OrderedDict((n, t.double() if t.is_floating_point() else t) for n, t in inputs.items())


def rms(e: torch.Tensor) -> float:
    return e.double().pow(2).mean().sqrt().item()


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    module, twin, inputs, kwargs, outputs, tensors = rebuild(args.bundle)
    ours = load_file(str(args.ours))
    gen = torch.Generator().manual_seed(args.seed)
    spread = {n: [] for n in outputs}
    for _ in range(args.trials):
        nudged = OrderedDict(
            (n, (t.double() * (1 + (torch.rand(t.shape, generator=gen, dtype=torch.float64) - 0.5) * 2**-22)).float()
             if t.is_floating_point() else t)
            for n, t in inputs.items())
        got = run_module(module, nudged, kwargs, outputs)
        exact = run_module(twin, as64(nudged), kwargs, outputs)
        for n in outputs:
            spread[n].append(rms(got[n].double() - exact[n]))
    for n in outputs:
        errs = torch.tensor(spread[n], dtype=torch.float64)
        r = tensors[f"parity.output.{n}.float64"].double()
        stored = rms(tensors[f"parity.output.{n}"].double() - r)
        mine = rms(ours[f"ours/{n}"].double() - r)
        q = torch.quantile(errs, torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0], dtype=torch.float64)).tolist()
        print(f"{args.bundle.name} {n}: PyTorch's float32 error (RMS) over {args.trials} nudged runs: "
              f"min {q[0]:.3g}, 5 % {q[1]:.3g}, median {q[2]:.3g}, 95 % {q[3]:.3g}, max {q[4]:.3g}")
        print(f"  stored PyTorch output {stored:.3g} (percentile {100 * (errs <= stored).double().mean().item():.1f}), "
              f"ours {mine:.3g} (percentile {100 * (errs <= mine).double().mean().item():.1f}); "
              f"ours / stored {mine / stored:.2f}, ours / median {mine / q[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
