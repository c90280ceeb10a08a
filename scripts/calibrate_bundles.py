"""Generate calibration bundles for the checker's pass rule (never committed; see ``calibration/``).

    python scripts/calibrate_bundles.py --out DIR --count N [--seed S] [--families a,b]
                                        [--max-elements M] [--shard K/M] [--threads T]

writes ``DIR/<id>.safetensors`` (a format-"1" parity bundle by ``export_bundle``, stage traces on),
``DIR/<id>.bugs.safetensors`` (tensors ``<bug>/<output>``: the same module and inputs run in the
bundle's dtype with one planted bug; metadata ``bugs``: the JSON list of the bugs stored) and one
JSON line per bundle in ``DIR/manifest.jsonl`` (id, path, block, template, dtype, seed, condition,
half = calibrate / validate by the index's parity, bugs, elements, seconds, ...; ``{"id", "error"}``
for a bundle that failed, ``"skipped"`` for one whose PyTorch output was not finite).

Deterministic given ``--seed`` (bundle ``i`` depends on the seed and ``i`` only); resumable (ids
already written or already in the manifest are skipped); ``--shard K/M`` makes the indices
``i % M == K``, so M processes split the work and share DIR and its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--count", required=True, type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default="", help="comma-separated block ids, families (diffusers, ldm, openai, "
                   "torch, ...) or template-name substrings (attn:, mid:, unet_mid_block_1d)")
    p.add_argument("--max-elements", type=int, default=200_000)
    p.add_argument("--shard", default="0/1", help="K/M: this process makes the indices i with i %% M == K")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--conditions", choices=("all", "classic"), default="all",
                   help="all: every input and weight condition of calibration/generate.py (default); classic: "
                   "normal, outlier and ill only (the calibration before 2026-12)")
    return p.parse_args(argv)


def done_ids(out: Path) -> set:
    """Ids with a manifest line (written, skipped or failed)."""
    ids = set()
    manifest = out / "manifest.jsonl"
    if manifest.exists():
        for line in manifest.read_text().splitlines():
            try:
                ids.add(json.loads(line)["id"])
            except (ValueError, KeyError):
                continue
    return ids


def append_line(out: Path, entry: dict) -> None:
    """One manifest line, written with a single O_APPEND write (two shards share the file)."""
    data = (json.dumps(entry) + "\n").encode()
    fd = os.open(out / "manifest.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    if "weights" in out.parts and (HERE.parent / "weights") in [out, *out.parents]:
        raise SystemExit("--out must not be inside the repository's weights/")
    k, m = (int(x) for x in args.shard.split("/"))
    if not 0 <= k < m:
        raise SystemExit(f"--shard {args.shard}: need 0 <= K < M")

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from export.common import _diffusers_quiet

    _diffusers_quiet()
    from calibration.generate import CLASSIC_CONDITIONS, CONDITIONS, bundle_id, generate_one, recipe, short_line
    from calibration.templates import all_templates

    out.mkdir(parents=True, exist_ok=True)
    templates = all_templates([t for t in args.families.split(",") if t])
    conditions = CLASSIC_CONDITIONS if args.conditions == "classic" else CONDITIONS
    seen = done_ids(out)
    stats = {"written": 0, "skipped": 0, "error": 0, "resumed": 0}
    t_start = time.perf_counter()
    for index in range(k, args.count, m):
        bid = bundle_id(index)
        if bid in seen or (out / f"{bid}.safetensors").exists():
            stats["resumed"] += 1
            continue
        t0 = time.perf_counter()
        try:
            entry = generate_one(out, templates, args.seed, index, args.max_elements, conditions)
        except Exception as e:  # logged, and on to the next bundle
            r = recipe(templates, args.seed, index, conditions)
            entry = {"id": bid, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                     "block": r["template"].block, "template": r["template"].name, "dtype": r["dtype"],
                     "condition": r["condition"], "seconds": round(time.perf_counter() - t0, 3)}
            if os.environ.get("CALIB_TRACEBACK"):
                traceback.print_exc()
        for suffix in (".safetensors.part", ".bugs.safetensors.part"):
            part = out / f"{bid}{suffix}"
            if part.exists():
                part.unlink()
        append_line(out, entry)
        stats["error" if "error" in entry else "skipped" if "skipped" in entry else "written"] += 1
        print(short_line(entry), flush=True)
    total = time.perf_counter() - t_start
    print(f"shard {args.shard}: {stats} in {total:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
