"""The whole-block cases (``whole NAME``, names in ``WHOLE``): a real mid block (or ResnetBlock2D)
at a real model's size with random weights, written once as a parity bundle to
``target/bench_blocks/NAME.safetensors`` (in a process of its own), then rebuilt from that bundle
alone and timed on its inputs, as ``crates/parity/examples/bench_bundle.rs`` times ours.
"""

import json
import os
import subprocess
import sys
import time

from .machine import BENCH_TORCH, MKL_MARK, Timer, cpu_model, placement, reset_peak_rss, rss_mib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLE_DIR = os.path.join(REPO, "target", "bench_blocks")

# The SD VAE decoder's mid block: what diffusers 0.42.1 ``Decoder`` (autoencoders/vae.py, norm_type
# "group") passes to UNetMidBlock2D for SD's block_out_channels[-1] = 512, norm_num_groups 32, act silu.
VAE_MID = dict(in_channels=512, resnet_eps=1e-6, resnet_act_fn="silu", output_scale_factor=1,
               resnet_time_scale_shift="default", attention_head_dim=512, resnet_groups=32, temb_channels=None,
               add_attention=True)
# UNet2DConditionModel -> get_mid_block("UNetMidBlock2DCrossAttn", ...) with the last entries of the
# per-level lists (export_models.unet2d_condition_mid_config); num_attention_heads = attention_head_dim
# of the config when num_attention_heads is null (the historical naming).
SD_CROSS_MID = dict(in_channels=1280, temb_channels=1280, dropout=0.0, resnet_eps=1e-5, resnet_act_fn="silu",
                    output_scale_factor=1.0, resnet_time_scale_shift="default", resnet_groups=32,
                    dual_cross_attention=False, upcast_attention=False, attention_type="default")
# SD 1.5: attention_head_dim 8 (= 8 heads of 160), cross_attention_dim 768, conv proj_in/proj_out.
SD15_MID = dict(SD_CROSS_MID, transformer_layers_per_block=1, cross_attention_dim=768, num_attention_heads=8,
                use_linear_projection=False)
# SDXL base: transformer_layers_per_block [1, 2, 10], attention_head_dim [5, 10, 20] (heads per level),
# cross_attention_dim 2048, use_linear_projection.
SDXL_MID = dict(SD_CROSS_MID, transformer_layers_per_block=10, cross_attention_dim=2048, num_attention_heads=20,
                use_linear_projection=True)
# guided-diffusion 256x256 unconditional: num_channels 256, channel_mult (1, 1, 2, 2, 4, 4) -> 1024 at the
# middle, time_embed_dim 4 * 256, num_head_channels 64 (16 heads), use_scale_shift_norm, QKVAttentionLegacy.
OPENAI_256_MID = dict(channels=1024, emb_channels=1024, dropout=0.0, dims=2, use_scale_shift_norm=True, num_heads=4,
                      num_head_channels=64, use_new_attention_order=False, use_spatial_transformer=False,
                      transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
                      disable_middle_self_attn=False, legacy=True)

# name -> (seed, readable case name)
WHOLE = {
    "vae_mid_64": (9001, "diffusers.UNetMidBlock2D SD VAE decoder mid (1, 512, 64, 64)"),
    "vae_mid_128": (9002, "diffusers.UNetMidBlock2D SD VAE decoder mid (1, 512, 128, 128)"),
    "sd15_mid": (9003, "diffusers.UNetMidBlock2DCrossAttn SD 1.5 mid (2, 1280, 8, 8), ctx (2, 77, 768)"),
    "ddpm_mid_16": (9004, "denoising_diffusion_pytorch.MidBlock Unet(64, (1, 2, 4, 8)) mid (1, 512, 16, 16)"),
    "ddpm_mid_32": (9005, "denoising_diffusion_pytorch.MidBlock Unet(64, (1, 2, 4, 8)) mid (1, 512, 32, 32)"),
    "openai_mid_256": (9006, "openai.MiddleBlock guided-diffusion 256x256 uncond (1, 1024, 8, 8)"),
    "resnet_512_64": (9007, "diffusers.ResnetBlock2D SD VAE decoder mid resnet (1, 512, 64, 64)"),
    "sdxl_mid": (9008, "diffusers.UNetMidBlock2DCrossAttn SDXL mid (1, 1280, 32, 32), 10 layers, ctx (1, 77, 2048)"),
}


def whole_path(name):
    return os.path.join(BUNDLE_DIR, f"{name}.safetensors")


def build_whole(name):
    """The case's randomized PyTorch module and what export_bundle needs:
    ``(module, block id, config, inputs, kwargs, source)``."""
    import torch
    from collections import OrderedDict

    from export_models import build_module, mid2d_resnet_config
    from parity_bundle import randomize_

    seed = WHOLE[name][0]
    g = torch.Generator().manual_seed(seed + 100_000)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    kwargs = None
    if name.startswith("vae_mid_"):
        side = int(name.rsplit("_", 1)[1])
        block, config = "diffusers.UNetMidBlock2D", VAE_MID
        inputs = OrderedDict(hidden_states=randn(1, 512, side, side))
        source = "AutoencoderKL Decoder.mid_block kwargs (diffusers 0.42.1 vae.py) for SD's VAE"
    elif name in ("sd15_mid", "sdxl_mid"):
        block, config = "diffusers.UNetMidBlock2DCrossAttn", SD15_MID if name == "sd15_mid" else SDXL_MID
        b, side = (2, 8) if name == "sd15_mid" else (1, 32)
        inputs = OrderedDict(hidden_states=randn(b, 1280, side, side), temb=randn(b, 1280),
                             encoder_hidden_states=randn(b, 77, config["cross_attention_dim"]))
        source = f"UNet2DConditionModel mid_block kwargs for {'SD 1.5' if name == 'sd15_mid' else 'SDXL base'}"
    elif name.startswith("ddpm_mid_"):
        from denoising_diffusion_pytorch import Unet
        from reference.mid_blocks import LucidrainsMidBlock

        side = int(name.rsplit("_", 1)[1])
        torch.manual_seed(0)
        unet = randomize_(Unet(dim=64, dim_mults=(1, 2, 4, 8)), seed).eval()
        block, config = "denoising_diffusion_pytorch.MidBlock", LucidrainsMidBlock.config_of(unet)
        with torch.no_grad():
            time_emb = unet.time_mlp(torch.tensor([500.0]))
        inputs = OrderedDict(x=randn(1, config["dim"], side, side), time_emb=time_emb)
        source = ("mid_block1 / mid_attn / mid_block2 of denoising_diffusion_pytorch.Unet(dim=64, "
                  "dim_mults=(1, 2, 4, 8)), time_emb = its time_mlp(500)")
        return LucidrainsMidBlock.of(unet), block, config, inputs, kwargs, source
    elif name == "openai_mid_256":
        block, config = "openai.MiddleBlock", OPENAI_256_MID
        inputs = OrderedDict(x=randn(1, 1024, 8, 8), emb=randn(1, 1024))
        source = "guided-diffusion 256x256_diffusion_uncond middle_block (guided-diffusion-sdk classes)"
    elif name == "resnet_512_64":
        block, config = "diffusers.ResnetBlock2D", mid2d_resnet_config(VAE_MID)
        inputs = OrderedDict(input_tensor=randn(1, 512, 64, 64))
        kwargs = {"temb": None}
        source = "resnets of the SD VAE decoder's mid block (temb None)"
    else:
        raise KeyError(f"unknown whole-block case {name!r}; known: {', '.join(WHOLE)}")
    torch.manual_seed(0)
    module = randomize_(build_module(block, config), seed)
    return module, block, config, inputs, kwargs, source


def export_whole(name):
    """Write the case's bundle (float64 reference run included)."""
    import torch

    from parity_bundle import export_bundle

    module, block, config, inputs, kwargs, source = build_whole(name)
    t = time.perf_counter()
    info = export_bundle(module, block, config, inputs, whole_path(name), kwargs=kwargs,
                         source=f"bench_torch.py whole {name}: {source}; random weights (randomize_ seed "
                                f"{WHOLE[name][0]}), inputs N(0, 1)",
                         dtype=torch.float32, trace=False, extra_metadata={"bench.case": WHOLE[name][1]})
    diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
    print(f"wrote {info['path']} ({info['bytes'] / 2**20:.1f} MiB, {time.perf_counter() - t:.1f} s) "
          f"{block} max|f32-f64| {diffs}", file=sys.stderr, flush=True)


def ensure_whole(name):
    """The case's bundle path, exported first (in a process of its own, without the MKL shim) if
    missing."""
    path = whole_path(name)
    if not os.path.exists(path):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", MKL_MARK)}
        subprocess.run([sys.executable, BENCH_TORCH, "export", name], check=True, env=env)
    return path



def load_whole(path):
    """The module rebuilt from the bundle alone, its inputs, kwargs, float64 outputs and case name."""
    from export_models import build_module
    from parity_bundle import load_bundle

    b = load_bundle(path)
    module = build_module(b["block"], b["config"])
    module.load_state_dict(b["state_dict"], strict=True)
    module.eval()
    case = b["metadata"].get("bench.case", os.path.splitext(os.path.basename(path))[0])
    return module, b["inputs"], b["kwargs"], list(b["expected_f64"].values()), case, b["block"]


def time_whole(args):
    """``whole NAME``: time the PyTorch block on its bundle's weights and inputs."""
    import torch

    torch.set_num_threads(2)
    reps, warmup = args.reps, args.warmup
    path = ensure_whole(args.name)
    module, inputs, kwargs, expected64, case, block = load_whole(path)
    device, dtype = placement(args)
    keep_f32 = set()
    if dtype != torch.float32 and block.startswith("openai."):
        # guided-diffusion's own half mode: convolutions in half, GroupNorm32 and the embedding
        # path in float32 (its time embedding stays float32).
        from parity_bundle import convert_convs_to_half_

        convert_convs_to_half_(module.to(device), dtype)
        keep_f32 = {"emb"}
    else:
        module.to(device, dtype)
    inputs = {k: v.to(device, torch.float32 if k in keep_f32 else dtype) if v.is_floating_point() else v.to(device)
              for k, v in inputs.items()}
    kwargs = {k: v.to(device, dtype) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    def run():
        out = module(**inputs, **kwargs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    with torch.inference_mode():
        reset_peak_rss()
        rss_before = rss_mib("VmRSS:")
        for _ in range(warmup):
            run()
        timer = Timer(device)
        ms, out = [], None
        for i in range(max(reps, 1)):  # reps 0: one untimed call, for the error
            t, last = timer.time(run)
            if i < reps:
                ms.append(t)
            if i == max(reps, 1) - 1:
                out = last  # only the last call's outputs are kept (as in bench_bundle)
            del last
        peak = rss_mib("VmHWM:")
        err = max(float((o.double().cpu() - e).abs().max()) for o, e in zip(out, expected64))
    io = sum(t.numel() * t.element_size() for t in list(inputs.values()) + out)
    print(json.dumps({
        "impl": "torch", "case": case, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": cpu_model(), "mkl_avx512": os.environ.get(MKL_MARK) == "1",
        "ms": [round(x, 2) for x in ms], "median_ms": round(sorted(ms)[len(ms) // 2], 2) if ms else None,
        "rss_before_mib": round(rss_before, 1), "peak_rss_mib": round(peak, 1), "io_mib": round(io / 2**20, 1),
        "max_abs_vs_f64": float(f"{err:.3e}"), **timer.fields(args),
    }), flush=True)
