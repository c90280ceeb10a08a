#!/usr/bin/env python3
"""Accuracy bundles (``weights/accuracy/``): the conv-heavy mid blocks with perturbed weights, for
the test that our f32 error against PyTorch's float64 output is at most 1.5x PyTorch's own f32
error (``tests/accuracy.rs``).

    python scripts/export_accuracy.py            # writes weights/accuracy/*.safetensors

Blocks: diffusers ``ResnetBlock2D`` and ``UNetMidBlock2D`` (0.42.1), ldm's ``mid`` (``ResnetBlock`` /
``AttnBlock`` of stable-diffusion-sdkit) and guided-diffusion's ``middle_block`` (guided-diffusion-sdk),
each at 64 channels (3x3 convolutions over 576 inputs:
several reduction blocks of the CPU GEMM) on a 16x16 input, two seeds each. Weights: ``randomize_``
(fan-in scaled, norm weights 1 + 0.2 N(0, 1)), then every weight and bias multiplied by
``1 + 0.3 N(0, 1)`` (a perturbation of scale 0.3; norm weights stay near 1). Inputs N(0, 1), a time
embedding N(0, 1) where the block takes one. Float32 blocks; the bundles hold PyTorch's f32 output
and the float64 run's, and the stage traces of both.
"""

import os
import sys
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from export_models import build_module  # noqa: E402
from parity_bundle import export_bundle, randomize_  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "weights", "accuracy")
C = 64
SIDE = 16
SEEDS = (11, 12)

BLOCKS = OrderedDict(
    resnet_block_2d=("diffusers.ResnetBlock2D",
                     dict(in_channels=C, out_channels=C, temb_channels=C, groups=32, eps=1e-6)),
    unet_mid_block_2d=("diffusers.UNetMidBlock2D",
                       dict(in_channels=C, temb_channels=C, resnet_eps=1e-6, resnet_act_fn="silu",
                            output_scale_factor=1, resnet_time_scale_shift="default", attention_head_dim=C,
                            resnet_groups=32, add_attention=True)),
    ldm_mid_block=("ldm.MidBlock", dict(in_channels=C, temb_channels=C, dropout=0.0, attn_type="vanilla")),
    openai_middle_block=("openai.MiddleBlock",
                         dict(channels=C, emb_channels=C, dropout=0.0, dims=2, use_scale_shift_norm=True, num_heads=4,
                              num_head_channels=16, use_new_attention_order=False, use_spatial_transformer=False,
                              transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
                              disable_middle_self_attn=False, legacy=True)),
)
# The forward's input names: (image, time embedding).
INPUTS = {
    "diffusers.ResnetBlock2D": ("input_tensor", "temb"),
    "diffusers.UNetMidBlock2D": ("hidden_states", "temb"),
    "ldm.MidBlock": ("x", "temb"),
    "openai.MiddleBlock": ("x", "emb"),
}


def perturb_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every floating parameter times (1 + 0.3 N(0, 1)), elementwise."""
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.mul_(1.0 + 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))
    return module


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (block, config) in BLOCKS.items():
        for seed in SEEDS:
            torch.manual_seed(0)
            module = perturb_(randomize_(build_module(block, config), seed), seed)
            gen = torch.Generator().manual_seed(seed + 100_000)
            image, temb = INPUTS[block]
            inputs = OrderedDict([(image, torch.randn(1, C, SIDE, SIDE, generator=gen)),
                                  (temb, torch.randn(1, C, generator=gen))])
            path = os.path.join(OUT, f"{name}_seed{seed}.safetensors")
            info = export_bundle(module, block, config, inputs, path, dtype=torch.float32, trace=True,
                                 source=f"scripts/export_accuracy.py: randomize_ seed {seed}, weights x (1 + 0.3 N(0, 1))")
            diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
            print(f"wrote {path}: PyTorch f32 vs float64 {diffs}")


if __name__ == "__main__":
    main()
