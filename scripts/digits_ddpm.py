#!/usr/bin/env python3
"""A tiny DDPM trained on scikit-learn's handwritten digits, the trained weights the whole-model
checks and the sampling example (``examples/digits``) use.

    python scripts/digits_ddpm.py train [--steps 2000] [--threads 2]
    python scripts/digits_ddpm.py sample [--seed 0] [--ddpm-steps 1000] [--ddim-steps 50] [--out FILE]

``train``: diffusers' ``UNet2DModel`` (1 channel, 16 x 16, widths 32 / 48 / 64, attention at 4 x 4 and
in the mid block, 948 k parameters) learns to predict the noise of ``DDPMScheduler`` (1000 linear
betas from 1e-4 to 0.02, the DDPM paper's) on the 1,797 8 x 8 digits of
``sklearn.datasets.load_digits`` (a file scikit-learn ships: no download), upscaled bilinearly to
16 x 16 and mapped from [0, 16] to [-1, 1]. AdamW, batch 64, learning rate 1e-3 with 100 warm-up
steps and a cosine decay, an exponential moving average of the weights (decay 0.995) is what is
saved, as ``save_pretrained`` writes it, to ``weights/models/digits_ddpm`` with the scheduler's
config and ``training.json`` (steps, time, loss).

``sample``: the saved model sampled from the same noise with diffusers' ``DDPMScheduler`` (every
training step) and ``DDIMScheduler`` (eta 0, from the same config), written out plainly as a
pipeline does. The noise is not torch's: both sides draw it from the counter-based generator
:func:`normal` (SplitMix64, Box-Muller in float64, rounded to float32), which the Rust example
implements too, so that a new ``--seed`` needs no stored tensors. DDPM's per-step noise enters
through ``DDPMScheduler.step``'s own ``randn_tensor``, replaced for the loop. Writes

* ``weights/whole/digits_samples.safetensors`` (not a parity bundle): ``noise`` (the first draw,
  for the generator to be checked), ``alphas_cumprod``, the timesteps and final samples of both
  loops (``ddpm``, ``ddim``: ``(16, 1, 16, 16)`` in [-1, 1] before quantization), DDPM's with 100
  steps (``ddpm_short``, the loop the test runs) and the DDIM samples after each step (``ddim_steps``); metadata: the seed and the versions.
* ``docs/images/digits_torch_ddpm.png`` / ``digits_torch_ddim.png``: 4 x 4 grids, each digit
  scaled up 4 times, one grey pixel between digits, quantized as diffusers' ``numpy_to_pil`` does (``round(x * 255)``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "weights" / "models" / "digits_ddpm"
OUT = ROOT / "weights" / "whole" / "digits_samples.safetensors"
IMAGES = ROOT / "docs" / "images"
SIZE = 16
BATCH = 16
MASK64 = (1 << 64) - 1


def unet_config():
    return dict(sample_size=SIZE, in_channels=1, out_channels=1, block_out_channels=(32, 48, 64),
                down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
                up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"), layers_per_block=1,
                norm_num_groups=8, attention_head_dim=16)


def digits():
    """The 1,797 digits as (N, 1, 16, 16) float32 in [-1, 1]."""
    from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = torch.nn.functional.interpolate(images, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return images * 2.0 - 1.0


def _splitmix(x):
    """SplitMix64's output function of ``x + golden`` on uint64 arrays (wrapping arithmetic)."""
    z = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def normal(seed: int, stream: int, n: int) -> np.ndarray:
    """``n`` standard normal float32 values, element ``i`` of stream ``stream`` of ``seed``.

    key = mix(mix(seed) ^ stream); bits(c) = mix(key + c); a pair ``(2p, 2p + 1)`` takes
    u1 = ((bits(2p) >> 11) + 0.5) / 2^53 and u2 likewise from bits(2p + 1), then
    r = sqrt(-2 ln u1), z = (r cos 2 pi u2, r sin 2 pi u2) in float64, each rounded to float32.
    """
    with np.errstate(over="ignore"):
        key = _splitmix(np.array([seed], dtype=np.uint64))
        key = _splitmix(key ^ np.uint64(stream))
        pairs = (n + 1) // 2
        c = np.arange(2 * pairs, dtype=np.uint64)
        bits = _splitmix(key + c)
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    u1, u2 = u[0::2], u[1::2]
    r = np.array([math.sqrt(-2.0 * math.log(v)) for v in u1])
    theta = np.array([2.0 * math.pi * v for v in u2])
    z = np.empty(2 * pairs)
    z[0::2] = r * np.array([math.cos(t) for t in theta])
    z[1::2] = r * np.array([math.sin(t) for t in theta])
    return z[:n].astype(np.float32)


def noise(seed: int, stream: int, shape) -> torch.Tensor:
    return torch.from_numpy(normal(seed, stream, int(np.prod(shape))).reshape(shape))


def train(args):
    from diffusers import DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    data = digits()
    model = UNet2DModel(**unet_config())
    ema = UNet2DModel(**unet_config())
    ema.load_state_dict(model.state_dict())
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    warmup = 100
    lr = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    start, losses = time.time(), []
    for step in range(args.steps):
        idx = torch.randint(0, len(data), (64,))
        x0 = data[idx]
        eps = torch.randn_like(x0)
        t = torch.randint(0, 1000, (64,))
        loss = torch.nn.functional.mse_loss(model(scheduler.add_noise(x0, eps, t), t).sample, eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.995).add_(p, alpha=0.005)
        losses.append(loss.item())
        if step % 200 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {np.mean(losses[-200:]):.4f} ({time.time() - start:.0f} s)", flush=True)
    MODEL.mkdir(parents=True, exist_ok=True)
    ema.save_pretrained(MODEL)
    scheduler.save_config(MODEL)
    (MODEL / "training.json").write_text(json.dumps(dict(
        data="sklearn.datasets.load_digits, 8x8 upscaled bilinearly to 16x16, [0, 16] -> [-1, 1]",
        steps=args.steps, batch=64, optimizer="AdamW lr 1e-3, 100 warm-up steps, cosine decay",
        ema_decay=0.995, seconds=round(time.time() - start, 1), threads=torch.get_num_threads(),
        loss_last_200=round(float(np.mean(losses[-200:])), 5), torch=torch.__version__,
        script="scripts/digits_ddpm.py train"), indent=2) + "\n")


def grid_png(samples: torch.Tensor, path: Path, scale: int = 4, gap: int = 1):
    """A 4 x 4 grid of (16, 1, S, S) samples in [-1, 1], each pixel ``scale`` times, 8-bit grey,
    tiles ``gap`` pixels (scaled) apart on value 64."""
    from PIL import Image

    x = ((samples / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)[:, 0]
    s = x.shape[-1]
    pitch = s + gap
    img = torch.full((4 * pitch - gap, 4 * pitch - gap), 64, dtype=torch.uint8)
    for i in range(16):
        r, c = divmod(i, 4)
        img[r * pitch:r * pitch + s, c * pitch:c * pitch + s] = x[i]
    img = img.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    Image.fromarray(img.numpy(), mode="L").save(path)


def sample(args):
    import diffusers.schedulers.scheduling_ddpm as ddpm_module
    from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel
    from safetensors.torch import save_file

    model = UNet2DModel.from_pretrained(MODEL).eval()
    shape = (BATCH, 1, SIZE, SIZE)
    x_t = noise(args.seed, 0, shape)
    out = {"noise": x_t.clone()}

    def run_ddpm(steps):
        ddpm = DDPMScheduler.from_pretrained(MODEL)
        ddpm.set_timesteps(steps)
        draws = iter(range(1, 10 ** 6))
        real = ddpm_module.randn_tensor
        ddpm_module.randn_tensor = lambda shape, **_: noise(args.seed, next(draws), tuple(shape))
        x = x_t.clone()
        with torch.no_grad():
            for t in ddpm.timesteps:
                x = ddpm.step(model(x, t).sample, t, x).prev_sample
        ddpm_module.randn_tensor = real
        return ddpm, x

    ddpm, out["ddpm"] = run_ddpm(args.ddpm_steps)
    out["ddpm_timesteps"] = ddpm.timesteps.clone()
    short, out["ddpm_short"] = run_ddpm(args.ddpm_short_steps)
    out["ddpm_short_timesteps"] = short.timesteps.clone()

    ddim = DDIMScheduler.from_config(ddpm.config)
    ddim.set_timesteps(args.ddim_steps)
    x, steps = x_t.clone(), []
    with torch.no_grad():
        for t in ddim.timesteps:
            x = ddim.step(model(x, t).sample, t, x, eta=0.0).prev_sample
            steps.append(x)
    out["ddim"], out["ddim_timesteps"], out["ddim_steps"] = x, ddim.timesteps.clone(), torch.stack(steps)
    out["alphas_cumprod"] = ddpm.alphas_cumprod.clone()
    import diffusers

    meta = {"digits.seed": str(args.seed), "digits.ddpm_steps": str(args.ddpm_steps),
            "digits.ddim_steps": str(args.ddim_steps),
            "digits.ddpm_short_steps": str(args.ddpm_short_steps), "digits.torch": torch.__version__,
            "digits.diffusers": diffusers.__version__, "digits.source": "scripts/digits_ddpm.py sample"}
    out_file = Path(args.out)
    save_file({k: v.contiguous() for k, v in out.items()}, out_file, metadata=meta)
    if out_file.resolve() != OUT.resolve():
        print(f"wrote {out_file} (no PNGs: not the committed reference)")
        return
    grid_png(out["ddpm"], IMAGES / "digits_torch_ddpm.png")
    grid_png(out["ddim"], IMAGES / "digits_torch_ddim.png")
    print(f"wrote {OUT.relative_to(ROOT)} and docs/images/digits_torch_{{ddpm,ddim}}.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("sample")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ddpm-steps", type=int, default=1000)
    s.add_argument("--ddim-steps", type=int, default=50)
    s.add_argument("--ddpm-short-steps", type=int, default=100)
    s.add_argument("--out", default=str(OUT))
    s.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    (train if args.cmd == "train" else sample)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
