#!/usr/bin/env python3
"""Whole-model parity bundles: diffusers 0.42.1 ``UNet2DConditionModel`` and ``AutoencoderKL`` run end
to end on tiny inputs, for ``unet-parity check weights/whole`` (block ids
``diffusers.UNet2DConditionModel``, ``diffusers.AutoencoderKL``).

    python scripts/export_whole.py [--only NAME ...] [--threads N]

Your own folder (any ``UNet2DConditionModel`` or ``AutoencoderKL`` that diffusers'
``save_pretrained`` wrote): ``python scripts/export_own.py FOLDER --whole`` calls
:func:`export_folder` here (see that script's docs).

For each tiny committed model in ``weights/models/`` (``diffusers_sd1``, ``diffusers_sd2``,
``diffusers_sdxl``; ``diffusers_sd1_g32`` with its 32 groups and loaded with 16) it writes
``weights/whole/<model>_unet.safetensors``: a float32 bundle that
*references* the model's ``diffusion_pytorch_model.safetensors`` (``parity.weights``, prefix ``""``)
with module-path stages (``trace="modules"``: ``conv_in``, ``time_embedding/linear_1``,
``down_blocks.0/resnets.0/norm1``, ``down_blocks.0``, ``mid_block``, ``up_blocks.1/upsamplers.0``,
..., each attention's core ``.../attn1/q``, ``probs``), so that a port gets its first divergent
module; and ``<model>_unet_f16.safetensors``, the same model converted with ``.to(float16)`` and run
by PyTorch in float16 on the same inputs (self-contained: it holds the rounded weights).

``diffusers_vae`` gives ``weights/whole/vae.safetensors`` (and ``vae_f16``): ``AutoencoderKL.forward(sample,
sample_posterior=False)``, that is ``decode(encode(sample).latent_dist.mode())``, on images in [-1, 1] at
batch 2, with the stages ``encoder/...``, ``quant_conv``, ``post_quant_conv``, ``decoder/...``;
``diffusers_vae_g32`` (widths 32, 64) gives ``vae_g32`` and, loaded with 16 groups, ``vae_g16``.

The U-Net's forward is diffusers' own ``UNet2DConditionModel.forward``; only its arguments are repacked
(``export_bundle`` stores tensors as inputs and JSON as kwargs): the model's class is swapped for
a subclass whose ``forward(sample, encoder_hidden_states, text_embeds=None, time_ids=None, *,
timestep)`` calls ``UNet2DConditionModel.forward(sample, timestep, encoder_hidden_states,
added_cond_kwargs={"text_embeds", "time_ids"} (SDXL), return_dict=False)[0]``. The module tree, and
so every module path and state-dict key, is the model's. ``timestep`` is a Python float
(``parity.kwargs``), which diffusers makes a float64 tensor and its ``Timesteps`` rounds to float32,
as candle-transformers' ``forward(xs, timestep: f64, ...)`` takes it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from parity_bundle import export_bundle  # noqa: E402

ROOT = HERE.parent
MODELS = ROOT / "weights" / "models"
OUT = ROOT / "weights" / "whole"
BLOCK = "diffusers.UNet2DConditionModel"
VAE_BLOCK = "diffusers.AutoencoderKL"
UNET2D_BLOCK = "diffusers.UNet2DModel"

# name -> (model folder, batch, (H, W), timestep, seed[, options]). sd2's 5 x 3 sample is not a
# multiple of 2^upsamplers: the up blocks then interpolate to the skip's size (forward_upsample_size).
# options: "config" overrides config.json's values when loading (``from_pretrained(**config)``; the
# bundle then stores the overridden config and references the same weights), "half": False leaves
# out the f16 twin (it holds its own rounded weights: 1.6 MB for the 32-group U-Net).
SPECS = {
    "sd1_unet": ("diffusers_sd1", 2, (6, 4), 999.0, 0),
    "sd2_unet": ("diffusers_sd2", 2, (5, 3), 1.0, 1),
    "sdxl_unet": ("diffusers_sdxl", 2, (4, 6), 500.5, 2),
    # widths divisible by 32, for candle-transformers' whole U-Net (examples/candle_transformers.rs)
    "sd1_g32_unet": ("diffusers_sd1_g32", 2, (2, 4), 999.0, 3, {"half": False}),
    # the same weights with 16 groups: candle-transformers' DownBlock2D / UpBlock2D keep 32
    "sd1_g16_unet": ("diffusers_sd1_g32", 2, (2, 4), 999.0, 4, {"half": False, "config": {"norm_num_groups": 16}}),
}

# name -> (model folder, batch, (H, W), seed[, options as SPECS']): AutoencoderKL forward bundles.
VAE_SPECS = {
    "vae": ("diffusers_vae", 2, (8, 6), 3),
    # widths divisible by 32, for candle-transformers' whole AutoEncoderKL (examples/candle_transformers.rs)
    "vae_g32": ("diffusers_vae_g32", 2, (4, 6), 5, {"half": False}),
    # the same weights with 16 groups
    "vae_g16": ("diffusers_vae_g32", 2, (4, 6), 6, {"half": False, "config": {"norm_num_groups": 16}}),
}


# name -> (model folder, batch, (H, W), timestep, seed): UNet2DModel forward bundles (the unconditional
# DDPM / LDM U-Net). A fractional timestep shows diffusers' truncation to an integer.
UNET2D_SPECS = {
    "unet2d": ("diffusers_unet2d", 2, (6, 10), 421.9, 7),
    "unet2d_scale_shift": ("diffusers_unet2d_scale_shift", 2, (8, 4), 17.0, 8),
    # The DDPM scripts/digits_ddpm.py trained on scikit-learn's digits: trained weights, at the first timestep of a
    # sampling loop (the input is pure noise there, as in sampling); float32 only (UNet2DModel's half twins are unet2d_f16).
    "digits_ddpm": ("digits_ddpm", 1, (16, 16), 999.0, 11, {"half": False}),
}


def unet2d_class():
    from diffusers import UNet2DModel

    class UNet2DModelInputs(UNet2DModel):
        """``UNet2DModel`` with the timestep as JSON (a Python number, as a sampling loop passes it)."""

        def forward(self, sample, *, timestep):
            return UNet2DModel.forward(self, sample, timestep, return_dict=False)[0]

    return UNet2DModel, UNet2DModelInputs


def write_unet2d(name, base, model, batch, size, timestep, seed, weights, out_dir, options, trace,
                 halves=(torch.float16,), f32=True):
    """The unconditional U-Net's bundles (:func:`write_bundles`), its wrapper checked to be diffusers' own."""
    g = torch.Generator().manual_seed(seed)
    ins = OrderedDict(sample=torch.randn(batch, model.config.in_channels, *size, generator=g))
    kwargs = {"timestep": timestep}
    with torch.no_grad():
        want = base.forward(model, ins["sample"], timestep, return_dict=False)[0]
        got = model(**ins, **kwargs)
    assert torch.equal(want, got), name
    return write_bundles(name, UNET2D_BLOCK, model, ins, weights, out_dir, "UNet2DModel.forward(sample, timestep)",
                         options, trace, kwargs=kwargs, halves=halves, f32=f32)


def export_unet2d(name, spec, trace="modules"):
    folder, batch, size, timestep, seed, *rest = spec
    options = rest[0] if rest else {}
    base, model = load(unet2d_class, MODELS / folder, options.get("config"))
    weights = MODELS / folder / "diffusion_pytorch_model.safetensors"
    write_unet2d(name, base, model, batch, size, timestep, seed, weights, OUT, options, trace)


def unet_class():
    from diffusers import UNet2DConditionModel

    class UNet2DConditionModelInputs(UNet2DConditionModel):
        """``UNet2DConditionModel`` with its forward's arguments as tensors and JSON (see the module docs)."""

        def forward(self, sample, encoder_hidden_states, text_embeds=None, time_ids=None, *, timestep):
            added = None
            if text_embeds is not None or time_ids is not None:
                added = {"text_embeds": text_embeds, "time_ids": time_ids}
            return UNet2DConditionModel.forward(self, sample, timestep, encoder_hidden_states,
                                                added_cond_kwargs=added, return_dict=False)[0]

    return UNet2DConditionModel, UNet2DConditionModelInputs


def load(classes, folder: Path, overrides=None):
    """``(base, model)``: the model of ``folder`` (``overrides`` replacing config.json values, checked), with
    fresh storage as export_own.py's fresh_copies_, its class swapped for the wrapper of ``classes``."""
    base, wrapped = classes()
    model = base.from_pretrained(folder, **(overrides or {})).eval()
    for k, v in (overrides or {}).items():
        assert model.config[k] == v, (folder, k)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.data = t.data.clone()
    model.__class__ = wrapped
    return base, model


HALF_TAGS = {torch.float16: "f16", torch.bfloat16: "bf16"}


def write_bundles(name, block, model, ins, weights, out_dir, forward, options, trace, kwargs=None,
                  halves=(torch.float16,), f32=True, output_names=None):
    """The float32 bundle ``<name>`` (referencing the checkpoint ``weights``, relative to ``out_dir``) unless
    ``f32`` is false and, unless ``options["half"]`` is false, its half-precision twins ``<name>_f16`` /
    ``<name>_bf16`` for the dtypes ``halves`` (self-contained: they hold the rounded weights), of ``model`` on
    ``ins``; ``forward`` names the PyTorch forward in the bundles' ``source``. Returns the files written."""
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    out_dir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(weights, out_dir).replace(os.sep, "/")
    import diffusers

    source = (f"diffusers {diffusers.__version__} {forward} (scripts/export_whole.py); weights {rel}"
              + "".join(f"; loaded with {k}={v!r} (config.json overridden)" for k, v in options.get("config", {}).items()))
    written = []
    if f32:
        out = out_dir / f"{name}.safetensors"
        info = export_bundle(model, block, config, ins, out, kwargs=kwargs, weights_ref=(rel, ""), trace=trace,
                             source=source, output_names=output_names)
        print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}")
        written.append(out)
    if not options.get("half", True):
        return written
    for dtype in halves:
        tag = HALF_TAGS[dtype]
        half = out_dir / f"{name}_{tag}.safetensors"
        info = export_bundle(model, block, config, ins, half, kwargs=kwargs, dtype=dtype, trace=trace,
                             source=f"{source}; the float32 model converted to {tag} (.to(dtype)) and run in it",
                             output_names=output_names)
        print(f"wrote {half}  {info['bytes']} bytes  max|{tag}-f64| {info['max_abs_diff_f64']}")
        written.append(half)
    return written


def inputs(model, batch, size, seed, tokens=7):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    cross = c.cross_attention_dim if isinstance(c.cross_attention_dim, int) else c.cross_attention_dim[-1]
    ins = OrderedDict(sample=torch.randn(batch, c.in_channels, *size, generator=g),
                      encoder_hidden_states=torch.randn(batch, tokens, cross, generator=g))
    if c.addition_embed_type == "text_time":
        text = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
        ins["text_embeds"] = torch.randn(batch, text, generator=g)
        h, w = size
        ins["time_ids"] = torch.tensor([[h * 8.0, w * 8.0, 0.0, 0.0, h * 8.0, w * 8.0]] * batch)
    return ins


def export(name, spec, trace="modules"):
    folder, batch, size, timestep, seed, *rest = spec
    options = rest[0] if rest else {}
    base, model = load(unet_class, MODELS / folder, options.get("config"))
    ins = inputs(model, batch, size, seed)
    weights = MODELS / folder / "diffusion_pytorch_model.safetensors"
    write_unet(name, base, model, ins, timestep, weights, OUT, options, trace)


def write_unet(name, base, model, ins, timestep, weights, out_dir, options, trace, halves=(torch.float16,), f32=True):
    """The U-Net's bundles (:func:`write_bundles`) once the repacked forward is checked to be diffusers' own."""
    kwargs = {"timestep": timestep}
    # the repacked forward is diffusers' own, bit for bit
    with torch.no_grad():
        added = None
        if "text_embeds" in ins:
            added = {"text_embeds": ins["text_embeds"], "time_ids": ins["time_ids"]}
        want = base.forward(model, ins["sample"], timestep, ins["encoder_hidden_states"], added_cond_kwargs=added,
                            return_dict=False)[0]
        got = model(**ins, **kwargs)
    assert torch.equal(want, got), name
    return write_bundles(name, BLOCK, model, ins, weights, out_dir, "UNet2DConditionModel.forward, arguments repacked",
                         options, trace, kwargs=kwargs, halves=halves, f32=f32)


def vae_class():
    from diffusers import AutoencoderKL

    class AutoencoderKLOutput(AutoencoderKL):
        """``AutoencoderKL`` whose forward returns the decoded tensor (``sample_posterior=False``)."""

        def forward(self, sample):
            return AutoencoderKL.forward(self, sample, sample_posterior=False, return_dict=False)[0]

    return AutoencoderKL, AutoencoderKLOutput


def export_vae(name, spec, trace="modules"):
    folder, batch, size, seed, *rest = spec
    options = rest[0] if rest else {}
    base, model = load(vae_class, MODELS / folder, options.get("config"))
    weights = MODELS / folder / "diffusion_pytorch_model.safetensors"
    write_vae(name, base, model, batch, size, seed, weights, OUT, options, trace)


def write_vae(name, base, model, batch, size, seed, weights, out_dir, options, trace, halves=(torch.float16,), f32=True):
    """The VAE's bundles on images in [-1, 1] (:func:`write_bundles`), its wrapper checked to be diffusers'
    own forward."""
    g = torch.Generator().manual_seed(seed)
    ins = OrderedDict(sample=torch.rand(batch, model.config.in_channels, *size, generator=g) * 2 - 1)
    with torch.no_grad():
        want = base.forward(model, ins["sample"], sample_posterior=False, return_dict=False)[0]
        got = model(**ins)
    assert torch.equal(want, got), name
    return write_bundles(name, VAE_BLOCK, model, ins, weights, out_dir, "AutoencoderKL.forward(sample_posterior=False)",
                         options, trace, halves=halves, f32=f32)


def export_folder(folder, weights, cls, out_dir, name, *, batch=2, size=None, timestep=500.0, seed=0, tokens=7,
                  dtype="f32", trace="modules"):
    """Whole-model bundles of any diffusers ``UNet2DConditionModel`` / ``AutoencoderKL`` folder: the float32
    bundle ``<name>_whole`` referencing ``weights`` (module-path stages), and with ``dtype`` f16 / bf16 the
    self-contained ``<name>_whole_<dtype>`` twin too. ``size``: the input's (H, W), by default the smallest
    the model halves evenly (2^levels x 1.5 times that, not square). Returns the files written."""
    halves = {"f32": (), "f16": (torch.float16,), "bf16": (torch.bfloat16,)}[dtype]
    levels = len(json_config(folder)["block_out_channels"]) - 1
    if size is None:
        f = 2 ** levels
        size = (2 * f, 3 * f)
    stem = f"{name}_whole"
    if cls == "UNet2DConditionModel":
        base, model = load(unet_class, folder)
        ins = inputs(model, batch, size, seed, tokens)
        return write_unet(stem, base, model, ins, timestep, weights, out_dir, {}, trace, halves=halves)
    if cls == "AutoencoderKL":
        base, model = load(vae_class, folder)
        return write_vae(stem, base, model, batch, size, seed, weights, out_dir, {}, trace, halves=halves)
    if cls == "UNet2DModel":
        base, model = load(unet2d_class, folder)
        return write_unet2d(stem, base, model, batch, size, timestep, seed, weights, out_dir, {}, trace, halves=halves)
    raise ValueError(f"whole-model bundles: UNet2DConditionModel, UNet2DModel or AutoencoderKL, not {cls}")


def json_config(folder):
    import json

    return json.loads((Path(folder) / "config.json").read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=sorted(SPECS) + sorted(VAE_SPECS) + sorted(UNET2D_SPECS))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name in args.only or sorted(SPECS) + sorted(VAE_SPECS) + sorted(UNET2D_SPECS):
        if name in VAE_SPECS:
            export_vae(name, VAE_SPECS[name])
        elif name in UNET2D_SPECS:
            export_unet2d(name, UNET2D_SPECS[name])
        else:
            export(name, SPECS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
