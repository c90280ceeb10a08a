#!/usr/bin/env python3
"""PyTorch's side of the whole-model benchmark (BENCHMARKS.md, "Whole models"): one
``UNet2DConditionModel`` step at Stable Diffusion 1.5's size and one ``AutoencoderKL`` decode, in
float32 on the CPU, against ``cargo run --release --example bench_whole`` on the same folders.

    python scripts/bench/whole_models.py make DIR          # random SD 1.5-size unet/ and vae/ in DIR
    python scripts/bench/whole_models.py make DIR --sdxl   # random SDXL-size unet/ (2.6 B parameters) in DIR
    python scripts/bench/whole_models.py run DIR/unet unet [--runs 3] [--threads N] [--latent 64] [--batch 2]
    python scripts/bench/whole_models.py run DIR/vae vae [--runs 3] [--device cuda] [--dtype f16]
    python scripts/bench/whole_models.py make DIR --more    # DIR/controlnet (SD 1.5's, from DIR/unet), DIR/ddpm, DIR/lucidrains
    python scripts/bench/whole_models.py run DIR/controlnet controlnet | run DIR/ddpm unet2d --latent 32 --batch 16
    python scripts/bench/whole_models.py run DIR/lucidrains lucidrains --latent 64 --batch 4
    python scripts/bench/whole_models.py run DIR/annotated annotated --latent 28 --batch 128

``make --more`` writes the models of issue 58: SD 1.5's ``ControlNetModel`` (``from_unet`` of
``DIR/unet``, which ``make`` wrote), ``google/ddpm-cifar10-32``'s ``UNet2DModel`` config, and
lucidrains' ``Unet(dim=64, dim_mults=(1, 2, 4, 8))`` (the README's) as ``config.json`` and
``model.safetensors``, and the Annotated Diffusion post's ``Unet(dim=28, channels=1, dim_mults=(1, 2, 4))`` (its
Fashion-MNIST model; ``scripts/reference/annotated_diffusion.py``) the same way. ``controlnet`` runs one step at the U-Net's shapes with a control image
(2, 3, 512, 512), ``unet2d`` a step at timestep 500 on (batch, 3, latent, latent), ``lucidrains``
a step at time 500 on (batch, 3, latent, latent), ``annotated`` the same on (batch, 1, latent, latent) (the
post trains on 28 × 28 images in batches of 128).

``--device`` (cpu, cuda) and ``--dtype`` (f32, f16, bf16) place the model and its inputs (on a GPU each run
ends with ``torch.cuda.synchronize()``, and the line adds ``cuda_peak_mib``); the GPU kit's ``models`` stage
runs it (``scripts/gpu_kit/run.sh``) against ``bench_whole --device cuda``.

``make --sdxl`` writes SDXL base 1.0's U-Net config (10.3 GB of f32 weights) instead: the size of the
model a 16 GB machine must hold, measured without a download. ``make`` builds both models with
diffusers 0.42.1's SD 1.5 configs (the U-Net's defaults with
``cross_attention_dim=768``; the VAE of ``sd-vae-ft-mse``: 128, 256, 512, 512 channels) from a
seeded random initialisation and saves them as diffusers folders (about 3.4 GB and 330 MB): speed
does not depend on the weights' values. ``run`` loads one (one model a process, so that the peak
memory is that model's), runs it once to warm up, then ``--runs`` times, and prints one JSON line:
the shapes, each run's milliseconds, the median and the fastest, the resident memory after loading
and the peaks of the load, of the first run and of the timed runs (``VmHWM``, reset between
them through ``/proc/self/clear_refs``), the load's milliseconds (``from_pretrained`` with
``torch_dtype``: what a user calls), and torch's version and thread count.

Shapes: the U-Net on a latent (2, 4, 64, 64) (classifier-free guidance's batch of two at 512 × 512)
with timestep 500 and a context (2, 77, 768); the VAE's ``decode`` of a latent (1, 4, 64, 64) to a
(1, 3, 512, 512) image.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """VmHWM back to the current resident size (Linux 4.0+), so the next reading is the peak of
    what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# SDXL base 1.0's U-Net (diffusers' config.json of stabilityai/stable-diffusion-xl-base-1.0).
SDXL_UNET = dict(
    sample_size=128,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(320, 640, 1280),
    attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
)


# google/ddpm-cifar10-32's UNet2DModel config
DDPM_CIFAR10 = dict(sample_size=32, block_out_channels=(128, 256, 256, 256), layers_per_block=2,
                    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                    up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                    attention_head_dim=None, norm_eps=1e-6, downsample_padding=0, flip_sin_to_cos=False,
                    freq_shift=1)
LUCIDRAINS = dict(dim=64, dim_mults=(1, 2, 4, 8))
ANNOTATED = dict(dim=28, channels=1, dim_mults=(1, 2, 4))


def annotated_unet_class():
    """The post's ``Unet`` (re-stated in scripts/reference/annotated_diffusion.py)."""
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from reference.annotated_diffusion import Unet

    return Unet


def make_more(out: str) -> None:
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel, UNet2DModel
    from denoising_diffusion_pytorch import Unet
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ControlNetModel.from_unet(UNet2DConditionModel.from_pretrained(f"{out}/unet")).save_pretrained(f"{out}/controlnet")
    UNet2DModel(**DDPM_CIFAR10).save_pretrained(f"{out}/ddpm")
    import os
    os.makedirs(f"{out}/lucidrains", exist_ok=True)
    with open(f"{out}/lucidrains/config.json", "w") as f:
        json.dump(LUCIDRAINS, f)
    save_file({k: v.contiguous() for k, v in Unet(**LUCIDRAINS).state_dict().items()}, f"{out}/lucidrains/model.safetensors")
    os.makedirs(f"{out}/annotated", exist_ok=True)
    with open(f"{out}/annotated/config.json", "w") as f:
        json.dump(ANNOTATED, f)
    model = annotated_unet_class()(**ANNOTATED)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/annotated/model.safetensors")
    print(f"wrote {out}/controlnet, {out}/ddpm, {out}/lucidrains and {out}/annotated")


def make(out: str, sdxl: bool = False) -> None:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    if sdxl:
        UNet2DConditionModel(**SDXL_UNET).save_pretrained(f"{out}/unet")
        print(f"wrote {out}/unet")
        return
    UNet2DConditionModel(cross_attention_dim=768, sample_size=64).save_pretrained(f"{out}/unet")
    AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        sample_size=512,
    ).save_pretrained(f"{out}/vae")
    print(f"wrote {out}/unet and {out}/vae")


def run(folder: str, model: str, runs: int, threads: int | None, device: str = "cpu", dtype: str = "f32",
        latent: int = 64, batch: int | None = None) -> None:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    if threads:
        torch.set_num_threads(threads)
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(0)

    def put(t):
        return t.to(device=device, dtype=dt)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    n = latent
    t0 = time.perf_counter()
    if model == "unet":
        b = batch or 2
        m = UNet2DConditionModel.from_pretrained(folder, torch_dtype=dt).eval().to(device=device)
        load_ms = (time.perf_counter() - t0) * 1e3
        cfg = m.config
        ctx_dim = cfg.cross_attention_dim if isinstance(cfg.cross_attention_dim, int) else cfg.cross_attention_dim[0]
        x = put(torch.randn(b, 4, n, n, generator=g))
        ctx = put(torch.randn(b, 77, ctx_dim, generator=g))
        kwargs = {}
        shapes = f"sample ({b}, 4, {n}, {n}), timestep 500, context ({b}, 77, {ctx_dim})"
        if cfg.addition_embed_type == "text_time":
            text = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
            kwargs["added_cond_kwargs"] = {
                "text_embeds": put(torch.randn(b, text, generator=g)),
                "time_ids": put(torch.randn(b, 6, generator=g)),
            }
            shapes += ", added_cond_kwargs"

        def step():
            return m(x, 500.0, ctx, return_dict=False, **kwargs)[0]
    elif model == "controlnet":
        from diffusers import ControlNetModel

        b = batch or 2
        m = ControlNetModel.from_pretrained(folder, torch_dtype=dt).eval().to(device=device)
        load_ms = (time.perf_counter() - t0) * 1e3
        levels = len(m.config.conditioning_embedding_out_channels) - 1
        x = put(torch.randn(b, 4, n, n, generator=g))
        ctx = put(torch.randn(b, 77, m.config.cross_attention_dim, generator=g))
        cond = put(torch.rand(b, 3, n << levels, n << levels, generator=g))

        def step():
            return m(x, 500.0, ctx, cond, return_dict=False)[1]
        shapes = f"sample ({b}, 4, {n}, {n}), timestep 500, context ({b}, 77, {m.config.cross_attention_dim}), " \
                 f"controlnet_cond ({b}, 3, {n << levels}, {n << levels})"
    elif model == "unet2d":
        from diffusers import UNet2DModel

        b = batch or 16
        m = UNet2DModel.from_pretrained(folder, torch_dtype=dt).eval().to(device=device)
        load_ms = (time.perf_counter() - t0) * 1e3
        x = put(torch.randn(b, m.config.in_channels, n, n, generator=g))

        def step():
            return m(x, 500, return_dict=False)[0]
        shapes = f"sample ({b}, {m.config.in_channels}, {n}, {n}), timestep 500"
    elif model in ("lucidrains", "annotated"):
        from safetensors.torch import load_file

        if model == "lucidrains":
            from denoising_diffusion_pytorch import Unet
        else:
            Unet = annotated_unet_class()
        b = batch or (4 if model == "lucidrains" else 128)
        with open(f"{folder}/config.json") as f:
            cfg = json.load(f)
        m = Unet(**cfg)
        m.load_state_dict(load_file(f"{folder}/model.safetensors"))
        m = m.eval().to(device=device, dtype=dt)
        load_ms = (time.perf_counter() - t0) * 1e3
        x = put(torch.randn(b, m.channels, n, n, generator=g))
        t = torch.full((b,), 500, device=device)

        def step():
            return m(x, t)
        shapes = f"x ({b}, {m.channels}, {n}, {n}), time 500"
    else:
        b = batch or 1
        m = AutoencoderKL.from_pretrained(folder, torch_dtype=dt).eval().to(device=device)
        load_ms = (time.perf_counter() - t0) * 1e3
        z = put(torch.randn(b, 4, n, n, generator=g))

        def step():
            return m.decode(z, return_dict=False)[0]

        shapes = f"decode ({b}, 4, {n}, {n}) -> ({b}, 3, {8 * n}, {8 * n})"
    loaded = rss_mib()
    peak_load = status_mib("VmHWM:")
    reset_peak()
    times = []
    with torch.inference_mode():
        t1 = time.perf_counter()
        step()
        sync()
        first_ms = (time.perf_counter() - t1) * 1e3
        peak_first = status_mib("VmHWM:")
        reset_peak()
        for _ in range(runs):
            t0 = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    peak_steady = status_mib("VmHWM:")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    extra = {}
    if device.startswith("cuda"):
        extra = {"cuda_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20), "gpu": torch.cuda.get_device_name()}
    print(json.dumps({
        "side": "pytorch", "model": model, "shapes": shapes, "dtype": dtype, "device": device, **extra,
        "load_ms": round(load_ms, 1), "first_ms": round(first_ms, 1),
        "runs_ms": [round(t, 1) for t in times],
        "median_ms": round(statistics.median(times), 1) if times else None,
        "min_ms": round(min(times), 1) if times else None,
        "rss_loaded_mib": round(loaded), "peak_load_mib": round(peak_load),
        "peak_first_mib": round(peak_first), "peak_steady_mib": round(peak_steady),
        "peak_rss_mib": round(peak),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("out")
    mk.add_argument("--sdxl", action="store_true", help="SDXL base 1.0's U-Net instead of SD 1.5's models")
    mk.add_argument("--more", action="store_true", help="SD 1.5's ControlNet (from OUT/unet), DDPM CIFAR-10, lucidrains' Unet")
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("model", choices=["unet", "vae", "controlnet", "unet2d", "lucidrains", "annotated"])
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--device", default="cpu")
    r.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    r.add_argument("--latent", type=int, default=64, help="the latent's height and width")
    r.add_argument("--batch", type=int, default=None, help="default 2 (U-Net), 1 (VAE)")
    a = p.parse_args(argv)
    if a.cmd == "make" and a.more:
        make_more(a.out)
    elif a.cmd == "make":
        make(a.out, a.sdxl)
    else:
        run(a.folder, a.model, a.runs, a.threads, a.device, a.dtype, a.latent, a.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
