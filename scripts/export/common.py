"""Shared pieces of the ``export_models.py`` exporters: the ``weights/`` paths, the size budget,
the ``parity.source`` phrases, capturing a submodule's inputs and output while a whole model runs
(``capture``), and ``Ctx``, which collects the checkpoint files and bundle specs the builders make.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn


HERE = Path(__file__).resolve().parent.parent  # scripts/
REPO = HERE.parent
WEIGHTS = REPO / "weights"
MODELS = WEIGHTS / "models"
MID = WEIGHTS / "mid"
# 28 MiB. 10 MiB before stage traces (issue 8); the float32 traces of 32 attention bundles made it
# 10,769,551 bytes; traces in all 173 bundles, the half-precision ones with their float64 copy's
# stages (half of the trace bytes), make it about 26.3 MB. 56 MiB since the accuracy bundles
# (weights/accuracy/, 15.5 MB) and the IF / Kandinsky / ControlNet models and bundles (issue 17,
# 5.5 MB) made it 47.4 MB: below the GPU machine's 64 MiB of working tree (the kit carries
# weights/ apart, scripts/gpu_kit.sh), with room for a few more small models.
# 60 MiB since issue 17's MoVQ, 1-D, dual-cross-attention and video models and bundles (about 9 MB)
# made it 62.4 MB. The GPU machine takes 64 MiB of working tree in all (tracked files and what
# is carried): the kit's CUDA binary (about 7 MB compressed) no longer fits beside the tree, so a
# GPU run must first make room (see scripts/gpu_kit.sh).
# Plus 2,943,914 bytes for Stable Video Diffusion's two tiny float16 models and 8 bundles (issue 17): 32 channels is
# the least these blocks take (GroupNorm(32) hard-coded), a 3 x 2 latent the least that keeps those norms well
# conditioned, and the half-precision twins carry float64 stages.
# Plus 1,315,362 bytes for issue 17's AnimateDiff UNetMotionModel and I2VGenXLUNet models and bundles.
# Plus 789,459 bytes for the tiny UNetControlNetXSModel and its ControlNetXSCrossAttnMidBlock2D bundles.
# Plus 9,694,004 bytes (issue 31) for the float64 stages of the 160 float32 bundles, stored as bfloat16 deltas
# (scripts/add_trace_twins.py): a stage is judged against PyTorch's own error, as an output is.
# Plus the outlier bundles of weights/outlier (issue 32, scripts/export_outliers.py), with their float64 stages.
# Plus 9,047,358 bytes (issue 48) for the 32-group tiny U-Net and VAE (diffusers_sd1_g32, diffusers_vae_g32:
# candle-transformers' whole models need widths divisible by 32) and their four whole bundles in weights/whole.
# Plus 6,500,000 bytes (issue 48) for weights/whole's other bundles: the SD 1 / 2 / XL U-Nets and the VAE, f32
# (referencing the tiny checkpoints) and f16 (self-contained), and the denoising example's reference run.
# Plus 6,600,000 bytes (issues 57 and 58): UNet2DModel's whole bundles (weights/whole/unet2d*, f32 and f16) and
# weights/own/whole (scripts/own_whole_example.sh: two models of configs in no other folder and their whole bundles,
# written by `scripts/export_own.py FOLDER --whole`).
# Plus 8,100,000 bytes (issue 58): the trained digits DDPM (weights/models/digits_ddpm, 3.8 MB, scripts/digits_ddpm.py),
# its sampling reference (weights/whole/digits_samples.safetensors) and its float32 whole bundle (digits_ddpm).
# Plus 7,000,000 bytes (issue 58): the single-file checkpoints of weights/single_file (a float16 SD 1.x-style
# .safetensors with U-Net and VAE, an SD 2.x-style .ckpt; scripts/export_single_file.py) and their whole bundles
# (module-path stages: most of it).
# Plus 2,700,000 bytes (issue 58): ControlNetModel's whole bundles and the ControlNet + U-Net pair's
# (weights/whole/controlnet*, scripts/export_controlnet.py; the pair's hold both tiny models).
# Plus 3,500,000 bytes (issue 58): lucidrains' whole Unet bundles (weights/whole/lucidrains_unet_*,
# scripts/export_lucidrains_unet.py; two reference the committed Trainer checkpoint, three hold their weights).
# Plus 2,600,000 bytes (issue 58): the Annotated Diffusion post's whole Unet bundles (weights/whole/annotated_unet_*,
# scripts/export_annotated_unet.py; its 4 x 32-head attention's stages are most of it).
# Plus 3,300,000 bytes (issue 58): the SDXL-style single file (weights/single_file/sdxl_tiny.safetensors, float16;
# its 1280-wide cross-attention keys are most of it) and its bundle (module-path stages); and 250,000 for the
# ControlNet's guess_mode bundle (weights/whole/controlnet_guess); and 900,000 for the tiny SDXL ControlNet
# (weights/models/diffusers_controlnet_sdxl) and its bundle with its f16 twin (weights/whole/controlnet_sdxl*).
MAX_WEIGHTS_BYTES = (60 * 1024 * 1024 + 2_943_914 + 1_315_362 + 789_459 + 9_694_004 + 1_500_000 + 9_047_358
                     + 6_500_000 + 6_600_000 + 8_100_000 + 7_000_000 + 2_700_000 + 3_500_000
                     + 2_600_000 + 3_300_000 + 250_000 + 900_000)

HALF_DTYPES = (("float16", "f16"), ("bfloat16", "bf16"))

DIFF_BLOCKS = "real library class diffusers.models.unets.unet_2d_blocks.{}"
DIFF_RESNET = "real library class diffusers.models.resnet.ResnetBlock2D"
LUCID_MID = ("wrapper scripts/reference/mid_blocks.py LucidrainsMidBlock holding the real "
             "denoising_diffusion_pytorch.denoising_diffusion_pytorch ResnetBlock / Attention / ResnetBlock "
             "(Unet.mid_block1, mid_attn, mid_block2; forward = the Unet.forward lines x = mid_block1(x, t); "
             "x = mid_attn(x) + x; x = mid_block2(x, t))")
LDM_MID = ("wrapper scripts/reference/mid_blocks.py LdmMidBlock holding the published ldm.modules.diffusionmodules.model "
           "ResnetBlock / make_attn of Stability-AI/stablediffusion (SD 2.x ldm tree, as shipped by stable-diffusion-sdkit; "
           "unchanged from CompVis/latent-diffusion) mid.block_1 -> mid.attn_1 -> mid.block_2")
LDM_MID_LINEAR = ("; attn_1 = LinAttnBlock, re-stated in scripts/reference/ldm.py from CompVis/latent-diffusion "
                  "ldm/modules/diffusionmodules/model.py (commit a506df575647): the SD 2.x make_attn has no \"linear\"")
OPENAI_MID = ("scripts/reference/mid_blocks.py openai_middle_block: the published "
              "TimestepEmbedSequential(ResBlock, {}, ResBlock) of UNetModel.middle_block")
GUIDED = "guided_diffusion.unet of openai/guided-diffusion (as shipped by guided-diffusion-sdk)"
SD_OPENAIMODEL = ("ldm.modules.diffusionmodules.openaimodel of Stability-AI/stablediffusion (SD 2.x ldm tree, as shipped "
                  "by stable-diffusion-sdkit)")


def _diffusers_quiet():
    from diffusers.utils import logging as dlogging

    dlogging.set_verbosity_error()


def capture(module: nn.Module, run, names=None, all_outputs=False):
    """Run ``run()`` and return (inputs, output) of the (single) call of ``module`` during it:
    inputs = OrderedDict forward-parameter name -> value (bound by the forward's signature; cloned);
    output: the first of a tuple, or (``all_outputs``) the tuple of every output."""
    rec = []

    def pre(mod, args, kwargs):
        rec.append([args, kwargs, None])

    def post(mod, args, kwargs, out):
        # cloned now: the model may update the returned tensors in place later (UNetControlNetXSModel's
        # up blocks add into h_base)
        rec[-1][2] = (tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out)
                      if isinstance(out, (tuple, list)) else out.detach().clone())

    h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = module.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        h1.remove()
        h2.remove()
    assert len(rec) == 1, f"{type(module).__name__} called {len(rec)} times"
    args, kwargs, out = rec[0]
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    ins = OrderedDict()
    for name, value in bound.arguments.items():
        if names is not None:
            name = names.get(name, name)
        # clone() keeps the strides the whole model gave (e.g. a channels-last-strided hidden_states
        # after an attention block): the in-model check reruns on exactly these, the bundle stores
        # contiguous copies (see Ctx.bundle)
        ins[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    if isinstance(out, (tuple, list)):
        if all_outputs:
            return ins, tuple(o.detach().clone() for o in out)
        out = out[0]
    return ins, out.detach().clone()


def tensor_inputs(ins, drop=()):
    """Forward inputs as stored in a bundle: tensors only (None and non-tensor arguments left out)."""
    return OrderedDict((k, v) for k, v in ins.items() if isinstance(v, torch.Tensor) and k not in drop)


def sub_state(state: dict, prefix: str) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((k[len(prefix):], v) for k, v in state.items() if k.startswith(prefix))


class Ctx:
    """Collects checkpoint files and bundle specs."""

    def __init__(self):
        self.files = []     # written checkpoint files (Path)
        self.specs = []     # bundle specs

    def bundle(self, name, block, config, inputs, expected, *, state=None, ref=None, source="", module=None,
               half=False, note="", kwargs=None):
        """``state``: the block's own weights (self-contained bundle); ``ref``: (checkpoint path
        relative to weights/, prefix[, key]) (referencing bundle). ``expected``: the output of the
        block inside the whole model (or of the module that produced the checkpoint)."""
        assert (state is None) != (ref is None)
        raw = inputs
        inputs = OrderedDict((k, v.contiguous()) for k, v in inputs.items())
        self.specs.append(dict(path=f"mid/{name}.safetensors", block=block, config=config, inputs=inputs,
                               expected=expected, state=state, ref=ref, source=source, half=half, note=note,
                               kwargs=kwargs, raw_inputs=raw))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def save_diffusers(model, name, safe=True):
    folder = MODELS / name
    model.save_pretrained(folder, safe_serialization=safe)
    out = [folder / "config.json", folder / ("diffusion_pytorch_model.safetensors" if safe else "diffusion_pytorch_model.bin")]
    for p in out:
        assert p.is_file(), p
    return out
