#!/usr/bin/env python3
"""Bundles whose PyTorch output is wrong in its dtype only, for ``crates/parity/tests/cli/verdict.rs``
(issue 53: a PASS is a statement about PyTorch's output). Not under ``weights/``: ``check weights``
must pass, and these must not.

    python scripts/export_verdict.py [--out crates/parity/tests/data/verdict]

From the committed ``weights/diffusers/attention_vae_mid.safetensors`` (diffusers 0.42.1
``Attention`` with the VAE mid block's kwargs: its weights, config and inputs):

* ``vae_mid_eps_f32_only.safetensors``: PyTorch's float32 output computed with the GroupNorm's eps
  x10 (1e-6 -> 1e-5), the float64 twin from the right module: a dtype-specific bug (a fused
  kernel, a dtype-dependent eps, a missing upcast) that the twin does not show. Ours reproduces the
  twin, not the output: not a PASS.
* ``vae_mid_eps_wrong_module.safetensors``: the same wrong module, its own twin: our (right) block
  is a FAIL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from attention_bundles.blocks import build_module  # noqa: E402
from parity_bundle import export_bundle  # noqa: E402

ROOT = HERE.parent
SOURCE = ROOT / "weights" / "diffusers" / "attention_vae_mid.safetensors"


def load_committed():
    """(module, config, inputs, source) of the committed bundle."""
    from safetensors import safe_open

    with safe_open(str(SOURCE), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(meta["parity.config"])
    module = build_module(meta["parity.block"], config, (), meta.get("parity.source", ""))
    module.load_state_dict({k: v for k, v in tensors.items() if not k.startswith("parity.")}, strict=True)
    inputs = {n: tensors[f"parity.input.{n}"] for n in json.loads(meta["parity.inputs"])}
    return module.eval(), config, inputs, meta.get("parity.source", "")


def wrong_eps(module):
    import copy

    m = copy.deepcopy(module)
    m.group_norm.eps *= 10
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "crates" / "parity" / "tests" / "data" / "verdict")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module, config, inputs, source = load_committed()
    wrong = wrong_eps(module)
    block = "diffusers.Attention"

    right_path = args.out / "vae_mid_eps_f32_only.safetensors"
    export_bundle(module, block, config, inputs, right_path, trace=False,
                  source=f"{source}; PyTorch's float32 output replaced by the run of the same module with the "
                         "GroupNorm's eps x10 (scripts/export_verdict.py): wrong in float32 only")
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(right_path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(right_path))
    with torch.no_grad():
        tensors["parity.output.output"] = wrong(inputs["hidden_states"]).contiguous()
    save_file(tensors, str(right_path), metadata=meta)

    export_bundle(wrong, block, config, inputs, args.out / "vae_mid_eps_wrong_module.safetensors", trace=False,
                  source=f"{source}; the module's GroupNorm eps x10 (scripts/export_verdict.py); its own twin")
    for path in sorted(args.out.glob("*.safetensors")):
        print(path.relative_to(ROOT), path.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
