#!/usr/bin/env python3
"""Whole-model bundles of diffusers' ``ControlNetModel`` and of a ControlNet driving a U-Net, the
pair a ControlNet pipeline runs at every step.

    python scripts/export_controlnet.py

Writes into ``weights/whole/``:

* ``controlnet.safetensors`` (+ ``_f16``): block ``diffusers.ControlNetModel`` on the tiny
  ``weights/models/diffusers_controlnet`` (referenced): ``forward(sample, timestep,
  encoder_hidden_states, controlnet_cond, conditioning_scale)``, outputs ``down_0`` ... (one
  residual per skip of the down path) and ``mid``; module-path stages.
* ``controlnet_bgr_pooled.safetensors``: the same weights with ``controlnet_conditioning_channel_order
  = "bgr"`` and ``global_pool_conditions = true`` (config overrides), ``conditioning_scale`` 0.7.
* ``controlnet_guess.safetensors``: the same weights with ``guess_mode=True`` (the residuals scaled
  by ``logspace(-1, 0, n) * conditioning_scale``, 0.9).
* ``controlnet_sdxl.safetensors`` (+ ``_f16``): an SDXL ControlNet (``addition_embed_type``
  "text_time"), ``weights/models/diffusers_controlnet_sdxl`` (``ControlNetModel.from_unet`` of the tiny
  SDXL U-Net, weights then seeded random), with ``text_embeds`` and ``time_ids`` as inputs.
* ``controlnet_pair.safetensors``: block ``diffusers.ControlNetPair``, a module holding
  ``controlnet`` (the model above) and ``unet`` (``weights/models/diffusers_sd1``), whose forward is
  the two calls ``StableDiffusionControlNetPipeline`` makes per step::

      down, mid = controlnet(sample, t, encoder_hidden_states, controlnet_cond, conditioning_scale, return_dict=False)
      noise_pred = unet(sample, t, encoder_hidden_states, down_block_additional_residuals=down,
                        mid_block_additional_residual=mid).sample

  self-contained (both state dicts inside, under ``controlnet.`` and ``unet.``), stages by module path
  under the two prefixes; ``controlnet_pair_small.safetensors``: another step (2 x 4 latents, scale 1.3).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from export_whole import MODELS, OUT, load, unet_class, write_bundles  # noqa: E402
from parity.export import export_bundle  # noqa: E402

BLOCK = "diffusers.ControlNetModel"
PAIR_BLOCK = "diffusers.ControlNetPair"
FOLDER = MODELS / "diffusers_controlnet"
UNET_FOLDER = MODELS / "diffusers_sd1"
# an SDXL ControlNet: ControlNetModel.from_unet of the tiny SDXL U-Net (weights/models/diffusers_sdxl)
SDXL_FOLDER = MODELS / "diffusers_controlnet_sdxl"


def controlnet_class():
    from diffusers import ControlNetModel

    class ControlNetModelInputs(ControlNetModel):
        """``ControlNetModel`` with the timestep and scale as JSON, its residuals as a flat tuple."""

        def forward(self, sample, encoder_hidden_states, controlnet_cond, text_embeds=None, time_ids=None, *,
                    timestep, conditioning_scale=1.0, guess_mode=False):
            added = None if text_embeds is None else {"text_embeds": text_embeds, "time_ids": time_ids}
            down, mid = ControlNetModel.forward(self, sample, timestep, encoder_hidden_states, controlnet_cond,
                                                conditioning_scale=conditioning_scale, guess_mode=guess_mode,
                                                added_cond_kwargs=added, return_dict=False)
            return (*down, mid)

    return ControlNetModel, ControlNetModelInputs


def inputs(model, seed, batch=1, size=(6, 4)):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    levels = len(c.conditioning_embedding_out_channels) - 1
    h, w = size
    ins = OrderedDict(
        sample=torch.randn(batch, c.in_channels, h, w, generator=g),
        encoder_hidden_states=torch.randn(batch, 7, c.cross_attention_dim, generator=g),
        controlnet_cond=torch.rand(batch, c.conditioning_channels, h << levels, w << levels, generator=g),
    )
    if c.addition_embed_type == "text_time":
        pooled = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
        ins["text_embeds"] = torch.randn(batch, pooled, generator=g)
        ins["time_ids"] = torch.tensor([[h * 8.0, w * 8.0, 0.0, 0.0, h * 8.0, w * 8.0]] * batch)
    return ins


def make_sdxl_folder(seed=9):
    """``SDXL_FOLDER``: ``ControlNetModel.from_unet`` of the tiny SDXL U-Net (its down blocks, mid block
    and ``add_embedding`` copied), a two-level conditioning embedding, every weight then seeded random
    (``from_unet``'s zero convolutions would make every residual zero)."""
    from diffusers import ControlNetModel, UNet2DConditionModel
    from parity.randomize import randomize_

    unet = UNet2DConditionModel.from_pretrained(MODELS / "diffusers_sdxl")
    torch.manual_seed(seed)
    model = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(4, 8))
    randomize_(model, seed).eval()
    model.save_pretrained(SDXL_FOLDER)
    print(f"wrote {SDXL_FOLDER}")


def output_names(model):
    n = 1 + len(model.config.down_block_types) * model.config.layers_per_block + len(model.config.down_block_types) - 1
    return [f"down_{i}" for i in range(n)] + ["mid"]


class ControlNetPair(nn.Module):
    """A ControlNet and the U-Net it drives, one step of ``StableDiffusionControlNetPipeline``."""

    def __init__(self, controlnet, unet):
        super().__init__()
        self.controlnet = controlnet
        self.unet = unet

    def forward(self, sample, encoder_hidden_states, controlnet_cond, *, timestep, conditioning_scale=1.0):
        from diffusers import ControlNetModel, UNet2DConditionModel

        down, mid = ControlNetModel.forward(self.controlnet, sample, timestep, encoder_hidden_states, controlnet_cond,
                                            conditioning_scale=conditioning_scale, return_dict=False)
        return UNet2DConditionModel.forward(self.unet, sample, timestep, encoder_hidden_states,
                                            down_block_additional_residuals=down,
                                            mid_block_additional_residual=mid, return_dict=False)[0]


def export_model(name, overrides, seed, timestep, scale, halves, guess_mode=False, folder=FOLDER):
    base, model = load(controlnet_class, folder, overrides)
    ins = inputs(model, seed)
    kwargs = {"timestep": timestep, "conditioning_scale": scale}
    if guess_mode:
        kwargs["guess_mode"] = True
    added = {"text_embeds": ins["text_embeds"], "time_ids": ins["time_ids"]} if "time_ids" in ins else None
    with torch.no_grad():
        want = base.forward(model, ins["sample"], timestep, ins["encoder_hidden_states"], ins["controlnet_cond"],
                            conditioning_scale=scale, guess_mode=guess_mode, added_cond_kwargs=added,
                            return_dict=False)
        got = model(**ins, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip((*want[0], want[1]), got)), name
    weights = folder / "diffusion_pytorch_model.safetensors"
    options = {"config": overrides} if overrides else {}
    write_bundles(name, BLOCK, model, ins, weights, OUT,
                  "ControlNetModel.forward(sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale"
                  + (", guess_mode=True)" if guess_mode else ")"),
                  options, "modules", kwargs=kwargs, halves=halves, output_names=output_names(model))


def export_pair(name, seed, timestep, scale, size):
    _, controlnet = load(controlnet_class, FOLDER)
    _, unet = load(unet_class, UNET_FOLDER)
    import diffusers

    pair = ControlNetPair(controlnet, unet).eval()
    ins = inputs(controlnet, seed, size=size)
    kwargs = {"timestep": timestep, "conditioning_scale": scale}
    config = {"controlnet": {k: v for k, v in controlnet.config.items() if not k.startswith("_")},
              "unet": {k: v for k, v in unet.config.items() if not k.startswith("_")}}
    source = (f"diffusers {diffusers.__version__} ControlNetModel.forward then UNet2DConditionModel.forward with its "
              "residuals, as StableDiffusionControlNetPipeline steps (scripts/export_controlnet.py); weights of "
              "weights/models/diffusers_controlnet and diffusers_sd1, inside the bundle")
    # float32 only: the module-path stages of two models make the bundle large, and the ControlNet's
    # half-precision twin is controlnet_f16
    for dtype, tag in ((None, ""),):
        out = OUT / f"{name}{tag}.safetensors"
        info = export_bundle(pair, PAIR_BLOCK, config, ins, out, kwargs=kwargs, trace="modules", dtype=dtype,
                             source=source if dtype is None else f"{source}; converted to f16 (.to(dtype)) and run in it")
        print(f"wrote {out}  {info['bytes']} bytes  max|out-f64| {info['max_abs_diff_f64']}")


def main() -> int:
    torch.set_num_threads(1)
    export_model("controlnet", None, seed=3, timestep=421.0, scale=1.0, halves=(torch.float16,))
    export_model("controlnet_bgr_pooled", {"controlnet_conditioning_channel_order": "bgr",
                                           "global_pool_conditions": True}, seed=4, timestep=17.0, scale=0.7, halves=())
    export_model("controlnet_guess", None, seed=7, timestep=250.0, scale=0.9, halves=(), guess_mode=True)
    make_sdxl_folder()
    export_model("controlnet_sdxl", None, seed=8, timestep=333.0, scale=1.0, halves=(torch.float16,),
                 folder=SDXL_FOLDER)
    export_pair("controlnet_pair", seed=5, timestep=701.0, scale=0.8, size=(6, 4))
    export_pair("controlnet_pair_small", seed=6, timestep=99.0, scale=1.3, size=(2, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
