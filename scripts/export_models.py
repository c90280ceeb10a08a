#!/usr/bin/env python3
"""Small whole checkpoints of the real libraries (``weights/models/``) and mid-block ("bottleneck")
parity bundles checked against them (``weights/mid/``).

    python scripts/export_models.py            # delete weights/mid/*.safetensors and weights/models/, write all
    python scripts/export_models.py --verify   # export, then reload and re-check every file
    python scripts/export_models.py --verify-only

Checkpoints: tiny randomly initialised WHOLE models saved as their libraries save them (diffusers
``save_pretrained``; lucidrains ``Trainer.save``'s dict; an SD-style ``.ckpt`` of an ldm ``UNetModel``
+ first-stage ``Encoder`` / ``Decoder``, a bare ldm ``Model`` and a bare guided-diffusion ``UNetModel``
state dict, built from stable-diffusion-sdkit and guided-diffusion-sdk).

Bundles (format "1", see parity_bundle.py) for the block ids ``diffusers.ResnetBlock2D``,
``diffusers.UNetMidBlock2D``, ``diffusers.UNetMidBlock2DCrossAttn`` (``dual_cross_attention`` too),
``diffusers.DualTransformer2DModel``, ``diffusers.UNetMidBlock2DSimpleCrossAttn``, ``diffusers.UNetMidBlock3DCrossAttn``,
``diffusers.UNetMidBlockCrossAttnMotion``,
``diffusers.UNetMidBlock1D``, ``diffusers.MidResTemporalBlock1D``, ``diffusers.ValueFunctionMidBlock1D``, ``diffusers.ControlNetMidBlock``,
``denoising_diffusion_pytorch.MidBlock``, ``ldm.MidBlock``, ``openai.MiddleBlock``. Inputs of
the blocks inside a whole model are captured with a forward pre-hook while the whole model runs
on random inputs, and the block rebuilt from its config + weights must reproduce the output the
whole model's block produced, bit for bit (asserted). A *referencing* bundle holds no weights:
``parity.weights`` names the checkpoint (relative to the bundle's folder), ``parity.prefix`` the
key prefix and ``parity.weights_key`` (pickles with a top-level dict only) the entry holding the
state dict.

This file is the command line; the exporters live in the package ``scripts/export/``, one module
per source family (see its ``__init__``). The names other scripts import from here
(``build_module``, the ``*_mid_config`` functions, ``capture``, ``verify_bundle``, ...) are
re-exported below.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from export.blocks import (DUAL_ATTRIBUTES, MASKLESS_NOTE, build_module, dual_attributes_,  # noqa: E402
                           maskless_dual_)
from export.builders import MODEL_BUILDERS  # noqa: E402
from export.bundles import block_module, cast_module, describe, export_all, half_twin  # noqa: E402
from export.common import (DIFF_BLOCKS, DIFF_RESNET, GUIDED, LDM_MID, LUCID_MID, MAX_WEIGHTS_BYTES, MID,  # noqa: E402
                           MODELS, OPENAI_MID, REPO, WEIGHTS, Ctx, capture, sub_state, tensor_inputs)
from export.configs import (_per_block, controlnet_mid_config, cross_attn_resnet0_config,  # noqa: E402
                            mid2d_resnet_config, unet2d_condition_mid_config,
                            unet2d_condition_simple_cross_mid_config, unet2d_mid_config,
                            unet3d_condition_mid_config, vae_mid_config)
from export.verify import digest, verify_all, verify_bundle, verify_half_twin, verify_models  # noqa: E402

__all__ = [
    "DUAL_ATTRIBUTES", "MASKLESS_NOTE", "build_module", "dual_attributes_", "maskless_dual_", "MODEL_BUILDERS",
    "block_module", "cast_module", "describe", "export_all", "half_twin", "DIFF_BLOCKS", "DIFF_RESNET", "GUIDED",
    "LDM_MID", "LUCID_MID", "MAX_WEIGHTS_BYTES", "MID", "MODELS", "OPENAI_MID", "REPO", "WEIGHTS", "Ctx",
    "capture", "sub_state", "tensor_inputs", "_per_block", "controlnet_mid_config", "cross_attn_resnet0_config",
    "mid2d_resnet_config", "unet2d_condition_mid_config", "unet2d_condition_simple_cross_mid_config",
    "unet2d_mid_config", "unet3d_condition_mid_config", "vae_mid_config", "digest", "verify_all",
    "verify_bundle", "verify_half_twin", "verify_models", "main",
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="after exporting, reload and re-check every file")
    ap.add_argument("--verify-only", action="store_true", help="only re-check the files on disk")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--only", nargs="+", choices=[b.__name__ for b in MODEL_BUILDERS],
                    help="export only these builders' models and bundles (nothing else is deleted or rewritten; "
                    "--verify then checks only their bundles)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    ctx = None
    if not args.verify_only:
        ctx = Ctx()
        export_all(ctx, args.only)
    if args.only and args.verify:
        for spec in ctx.specs:
            for suffix in ("", "_f16", "_bf16") if spec["half"] else ("",):
                if suffix and half_twin(spec, torch.float16) is None:
                    continue  # no twin (skipped when exported)
                p = WEIGHTS / spec["path"].replace(".safetensors", f"{suffix}.safetensors")
                diffs = verify_bundle(p)
                if suffix:
                    verify_half_twin(p, WEIGHTS / spec["path"])
                print(f"verified {p.relative_to(REPO)} (max|out-f64| {diffs})")
    elif args.verify or args.verify_only:
        verify_all(ctx)
    print(f"sha256 of weights/mid + weights/models: {digest()}")


if __name__ == "__main__":
    main()
