#!/usr/bin/env python3
"""Whole-model bundles of lucidrains' ``denoising_diffusion_pytorch.Unet`` (2.3.4).

    python scripts/export_lucidrains_unet.py

Writes into ``weights/whole/``:

* ``lucidrains_unet_model.safetensors`` / ``lucidrains_unet_ema.safetensors``: the ``Unet`` of the
  committed ``Trainer.save`` checkpoint ``weights/models/lucidrains_ddpm/model-1.pt`` (``dim=6,
  dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8)``; its ``model`` entry under ``model.``,
  its EMA under ``ema_model.model.``), referenced, on ``x`` (1, 3, 8, 12) and ``time`` [71];
* ``lucidrains_unet_selfcond.safetensors``: ``self_condition``, learned sinusoidal time features,
  ``full_attn=(False, True, True)``, ``flash_attn``, three stages, with ``x_self_cond`` given;
* ``lucidrains_unet_fourier.safetensors``: random Fourier features, ``init_dim``, ``out_dim``, two
  channels, full attention everywhere, per-stage heads;
* ``lucidrains_unet_theta.safetensors``: ``sinusoidal_pos_emb_theta=100``, ``self_condition``
  without ``x_self_cond`` (zeros), ``learned_variance``.

The last three are self-contained (seeded random weights inside). All carry module-path stages.
``time`` is a float tensor (a bundle's inputs are floating point): ``GaussianDiffusion`` passes
integer timesteps, which the embedding turns into the same float32 values.
No half-precision twins: PyTorch's ``Unet`` does not run in half precision (its sinusoidal
embedding is float32 whatever the weights, and the first ``Linear`` refuses it).
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from parity.export import export_bundle  # noqa: E402
from parity.randomize import randomize_  # noqa: E402

REPO = HERE.parent
OUT = REPO / "weights" / "whole"
CHECKPOINT = REPO / "weights" / "models" / "lucidrains_ddpm" / "model-1.pt"
BLOCK = "denoising_diffusion_pytorch.Unet"
COMMITTED = dict(dim=6, dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8))


def cast_embedding_input(module, args):
    """The sinusoidal embedding is float32 whatever the weights: the float64 twin takes it as
    float32 values in float64 (as diffusers' ``time_proj(t).to(dtype)``)."""
    return tuple(a.to(module.weight.dtype) for a in args)


def unet(**config):
    from denoising_diffusion_pytorch import Unet

    model = Unet(**config).eval()
    model.time_mlp[1].register_forward_pre_hook(cast_embedding_input)
    return model


def json_config(config):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def source(what):
    from denoising_diffusion_pytorch.version import __version__

    return f"denoising-diffusion-pytorch {__version__} Unet.forward(x, time, x_self_cond) (scripts/export_lucidrains_unet.py); {what}"


def export(name, model, config, ins, what, weights_ref=None):
    out = OUT / f"{name}.safetensors"
    info = export_bundle(model, BLOCK, json_config(config), ins, out, trace="modules", source=source(what),
                         weights_ref=weights_ref)
    print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}")


def committed():
    data = torch.load(CHECKPOINT, map_location="cpu", weights_only=True)
    g = torch.Generator().manual_seed(7311)
    ins = OrderedDict(x=torch.randn(1, 3, 8, 12, generator=g), time=torch.tensor([71.0]))
    rel = os.path.relpath(CHECKPOINT, OUT).replace(os.sep, "/")
    for entry, prefix in (("model", "model."), ("ema", "ema_model.model.")):
        model = unet(**COMMITTED)
        state = {k[len(prefix):]: v for k, v in data[entry].items() if k.startswith(prefix)}
        model.load_state_dict(state)
        export(f"lucidrains_unet_{entry}", model, COMMITTED, ins,
               f"weights {rel}, entry '{entry}' under {prefix} (Trainer.save)", weights_ref=(rel, prefix))


def variants():
    specs = {
        "selfcond": (dict(dim=8, dim_mults=(1, 2, 2), self_condition=True, learned_sinusoidal_cond=True,
                          full_attn=(False, True, True), flash_attn=True, attn_heads=2, attn_dim_head=8),
                     (1, 3, 8, 8), [500], True),
        "fourier": (dict(dim=8, init_dim=12, out_dim=5, channels=2, dim_mults=(1, 2), random_fourier_features=True,
                         learned_sinusoidal_dim=10, full_attn=True, attn_heads=(1, 2), attn_dim_head=(8, 4)),
                    (2, 2, 4, 6), [0, 999], False),
        "theta": (dict(dim=8, dim_mults=(1, 2), sinusoidal_pos_emb_theta=100, self_condition=True,
                       learned_variance=True, attn_heads=(1, 2), attn_dim_head=(4, 4)),
                  (1, 3, 4, 4), [250], False),
    }
    for i, (name, (config, shape, time, give_cond)) in enumerate(specs.items()):
        torch.manual_seed(0)
        model = randomize_(unet(**config), 7320 + i).eval()
        g = torch.Generator().manual_seed(7330 + i)
        ins = OrderedDict(x=torch.randn(*shape, generator=g), time=torch.tensor(time, dtype=torch.float32))
        if give_cond:
            ins["x_self_cond"] = torch.randn(*shape, generator=g)
        export(f"lucidrains_unet_{name}", model, config, ins, "seeded random weights inside the bundle")


def main() -> int:
    torch.set_num_threads(1)
    committed()
    variants()
    return 0


if __name__ == "__main__":
    sys.exit(main())
