#!/usr/bin/env python3
"""Whole-model bundles of the Annotated Diffusion post's ``Unet`` (huggingface/blog
``annotated-diffusion.md`` at fd0b6566b04f; re-stated in ``scripts/reference/annotated_diffusion.py``).

    python scripts/export_annotated_unet.py

Writes into ``weights/whole/`` (seeded random weights inside each bundle, module-path stages):

* ``annotated_unet_fashion.safetensors``: the post's own configuration scaled down
  (``channels=1, dim_mults=(1, 2, 4)``, its Fashion-MNIST model, with ``dim=4``) on ``x`` (1, 1, 8, 8);
* ``annotated_unet_selfcond.safetensors``: ``self_condition`` with ``x_self_cond`` given, ``out_dim``,
  ``resnet_block_groups=2``, RGB, two stages, two timesteps in a batch of two.

(The attention blocks are 4 heads of 32 whatever ``dim``, as in the post, so the stages of their
384-channel ``to_qkv`` dominate a bundle's size: the inputs are kept small.)

The post's ``WeightStandardizedConv2d`` takes eps from the input's dtype (1e-5 for float32, 1e-3
otherwise), so each bundle's float64 twin runs its convs with float32's eps (``scripts/parity/
float64.py``), the twin of the float32 run. Each export also runs the model with the standardized
weight multiplied by the rsqrt (lucidrains' own class, which the post's line is not) and prints how
far that moves the output: a port that "fixes" the post's line fails by that much.
``time`` is a float tensor (a bundle's inputs are floating point); the post's sampling loop passes
integer timesteps, which the embedding turns into the same float32 values. No half-precision twins:
the post's ``Unet`` does not run in half precision (its time embedding is float32 whatever the
weights, and the first ``Linear`` refuses it).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from parity.export import export_bundle  # noqa: E402
from parity.randomize import randomize_  # noqa: E402
from reference import annotated_diffusion  # noqa: E402

REPO = HERE.parent
OUT = REPO / "weights" / "whole"
BLOCK = "annotated_diffusion.Unet"
SOURCE = ("Annotated Diffusion Unet.forward(x, time, x_self_cond) (huggingface/blog annotated-diffusion.md "
          "fd0b6566b04f, re-stated in scripts/reference/annotated_diffusion.py; scripts/export_annotated_unet.py); "
          "seeded random weights inside the bundle")

SPECS = {
    "fashion": (dict(dim=4, channels=1, dim_mults=(1, 2, 4)), (1, 1, 8, 8), [640.0], False),
    "selfcond": (dict(dim=4, out_dim=5, dim_mults=(1, 2), self_condition=True, resnet_block_groups=2),
                 (2, 3, 4, 4), [0.0, 250.0], True),
}


def json_config(config):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def times_rsqrt_forward(self, x):
    """Weight standardization with the rsqrt multiplied, as lucidrains' class computes it."""
    eps = 1e-5 if x.dtype == torch.float32 else 1e-3
    w = self.weight
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
    return F.conv2d(x, (w - mean) * (var + eps).rsqrt(), self.bias, self.stride, self.padding, self.dilation,
                    self.groups)


def times_rsqrt_effect(model, ins):
    """max |output(post) - output(rsqrt multiplied)| on ``ins``."""
    with torch.no_grad():
        post = model(*ins.values())
        cls = annotated_diffusion.WeightStandardizedConv2d
        published = cls.forward
        cls.forward = times_rsqrt_forward
        try:
            fixed = model(*ins.values())
        finally:
            cls.forward = published
    return (post - fixed).abs().max().item(), post.abs().max().item()


def main() -> int:
    torch.set_num_threads(1)
    for i, (name, (config, shape, time, give_cond)) in enumerate(SPECS.items()):
        torch.manual_seed(0)
        model = randomize_(annotated_diffusion.Unet(**config), 7410 + i).eval()
        g = torch.Generator().manual_seed(7420 + i)
        ins = OrderedDict(x=torch.randn(*shape, generator=g), time=torch.tensor(time))
        if give_cond:
            ins["x_self_cond"] = torch.randn(*shape, generator=g)
        out = OUT / f"annotated_unet_{name}.safetensors"
        info = export_bundle(model, BLOCK, json_config(config), ins, out, trace="modules", source=SOURCE)
        moved, scale = times_rsqrt_effect(model, ins)
        print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}  "
              f"rsqrt multiplied moves the output by {moved:.3g} (max |output| {scale:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
