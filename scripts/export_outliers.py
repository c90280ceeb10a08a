#!/usr/bin/env python3
"""Outlier bundles (``weights/outlier/``): honest bundles of diffusers' VAE-mid ``Attention`` (0.42.1)
whose input holds one very large element, for the test that the pass rule judges every element on
its own (``crates/parity/tests/cli/pass_rule.rs``).

    python scripts/export_outliers.py            # writes weights/outlier/*.safetensors

With one input element at 1e4 (or 1e6), PyTorch's own float32 error against its float64 run is
large at that element (the residual adds the outlier back) and tiny everywhere else. A pass rule
that compared global maxima let a port be wrong by twice that error anywhere; the elementwise
rule must pass these bundles with the right port and fail a port that is slightly wrong on
elements where PyTorch was exact.

The block: ``Attention(query_dim=64, heads=1, dim_head=64, norm_num_groups=32, residual_connection=True,
bias=True, upcast_softmax=True, _from_deprecated_attn_block=True)`` (the VAE mid block's attention at
64 channels), ``randomize_`` weights (seed 0), input N(0, 1) of shape (1, 64, 8, 8) (seed 1) with
element [0, 5, 3, 7] set to the outlier. f32 at 1e4 and 1e6, f16 and bf16 at 1e4.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from diffusers.models.attention_processor import Attention  # noqa: E402
from parity_bundle import export_bundle, randomize_  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "weights", "outlier")
CONFIG = dict(query_dim=64, heads=1, dim_head=64, norm_num_groups=32, residual_connection=True, bias=True,
              upcast_softmax=True, _from_deprecated_attn_block=True)
WHERE = (0, 5, 3, 7)
CASES = (
    ("vae_attention_outlier_1e4", 1e4, torch.float32),
    ("vae_attention_outlier_1e6", 1e6, torch.float32),
    ("vae_attention_outlier_1e4_f16", 1e4, torch.float16),
    ("vae_attention_outlier_1e4_bf16", 1e4, torch.bfloat16),
)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for name, outlier, dtype in CASES:
        attn = Attention(**CONFIG)
        randomize_(attn, seed=0)
        attn = attn.to(dtype).eval()
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(1, 64, 8, 8, generator=gen)
        x[WHERE] = outlier
        path = os.path.join(OUT, f"{name}.safetensors")
        export_bundle(attn, "diffusers.Attention", CONFIG, {"hidden_states": x.to(dtype)}, path)
        print(path)


if __name__ == "__main__":
    with torch.no_grad():
        main()
