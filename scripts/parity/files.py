"""The bundle file and the checkpoints it may reference: ``load_bundle`` (read a bundle back),
``write_bundle`` (safetensors with the metadata keys sorted, byte-reproducible), ``library_versions``
(the start of ``parity.source``), ``float64_delta`` (how a float32 bundle stores its float64
stages), ``load_checkpoint_state_dict`` and ``resolve_weights`` (a referencing bundle's weights).
"""

from __future__ import annotations

import json
import os
import struct
from collections import OrderedDict
from typing import Sequence

import torch
from torch import nn

FORMAT = "1"
# Key suffix of a float32 bundle's float64 stages, stored as deltas (``float64_delta``).
DELTA_SUFFIX = ".float64_delta"


def float64_delta(stage, stage64):
    """``stage64 - stage`` (float64 minus float32) rounded to bfloat16: what a float32 bundle stores for
    its float64 stage (0 where the two are the same value, infinities included)."""
    s = stage.double()
    return torch.where(stage64 == s, torch.zeros_like(s), stage64 - s).to(torch.bfloat16).contiguous()


_DIST_FOR_PACKAGE = {
    "denoising_diffusion_pytorch": "denoising-diffusion-pytorch",
    "ldm": "stable-diffusion-sdkit",
    "guided_diffusion": "guided-diffusion-sdk",
}


def library_versions(module: nn.Module | None = None) -> str:
    """``"torch X; <package of the module's class> Y; einops Z; safetensors W"``."""
    from importlib import metadata

    names = ["torch"]
    if module is not None:
        top = type(module).__module__.split(".")[0]
        if top not in ("torch", "__main__", "builtins"):
            names.append(_DIST_FOR_PACKAGE.get(top, top))
    names += ["einops", "safetensors"]
    parts = []
    for name in dict.fromkeys(names):
        try:
            version = torch.__version__ if name == "torch" else metadata.version(name)
        except Exception:
            continue
        parts.append(f"{name} {version}")
    return "; ".join(parts)


def write_bundle(tensors: dict, metadata: dict, path: str) -> None:
    """``save_file`` the tensors and metadata to ``path`` (parent folders created), then sort the
    header's metadata keys (``canonicalize_header``)."""
    from safetensors.torch import save_file

    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    save_file(tensors, path, metadata=metadata)
    canonicalize_header(path)


def canonicalize_header(path: str) -> None:
    """Make the file byte-reproducible: safetensors writes ``__metadata__`` in hash-map order,
    so rewrite the JSON header with the metadata keys sorted (tensor entries and data unchanged;
    the header is re-padded with spaces to a multiple of 8 bytes, as safetensors does)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"), object_pairs_hook=OrderedDict)
    out = OrderedDict()
    if "__metadata__" in header:
        out["__metadata__"] = OrderedDict(sorted(header["__metadata__"].items()))
    for k, v in header.items():
        if k != "__metadata__":
            out[k] = v
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _trace_f64(meta: dict, tensors: dict) -> "OrderedDict[str, torch.Tensor]":
    """Stage name -> the float64 run's stage, for the stages that have one."""
    out = OrderedDict()
    for n in json.loads(meta.get("parity.trace", "[]")):
        if f"parity.trace.{n}.float64" in tensors:
            out[n] = tensors[f"parity.trace.{n}.float64"]
        elif f"parity.trace.{n}.float64_delta" in tensors:
            out[n] = tensors[f"parity.trace.{n}"].double() + tensors[f"parity.trace.{n}.float64_delta"].double()
    return out


def load_bundle(path: str | os.PathLike) -> dict:
    """Read a bundle back: ``{"metadata", "block", "config", "inputs", "outputs", "kwargs",
    "state_dict", "expected", "expected_f64"}`` (inputs/expected in stored order)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(os.fspath(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    tensors = load_file(os.fspath(path))
    if meta.get("parity.format") != FORMAT:
        raise ValueError(f"{path}: parity.format {meta.get('parity.format')!r}, expected {FORMAT!r}")
    in_names = json.loads(meta["parity.inputs"])
    out_names = json.loads(meta["parity.outputs"])
    return {
        "metadata": meta,
        "block": meta["parity.block"],
        "config": json.loads(meta["parity.config"]),
        "kwargs": json.loads(meta.get("parity.kwargs", "{}")),
        "inputs": OrderedDict((n, tensors[f"parity.input.{n}"]) for n in in_names),
        "expected": OrderedDict((n, tensors[f"parity.output.{n}"]) for n in out_names),
        "expected_f64": OrderedDict((n, tensors[f"parity.output.{n}.float64"]) for n in out_names),
        "state_dict": OrderedDict((k, v) for k, v in tensors.items() if not k.startswith("parity.")),
        # stage name -> tensor (``output`` excluded: it is the first expected output), in order
        "trace": OrderedDict((n, tensors[f"parity.trace.{n}"]) for n in json.loads(meta.get("parity.trace", "[]"))
                             if n != "output"),
        # the float64 run's stages: stored as they are (half-precision bundles), or as bfloat16 deltas
        # from the float32 stage (``parity.trace.<stage>.float64_delta``, float32 bundles)
        "trace_f64": _trace_f64(meta, tensors),
        # referencing bundle: (checkpoint path relative to the bundle's folder, prefix, entry key or None)
        "weights_ref": ((meta["parity.weights"], meta.get("parity.prefix", ""), meta.get("parity.weights_key"))
                        if "parity.weights" in meta else None),
    }


def load_checkpoint_state_dict(path: str | os.PathLike, key: str | None = None) -> "OrderedDict[str, torch.Tensor]":
    """The state dict stored in a checkpoint file: a ``.safetensors`` file, or a ``torch.save``
    pickle (loaded with ``weights_only=True``) whose top level is the state dict, or, with ``key``,
    a dict whose entry ``key`` is."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        if key is not None:
            raise ValueError(f"{path}: a safetensors file has no entry {key!r}")
        from safetensors.torch import load_file

        return OrderedDict(load_file(path))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if key is not None:
        obj = obj[key]
    return OrderedDict((k, v) for k, v in obj.items() if isinstance(v, torch.Tensor))


def resolve_weights(bundle_path: str | os.PathLike, bundle: dict, keys: Sequence[str]) -> "OrderedDict[str, torch.Tensor]":
    """The block's state dict for ``bundle`` (from ``load_bundle``): its own tensors, or for a
    referencing bundle ``checkpoint[prefix + k]`` for every key ``k`` in ``keys`` (the module's
    own state-dict keys; a missing one is an error, other checkpoint keys are ignored)."""
    if bundle["weights_ref"] is None:
        return bundle["state_dict"]
    if bundle["state_dict"]:
        raise ValueError(f"{bundle_path}: a referencing bundle must not hold weights")
    rel, prefix, key = bundle["weights_ref"]
    ckpt = load_checkpoint_state_dict(os.path.join(os.path.dirname(os.fspath(bundle_path)), rel), key)
    missing = [prefix + k for k in keys if prefix + k not in ckpt]
    if missing:
        raise KeyError(f"{bundle_path}: {rel} lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return OrderedDict((k, ckpt[prefix + k]) for k in keys)
