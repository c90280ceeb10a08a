#!/usr/bin/env python3
"""Regenerate every reference parity bundle in ``weights/`` (format "1", see parity_bundle.py).

    python scripts/export_reference.py            # delete the owned bundles, export them all
    python scripts/export_reference.py --verify   # export, then reload and re-check every file
    python scripts/export_reference.py --verify-only   # only re-check the files on disk
    python scripts/export_reference.py --only torch/mha_causal   # the specs whose path or block id
                                                                 # contains it; nothing else touched

Blocks come from the real libraries where they are pip packages
(denoising-diffusion-pytorch, diffusers, torch.nn.MultiheadAttention, SD 2.x's ``ldm`` tree from
stable-diffusion-sdkit, OpenAI's ``guided_diffusion`` from guided-diffusion-sdk; see upstream.py) and
from the faithful re-statements in ``scripts/reference/`` where no package ships the class. Everything is deterministic (fixed seeds,
single-threaded CPU PyTorch).

``--verify`` reloads each bundle with safetensors, rebuilds the module from the stored
``parity.block`` + ``parity.config`` + state dict alone in the stored ``parity.dtype``, reruns it
(in that dtype and as the float64 copy) and asserts the outputs are bit-identical to the stored
ones; a float16 / bfloat16 twin must also hold exactly its float32 bundle's weights and inputs
rounded to its dtype (see ``HALF_FROM``).

This file is the command line; the exporter lives in the package ``scripts/attention_bundles/``
(see its ``__init__``). The names other scripts import from here (``bundle_specs``,
``build_module``, ``FAMILIES``, ``verify_file``, ...) are re-exported below.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from attention_bundles.blocks import (CONV_SHAPED_DIFFUSERS_KEYS, DIFFUSERS_PROCESSORS,  # noqa: E402
                                      LEGACY_DIFFUSERS_KEYS, build_module, cast_module,
                                      from_conv_shaped_diffusers_weights, from_legacy_diffusers_keys,
                                      to_conv_shaped_diffusers_weights, to_legacy_diffusers_keys)
from attention_bundles.common import FAMILIES, REPO, WEIGHTS  # noqa: E402
from attention_bundles.half import HALF_CONVERT_TO_FP16, HALF_DTYPES, HALF_FROM, HALF_REJECTED  # noqa: E402
from attention_bundles.sources import SD2_MARK, VAE_MID  # noqa: E402
from attention_bundles.specs import bundle_specs  # noqa: E402
from attention_bundles.verify import verify_all, verify_file, verify_half_twin  # noqa: E402
from attention_bundles.write import export_all, exported_specs, make_module_and_inputs, traced_spec  # noqa: E402

__all__ = [
    "CONV_SHAPED_DIFFUSERS_KEYS", "DIFFUSERS_PROCESSORS", "LEGACY_DIFFUSERS_KEYS", "build_module", "cast_module",
    "from_conv_shaped_diffusers_weights", "from_legacy_diffusers_keys", "to_conv_shaped_diffusers_weights",
    "to_legacy_diffusers_keys", "FAMILIES", "REPO", "WEIGHTS", "HALF_CONVERT_TO_FP16", "HALF_DTYPES", "HALF_FROM",
    "HALF_REJECTED", "SD2_MARK", "VAE_MID", "bundle_specs", "verify_all", "verify_file", "verify_half_twin",
    "export_all", "exported_specs", "make_module_and_inputs", "traced_spec", "main",
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="after exporting, reload and re-check every bundle")
    ap.add_argument("--verify-only", action="store_true", help="only re-check the bundles on disk")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--only", metavar="SUBSTR",
                    help="only the bundles whose path or block id contains SUBSTR (the others are kept)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    specs = bundle_specs()
    if args.only:
        specs = [s for s in specs if args.only in s["path"] or args.only in s["block"]]
        if not specs:
            ap.error(f"--only {args.only!r}: no bundle's path or block id contains it")
    if not args.verify_only:
        export_all(specs, delete_owned=not args.only)
    if args.verify or args.verify_only:
        verify_all(specs, whole=not args.only)


if __name__ == "__main__":
    main()
