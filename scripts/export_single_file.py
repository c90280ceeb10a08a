#!/usr/bin/env python3
"""Single-file checkpoints in the original ``ldm`` layout, written by the real ``ldm`` code
(stable-diffusion-sdkit 2.1.5: Stability's stablediffusion tree), and their whole-model bundles.

    python scripts/export_single_file.py

Writes into ``weights/single_file/``:

* ``sd1_tiny.safetensors``: an SD 1.x-style checkpoint as ``LatentDiffusion.state_dict()`` lays it
  out: ``model.diffusion_model.*`` (a tiny ``ldm.modules.diffusionmodules.openaimodel.UNetModel``:
  conv projections, ``num_heads``, two res blocks a level, ``first_stage_model.*`` (a tiny
  ``ldm.models.autoencoder.AutoencoderKL``) and two ``cond_stage_model.*`` tensors standing for the
  text encoder (a loader of the U-Net or the VAE reads neither).
* ``sd2_tiny.ckpt``: an SD 2.x-style checkpoint (linear projections, ``num_head_channels``, one res
  block a level, attention at both levels) saved as ``torch.save({"state_dict": ..., "global_step":
  0})``, as the original training code saves it.
* ``<name>.yaml.json``: the ``original_config`` each stands for (the ``model.params`` of an ldm
  inference YAML, as JSON), and ``<name>.unet.json`` / ``<name>.vae.json``: the diffusers configs
  diffusers 0.42.1 derives from it (``create_unet_diffusers_config_from_ldm`` and
  ``create_vae_diffusers_config_from_ldm``), which the Rust conversion must equal.
* ``sdxl_tiny.safetensors``: an SDXL-style U-Net (Stability's ``sgm`` layout, ``label_emb`` for the
  added conditions, attention from the second level with ``transformer_depth`` per level, a
  1280-wide context so that diffusers reads it as SDXL), and ``sdxl_tiny.yaml.json`` /
  ``sdxl_tiny.unet.json`` as above. No ``sgm`` package is installable here, so the file is written
  from a diffusers ``UNet2DConditionModel`` of the config diffusers derives from the YAML, its keys
  renamed to sgm's (``ldm_unet_key``); diffusers' own ``from_single_file`` must read back every
  tensor bit for bit (asserted), which is what ties the layout to sgm's. ``sdxl_base`` /
  ``sdxl_refiner`` ``.yaml.json`` / ``.unet.json``: the full-size SDXL configs (Stability's YAMLs'
  ``network_config.params``) and what diffusers derives from them, for the Rust presets to equal. Its bundle
  (``single_sdxl_tiny_unet``) is diffusers' forward with ``added_cond_kwargs`` (sgm's conditioner
  makes the U-Net's ``y`` from the same pooled text embedding and six size / crop numbers), its
  module-path stages renamed from diffusers' paths to sgm's through the same key map
  (``ldm_stage``: the stages sgm has no module for, ``time_proj``, are dropped).
* ``weights/whole/single_<name>_unet.safetensors`` / ``single_<name>_vae.safetensors``: whole-model bundles
  (blocks ``ldm.UNetModel``, ``ldm.AutoencoderKL``): the real ldm forward on seeded inputs, the
  ldm kwargs as config, the weights referenced in the single file under their prefix, stages by
  ldm's module paths (the Rust run records its diffusers stages under them: ``unet_stage``). Each model is
  also loaded by diffusers' own ``from_single_file`` (with the ``original_config``): its output is
  asserted to be ldm's within float32 rounding, and recorded in the bundle's source.
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from parity.export import export_bundle  # noqa: E402
from parity.randomize import randomize_  # noqa: E402

REPO = HERE.parent
OUT = REPO / "weights" / "single_file"
WHOLE = REPO / "weights" / "whole"
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."

# model.params.unet_config.params of an ldm inference YAML (v1-inference.yaml / v2-inference.yaml shapes, tiny)
# (32 channels at least: ldm's normalization() is GroupNorm(32) throughout; transformer_depth 1 as in SD 1.x / 2.x:
# sdkit's SpatialTransformer indexes its context per layer, so deeper ones need a list of contexts)
UNETS = {
    "sd1_tiny": dict(image_size=8, in_channels=4, out_channels=4, model_channels=32, attention_resolutions=[1],
                     num_res_blocks=2, channel_mult=[1, 2], num_heads=2, use_spatial_transformer=True,
                     transformer_depth=1, context_dim=24, use_checkpoint=False, legacy=False),
    "sd2_tiny": dict(image_size=8, in_channels=4, out_channels=4, model_channels=32, attention_resolutions=[2, 1],
                     num_res_blocks=1, channel_mult=[1, 1], num_head_channels=16, use_spatial_transformer=True,
                     use_linear_in_transformer=True, transformer_depth=1, context_dim=40, use_checkpoint=False,
                     legacy=False),
}
# sgm's UNetModel kwargs (sd_xl_base.yaml's network_config.params, tiny): SDXL's layout at 32 channels; the context
# stays 1280 wide (diffusers reads "sequential" classes as SDXL's text_time only with a 2048- or 1280-wide context)
SDXL_POOLED = 16
SDXL = dict(adm_in_channels=SDXL_POOLED + 6 * 256, num_classes="sequential", use_checkpoint=False, in_channels=4,
            out_channels=4, model_channels=32, attention_resolutions=[2], num_res_blocks=1, channel_mult=[1, 1],
            num_head_channels=16, use_linear_in_transformer=True, transformer_depth=[1, 2], context_dim=1280,
            spatial_transformer_attn_type="softmax-xformers", legacy=False)
SDXL_SCALE_FACTOR = 0.13025
# network_config.params of Stability's generative-models configs/inference/sd_xl_base.yaml (an earlier revision,
# with ldm's use_spatial_transformer and legacy) and sd_xl_refiner.yaml (a later one, without): the full-size
# configs diffusers derives from them are written as sdxl_base.unet.json / sdxl_refiner.unet.json
SDXL_BASE = dict(adm_in_channels=2816, num_classes="sequential", use_checkpoint=True, in_channels=4, out_channels=4,
                 model_channels=320, attention_resolutions=[4, 2], num_res_blocks=2, channel_mult=[1, 2, 4],
                 num_head_channels=64, use_spatial_transformer=True, use_linear_in_transformer=True,
                 transformer_depth=[1, 2, 10], context_dim=2048, spatial_transformer_attn_type="softmax-xformers",
                 legacy=False)
SDXL_REFINER = dict(adm_in_channels=2560, num_classes="sequential", use_checkpoint=True, in_channels=4,
                    out_channels=4, model_channels=384, attention_resolutions=[4, 2], num_res_blocks=2,
                    channel_mult=[1, 2, 4, 4], num_head_channels=64, use_linear_in_transformer=True,
                    transformer_depth=4, context_dim=[1280, 1280, 1280, 1280],
                    spatial_transformer_attn_type="softmax-xformers")
# model.params.first_stage_config.params.ddconfig (+ embed_dim), SD's with fewer, narrower levels
VAE = dict(double_z=True, z_channels=4, resolution=16, in_channels=3, out_ch=3, ch=32, ch_mult=[1, 1], num_res_blocks=1,
           attn_resolutions=[], dropout=0.0)
SCALE_FACTOR = 0.18215


def original_config(unet_params):
    return {"model": {"params": {"scale_factor": SCALE_FACTOR, "unet_config": {"params": unet_params},
                                 "first_stage_config": {"params": {"embed_dim": 4, "ddconfig": VAE}}}}}


def sdxl_original_config(params):
    return {"model": {"params": {"scale_factor": SDXL_SCALE_FACTOR, "network_config": {"params": params},
                                 "first_stage_config": {"params": {"embed_dim": 4, "ddconfig": VAE}}}}}


RESNET_KEYS = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
               "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}


def ldm_unet_key(name, params):
    """The sgm / ldm key of the diffusers U-Net weight ``name`` (diffusers' ``convert_ldm_unet_checkpoint``
    read backwards; diffusers' ``from_single_file`` checks the result)."""
    n = params["num_res_blocks"] + 1
    parts = name.split(".")
    head, rest = parts[0], parts[1:]
    resnet = lambda r: [RESNET_KEYS[r[0]], *r[1:]]  # noqa: E731
    if head in ("time_embedding", "add_embedding"):
        base = "time_embed" if head == "time_embedding" else "label_emb.0"
        return ".".join([base, {"linear_1": "0", "linear_2": "2"}[rest[0]], *rest[1:]])
    if head in ("conv_in", "conv_norm_out", "conv_out"):
        return ".".join([{"conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}[head], *rest])
    if head == "down_blocks":
        b, part = int(rest[0]), rest[1]
        if part == "downsamplers":
            return ".".join([f"input_blocks.{(b + 1) * n}.0.op", *rest[4:]])
        block = 1 + b * n + int(rest[2])
        if part == "resnets":
            return ".".join([f"input_blocks.{block}.0", *resnet(rest[3:])])
        return ".".join([f"input_blocks.{block}.1", *rest[3:]])
    if head == "mid_block":
        i = int(rest[1])
        if rest[0] == "resnets":
            return ".".join([f"middle_block.{2 * i}", *resnet(rest[2:])])
        return ".".join(["middle_block.1", *rest[2:]])
    if head == "up_blocks":
        b, part = int(rest[0]), rest[1]
        if part == "upsamplers":
            level = len(params["channel_mult"]) - 1 - b
            slot = 2 if 2 ** level in params["attention_resolutions"] else 1
            return ".".join([f"output_blocks.{b * n + n - 1}.{slot}.conv", *rest[4:]])
        block = b * n + int(rest[2])
        if part == "resnets":
            return ".".join([f"output_blocks.{block}.0", *resnet(rest[3:])])
        return ".".join([f"output_blocks.{block}.1", *rest[3:]])
    raise KeyError(name)


def ldm_stage(stage, params):
    """The sgm / ldm module-path stage of the diffusers stage ``stage`` (``down_blocks.1/resnets.0``
    -> ``input_blocks.4.0``), or ``None`` where sgm has no module for it (``time_proj``): a stage's
    module found through the key map of one of its weights, as the Rust side names its stages
    (``single_file::unet_stage``)."""
    from parity.trace_modules import module_stage_name

    path = stage.replace("/", ".")
    wholes = {"time_embedding": "time_embed", "mid_block": "middle_block"}
    if path in wholes:
        return wholes[path]
    for child, ldm_child in ((".weight", ".weight"), (".norm1.weight", ".in_layers.0.weight"),
                             (".conv.weight", ".op.weight"), (".conv.weight", ".conv.weight")):
        try:
            key = ldm_unet_key(path + child, params)
        except (KeyError, ValueError, IndexError):
            continue
        if key.endswith(ldm_child):
            return module_stage_name(key[: -len(ldm_child)])
    return None


def rename_stages_(path, params):
    """The module-path stages of the bundle at ``path`` (diffusers' module paths) renamed to sgm's
    (``ldm_stage``); the ones without an sgm module dropped."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    names, out = [], {k: v for k, v in tensors.items() if not k.startswith("parity.trace.")}
    for name in json.loads(meta["parity.trace"]):
        new = "output" if name == "output" else ldm_stage(name, params)
        if new is None or new in names:
            continue
        names.append(new)
        for suffix in ("", ".float64_delta"):
            if f"parity.trace.{name}{suffix}" in tensors:
                out[f"parity.trace.{new}{suffix}"] = tensors[f"parity.trace.{name}{suffix}"]
    meta["parity.trace"] = json.dumps(names)
    save_file(out, str(path), metadata=meta)
    return len(names)


def ldm_unet_class():
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    class UNetModelInputs(UNetModel):
        """ldm's ``UNetModel`` with the timestep as JSON: ``forward(x, timesteps, context)`` with
        ``timesteps = torch.full((batch,), timestep, dtype=long)``, as a sampler passes it."""

        def forward(self, x, context, *, timestep):
            t = torch.full((x.shape[0],), int(timestep), dtype=torch.long)
            return UNetModel.forward(self, x, t, context)

    return UNetModel, UNetModelInputs


def ldm_vae_class():
    # ldm.models.autoencoder imports pytorch_lightning for its training loop only; the module is a
    # LightningModule subclass whose forward / encode / decode are plain torch.
    if "pytorch_lightning" not in sys.modules:
        sys.modules["pytorch_lightning"] = types.SimpleNamespace(LightningModule=nn.Module)
    from ldm.models.autoencoder import AutoencoderKL

    class AutoencoderKLOutput(AutoencoderKL):
        """ldm's ``AutoencoderKL.forward(input, sample_posterior=False)``'s reconstruction."""

        def forward(self, sample):
            return AutoencoderKL.forward(self, sample, sample_posterior=False)[0]

    return AutoencoderKL, AutoencoderKLOutput


def to_f16_values_(model):
    """Round every weight to float16 and back: the checkpoint is stored in float16, as most
    published single files are, and the float32 reference runs on exactly those values."""
    with torch.no_grad():
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.copy_(p.half().float())
    return model


def cast_embedding_input(module, args):
    """ldm's ``timestep_embedding`` is float32 whatever the model's dtype: the float64 twin takes it
    as diffusers' ``time_proj(t).to(dtype)`` does."""
    return tuple(a.to(module[0].weight.dtype) for a in args)


def build_unet(params, seed):
    _, cls = ldm_unet_class()
    model = cls(**params)
    model.time_embed.register_forward_pre_hook(cast_embedding_input)
    return to_f16_values_(randomize_(model, seed)).eval()


def float64_dtype(model):
    """``UNetModel.forward`` casts its input to ``self.dtype`` (float32 unless ``use_fp16``)."""
    model.dtype = torch.float64


def build_vae(seed):
    _, cls = ldm_vae_class()
    model = cls(ddconfig=VAE, lossconfig={"target": "torch.nn.Identity"}, embed_dim=4)
    return to_f16_values_(randomize_(model, seed)).eval()


def state_with_prefix(module, prefix):
    """The module's state dict under ``prefix``, floating tensors in float16."""
    return OrderedDict((prefix + k, (v.half() if v.is_floating_point() else v).detach().clone().contiguous())
                       for k, v in module.state_dict().items())


def diffusers_unet(path, params):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel.from_single_file(str(path), original_config=original_config(params),
                                                torch_dtype=torch.float32).eval()


def diffusers_vae(path, params):
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_single_file(str(path), original_config=original_config(params),
                                          torch_dtype=torch.float32).eval()


def derived_configs(params):
    from diffusers.loaders.single_file_utils import (create_unet_diffusers_config_from_ldm,
                                                     create_vae_diffusers_config_from_ldm)

    cfg = original_config(params)
    unet = create_unet_diffusers_config_from_ldm(cfg, {}, image_size=None)
    vae = create_vae_diffusers_config_from_ldm(cfg, {}, image_size=None)
    return unet, vae


def write_unet_bundle(name, model, params, weights, seed):
    g = torch.Generator().manual_seed(seed)
    # small inputs: the module-path stages of every submodule make up most of the bundle
    x = torch.randn(1, params["in_channels"], 4, 4, generator=g)
    width = params["context_dim"] if isinstance(params["context_dim"], int) else params["context_dim"][0]
    ctx = torch.randn(1, 7, width, generator=g)
    timestep = 421.0
    with torch.no_grad():
        want = model(x, ctx, timestep=timestep)
        theirs = diffusers_unet(weights, params)(x, timestep, ctx, return_dict=False)[0]
    diff = (want - theirs).abs().max().item()
    assert diff < 1e-4 * max(1.0, want.abs().max().item()), f"{name}: diffusers' from_single_file is {diff} from ldm"
    rel = os.path.relpath(weights, WHOLE).replace(os.sep, "/")
    import diffusers
    source = (f"ldm (stable-diffusion-sdkit 2.1.5) UNetModel.forward(x, timesteps, context) "
              f"(scripts/export_single_file.py); weights {rel} under {UNET_PREFIX}; diffusers {diffusers.__version__} "
              f"UNet2DConditionModel.from_single_file on the same file: max |diff| {diff:.2e} from ldm")
    out = WHOLE / f"single_{name}_unet.safetensors"
    info = export_bundle(model, "ldm.UNetModel", params, OrderedDict(x=x, context=ctx), out,
                         kwargs={"timestep": timestep}, weights_ref=(rel, UNET_PREFIX), trace="modules", source=source,
                         prepare_float64=float64_dtype)
    print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}  diffusers vs ldm {diff:.2e}")


def write_vae_bundle(name, model, params, weights, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, 3, 8, 4, generator=g) * 2 - 1
    with torch.no_grad():
        want = model(x)
        theirs = diffusers_vae(weights, params)(x, sample_posterior=False, return_dict=False)[0]
    diff = (want - theirs).abs().max().item()
    assert diff < 1e-4, f"{name}: diffusers' from_single_file VAE is {diff} from ldm"
    rel = os.path.relpath(weights, WHOLE).replace(os.sep, "/")
    import diffusers
    config = dict(ddconfig=VAE, embed_dim=4, scale_factor=SCALE_FACTOR)
    source = (f"ldm (stable-diffusion-sdkit 2.1.5) AutoencoderKL.forward(input, sample_posterior=False)[0] "
              f"(scripts/export_single_file.py); weights {rel} under {VAE_PREFIX}; diffusers {diffusers.__version__} "
              f"AutoencoderKL.from_single_file on the same file: max |diff| {diff:.2e} from ldm")
    out = WHOLE / f"single_{name}_vae.safetensors"
    info = export_bundle(model, "ldm.AutoencoderKL", config, OrderedDict(sample=x), out,
                         weights_ref=(rel, VAE_PREFIX), trace="modules", source=source)
    print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}  diffusers vs ldm {diff:.2e}")


def write_sdxl(seed=17):
    """``sdxl_tiny.safetensors``, its configs and its bundle (see the module docs)."""
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import create_unet_diffusers_config_from_ldm
    from safetensors.torch import save_file

    for name, params in (("sdxl_base", SDXL_BASE), ("sdxl_refiner", SDXL_REFINER)):
        full = sdxl_original_config(params)
        (OUT / f"{name}.yaml.json").write_text(json.dumps(full, indent=2) + "\n")
        derived = create_unet_diffusers_config_from_ldm(full, {}, image_size=None)
        (OUT / f"{name}.unet.json").write_text(json.dumps(derived, indent=2) + "\n")
    cfg = sdxl_original_config(SDXL)
    derived = create_unet_diffusers_config_from_ldm(cfg, {}, image_size=None)
    model = to_f16_values_(randomize_(UNet2DConditionModel(**derived), seed)).eval()
    state = OrderedDict((UNET_PREFIX + ldm_unet_key(k, SDXL), v.half().contiguous())
                        for k, v in model.state_dict().items())
    g = torch.Generator().manual_seed(seed)
    # the two text encoders' place (sgm's conditioner): keys a U-Net loader leaves alone
    state["conditioner.embedders.0.transformer.text_model.final_layer_norm.weight"] = torch.randn(24, generator=g)
    state["conditioner.embedders.1.model.ln_final.weight"] = torch.randn(24, generator=g)
    path = OUT / "sdxl_tiny.safetensors"
    save_file(state, path)
    print(f"wrote {path}  {path.stat().st_size} bytes")
    (OUT / "sdxl_tiny.yaml.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (OUT / "sdxl_tiny.unet.json").write_text(json.dumps(derived, indent=2) + "\n")
    theirs = UNet2DConditionModel.from_single_file(str(path), original_config=cfg, torch_dtype=torch.float32).eval()
    ours, read = model.state_dict(), theirs.state_dict()
    assert ours.keys() == read.keys(), sorted(set(ours) ^ set(read))[:5]
    for k, v in ours.items():
        assert torch.equal(v, read[k]), f"diffusers' from_single_file reads {k} otherwise"

    class SdxlUNetInputs(UNet2DConditionModel):
        """diffusers' forward under sgm's input names: ``forward(x, context, text_embeds, time_ids, *,
        timestep)``."""

        def forward(self, x, context, text_embeds, time_ids, *, timestep):
            added = {"text_embeds": text_embeds, "time_ids": time_ids}
            return UNet2DConditionModel.forward(self, x, timestep, context, added_cond_kwargs=added,
                                                return_dict=False)[0]

    theirs.__class__ = SdxlUNetInputs
    x = torch.randn(1, 4, 4, 4, generator=g)
    ins = OrderedDict(x=x, context=torch.randn(1, 7, SDXL["context_dim"], generator=g),
                      text_embeds=torch.randn(1, SDXL_POOLED, generator=g),
                      time_ids=torch.tensor([[32.0, 32.0, 0.0, 0.0, 32.0, 32.0]]))
    rel = os.path.relpath(path, WHOLE).replace(os.sep, "/")
    import diffusers
    source = (f"diffusers {diffusers.__version__} UNet2DConditionModel.from_single_file({rel}, original_config="
              f"sdxl_tiny.yaml.json).forward(x, timestep, context, added_cond_kwargs=text_embeds / time_ids), every "
              f"tensor read back bit for bit (scripts/export_single_file.py); weights under {UNET_PREFIX}")
    out = WHOLE / "single_sdxl_tiny_unet.safetensors"
    info = export_bundle(theirs, "ldm.UNetModel", SDXL, ins, out, kwargs={"timestep": 421.0},
                         weights_ref=(rel, UNET_PREFIX), trace="modules", source=source)
    stages = rename_stages_(out, SDXL)
    print(f"wrote {out}  {info['bytes']} bytes  max|f32-f64| {info['max_abs_diff_f64']}  {stages} stages")


def main() -> int:
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for i, (name, params) in enumerate(UNETS.items()):
        unet = build_unet(params, seed=10 + i)
        vae = build_vae(seed=60 + i)
        state = state_with_prefix(unet, UNET_PREFIX)
        state.update(state_with_prefix(vae, VAE_PREFIX))
        g = torch.Generator().manual_seed(30 + i)
        # the text encoder's place: keys a U-Net or VAE loader leaves alone
        state["cond_stage_model.transformer.text_model.embeddings.position_ids"] = torch.arange(7)[None]
        state["cond_stage_model.transformer.text_model.final_layer_norm.weight"] = torch.randn(24, generator=g)
        if name == "sd1_tiny":
            path = OUT / f"{name}.safetensors"
            save_file(state, path)
        else:
            path = OUT / f"{name}.ckpt"
            torch.save({"state_dict": state, "global_step": 0}, path)
        print(f"wrote {path}  {path.stat().st_size} bytes")
        (OUT / f"{name}.yaml.json").write_text(json.dumps(original_config(params), indent=2) + "\n")
        unet_cfg, vae_cfg = derived_configs(params)
        (OUT / f"{name}.unet.json").write_text(json.dumps(unet_cfg, indent=2) + "\n")
        (OUT / f"{name}.vae.json").write_text(json.dumps(vae_cfg, indent=2) + "\n")
        write_unet_bundle(name, unet, params, path, seed=40 + i)
        write_vae_bundle(name, vae, params, path, seed=50 + i)
    write_sdxl()
    return 0


if __name__ == "__main__":
    sys.exit(main())
