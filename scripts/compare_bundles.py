#!/usr/bin/env python3
"""Compare two trees of exported files tensor by tensor and metadata entry by metadata entry.

    python scripts/compare_bundles.py NEW_DIR OLD_DIR [--glob 'mid/*.safetensors'] [-q]

For every file under both folders (``--glob``, relative, default every file): ``.safetensors``
files are compared key by key (dtype, shape, bit-identical values, else the max |difference| of
the floating values) and metadata entry by entry (for a differing string, the first differing
character and a little context; for JSON lists and dicts, the entries that differ); pickles
(``.pt``, ``.ckpt``, ``.bin``) are loaded with ``torch.load(weights_only=True)`` and their
tensors compared the same way; anything else byte by byte. Files on one side only are listed.
Exit status 0 when every common file is identical in content (bytes may still differ, e.g. a
pickle's zip timestamps), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _flatten(obj, prefix=""):
    """Tensor leaves of a nested dict / list (a checkpoint's pickled object), by dotted path."""
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out = {}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {f"{prefix}#value": obj}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _tensor_diffs(a: dict, b: dict) -> list:
    import torch

    notes = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            notes.append(f"key {k} only in {'new' if k in a else 'old'}")
            continue
        x, y = a[k], b[k]
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                notes.append(f"{k}: {x!r} != {y!r}")
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            notes.append(f"{k}: {x.dtype}{tuple(x.shape)} != {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x, y):
            if x.is_floating_point():
                d = float((x.double() - y.double()).abs().max())
                scale = float(y.double().abs().max())
                notes.append(f"{k}: max |diff| {d:.3e} (max |old| {scale:.3e})")
            else:
                notes.append(f"{k}: values differ")
    return notes


def _meta_diff(key: str, x: str, y: str) -> str:
    try:
        jx, jy = json.loads(x), json.loads(y)
    except (ValueError, TypeError):
        jx = jy = None
    if isinstance(jx, dict) and isinstance(jy, dict):
        ks = sorted(k for k in set(jx) | set(jy) if jx.get(k, "<absent>") != jy.get(k, "<absent>"))
        return f"metadata {key}: " + "; ".join(f"{k}: {jx.get(k, '<absent>')!r} != {jy.get(k, '<absent>')!r}"
                                               for k in ks)
    if isinstance(jx, list) and isinstance(jy, list):
        return f"metadata {key}: new-only {[v for v in jx if v not in jy]}, old-only {[v for v in jy if v not in jx]}"
    i = next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
    return f"metadata {key}: differs from character {i}: new ...{x[max(0, i - 40):i + 60]!r} old ...{y[max(0, i - 40):i + 60]!r}"


def compare_file(new: Path, old: Path) -> list:
    """Notes on how ``new`` differs from ``old`` (empty: identical content)."""
    if new.read_bytes() == old.read_bytes():
        return []
    if new.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        notes = _tensor_diffs(load_file(str(new)), load_file(str(old)))
        with safe_open(str(new), framework="pt") as f:
            mn = dict(f.metadata() or {})
        with safe_open(str(old), framework="pt") as f:
            mo = dict(f.metadata() or {})
        for k in sorted(set(mn) | set(mo)):
            if k not in mn or k not in mo:
                notes.append(f"metadata {k} only in {'new' if k in mn else 'old'}")
            elif mn[k] != mo[k]:
                notes.append(_meta_diff(k, mn[k], mo[k]))
        return notes or ["bytes differ (same tensors and metadata: header order or padding)"]
    if new.suffix in (".pt", ".ckpt", ".bin", ".pth"):
        import torch

        a = _flatten(torch.load(new, map_location="cpu", weights_only=True))
        b = _flatten(torch.load(old, map_location="cpu", weights_only=True))
        return _tensor_diffs(a, b) or ["bytes differ (same pickled tensors and values: zip container only)"]
    return ["bytes differ"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new", type=Path)
    ap.add_argument("old", type=Path)
    ap.add_argument("--glob", default="**/*", help="files to compare, relative to both folders (default all)")
    ap.add_argument("-q", "--quiet", action="store_true", help="only the files that differ and the summary")
    args = ap.parse_args(argv)
    rel = lambda root: {p.relative_to(root) for p in root.glob(args.glob) if p.is_file()}  # noqa: E731
    a, b = rel(args.new), rel(args.old)
    same = content_same = 0
    differ = []
    for r in sorted(a - b):
        print(f"only in {args.new}: {r}")
    for r in sorted(b - a):
        print(f"only in {args.old}: {r}")
    for r in sorted(a & b):
        notes = compare_file(args.new / r, args.old / r)
        if not notes:
            same += 1
            if not args.quiet:
                print(f"identical: {r}")
        elif all(n.startswith("bytes differ (same") for n in notes):
            content_same += 1
            print(f"same content: {r}: {notes[0]}")
        else:
            differ.append(r)
            print(f"DIFFERS: {r}")
            for n in notes:
                print(f"    {n}")
    print(f"{len(a & b)} files in both: {same} byte-identical, {content_same} same content in other bytes, "
          f"{len(differ)} differ; {len(a - b)} only in new, {len(b - a)} only in old")
    return 1 if differ or a != b else 0


if __name__ == "__main__":
    sys.exit(main())
