"""Re-checking what ``export_models.py`` wrote: every checkpoint loads with its library's own
loader, every bundle reruns bit-identically from its metadata (and traces), half twins are the
float32 bundle's rounding; the ``weights/`` size budget; the digest printed at the end.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

import torch

from parity_bundle import (CONVERT_TO_FP16_MARK, convert_convs_to_half_, float64_copy, load_bundle,
                           load_checkpoint_state_dict, resolve_weights, run_module)
from parity_trace import verify_traces
from .blocks import build_module
from .bundles import cast_module
from .common import _diffusers_quiet, Ctx, MAX_WEIGHTS_BYTES, MID, MODELS, REPO, WEIGHTS


def verify_bundle(path: Path) -> str:
    b = load_bundle(path)
    meta = b["metadata"]
    dtype = getattr(torch, meta["parity.dtype"])
    module = build_module(b["block"], b["config"])
    state = resolve_weights(path, b, list(module.state_dict()))
    if b["weights_ref"] is not None:
        # weightless; float32, or the half-precision twin of a referencing float32 bundle in the dtype its
        # checkpoint holds (no conversion)
        assert not b["state_dict"] and (dtype == torch.float32 or (path.stem.endswith(("_f16", "_bf16")) and all(
            v.dtype == dtype for v in state.values() if v.is_floating_point()))), \
            f"{path}: referencing bundles are weightless, float32 or a twin in the checkpoint's own dtype"
        assert (path.parent / b["weights_ref"][0]).resolve().is_relative_to(MODELS.resolve()), path
    mixed = CONVERT_TO_FP16_MARK in meta["parity.source"]
    if mixed:
        # guided-diffusion's convert_to_fp16: exactly the dtypes PyTorch held (conv parameters and x
        # half, norm and emb Linear parameters and emb float32)
        assert dtype in (torch.float16, torch.bfloat16), path
        convert_convs_to_half_(module, dtype)
        held = {k: v.dtype for k, v in module.state_dict().items()}
        assert set(held.values()) == {dtype, torch.float32}, f"{path}: not a mixed-dtype module"
        for k, v in state.items():
            assert v.dtype == held[k], f"{path}: {k} is {v.dtype}, PyTorch holds it in {held[k]}"
        for k, v in list(b["inputs"].items()) + list(b["expected"].items()):
            assert v.dtype == (torch.float32 if k == "emb" else dtype), f"{path}: {k} is {v.dtype}"
    else:
        cast_module(module, dtype)
    module.load_state_dict(state, strict=True)
    module.eval()
    names = list(b["expected"])
    # fresh copies: the loaded inputs are views at arbitrary offsets of the file's buffer, and
    # PyTorch's CPU kernels round differently on unaligned data (a 2e-6 difference seen on a
    # Linear); the export ran on freshly allocated tensors
    b["inputs"] = OrderedDict((k, v.clone()) for k, v in b["inputs"].items())
    got = run_module(module, b["inputs"], b["kwargs"])
    assert list(got) == names, f"{path}: outputs {list(got)} != {names}"
    for n in names:
        assert got[n].dtype == b["expected"][n].dtype and torch.equal(got[n], b["expected"][n]), \
            f"{path}: output {n} differs from the stored one"
    m64 = float64_copy(module)
    in64 = OrderedDict((k, v.double() if v.is_floating_point() else v) for k, v in b["inputs"].items())
    got64 = run_module(m64, in64, b["kwargs"])
    for n in names:
        assert torch.equal(got64[n], b["expected_f64"][n]), f"{path}: float64 output {n} differs"
    verify_traces(path, b, module, b["inputs"], m64, in64, b["kwargs"])
    return ", ".join(f"{n} {float((b['expected'][n].double() - b['expected_f64'][n]).abs().max()):.3e}" for n in names)


def verify_half_twin(path: Path, f32_path: Path):
    h, f = load_bundle(path), load_bundle(f32_path)
    dtype = getattr(torch, h["metadata"]["parity.dtype"])
    assert (h["block"], h["config"]) == (f["block"], f["config"]), path
    if f["weights_ref"] is not None and h["weights_ref"] is None:
        # the self-contained twin of a referencing bundle holds the checkpoint's weights, cast
        f = dict(f, state_dict=resolve_weights(f32_path, f, list(build_module(f["block"], f["config"]).state_dict())))
    else:
        assert h["weights_ref"] == f["weights_ref"], path
    # (sorted: safetensors orders the tensors of a mixed-dtype file by dtype first)
    assert sorted(h["state_dict"]) == sorted(f["state_dict"]) and list(h["inputs"]) == list(f["inputs"]), path
    held = {}
    if CONVERT_TO_FP16_MARK in h["metadata"]["parity.source"]:
        # guided-diffusion's convert_to_fp16 of the float32 block: conv parameters rounded, the rest
        # (and emb) float32
        module = convert_convs_to_half_(build_module(f["block"], f["config"]), dtype)
        held = {k: v.dtype for k, v in module.state_dict().items()}
        held["emb"] = torch.float32
    for k, v in list(f["state_dict"].items()) + list(f["inputs"].items()):
        hv = h["state_dict"].get(k, h["inputs"].get(k))
        want = v.to(held.get(k, dtype)) if v.is_floating_point() else v
        assert hv.dtype == want.dtype and torch.equal(hv, want), f"{path}: {k} is not the f32 twin's cast"


def verify_models():
    """Every checkpoint loads with its library's own loader."""
    from diffusers import (AutoencoderKL, AutoencoderKLTemporalDecoder, ControlNetModel, I2VGenXLUNet, UNet1DModel,
                           UNet2DConditionModel, UNet2DModel, UNet3DConditionModel, UNetControlNetXSModel, UNetMotionModel,
                           UNetSpatioTemporalConditionModel, VQModel)

    _diffusers_quiet()
    classes = {"diffusers_unet2d": UNet2DModel, "diffusers_unet2d_scale_shift": UNet2DModel,
               "diffusers_unet2d_bin": UNet2DModel, "diffusers_vae": AutoencoderKL, "diffusers_sd1": UNet2DConditionModel,
               "diffusers_sd2": UNet2DConditionModel, "diffusers_sdxl": UNet2DConditionModel,
               "diffusers_if": UNet2DConditionModel, "diffusers_kandinsky": UNet2DConditionModel,
               "diffusers_vd": UNet2DConditionModel,
               "diffusers_controlnet": ControlNetModel, "diffusers_unet3d": UNet3DConditionModel,
               "diffusers_svd": UNetSpatioTemporalConditionModel, "diffusers_svd_vae": AutoencoderKLTemporalDecoder,
               "diffusers_movq": VQModel, "diffusers_unet1d": UNet1DModel, "diffusers_unet1d_trajectory": UNet1DModel,
               "diffusers_unet1d_value": UNet1DModel, "diffusers_unet_motion": UNetMotionModel,
               "diffusers_i2vgen_xl": I2VGenXLUNet, "diffusers_controlnet_xs": UNetControlNetXSModel,
               "diffusers_sd1_g32": UNet2DConditionModel, "diffusers_vae_g32": AutoencoderKL}
    for name, cls in classes.items():
        m = cls.from_pretrained(MODELS / name)
        files = {p.name for p in (MODELS / name).iterdir()}
        weights = "diffusion_pytorch_model.bin" if name.endswith("_bin") else "diffusion_pytorch_model.safetensors"
        assert files == {"config.json", weights}, (name, files)
        sd = load_checkpoint_state_dict(MODELS / name / weights)
        msd = m.state_dict()
        assert list(sd) != [] and set(sd) == set(msd) and all(torch.equal(sd[k], msd[k]) for k in sd), name
        print(f"verified weights/models/{name}: {cls.__name__}.from_pretrained loads it ({len(sd)} tensors)")
    # lucidrains: as Trainer.load does
    from denoising_diffusion_pytorch import GaussianDiffusion, Unet
    from ema_pytorch import EMA

    data = torch.load(MODELS / "lucidrains_ddpm" / "model-1.pt", map_location="cpu", weights_only=True)
    assert set(data) == {"step", "model", "opt", "ema", "scaler", "version"}
    unet = Unet(dim=6, dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8))
    diffusion = GaussianDiffusion(unet, image_size=(8, 12), timesteps=100)
    diffusion.load_state_dict(data["model"])
    ema = EMA(diffusion, beta=0.995, update_every=10)
    ema.load_state_dict(data["ema"])
    assert not torch.equal(ema.ema_model.model.mid_attn.to_qkv.weight, diffusion.model.mid_attn.to_qkv.weight)
    print("verified weights/models/lucidrains_ddpm/model-1.pt: GaussianDiffusion and EMA load_state_dict "
          "(as Trainer.load); EMA weights differ from the online ones")
    for rel, key in (("sd_v1_tiny/sd_v1_tiny.ckpt", "state_dict"), ("guided_tiny/guided_tiny.pt", None),
                     ("ldm_ddpm_tiny/ldm_ddpm_tiny.pt", None)):
        sd = load_checkpoint_state_dict(MODELS / rel, key)
        print(f"verified weights/models/{rel}: torch.load(weights_only=True) ({len(sd)} tensors)")
    for p in MODELS.rglob("*"):
        if p.suffix in (".pt", ".ckpt", ".bin"):
            import zipfile

            assert zipfile.is_zipfile(p), f"{p}: not a zip-format torch.save file"


def verify_all(ctx: Ctx | None):
    verify_models()
    paths = sorted(MID.glob("*.safetensors"))
    if ctx is not None:
        want = set()
        for s in ctx.specs:
            want.add(WEIGHTS / s["path"])
        twins = {p for p in paths if p.stem.endswith(("_f16", "_bf16"))}
        assert set(paths) - twins == want, f"stale or missing bundles: {sorted(set(paths) ^ want - twins)}"
    for p in paths:
        diffs = verify_bundle(p)
        twin = ""
        for suffix in ("_f16", "_bf16"):
            if p.stem.endswith(suffix):
                f32 = p.with_name(p.stem[: -len(suffix)] + ".safetensors")
                verify_half_twin(p, f32)
                twin = f", same weights and inputs as {f32.relative_to(REPO)} rounded"
        print(f"verified {p.relative_to(REPO)}: rebuilt from metadata{' + referenced checkpoint' if 'parity.weights' in load_bundle(p)['metadata'] else ''}, "
              f"outputs bit-identical{twin} (max|out-f64| {diffs})")
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    print(f"verified {len(paths)} bundles; weights/ holds {total} bytes")
    assert total < MAX_WEIGHTS_BYTES, f"weights/ exceeds {MAX_WEIGHTS_BYTES} bytes"


def digest():
    h = hashlib.sha256()
    for p in sorted(list(MID.rglob("*")) + list(MODELS.rglob("*"))):
        if p.is_file():
            h.update(p.relative_to(WEIGHTS).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
