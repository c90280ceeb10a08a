#!/usr/bin/env python3
"""Your own checkpoint in one command: run the real PyTorch model once, capture what its mid
block(s) receive, and write *referencing* parity bundles (with stage traces) for them.

    python scripts/export_own.py MODEL [--out DIR] [--name NAME] [--size H W] [--batch B] [--seed S]
                                 [--inputs FILE.safetensors] [--variant V] [--threads N]
    python scripts/export_own.py model-10.pt --unet-kwargs '{"dim": 64, "dim_mults": [1, 2, 4, 8]}' [--entry ema]
    python scripts/export_own.py MODEL --trace modules [--only decoder_mid_block]   # module-path stages
    python scripts/export_own.py MODEL --dtype f16      # the mid blocks run in float16 (or bf16)
    python scripts/export_own.py MODEL --whole [--dtype f16] [--size H W] [--timestep T] [--tokens N]
                                                        # the whole model, end to end

MODEL is a folder that diffusers' ``save_pretrained`` wrote (``config.json`` + the weights:
``diffusion_pytorch_model.safetensors``, its sharded index, or ``.bin``), or the weights file in
such a folder: ``UNet2DConditionModel``, ``UNet2DModel``, ``AutoencoderKL`` (both mid blocks) and
``ControlNetModel``. A denoising-diffusion-pytorch ``Trainer.save`` file (or a bare ``Unet`` state
dict) works with ``--unet-kwargs``, the ``Unet(...)`` keyword arguments it was built with. ldm /
Stable Diffusion ``.ckpt`` files and guided-diffusion state dicts are refused: those ``UNetModel``
classes are not pip packages, so there is no whole model here to run.

The model runs once on random inputs (``--seed``; the sample is sized so that the mid block sees
4 x 6 pixels unless ``--size`` says otherwise) or on ``--inputs`` (tensors named after the model's
forward parameters, ``added_cond_kwargs.<key>`` for that dict). A forward pre-hook records the
mid block's arguments and a forward hook its output. The block is then rebuilt from its block id
and the config its parent passes it (the kwargs ``scripts/export_models.py`` writes, the ones
``unet-parity detect`` derives from ``config.json``), loaded with the weights read back from the
checkpoint file, and must reproduce the in-model output bit for bit on the captured tensors. Each
bundle references the checkpoint (``parity.weights``, relative to the bundle's folder) instead
of holding the weights. Then: ``unet-parity check --trace DIR`` and ``unet-parity show BUNDLE``.

Stage traces: by default the block's named stages (``parity_trace.TRACERS``: ``resnets.0/conv1``,
``attentions.0/transformer_blocks.0/attn1/q``, ...). ``--trace modules`` records instead the
output of every submodule that runs, named by its module path (``resnets.0/norm1``,
``attentions.0/transformer_blocks.0/attn1/to_q``, a second call ``resnets.0/nonlinearity#2``; the
rules are in ``parity_trace.py``'s docstring), for a port whose forward records its submodules'
outputs under the same paths. ``--only SITE ...`` writes only those mid blocks (file-name
suffixes: ``mid_block``, ``encoder_mid_block``, ``decoder_mid_block``, ``controlnet_mid_block``).

``--whole`` (a ``UNet2DConditionModel``, ``UNet2DModel`` or ``AutoencoderKL`` folder): one bundle of the whole model
instead, ``<name>_whole.safetensors``, run end to end by diffusers on random inputs
(``scripts/export_whole.py``'s ``export_folder``): the U-Net's ``forward(sample, timestep,
encoder_hidden_states[, added_cond_kwargs])`` with ``--timestep`` (500) and a context of ``--tokens``
(7) tokens of the config's ``cross_attention_dim`` (SDXL's ``text_embeds`` and ``time_ids`` from
its config), the unconditional U-Net's ``forward(sample, timestep)``, the VAE's ``forward(sample, sample_posterior=False)`` (encode, then decode the mode) on
images in [-1, 1]; ``--size`` (default: the smallest input the model halves evenly, 2^levels x 1.5
that, not square), ``--batch`` and ``--seed`` as above. It references the checkpoint and records
every module's output under its module path (``down_blocks.0/resnets.0/norm1``, ``mid_block``,
``up_blocks.1/upsamplers.0``, ...). ``--dtype f16`` / ``bf16`` adds the self-contained twin
``<name>_whole_<dtype>.safetensors``. Then ``unet-parity check DIR`` (block ids
``diffusers.UNet2DConditionModel``, ``diffusers.AutoencoderKL``) or a ``PortCheck`` of your port.

``--dtype f16`` / ``bf16``: the model still runs in float32 to capture the mid block's inputs; the
block is then converted with ``.to(dtype)`` and run by PyTorch in that dtype on those inputs cast
to it (``export_bundle(dtype=...)``). Such a bundle holds its rounded weights itself instead of
referencing the checkpoint, and is named ``<name>_<site>_<dtype>.safetensors``; its float64 twin
starts from the same rounded weights and inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from export_models import (LUCID_MID, _per_block, build_module, capture, controlnet_mid_config,  # noqa: E402
                           unet2d_condition_mid_config, unet2d_condition_simple_cross_mid_config, unet2d_mid_config,
                           vae_mid_config)
from parity_bundle import export_bundle, load_bundle, load_checkpoint_state_dict, run_module  # noqa: E402
from reference import mid_blocks  # noqa: E402

DIFFUSERS_CLASSES = ("UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel")
WEIGHT_NAMES = ("diffusion_pytorch_model{}.safetensors", "diffusion_pytorch_model{}.safetensors.index.json",
                "diffusion_pytorch_model{}.bin")
MID_PIXELS = (4, 6)  # the mid block's default (H, W): small, not square (a transposed port fails)


class Refused(Exception):
    """Input this command cannot take: printed as one line ``error: <what>``, exit code 2."""


def brief(e: Exception) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


# --------------------------------------------------------------------------------------------
# what the user gave


def locate(model: Path, variant: str | None):
    """``("diffusers", folder, weights file, class name)`` or ``("pickle", file, None, None)``."""
    if not model.exists():
        raise Refused(f"{model}: no such file or folder")
    folder = model if model.is_dir() else model.parent
    config = folder / "config.json"
    if not config.is_file():
        if model.is_dir():
            parts = sorted(p.name for p in model.iterdir() if (p / "config.json").is_file())
            hint = (f"; a pipeline folder: give one of its model folders ({', '.join(parts)})" if parts else
                    "; give the folder save_pretrained wrote (config.json + diffusion_pytorch_model.safetensors)")
            raise Refused(f"{model}: no config.json{hint}")
        return "pickle", model, None, None
    try:
        cls = json.loads(config.read_text()).get("_class_name")
    except (ValueError, AttributeError) as e:
        raise Refused(f"{config}: not a JSON object ({e})") from None
    if cls not in DIFFUSERS_CLASSES:
        raise Refused(f"{config}: _class_name {cls!r} is not supported yet (supported: {', '.join(DIFFUSERS_CLASSES)})")
    if model.is_file():
        return "diffusers", folder, model, cls
    suffix = f".{variant}" if variant else ""
    for pattern in WEIGHT_NAMES:
        if (folder / pattern.format(suffix)).is_file():
            return "diffusers", folder, folder / pattern.format(suffix), cls
    if variant and (folder / f"diffusion_pytorch_model.safetensors.index.{variant}.json").is_file():
        raise Refused(f"{folder}: a sharded {variant} variant (diffusion_pytorch_model.safetensors.index.{variant}"
                      ".json) is not supported yet: unet-parity reads a sharded index by a name ending in .index.json")
    names = ", ".join(p.format(suffix) for p in WEIGHT_NAMES)
    raise Refused(f"{folder}: none of {names}")


def load_state(path: Path, key: str | None = None) -> "OrderedDict[str, torch.Tensor]":
    """The checkpoint's state dict as the Rust side reads it (a sharded index: every shard)."""
    if path.name.endswith(".index.json"):
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        state = OrderedDict()
        for shard in shards:
            state.update(load_checkpoint_state_dict(path.parent / shard))
        return state
    return load_checkpoint_state_dict(path, key)


# --------------------------------------------------------------------------------------------
# the mid blocks of each model class: (file suffix, block id, config, prefix, module, extra)


def sample_size(args, levels: int, what: str):
    """``(H, W)`` of the model's input: ``--size``, else the mid block at ``MID_PIXELS``."""
    f = 2 ** levels
    h, w = args.size or (MID_PIXELS[0] * f, MID_PIXELS[1] * f)
    if h % f or w % f:
        raise Refused(f"--size {h} {w}: {what} halves the image {levels} times, so both must be multiples of {f}")
    return h, w


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def timesteps(g, b):
    return torch.randint(0, 1000, (b,), generator=g)


def condition_inputs(model, args, g) -> dict:
    """Random forward arguments of a ``UNet2DConditionModel`` / ``ControlNetModel`` by its config."""
    c = model.config
    n = len(c.down_block_types)
    b = args.batch
    h, w = sample_size(args, n - 1, type(model).__name__)
    cross = _per_block(c.cross_attention_dim, n)
    if len(set(cross)) > 1:
        raise Refused(f"cross_attention_dim {list(cross)} differs per block: give encoder_hidden_states with --inputs")
    ctx_dim = cross[-1]
    hid_type = getattr(c, "encoder_hid_dim_type", None)
    if getattr(c, "encoder_hid_dim", None) is not None and hid_type in (None, "text_proj", "text_image_proj"):
        ctx_dim = c.encoder_hid_dim
    kw = dict(sample=randn(g, b, c.in_channels, h, w), timestep=timesteps(g, b),
              encoder_hidden_states=randn(g, b, 7, ctx_dim))
    added = {}
    if hid_type == "image_proj" or getattr(c, "addition_embed_type", None) in ("image", "image_hint"):
        added["image_embeds"] = randn(g, b, c.encoder_hid_dim)
    if hid_type == "text_image_proj" or getattr(c, "addition_embed_type", None) == "text_image":
        added["image_embeds"] = randn(g, b, cross[-1])
    if getattr(c, "addition_embed_type", None) == "text_image":
        added["text_embeds"] = randn(g, b, cross[-1])  # Kandinsky 2.1's pooled text embedding
    if getattr(c, "addition_embed_type", None) == "text_time":
        text = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
        added["text_embeds"] = randn(g, b, text)
        added["time_ids"] = torch.tensor([[h * 8.0, w * 8.0, 0.0, 0.0, h * 8.0, w * 8.0]] * b)
    if added:
        kw["added_cond_kwargs"] = added
    if getattr(c, "time_cond_proj_dim", None) is not None:
        kw["timestep_cond"] = randn(g, b, c.time_cond_proj_dim)
    kw.update(class_inputs(c, g, b))
    return kw


def class_inputs(c, g, b) -> dict:
    kind = getattr(c, "class_embed_type", None)
    if kind is None and getattr(c, "num_class_embeds", None) is not None:
        return {"class_labels": torch.randint(0, c.num_class_embeds, (b,), generator=g)}
    if kind == "timestep":
        return {"class_labels": timesteps(g, b)}
    if kind in ("projection", "simple_projection"):
        return {"class_labels": randn(g, b, c.projection_class_embeddings_input_dim)}
    if kind is not None:
        raise Refused(f"class_embed_type {kind!r}: give class_labels with --inputs")
    return {}


def diffusers_sites(model, cls):
    """The model's mid blocks: ``(suffix, block id, config, prefix, module)``."""
    if cls == "UNet2DModel":
        if model.mid_block is None:
            raise Refused("UNet2DModel with mid_block_type None has no mid block")
        return [("mid_block", "diffusers.UNetMidBlock2D", unet2d_mid_config(model), "mid_block.", model.mid_block)]
    if cls == "AutoencoderKL":
        return [(f"{part}_mid_block", "diffusers.UNetMidBlock2D", vae_mid_config(model, part), f"{part}.mid_block.",
                 getattr(model, part).mid_block) for part in ("encoder", "decoder")]
    if cls == "ControlNetModel":
        return [("controlnet_mid_block", "diffusers.ControlNetMidBlock", controlnet_mid_config(model), "",
                 model.mid_block)]
    kind = model.config.mid_block_type
    if kind == "UNetMidBlock2DCrossAttn":
        cfg, block = unet2d_condition_mid_config(model), "diffusers.UNetMidBlock2DCrossAttn"
    elif kind == "UNetMidBlock2DSimpleCrossAttn":
        cfg, block = unet2d_condition_simple_cross_mid_config(model), "diffusers.UNetMidBlock2DSimpleCrossAttn"
    elif kind == "UNetMidBlock2D":
        cfg, block = plain_mid_config(model), "diffusers.UNetMidBlock2D"
    else:
        raise Refused(f"UNet2DConditionModel mid_block_type {kind!r} is not supported yet")
    return [("mid_block", block, cfg, "mid_block.", model.mid_block)]


def plain_mid_config(model) -> dict:
    """``get_mid_block("UNetMidBlock2D", ...)`` of ``UNet2DConditionModel`` (diffusers 0.42.1):
    ``UNetMidBlock2D(in_channels, temb_channels, dropout, num_layers=0, resnet_eps, resnet_act_fn,
    output_scale_factor, resnet_groups, resnet_time_scale_shift, add_attention=False)``."""
    c = model.config
    return dict(in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, num_layers=0, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, resnet_groups=c.norm_num_groups,
                resnet_time_scale_shift=c.resnet_time_scale_shift, add_attention=False)


def diffusers_inputs(model, cls, args, g) -> dict:
    c = model.config
    b = args.batch
    if cls == "UNet2DModel":
        h, w = sample_size(args, len(c.down_block_types) - 1, cls)
        kw = dict(sample=randn(g, b, c.in_channels, h, w), timestep=timesteps(g, b))
        kw.update(class_inputs(c, g, b))
        return kw
    if cls == "AutoencoderKL":
        h, w = sample_size(args, len(c.down_block_types) - 1, cls)
        return dict(sample=randn(g, b, c.in_channels, h, w))
    kw = condition_inputs(model, args, g)
    if cls == "ControlNetModel":
        h, w = kw["sample"].shape[-2:]
        f = 2 ** (len(c.conditioning_embedding_out_channels) - 1)
        kw["controlnet_cond"] = randn(g, b, c.conditioning_channels, h * f, w * f)
        kw["return_dict"] = False
    return kw


def user_inputs(path: Path, kw: dict) -> dict:
    """``--inputs``: the file's tensors replace or add forward arguments (``added_cond_kwargs.<key>``
    goes into that dict)."""
    from safetensors.torch import load_file

    try:
        given = load_file(os.fspath(path))
    except Exception as e:  # noqa: BLE001 (safetensors raises several types)
        raise Refused(f"{path}: not a readable safetensors file ({e})") from None
    for name, t in given.items():
        if name.startswith("added_cond_kwargs."):
            kw.setdefault("added_cond_kwargs", {})[name.split(".", 1)[1]] = t
        else:
            kw[name] = t
    return kw


def describe_inputs(kw: dict) -> str:
    parts = []
    for k, v in kw.items():
        if isinstance(v, dict):
            parts += [f"{k}.{kk} {tuple(vv.shape)}" for kk, vv in v.items()]
        elif isinstance(v, torch.Tensor):
            parts.append(f"{k} {tuple(v.shape)}" if v.numel() > 8 else f"{k} {v.tolist()}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# lucidrains denoising-diffusion-pytorch


def lucidrains_plan(path: Path, args):
    """``(model, run, sites, key)`` for a ``Trainer.save`` file or a bare ``Unet`` state dict."""
    if not args.unet_kwargs:
        raise Refused(f"{path}: a denoising-diffusion-pytorch checkpoint: give --unet-kwargs with the Unet(...) "
                      "keyword arguments it was built with (the file does not hold them)")
    from denoising_diffusion_pytorch import Unet

    top = torch.load(path, map_location="cpu", weights_only=True)
    key, prefix = None, ""
    if any(k in top for k in ("model", "ema")):
        key = args.entry or ("ema" if "ema" in top else "model")
        if key not in top:
            raise Refused(f"{path}: no entry {key!r} (entries: {', '.join(map(str, top))})")
        prefix = "ema_model.model." if key == "ema" else "model."
    elif args.entry:
        raise Refused(f"{path}: --entry {args.entry}: the file is a bare state dict")
    state = load_checkpoint_state_dict(path, key)
    try:
        # JSON lists are the tuples Unet's signature shows (dim_mults, attn_heads, ...)
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.unet_kwargs).items()}
        unet = Unet(**kwargs)
        unet.load_state_dict(OrderedDict((k[len(prefix):], v) for k, v in state.items() if k.startswith(prefix)))
    except (TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise Refused(f"{path}: Unet(**--unet-kwargs) does not load {key or 'the state dict'}: {brief(e)}") from None
    unet.eval()
    g = torch.Generator().manual_seed(args.seed)
    h, w = sample_size(args, len(unet.downs) - 1, "Unet")
    x, time = randn(g, args.batch, unet.channels, h, w), timesteps(g, args.batch)
    if args.inputs:
        kw = user_inputs(args.inputs, {"x": x, "time": time})
        x, time = kw["x"], kw["time"]
    what = describe_inputs({"x": x, "time": time})
    site = ("mid_block", "denoising_diffusion_pytorch.MidBlock", mid_blocks.LucidrainsMidBlock.config_of(unet), prefix,
            unet)
    return unet, (lambda: unet(x, time)), [site], key, what


def lucidrains_capture(unet, run):
    ins, _ = capture(unet.mid_block1, run, names={"t": "time_emb"})
    _, out = capture(unet.mid_block2, run)
    return ins, (out,)


# --------------------------------------------------------------------------------------------
# checkpoints with no model to run


def pickle_kind(path: Path) -> str:
    """What a checkpoint without ``config.json`` holds, by its keys: ``lucidrains`` or a refusal."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(os.fspath(path), framework="pt") as f:
                top = {k: None for k in f.keys()}
        else:
            top = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 (a torch.load of a stranger's file raises anything)
        raise Refused(f"{path}: not a readable checkpoint ({brief(e)})") from None
    if not isinstance(top, dict):
        raise Refused(f"{path}: the top level is a {type(top).__name__}, not a state dict")
    keys = [str(k) for k in top]
    for entry in ("state_dict", "model", "ema"):
        if isinstance(top.get(entry), dict):
            keys += [f"{entry}/{k}" for k in top[entry]]
    restated = ("ldm and guided-diffusion are not pip packages, so there is no whole model here to run and capture "
                "the block's real inputs from; write a bundle with parity_bundle.export_bundle instead (docs/exporting.md: "
                "Exporting your own PyTorch module)")
    if any("model.diffusion_model." in k or "first_stage_model." in k for k in keys):
        raise Refused(f"{path}: an ldm / Stable Diffusion checkpoint (model.diffusion_model.*): not supported yet: "
                      "convert it to diffusers folders (diffusers' from_single_file, then save_pretrained) and give "
                      "the unet or vae folder, or: " + restated)
    if any("middle_block." in k for k in keys):
        raise Refused(f"{path}: a guided-diffusion / ldm UNetModel state dict (middle_block.*): not supported yet: "
                      + restated)
    if any(k.split("/")[-1].startswith("mid.block_1.") for k in keys):
        raise Refused(f"{path}: an ldm DDPM / VAE Model state dict (mid.block_1.*): not supported yet: " + restated)
    if any("mid_block1." in k for k in keys):
        return "lucidrains"
    if any("mid_block." in k for k in keys):
        raise Refused(f"{path}: diffusers weights without their config.json: give the folder save_pretrained wrote")
    raise Refused(f"{path}: no mid block this command knows (diffusers mid_block.*, lucidrains mid_block1.*)")


# --------------------------------------------------------------------------------------------
# capture, check, write


def captured_site(model, run, site, cls):
    """The site's bundle inputs, expected outputs and forward kwargs, captured from the whole run."""
    suffix, block, cfg, prefix, module = site
    if block == "denoising_diffusion_pytorch.MidBlock":
        ins, expected = lucidrains_capture(module, run)
        return ins, expected, None
    ins, out = capture(module, run)
    kwargs = None
    if cls == "ControlNetModel":
        # the model's mid_block_res_sample; its forward's conditioning_scale is left at 1.0
        with torch.no_grad():
            res = run()[1]
        expected, kwargs = (res, out), {"conditioning_scale": 1.0}
    else:
        expected = (out,)
    odd = [k for k, v in ins.items() if v is not None and not isinstance(v, torch.Tensor)]
    if odd:
        raise Refused(f"{suffix}: the model passed the mid block non-tensor arguments {odd} (not supported yet)")
    if isinstance(ins.get("temb"), torch.Tensor) and "temb_channels" in cfg:
        # the width the block really gets (class_embeddings_concat doubles the time embedding)
        cfg["temb_channels"] = int(ins["temb"].shape[-1])
    return OrderedDict((k, v) for k, v in ins.items() if isinstance(v, torch.Tensor)), expected, kwargs


def rebuilt(block, cfg, weights: Path, key, prefix):
    """The block from block id + config, with its weights read back from the checkpoint file."""
    module = build_module(block, cfg)
    state = load_state(weights, key)
    missing = [prefix + k for k in module.state_dict() if prefix + k not in state]
    if missing:
        raise Refused(f"{weights}: the {block} built from the config needs {missing[:3]}, which the file lacks "
                      "(the config and the weights disagree)")
    module.load_state_dict(OrderedDict((k, state[prefix + k]) for k in module.state_dict()), strict=True)
    return module.eval()


DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def export_site(site, ins, expected, kwargs, weights: Path, key, out: Path, source: str, trace="named",
                dtype="f32"):
    suffix, block, cfg, prefix, _ = site
    module = rebuilt(block, cfg, weights, key, prefix)
    got = list(run_module(module, ins, kwargs).values())
    if len(got) != len(expected) or not all(torch.equal(a, b) for a, b in zip(got, expected)):
        d = max(float((a - b).abs().max()) for a, b in zip(got, expected))
        raise Refused(f"{suffix}: the {block} rebuilt from {json.dumps(cfg)} differs from the model's own mid block "
                      f"by {d:.3e} on the captured inputs (a config this command derives wrongly: please report it)")
    strided = [k for k, v in ins.items() if not v.is_contiguous()]
    if strided:
        source += (f"; the model passed {', '.join(strided)} non-contiguous, stored contiguous with PyTorch's output "
                   "on the contiguous copy")
    out.parent.mkdir(parents=True, exist_ok=True)
    if dtype != "f32":
        return export_half(module, block, cfg, ins, kwargs, out, source, trace, dtype)
    rel = os.path.relpath(weights.resolve(), out.parent.resolve()).replace(os.sep, "/")
    ref = (rel, prefix) if key is None else (rel, prefix, key)
    contiguous = OrderedDict((k, v.contiguous()) for k, v in ins.items())
    info = export_bundle(module, block, cfg, contiguous, out, kwargs=kwargs, weights_ref=ref,
                         trace=True if trace == "named" else trace,
                         source=f"{source}; weights {rel} prefix {prefix!r}" + (f" entry {key!r}" if key else ""))
    # the reference resolves from where the bundle lies, and gives back the stored outputs
    back = load_bundle(out)
    again = run_module(rebuilt(block, back["config"], out.parent / back["weights_ref"][0], key, prefix),
                       OrderedDict((k, v.clone()) for k, v in back["inputs"].items()), back["kwargs"])
    assert all(torch.equal(again[n], back["expected"][n]) for n in back["expected"]), out
    return info


def export_half(module, block, cfg, ins, kwargs, out: Path, source: str, trace, dtype):
    """The float32 block converted to ``dtype`` (f16 / bf16) and run by PyTorch in it on the captured
    inputs cast to it, as a *self-contained* bundle: it holds the block's weights in ``dtype``
    (the rounded weights PyTorch ran, which the checkpoint does not hold) and, as every half
    bundle, the float64 copy's outputs and stages started from those rounded weights."""
    contiguous = OrderedDict((k, v.contiguous()) for k, v in ins.items())
    return export_bundle(module, block, cfg, contiguous, out, kwargs=kwargs, dtype=DTYPES[dtype],
                         trace=True if trace == "named" else trace,
                         source=f"{source}; the float32 block converted to {DTYPES[dtype]} (.to(dtype)) and run in it")


def fresh_copies_(model):
    """Give every parameter and buffer a freshly allocated copy, as the rebuilt block's are:
    ``from_pretrained`` leaves them as views into the file's bytes at arbitrary offsets, where
    PyTorch's CPU kernels can round the last bit differently (the values are the same)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.data = t.data.clone()
    return model.eval()


def diffusers_plan(folder: Path, weights: Path, cls: str, args):
    import diffusers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    try:
        model = getattr(diffusers, cls).from_pretrained(folder, torch_dtype=torch.float32, variant=args.variant,
                                                        use_safetensors=weights.name.endswith((".safetensors",
                                                                                               ".index.json")))
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        raise Refused(f"{folder}: {cls}.from_pretrained fails: {brief(e)}") from None
    fresh_copies_(model)
    kw = diffusers_inputs(model, cls, args, torch.Generator().manual_seed(args.seed))
    if args.inputs:
        kw = user_inputs(args.inputs, kw)
    what = describe_inputs(kw)
    return model, (lambda: model(**kw)), diffusers_sites(model, cls), None, what


def export_whole_model(kind, folder, weights, cls, args) -> int:
    """``--whole``: the whole model's bundles (``export_whole.export_folder``)."""
    from export_whole import export_folder

    if kind != "diffusers" or cls not in ("UNet2DConditionModel", "UNet2DModel", "AutoencoderKL"):
        raise Refused(f"{args.model}: --whole takes a UNet2DConditionModel, UNet2DModel or AutoencoderKL folder (found "
                      f"{cls or 'a pickle'}); its mid blocks: leave out --whole")
    if args.inputs or args.only or args.trace != "named":
        raise Refused("--whole makes its own inputs and records every module (leave out --inputs, --only, --trace)")
    if args.tokens < 1:
        raise Refused(f"--tokens {args.tokens}: at least 1")
    name = args.name or folder.name
    try:
        written = export_folder(folder, weights, cls, args.out, name, batch=args.batch,
                                size=tuple(args.size) if args.size else None, timestep=args.timestep, seed=args.seed,
                                tokens=args.tokens, dtype=args.dtype)
    except Exception as e:  # noqa: BLE001 (the model's own forward on inputs it rejects)
        raise Refused(f"{args.model}: the whole {cls} fails on the inputs: {brief(e)}") from None
    print(f"next: cargo run --release -p unet-parity -- check --trace {' '.join(str(w) for w in written)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="a diffusers model folder (or its weights file), or a lucidrains .pt")
    ap.add_argument("--out", type=Path, default=Path("parity_bundles"), help="folder for the bundles (parity_bundles)")
    ap.add_argument("--name", help="file name stem (default: the model folder's or file's name)")
    ap.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="the model's input sample size")
    ap.add_argument("--batch", type=int, default=2, help="batch size of the random inputs (2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")
    ap.add_argument("--inputs", type=Path, help="safetensors file of forward arguments replacing the random ones")
    ap.add_argument("--variant", help="diffusers weight variant (diffusion_pytorch_model.<variant>.safetensors)")
    ap.add_argument("--unet-kwargs", help="lucidrains: JSON of the Unet(...) keyword arguments")
    ap.add_argument("--entry", choices=("model", "ema"), help="lucidrains Trainer file: which weights (default ema)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: byte-reproducible files)")
    ap.add_argument("--trace", choices=("named", "modules"), default="named",
                    help="stage traces: the block's named stages (q, k, v, probs, ...; default), or 'modules': every "
                    "submodule's output under its module path (resnets.0/norm1, ...; parity_trace.py's rules)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="f32",
                    help="the dtype PyTorch runs the mid block in (f32, the default; f16 or bf16: the block converted "
                    "with .to(dtype) on the captured inputs cast to it, a self-contained bundle holding the rounded "
                    "weights, named <name>_<site>_<dtype>.safetensors)")
    ap.add_argument("--whole", action="store_true",
                    help="one bundle of the whole model (UNet2DConditionModel or AutoencoderKL), end to end, with "
                    "module-path stages, instead of its mid blocks")
    ap.add_argument("--timestep", type=float, default=500.0, help="--whole U-Net: the timestep (500)")
    ap.add_argument("--tokens", type=int, default=7, help="--whole U-Net: context tokens (7)")
    ap.add_argument("--only", nargs="+", metavar="SITE",
                    help="only these mid blocks, by file-name suffix (e.g. decoder_mid_block of an AutoencoderKL)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    try:
        if args.batch < 1:
            raise Refused(f"--batch {args.batch}: at least 1")
        kind, where, weights, cls = locate(args.model, args.variant)
        if args.whole:
            return export_whole_model(kind, where, weights, cls, args)
        if kind == "diffusers":
            model, run, sites, key, what = diffusers_plan(where, weights, cls, args)
        else:
            pickle_kind(where)
            weights, cls = where, "lucidrains Unet"
            model, run, sites, key, what = lucidrains_plan(where, args)
        name = args.name or (where.name if kind == "diffusers" else where.stem)
        if args.only:
            unknown = sorted(set(args.only) - {site[0] for site in sites})
            if unknown:
                raise Refused(f"--only {' '.join(unknown)}: this {cls} has {', '.join(site[0] for site in sites)}")
            sites = [site for site in sites if site[0] in args.only]
        written = []
        for site in sites:
            try:
                ins, expected, kwargs = captured_site(model, run, site, cls)
            except Refused:
                raise
            except Exception as e:  # noqa: BLE001 (the model's own forward on inputs it rejects)
                raise Refused(f"{args.model}: the {cls} forward fails on the inputs ({what}): {brief(e)}; give "
                              "your own with --inputs FILE.safetensors") from None
            source = site_source(site, cls, what)
            tag = "" if args.dtype == "f32" else f"_{args.dtype}"
            out = args.out / f"{name}_{site[0]}{tag}.safetensors"
            info = export_site(site, ins, expected, kwargs, weights, key, out, source, args.trace, args.dtype)
            diffs = ", ".join(f"{k} {v:.2e}" for k, v in info["max_abs_diff_f64"].items())
            shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in ins.items())
            print(f"wrote {out} ({info['bytes']} B) {site[1]} inputs [{shapes}] prefix {site[3]!r} "
                  f"max|{args.dtype}-f64| {diffs}")
            written.append(out)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"next: unet-parity check --trace {args.out}    (and unet-parity show {written[0]} --out pictures)")
    return 0


def site_source(site, cls, what) -> str:
    suffix, block, _, prefix, _ = site
    if block == "denoising_diffusion_pytorch.MidBlock":
        return f"{LUCID_MID}; captured from the whole Unet by scripts/export_own.py on {what}"
    return (f"real diffusers class {block.split('.')[1]}: the {prefix.rstrip('.') or 'mid block'} of the whole {cls}, "
            f"inputs captured by a forward pre-hook by scripts/export_own.py while the model ran on {what}")


if __name__ == "__main__":
    sys.exit(main())
