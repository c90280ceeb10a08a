#!/usr/bin/env python3
"""PyTorch timings and peak memory for the cases of ``crates/attention/examples/bench_sdpa.rs``.

    python scripts/bench_torch.py core 1 1 4096 4096 512 [--reps 5] [--warmup 1]
    python scripts/bench_torch.py block vae 128
    python scripts/bench_torch.py block ddpm 32
    python scripts/bench_torch.py whole vae_mid_64 [--reps 5]   # a whole block on its bundle (see below)
    python scripts/bench_torch.py export vae_mid_64             # only write the bundle of a whole-block case
    python scripts/bench_torch.py all [--reps 5]      # every case, one subprocess each
    python scripts/bench_torch.py compare [RUST_EXAMPLE] [--bundle-bin BIN] [--rounds 5] [--reps N] [--only SUBSTR] [--out FILE] [--mkl-avx512]
    python scripts/bench_torch.py SUBCOMMAND --help             # each subcommand's options (argparse)

Unknown options, missing values and unknown case names are errors (exit status 2).

``compare`` runs each case alternately here and with the Rust example binary
(``target/release/examples/bench_sdpa``), ``--rounds`` times each, so both see the same machine
load; it appends every JSON line to ``--out`` (default ``bench_results.jsonl``) and prints a
Markdown table of the medians (and minima) over all repetitions of all rounds. Without
``--reps``, each case gets enough repetitions for about half a second per run (sub-millisecond
cases swing by tens of percent over a handful of calls on a shared machine).

**Whole blocks** (``whole NAME``, names in ``WHOLE``): a real mid block (or ResnetBlock2D) at a
real model's size, with random weights (``parity_bundle.randomize_``: weights ~ N(0, 1/fan_in),
norm weights near 1). The first use writes it as a parity bundle to
``target/bench_blocks/NAME.safetensors`` (``export_bundle``: the block id and config the repo's
exporters use, PyTorch's float32 and float64 outputs, metadata ``bench.case``), in a separate
process; every run then rebuilds the module from that bundle alone (``export_models.build_module``
+ its state dict) and runs it on the bundle's inputs, so PyTorch and ours
(``target/release/examples/bench_bundle BUNDLE``, from ``crates/parity/examples/bench_bundle.rs``)
run the very same numbers. After loading, both reset the peak resident set (``/proc/self/clear_refs``
5), so ``peak_rss_mib`` is the peak of the calls, not of reading the bundle; both also report
``max_abs_vs_f64`` (their last call's max |output − the bundle's float64 output|). ``compare``
exports every selected bundle before the timing rounds start and runs ours with ``--bundle-bin``
(default ``target/release/examples/bench_bundle``); ``RUST_EXAMPLE`` (default
``target/release/examples/bench_sdpa``) runs the other cases.

``--device cuda[:N]`` and ``--dtype f32|f16|bf16`` (core, block, whole, compare; default the CPU
and float32): run on that device in that dtype. Every timed call then ends with
``torch.cuda.synchronize()``, and the JSON adds ``device``, ``dtype``, ``gpu`` (its name),
``gpu_before_mib`` and ``gpu_peak_mib`` (``torch.cuda.memory_allocated`` before the first call and
``max_memory_allocated`` over the calls), ``tf32_convs`` and ``tf32_matmuls`` (PyTorch's defaults:
cuDNN convolutions in TF32, matmuls not; ``--strict-f32`` turns both off, so that its float32 is
float32 as ours is). ``compare`` passes both flags to the Rust binaries
(``bench_sdpa``/``bench_bundle``, built with ``--features cuda``), and, on a GPU, runs 20
repetitions per case unless ``--reps`` says otherwise. Whole-block bundles are still exported on
the CPU (float32 and float64) and moved after loading.

``--mkl-avx512`` (any command): run PyTorch with MKL's Intel code paths on a non-Intel CPU. MKL
picks its kernels by CPU vendor, and on AMD processors with AVX-512 (Zen 4/5) it runs its AVX2
kernels, about half the FLOP rate (a 4096×512×4096 sgemm on one Zen 5 core: 99 GFLOP/s stock,
191 with this flag). The flag compiles a two-function shim (``mkl_serv_intel_cpu_true`` returning
1; needs ``cc``) and re-runs the script with it in ``LD_PRELOAD``; the JSON records
``"mkl_avx512": true``. Stock PyTorch is what users get; the flag shows PyTorch's best kernels on
the same hardware.

One case per process, so ``ru_maxrss`` is that case's peak resident set. Prints one JSON line per
case, the same fields as the Rust example: times per repetition after the warm-up, median, RSS
before the first call (inputs and weights built) and peak. ``torch.set_num_threads(2)``, no
autograd (``torch.inference_mode``), float32, CPU. The core case is
``F.scaled_dot_product_attention`` (torch's CPU flash kernel for these shapes); the blocks are
the real library classes with random weights.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MKL_SHIM = """
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
"""
MKL_MARK = "UNET_BENCH_MKL_AVX512"


def mkl_avx512_env():
    """The environment with the MKL vendor-check shim preloaded (compiled into a temporary
    folder; the caller's environment if it already has it)."""
    if os.environ.get(MKL_MARK) == "1":
        return dict(os.environ)
    tmp = tempfile.mkdtemp(prefix="mkl_shim_")
    src, lib = os.path.join(tmp, "shim.c"), os.path.join(tmp, "libmkl_intel_cpu.so")
    with open(src, "w") as f:
        f.write(MKL_SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", lib, src], check=True)
    return dict(os.environ, LD_PRELOAD=lib, **{MKL_MARK: "1"})


def mkl_avx512_reexec(args):
    """Re-run this script with the shim preloaded, unless it already is."""
    if os.environ.get(MKL_MARK) != "1":
        os.execve(sys.executable, [sys.executable, __file__, *args], mkl_avx512_env())


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"

CORE_SHAPES = [
    (1, 1, 4096, 4096, 512),
    (1, 1, 16384, 16384, 512),
    (2, 20, 1024, 1024, 64),
    (2, 8, 64, 64, 160),
    (2, 8, 64, 77, 160),
    (4, 4, 256, 260, 32),
    (1, 4, 1024, 1028, 32),
]
BLOCKS = [("vae", 64), ("vae", 128), ("ddpm", 16), ("ddpm", 32)]


def rss_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


def placement(args):
    """``(device, dtype)`` from ``--device`` / ``--dtype``; ``--strict-f32`` turns TF32 off in cuDNN
    (PyTorch's default lets its float32 convolutions run in TF32) and cuBLAS."""
    import torch

    if args.strict_f32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    return torch.device(args.device), dtypes[args.dtype]


class Timer:
    """Wall-clock milliseconds of a call, with the GPU's queue drained after it; the GPU memory
    fields of the JSON line."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()

    def time(self, run):
        if self.cuda:
            self.torch.cuda.synchronize()
        t = time.perf_counter()
        out = run()
        if self.cuda:
            self.torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3, out

    def fields(self, args):
        if not self.cuda:
            return {}
        cuda = self.torch.cuda
        return {"device": args.device, "dtype": args.dtype,
                "tf32_convs": self.torch.backends.cudnn.allow_tf32,
                "tf32_matmuls": self.torch.backends.cuda.matmul.allow_tf32,
                "gpu": cuda.get_device_name(), "gpu_before_mib": round(self.before / 2**20, 1),
                "gpu_peak_mib": round(cuda.max_memory_allocated() / 2**20, 1)}


def one(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    torch.manual_seed(0)
    reps, warmup = args.reps, args.warmup
    device, dtype = placement(args)
    size = torch.tensor([], dtype=dtype).element_size()
    if args.command == "core":
        b, h, lq, lk, d = args.b, args.h, args.lq, args.lk, args.d
        q = torch.randn(b, h, lq, d).to(device, dtype)
        k = torch.randn(b, h, lk, d).to(device, dtype)
        v = torch.randn(b, h, lk, d).to(device, dtype)
        case = f"sdpa {(b, h, lq, lk, d)}"
        io = size * b * h * d * (2 * lq + 2 * lk)

        def run():
            return F.scaled_dot_product_attention(q, k, v)

    else:
        kind, side = args.kind, args.side
        if kind == "vae":
            from diffusers.models.attention_processor import Attention

            block = Attention(
                512, heads=1, dim_head=512, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=32,
                spatial_norm_dim=None, residual_connection=True, bias=True, upcast_softmax=True,
                _from_deprecated_attn_block=True,
            )
            case = f"diffusers.Attention vae_mid {side}x{side}"
        else:
            from denoising_diffusion_pytorch.denoising_diffusion_pytorch import Attention

            block = Attention(512, heads=4, dim_head=32, num_mem_kv=4, flash=False)
            case = f"denoising_diffusion_pytorch.Attention mid {side}x{side}"
        block.eval().to(device, dtype)
        x = torch.randn(1, 512, side, side).to(device, dtype)
        io = 2 * size * x.numel()

        def run():
            return block(x)

    with torch.inference_mode():
        rss_before = rss_mib("VmRSS:")
        for _ in range(warmup):
            run()
        timer = Timer(device)
        ms = []
        for _ in range(reps):
            t, out = timer.time(run)
            ms.append(t)
            del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "impl": "torch", "case": case, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": cpu_model(), "mkl_avx512": os.environ.get(MKL_MARK) == "1",
        "ms": [round(x, 2) for x in ms], "median_ms": round(sorted(ms)[len(ms) // 2], 2),
        "rss_before_mib": round(rss_before, 1), "peak_rss_mib": round(peak, 1), "io_mib": round(io / 2**20, 1),
        **timer.fields(args),
    }), flush=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE_DIR = os.path.join(REPO, "target", "bench_blocks")
BUNDLE_BIN = os.path.join(REPO, "target", "release", "examples", "bench_bundle")
SDPA_BIN = os.path.join(REPO, "target", "release", "examples", "bench_sdpa")

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
        subprocess.run([sys.executable, os.path.abspath(__file__), "export", name], check=True, env=env)
    return path


def reset_peak_rss():
    """Reset ``VmHWM`` (Linux: ``/proc/self/clear_refs`` 5); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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


def case_args():
    return ([["core", *map(str, s)] for s in CORE_SHAPES] + [["block", k, str(s)] for k, s in BLOCKS]
            + [["whole", name] for name in WHOLE])


# Repetitions per run when ``compare`` is not given ``--reps``: about half a second of calls.
DEFAULT_REPS = {
    "core 1 1 4096 4096 512": 5,
    "core 1 1 16384 16384 512": 2,
    "core 2 20 1024 1024 64": 10,
    "core 2 8 64 64 160": 400,
    "core 2 8 64 77 160": 400,
    "core 4 4 256 260 32": 150,
    "core 1 4 1024 1028 32": 50,
    "block vae 64": 5,
    "block vae 128": 2,
    "block ddpm 16": 50,
    "block ddpm 32": 10,
    # whole blocks: one call took (PyTorch / ours, s, 2-core AMD EPYC without AVX-512, loaded): resnet 0.3 / 0.7,
    # ddpm 16 0.06 / 0.09, ddpm 32 0.24 / 0.30, openai 0.14 / 0.34, sd15 1.2 / 0.8, vae 64 1.8 / 2.8,
    # vae 128 7.5 / 12.5, sdxl 7.3 / 8.9 (each run adds one warm-up call)
    "whole resnet_512_64": 3,
    "whole ddpm_mid_16": 10,
    "whole ddpm_mid_32": 3,
    "whole openai_mid_256": 5,
    "whole sd15_mid": 2,
    "whole vae_mid_64": 2,
    "whole vae_mid_128": 1,
    "whole sdxl_mid": 1,
}


def compare(args):
    cases = [c for c in case_args() if not args.only or args.only in " ".join(c)]
    # --device / --dtype go to both sides only where given (the Rust binaries' defaults otherwise)
    place = [x for f, v in (("--device", args.device), ("--dtype", args.dtype)) if v is not None for x in (f, v)]
    strict = ["--strict-f32"] if args.strict_f32 else []
    on_gpu = not (args.device or "cpu").startswith("cpu")
    # Whole-block bundles are written before any timing (the float64 reference runs take a while).
    for c in cases:
        if c[0] == "whole":
            ensure_whole(c[1])
    # The shim is built once; only PyTorch's runs get it.
    torch_env = mkl_avx512_env() if args.mkl_avx512 else None
    rows = {}
    for c in cases:
        extra = ["--reps", str(args.reps or (20 if on_gpu else DEFAULT_REPS.get(" ".join(c), 5))), *place]
        ours = [args.bundle_bin, whole_path(c[1])] if c[0] == "whole" else [args.rust_example, *c]
        for _ in range(args.rounds):
            for cmd, env in (([sys.executable, __file__, *c, *extra, *strict], torch_env), ([*ours, *extra], None)):
                run = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                line = run.stdout.strip().splitlines()[-1]
                rec = json.loads(line)
                with open(args.out, "a") as f:
                    f.write(line + "\n")
                rows.setdefault(" ".join(c), {}).setdefault(rec["impl"], []).append(rec)
                print(line, file=sys.stderr, flush=True)
    print("| case | PyTorch ms | ours ms | speed ours/PyTorch | fastest call PyTorch / ours (ms) | PyTorch peak RSS − before (MiB) | ours peak RSS − before (MiB) | inputs+output (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, by in rows.items():
        def med(recs, f):
            xs = sorted(f(r) for r in recs)
            return xs[len(xs) // 2]
        t_ms = sorted(x for r in by["torch"] for x in r["ms"])
        o_ms = sorted(x for r in by["candle"] for x in r["ms"])
        tm, om = t_ms[len(t_ms) // 2], o_ms[len(o_ms) // 2]
        tmem = med(by["torch"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        omem = med(by["candle"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        fastest = f"{t_ms[0]:.2f} / {o_ms[0]:.2f}"
        print(f"| {by['torch'][0]['case']} | {tm:.2f} | {om:.2f} | {tm / om:.2f} | {fastest} | {tmem:.0f} | {omem:.0f} | {by['torch'][0]['io_mib']:.1f} |")


def run_options(device_default="cpu", dtype_default="f32", reps_default=5, warmup=True):
    """The options shared by the subcommands that run PyTorch (a parent parser)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--reps", type=int, default=reps_default, metavar="N",
                   help=f"timed repetitions after the warm-up (default {reps_default})")
    if warmup:
        p.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls first (default 1)")
    p.add_argument("--device", default=device_default, metavar="DEV",
                   help=f"cpu or cuda[:N] (default {device_default or 'the CPU'})")
    p.add_argument("--dtype", default=dtype_default, choices=("f32", "f16", "bf16"),
                   help=f"(default {dtype_default or 'f32'})")
    p.add_argument("--strict-f32", action="store_true", help="TF32 off in cuDNN and cuBLAS")
    p.add_argument("--mkl-avx512", action="store_true", help="run PyTorch with MKL's Intel code paths forced")
    return p


def parser():
    ap = argparse.ArgumentParser(prog="bench_torch.py", description=__doc__.split("\n\n", 1)[0],
                                 epilog="See the module docstring (python -c 'import bench_torch; help(bench_torch)')"
                                 " for the JSON fields.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = run_options()

    core = sub.add_parser("core", parents=[run], help="F.scaled_dot_product_attention on one shape",
                          description="Time F.scaled_dot_product_attention on q (B, H, LQ, D), k and v (B, H, LK, D).")
    for name in ("b", "h", "lq", "lk", "d"):
        core.add_argument(name, type=int, metavar=name.upper())

    block = sub.add_parser("block", parents=[run], help="a real library attention block at 512 channels",
                           description="Time diffusers' Attention (vae) or denoising_diffusion_pytorch's Attention "
                           "(ddpm) on a (1, 512, SIDE, SIDE) input.")
    block.add_argument("kind", choices=("vae", "ddpm"))
    block.add_argument("side", type=int)

    whole = sub.add_parser("whole", parents=[run], help="a whole block on its bundle (exported first if missing)",
                           description="Time a whole block rebuilt from its bundle in target/bench_blocks/.")
    whole.add_argument("name", choices=list(WHOLE))

    export = sub.add_parser("export", help="only write the bundle of a whole-block case",
                            description="Write target/bench_blocks/NAME.safetensors (float32 and float64 runs).")
    export.add_argument("name", choices=list(WHOLE))
    export.add_argument("--mkl-avx512", action="store_true", help="accepted for symmetry (the export ignores it)")

    sub.add_parser("all", parents=[run], help="every case, one subprocess each (the options go to each)",
                   description="Run every core, block and whole case, one subprocess each, with these options.")

    cmp = sub.add_parser("compare", help="alternate PyTorch and the Rust examples, print the Markdown table",
                         description="Run each case alternately here and with the Rust example binaries, append "
                         "every JSON line to --out and print a Markdown table of the medians.")
    cmp.add_argument("rust_example", nargs="?", default=SDPA_BIN, metavar="RUST_EXAMPLE",
                     help="the bench_sdpa binary (default target/release/examples/bench_sdpa)")
    cmp.add_argument("--bundle-bin", default=BUNDLE_BIN, metavar="BIN",
                     help="the bench_bundle binary (default target/release/examples/bench_bundle)")
    cmp.add_argument("--rounds", type=int, default=5, metavar="N", help="rounds per case (default 5)")
    cmp.add_argument("--reps", type=int, default=0, metavar="N",
                     help="repetitions per run (default: about half a second of calls; 20 on a GPU)")
    cmp.add_argument("--only", metavar="SUBSTR", help="only the cases whose command line contains SUBSTR")
    cmp.add_argument("--out", default="bench_results.jsonl", metavar="FILE",
                     help="JSON lines appended here (default bench_results.jsonl)")
    cmp.add_argument("--device", default=None, metavar="DEV", help="passed to both sides (default the CPU)")
    cmp.add_argument("--dtype", default=None, choices=("f32", "f16", "bf16"), help="passed to both sides (default f32)")
    cmp.add_argument("--strict-f32", action="store_true", help="TF32 off in PyTorch's runs")
    cmp.add_argument("--mkl-avx512", action="store_true", help="PyTorch's runs with MKL's Intel code paths forced")
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.exit(__doc__)
    args = parser().parse_args(argv)
    if args.mkl_avx512 and args.command != "compare":
        mkl_avx512_reexec(argv)
    if args.command == "compare":
        compare(args)
    elif args.command == "export":
        export_whole(args.name)
    elif args.command == "whole":
        time_whole(args)
    elif args.command == "all":
        for c in case_args():
            subprocess.run([sys.executable, __file__, *c, *argv[1:]], check=True)
    else:
        one(args)


if __name__ == "__main__":
    main()
