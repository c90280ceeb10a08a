"""Templates: every block configuration the project exports, as a recipe for fresh bundles.

Two sources, both the project's own:

* the attention bundles of ``attention_bundles.specs.bundle_specs()`` (every float32 spec, plus
  the half-only ``..._nomask`` substitute and the large-activation VAE attention), built with
  ``attention_bundles.blocks.build_module``; their inputs are the spec's ``make_inputs`` (masks and
  aliasing, e.g. MultiheadAttention's ``key is value``, included);
* the mid-block bundles of ``export/`` (``weights/mid/*.safetensors``, float32 ones): those are
  captured inside whole small models, so the template reads the block id, config, forward kwargs
  and input tensors back from the committed bundle's header and inputs (no whole model is
  rebuilt) and builds the block with ``export.blocks.build_module`` (the same constructor the
  exporter and its re-check use). Duplicates (the ``_ref`` twin of a self-contained bundle) are
  dropped.

``Template.half`` says how the block runs in float16 / bfloat16: ``"to"`` (``module.to(dtype)``),
``"convert"`` (guided-diffusion's ``convert_to_fp16`` form, ``convert_convs_to_half_``: PyTorch's
CPU GroupNorm32 rejects a half weight) or ``None`` (no half form: ``attention_bundles.half``'s
``HALF_REJECTED`` and ldm's SpatialTransformer middle block, see ``export.bundles.half_twin``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from parity.run import flatten_list_inputs

MID_DIR = Path(__file__).resolve().parent.parent.parent / "weights" / "mid"


@dataclass
class Template:
    """One block configuration: how to build it, its forward inputs (float32 / bool / int
    tensors, list inputs flattened to ``name.0``, ...), kwargs and half-precision form."""

    name: str
    block: str
    config: dict
    source: str
    kwargs: dict | None
    inputs: "OrderedDict[str, torch.Tensor]"
    half: str | None
    kind: str                      # "attention", "mid" or "whole"
    state_keys: tuple = ()
    half_input_dtypes: dict | None = field(default=None)
    half_rejected: str | None = None
    # a model folder whose trained weights the bundles keep (not randomized: the generator's
    # ``randomize_`` is skipped for these; weight conditions still change them)
    trained: Path | None = None

    @property
    def family(self) -> str:
        return self.block.split(".")[0]

    def build(self) -> nn.Module:
        """The block in float32 with its constructor's weights (randomize them afterwards)."""
        if self.kind == "attention":
            from attention_bundles.blocks import build_module

            return build_module(self.block, self.config, self.state_keys, self.source)
        if self.kind == "ddpm":
            return build_ddpm(self.block, self.config)
        if self.kind == "whole":
            model = build_whole(self.block, self.config)
            if self.trained is not None:
                from safetensors.torch import load_file

                model.load_state_dict(load_file(self.trained / "diffusion_pytorch_model.safetensors"))
            return model
        from export.blocks import build_module

        return build_module(self.block, self.config)

    def matches(self, tokens) -> bool:
        """``--families``: a token equal to the block id or its family (``diffusers``, ``ldm``,
        ``openai``, ``torch``, ...), or a substring of the template name."""
        return any(t == self.block or t == self.family or t in self.name for t in tokens)


def attention_templates() -> list[Template]:
    from attention_bundles.half import HALF_CONVERT_TO_FP16, HALF_REJECTED
    from attention_bundles.specs import bundle_specs

    out = []
    for spec in bundle_specs():
        if spec.get("rejected"):
            continue
        stem = spec["path"][: -len(".safetensors")]
        if spec.get("dtype") is not None:
            # a half twin: a template of its own only where no float32 spec has its configuration
            if not stem.endswith("_f16") or not (stem.endswith("_nomask_f16") or spec.get("large_activations")):
                continue
            stem = stem[: -len("_f16")]
        if stem in HALF_CONVERT_TO_FP16 or spec["block"] == "openai.AttentionBlock":
            half = "convert"
        elif stem in HALF_REJECTED:
            half = None
        else:
            half = "to"
        gen = torch.Generator().manual_seed(spec["seed"] + 100_000)
        inputs = flatten_list_inputs(spec["make_inputs"](gen))
        keys = ("qkv.weight",) if spec.get("fused") else ()
        out.append(Template(name=f"attn:{stem}", block=spec["block"], config=dict(spec["config"]),
                            source=spec["source"] or "", kwargs=spec["kwargs"], inputs=OrderedDict(inputs),
                            half=half, kind="attention", state_keys=keys))
    return out


def _mid_half(block: str, config: dict):
    """(half form, input dtypes in the half form) of a mid block (``export.bundles.half_twin``)."""
    if block != "openai.MiddleBlock":
        return "to", None
    if config.get("use_spatial_transformer"):
        return None, None
    return "convert", {"emb": torch.float32}


def mid_templates(folder: Path = MID_DIR) -> list[Template]:
    from safetensors import safe_open

    out, seen = [], set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            if meta.get("parity.dtype") != "float32":
                continue
            names = json.loads(meta["parity.inputs"])
            inputs = OrderedDict((n, f.get_tensor(f"parity.input.{n}")) for n in names)
        block, config = meta["parity.block"], json.loads(meta["parity.config"])
        kwargs = json.loads(meta["parity.kwargs"]) if "parity.kwargs" in meta else None
        key = (block, json.dumps(config, sort_keys=True), json.dumps(kwargs, sort_keys=True),
               tuple((n, tuple(t.shape)) for n, t in inputs.items()))
        if key in seen:
            continue
        seen.add(key)
        half, half_dtypes = _mid_half(block, config)
        out.append(Template(name=f"mid:{path.stem}", block=block, config=config, source=meta.get("parity.source", ""),
                            kwargs=kwargs, inputs=inputs, half=half, kind="mid", half_input_dtypes=half_dtypes))
    return out


WHOLE_MODELS = (("diffusers_sd1", "diffusers.UNet2DConditionModel"), ("diffusers_sd2", "diffusers.UNet2DConditionModel"),
                ("diffusers_sdxl", "diffusers.UNet2DConditionModel"), ("diffusers_vae", "diffusers.AutoencoderKL"),
                ("diffusers_unet2d", "diffusers.UNet2DModel"), ("digits_ddpm", "diffusers.UNet2DModel"))
# whole models whose committed weights are trained (scripts/digits_ddpm.py): their bundles keep them
TRAINED = {"digits_ddpm"}


def build_whole(block: str, config: dict) -> nn.Module:
    """A whole model from its config with export_whole.py's forward (arguments as tensors and JSON)."""
    from export_whole import BLOCK, UNET2D_BLOCK, unet2d_class, unet_class, vae_class

    base, wrapped = {BLOCK: unet_class, UNET2D_BLOCK: unet2d_class}.get(block, vae_class)()
    model = base.from_config(config)
    model.__class__ = wrapped
    return model


def whole_templates(folder: Path = MID_DIR.parent / "models") -> list[Template]:
    """The whole models of ``weights/whole/`` (the tiny SD 1.x / 2.x / XL U-Nets, the VAE, UNet2DModel
    and the trained digits DDPM, whose weights are kept), rebuilt from their folders' config.json,
    inputs as ``scripts/export_whole.py`` makes them."""
    from export_whole import inputs as unet_inputs

    out = []
    for name, block in WHOLE_MODELS:
        config = {k: v for k, v in json.loads((folder / name / "config.json").read_text()).items()
                  if not k.startswith("_")}
        model = build_whole(block, config)
        if block == "diffusers.AutoencoderKL":
            g = torch.Generator().manual_seed(0)
            ins = OrderedDict(sample=torch.rand(2, config["in_channels"], 8, 6, generator=g) * 2 - 1)
            kwargs = None
        elif block == "diffusers.UNet2DModel":
            # pure noise, as a sampling loop's input (the generator draws the timestep)
            g = torch.Generator().manual_seed(0)
            size = (16, 16) if name in TRAINED else (6, 4)
            ins, kwargs = OrderedDict(sample=torch.randn(2, config["in_channels"], *size, generator=g)), {"timestep": 999.0}
        else:
            ins, kwargs = unet_inputs(model, 2, (6, 4), 0), {"timestep": 999.0}
        out.append(Template(name=f"whole:{name}", block=block, config=config,
                            source=f"diffusers 0.42.1 {type(model).__mro__[1].__name__}.forward (calibration, "
                                   "scripts/calibration/templates.py)",
                            kwargs=kwargs, inputs=ins, half="to", kind="whole",
                            trained=folder / name if name in TRAINED else None))
    return out


# The DDPM U-Nets of issue 58, as their exporters build them (scripts/export_lucidrains_unet.py,
# scripts/export_annotated_unet.py): name, block, kwargs, x's shape, timesteps, x_self_cond given.
DDPM_UNETS = (
    ("lucidrains_unet_selfcond", "denoising_diffusion_pytorch.Unet",
     dict(dim=8, dim_mults=[1, 2], self_condition=True, learned_sinusoidal_cond=True, full_attn=[False, True],
          flash_attn=True, attn_heads=2, attn_dim_head=8), (1, 3, 8, 8), [500.0], True),
    ("lucidrains_unet_plain", "denoising_diffusion_pytorch.Unet",
     dict(dim=8, dim_mults=[1, 2], attn_heads=[1, 2], attn_dim_head=[4, 4]), (2, 3, 4, 4), [10.0, 900.0], False),
    ("annotated_unet_fashion", "annotated_diffusion.Unet", dict(dim=4, channels=1, dim_mults=[1, 2, 4]),
     (1, 1, 8, 8), [640.0], False),
    ("annotated_unet_selfcond", "annotated_diffusion.Unet",
     dict(dim=4, out_dim=5, dim_mults=[1, 2], self_condition=True, resnet_block_groups=2), (2, 3, 4, 4),
     [0.0, 250.0], True),
)


def build_ddpm(block: str, config: dict) -> nn.Module:
    """lucidrains' or the Annotated Diffusion post's ``Unet`` from its JSON kwargs (lists as the
    tuples their constructors expect), as the exporters build it."""
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    if block == "denoising_diffusion_pytorch.Unet":
        from export_lucidrains_unet import unet

        return unet(**kwargs)
    from reference import annotated_diffusion

    return annotated_diffusion.Unet(**kwargs)


def ddpm_templates() -> list[Template]:
    """The DDPM U-Nets of ``DDPM_UNETS`` (float32 only: PyTorch runs neither in half precision)."""
    out = []
    for name, block, config, shape, time, give_cond in DDPM_UNETS:
        g = torch.Generator().manual_seed(0)
        ins = OrderedDict(x=torch.randn(*shape, generator=g), time=torch.tensor(time))
        if give_cond:
            ins["x_self_cond"] = torch.randn(*shape, generator=g)
        out.append(Template(name=f"whole:{name}", block=block, config=config,
                            source=f"{block}.forward (calibration, scripts/calibration/templates.py)",
                            kwargs=None, inputs=ins, half="to", kind="ddpm"))
    return out


def half_runs(template, dtype) -> str | None:
    """``None`` if PyTorch runs the template (its own inputs, seed-0 weights) in ``dtype`` in its
    half form, else the first line of PyTorch's error (e.g. the SD 2.x CrossAttention, whose fp32
    q/k upcast meets a half ``v`` in ``einsum``)."""
    from parity.export import _inputs_to_store
    from parity.run import run_module
    from parity_bundle import convert_convs_to_half_, randomize_

    from attention_bundles.blocks import cast_module

    m = randomize_(template.build(), 0).eval()
    m = convert_convs_to_half_(m, dtype) if template.half == "convert" else cast_module(m, dtype)
    try:
        run_module(m, _inputs_to_store(template.inputs, dtype, template.half_input_dtypes), template.kwargs)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def all_templates(families=None) -> list[Template]:
    """Every template (attention first, then mid blocks, each in a fixed order), optionally only
    those matching ``families`` (see ``Template.matches``). A template PyTorch cannot run in
    float16 or bfloat16 on the CPU gets ``half = None`` (float32 bundles only) and the reason in
    ``half_rejected``."""
    ts = attention_templates() + mid_templates() + whole_templates() + ddpm_templates()
    if families:
        ts = [t for t in ts if t.matches(families)]
    if not ts:
        raise SystemExit(f"no template matches --families {families}")
    for t in ts:
        if t.half is not None:
            why = half_runs(t, torch.float16) or half_runs(t, torch.bfloat16)
            if why is not None:
                t.half, t.half_rejected = None, why
    return ts
