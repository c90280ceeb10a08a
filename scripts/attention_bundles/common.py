"""Paths and names the attention-bundle exporter shares: the repository, ``weights/``, the family
folders whose bundles it owns, and the short dtype names it prints."""

from __future__ import annotations

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent.parent
WEIGHTS = REPO / "weights"
# weights/<family>/ folders whose *.safetensors this script owns (stale ones are deleted)
FAMILIES = ["denoising_diffusion_pytorch", "annotated_diffusion", "ldm", "diffusers", "fastai", "torch", "textbook",
            "openai"]


def short_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}[dtype]
