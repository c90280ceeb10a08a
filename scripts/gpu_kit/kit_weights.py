#!/usr/bin/env python3
"""The bundles the GPU kit carries: a copy of ``weights/`` without what no stage of the kit reads.

    python3 scripts/gpu_kit/kit_weights.py WEIGHTS DEST      # writes DEST/weights/...

Left out (issue 55: tree and kit must fit a lent machine's copy with room to spare):

* ``weights/accuracy`` (the CPU accuracy test's perturbed f32 blocks, never run on a GPU), the
  32-group models and bundles that exist for the CPU comparison with candle-transformers
  (``weights/models/*_g32``, ``weights/whole/*_g16_*``, ``*_g32_*``, ``vae_g*``), and
  ``weights/whole``'s float32 bundles and denoising reference (its float16 twins travel: they are
  what the CUDA layers change);
* in every bundle, the stage traces: the tensors ``parity.trace.<stage>`` and
  ``parity.trace.<stage>.float64_delta`` and the metadata ``parity.trace`` / ``parity.trace_mode``
  (40 of the 60 MiB that travelled). ``unet-parity check`` reads them only with ``--trace``
  (``crates/parity/src/bundle.rs``: ``Load::NoStages``), which the kit never passes: its
  verdicts, errors and ``VS_F64`` columns are the same on these copies (the dry run and the lend
  simulation of ``scripts/gpu_kit.sh`` do not re-check that; ``scripts/gpu_kit.sh strip-check``
  does, on the CPU).

Everything else (weights, inputs, PyTorch's outputs and their float64 twins, the other metadata,
model checkpoints, configs) is copied byte for byte; a rewritten bundle keeps its other tensors
in their order, contiguous, and its header padded to 8 bytes as safetensors writes it. Only the
Python standard library is needed.
"""

import fnmatch
import json
import os
import shutil
import struct
import sys

# Paths under weights/ (relative, '/'-separated) that stay behind: fnmatch patterns.
LEFT_OUT = [
    "accuracy/*",
    "models/*_g32/*",
    "whole/*_g16_*",
    "whole/*_g32_*",
    "whole/vae_g*",
    "whole/*_unet.safetensors",
    "whole/vae.safetensors",
    "whole/denoise_*",
]
TRACE_PREFIX = "parity.trace."
TRACE_METADATA = ("parity.trace", "parity.trace_mode")


def left_out(rel):
    return any(fnmatch.fnmatch(rel, p) for p in LEFT_OUT)


def strip_traces(src, dst):
    """Copy the safetensors file ``src`` to ``dst`` without its stage traces; returns the bytes
    left out."""
    with open(src, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", None)
    keep = sorted(((k, v) for k, v in header.items() if not k.startswith(TRACE_PREFIX)),
                  key=lambda kv: kv[1]["data_offsets"][0])
    if len(keep) == len(header) and not (meta and any(k in meta for k in TRACE_METADATA)):
        shutil.copyfile(src, dst)
        return 0
    out_header, chunks, at = {}, [], 0
    if meta is not None:
        out_header["__metadata__"] = {k: v for k, v in meta.items() if k not in TRACE_METADATA}
    for name, info in keep:
        begin, end = info["data_offsets"]
        chunks.append(body[begin:end])
        out_header[name] = dict(info, data_offsets=[at, at + end - begin])
        at += end - begin
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    return len(data) - 8 - len(text) - at


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dest = sys.argv[1], os.path.join(sys.argv[2], "weights")
    kept = stripped = skipped = 0
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            if left_out(rel):
                skipped += os.path.getsize(path)
                continue
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            if name.endswith(".safetensors"):
                stripped += strip_traces(path, out)
            else:
                shutil.copyfile(path, out)
            kept += os.path.getsize(out)
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    print(f"kit_weights.py: {mib(kept)} kept, {mib(stripped)} of stage traces and {mib(skipped)} of files left out")


if __name__ == "__main__":
    main()
