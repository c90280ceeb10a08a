#!/usr/bin/env python3
"""PyTorch's side of the whole-model benchmark (BENCHMARKS.md, "Whole models"): one
``UNet2DConditionModel`` step at Stable Diffusion 1.5's size and one ``AutoencoderKL`` decode, in
float32 on the CPU, against ``cargo run --release --example bench_whole`` on the same folders.

    python scripts/bench/whole_models.py make DIR          # random SD 1.5-size unet/ and vae/ in DIR
    python scripts/bench/whole_models.py run DIR/unet unet [--runs 3] [--threads N]
    python scripts/bench/whole_models.py run DIR/vae vae [--runs 3] [--device cuda] [--dtype f16]

``--device`` (cpu, cuda) and ``--dtype`` (f32, f16, bf16) place the model and its inputs (on a GPU each run
ends with ``torch.cuda.synchronize()``, and the line adds ``cuda_peak_mib``); the GPU kit's ``models`` stage
runs it (``scripts/gpu_kit/run.sh``) against ``bench_whole --device cuda``.

``make`` builds both models with diffusers 0.42.1's SD 1.5 configs (the U-Net's defaults with
``cross_attention_dim=768``; the VAE of ``sd-vae-ft-mse``: 128, 256, 512, 512 channels) from a
seeded random initialisation and saves them as diffusers folders (about 3.4 GB and 330 MB): speed
does not depend on the weights' values. ``run`` loads one (one model a process, so that the peak
memory is that model's), runs it once to warm up, then ``--runs`` times, and prints one JSON line:
the shapes, each run's milliseconds, the median and the fastest, the resident memory after loading
and the process's peak (``ru_maxrss``), and torch's version and thread count.

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


def make(out: str) -> None:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    UNet2DConditionModel(cross_attention_dim=768, sample_size=64).save_pretrained(f"{out}/unet")
    AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        sample_size=512,
    ).save_pretrained(f"{out}/vae")
    print(f"wrote {out}/unet and {out}/vae")


def run(folder: str, model: str, runs: int, threads: int | None, device: str = "cpu", dtype: str = "f32") -> None:
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

    if model == "unet":
        m = UNet2DConditionModel.from_pretrained(folder).eval().to(device=device, dtype=dt)
        x = put(torch.randn(2, 4, 64, 64, generator=g))
        ctx = put(torch.randn(2, 77, 768, generator=g))

        def step():
            return m(x, 500.0, ctx, return_dict=False)[0]

        shapes = "sample (2, 4, 64, 64), timestep 500, context (2, 77, 768)"
    else:
        m = AutoencoderKL.from_pretrained(folder).eval().to(device=device, dtype=dt)
        z = put(torch.randn(1, 4, 64, 64, generator=g))

        def step():
            return m.decode(z, return_dict=False)[0]

        shapes = "decode (1, 4, 64, 64) -> (1, 3, 512, 512)"
    loaded = rss_mib()
    times = []
    with torch.inference_mode():
        step()
        sync()
        for _ in range(runs):
            t0 = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    extra = {}
    if device.startswith("cuda"):
        extra = {"cuda_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20), "gpu": torch.cuda.get_device_name()}
    print(json.dumps({
        "side": "pytorch", "model": model, "shapes": shapes, "dtype": dtype, "device": device, **extra,
        "runs_ms": [round(t, 1) for t in times],
        "median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
        "rss_loaded_mib": round(loaded), "peak_rss_mib": round(peak),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("folder")
    r.add_argument("model", choices=["unet", "vae"])
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--device", default="cpu")
    r.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    a = p.parse_args(argv)
    if a.cmd == "make":
        make(a.out)
    else:
        run(a.folder, a.model, a.runs, a.threads, a.device, a.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
