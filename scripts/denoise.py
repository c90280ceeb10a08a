#!/usr/bin/env python3
"""The PyTorch side of the denoising example (``examples/denoise.rs``): a DDIM loop with
classifier-free guidance driving diffusers' own ``UNet2DConditionModel`` and ``AutoencoderKL`` on
the tiny committed models, written out plainly, its result saved for the Rust loop to match.

    python scripts/denoise.py [--steps 10] [--size 16] [--seed 0] [--threads 1]

The loop is Stable Diffusion 1.5's sampler with its scheduler config: DDIM, eta 0,
``scaled_linear`` betas from 0.00085 to 0.012 over 1000 training steps, ``set_alpha_to_one=False``,
``leading`` timestep spacing with ``steps_offset`` 1, epsilon prediction, no clipping. Each step
runs the U-Net once on a batch of two (the unconditional context first, then the conditional one,
as the SD pipeline concatenates them), mixes the two noise predictions with guidance scale 7.5 and
takes the DDIM step. The final latents are decoded with ``vae.decode(latents / scaling_factor)`` and
mapped to [0, 1] with ``(x / 2 + 0.5).clamp(0, 1)``.

The plain loop is checked against diffusers' ``DDIMScheduler`` built with the same config: the
same timesteps, the same ``alphas_cumprod``, and ``scheduler.step`` giving bit-identical latents at
every step (asserted). There is no text encoder: the two contexts are seeded random
``(1, 7, cross_attention_dim)`` tensors.

Writes

* ``weights/whole/denoise_sd1.safetensors`` (no ``parity.*`` metadata: not a parity bundle;
  ``unet-parity check weights`` skips it with its note on checkpoints): the inputs ``noise``
  ``(1, 4, S, S)`` and ``context`` ``(2, 7, 24)`` (unconditional, conditional), the schedule
  ``timesteps`` (int64) and ``alphas_cumprod`` (float32, for the Rust schedule to be compared
  with), PyTorch's ``latents`` after each step ``(steps, 1, 4, S, S)``, its final float32
  ``image`` ``(1, 3, 2S, 2S)`` before 8-bit quantization, and ``image_f16`` / ``image_bf16``: the
  same loop with both models converted to that dtype (``.to(dtype)``, latents and contexts in it,
  as diffusers runs a half pipeline), stored as float32. Metadata: the loop's settings and the
  torch / diffusers versions.
* ``docs/images/denoise_torch.png``: the float32 image quantized as diffusers' ``numpy_to_pil``
  does (``round(x * 255)``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
UNET = ROOT / "weights" / "models" / "diffusers_sd1"
VAE = ROOT / "weights" / "models" / "diffusers_vae"
OUT = ROOT / "weights" / "whole" / "denoise_sd1.safetensors"
PNG = ROOT / "docs" / "images" / "denoise_torch.png"

# SD 1.5's scheduler_config.json, the fields DDIM reads.
SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                 clip_sample=False, set_alpha_to_one=False, steps_offset=1, timestep_spacing="leading",
                 prediction_type="epsilon")
GUIDANCE = 7.5


class PlainDdim:
    """DDIM with eta 0, written out: the schedule and the step, nothing else."""

    def __init__(self, steps: int, train_steps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 steps_offset: int = 1):
        # "scaled_linear": linear in sqrt(beta), in float32, squared.
        betas = torch.linspace(beta_start**0.5, beta_end**0.5, train_steps, dtype=torch.float32) ** 2
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        # set_alpha_to_one=False: the step past t = 0 lands on alphas_cumprod[0], not on 1.
        self.final_alpha_cumprod = self.alphas_cumprod[0]
        # "leading" spacing: 0, r, 2r, ... reversed, shifted by steps_offset.
        self.ratio = train_steps // steps
        self.timesteps = [i * self.ratio + steps_offset for i in reversed(range(steps))]

    def step(self, eps: torch.Tensor, t: int, x: torch.Tensor) -> torch.Tensor:
        prev = t - self.ratio
        a_t = self.alphas_cumprod[t]
        a_prev = self.alphas_cumprod[prev] if prev >= 0 else self.final_alpha_cumprod
        # 0-d float32 tensors, as the scheduler computes them; the tensors keep their own dtype.
        x0 = (x - (1 - a_t) ** 0.5 * eps) / a_t**0.5
        return a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps


def load(dtype):
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(UNET, torch_dtype=dtype).eval()
    vae = AutoencoderKL.from_pretrained(VAE, torch_dtype=dtype).eval()
    return unet, vae


@torch.no_grad()
def denoise(noise, context, steps, dtype, check_scheduler=False):
    """The loop in ``dtype``: (latents after each step, as float32; the image in [0, 1], float32)."""
    unet, vae = load(dtype)
    ddim = PlainDdim(steps)
    if check_scheduler:
        from diffusers import DDIMScheduler

        sched = DDIMScheduler(**SCHEDULER)
        sched.set_timesteps(steps)
        assert sched.timesteps.tolist() == ddim.timesteps, (sched.timesteps, ddim.timesteps)
        assert torch.equal(sched.alphas_cumprod, ddim.alphas_cumprod)
        assert sched.init_noise_sigma == 1.0
    latents = noise.to(dtype)  # init_noise_sigma is 1 for DDIM
    context = context.to(dtype)
    trajectory = []
    for t in ddim.timesteps:
        both = torch.cat([latents, latents])  # scale_model_input is the identity for DDIM
        eps = unet(both, torch.tensor(t), encoder_hidden_states=context).sample
        uncond, cond = eps.chunk(2)
        eps = uncond + GUIDANCE * (cond - uncond)
        stepped = ddim.step(eps, t, latents)
        if check_scheduler:
            theirs = sched.step(eps, t, latents, eta=0.0).prev_sample
            assert theirs.dtype == stepped.dtype and torch.equal(theirs, stepped), f"step at t={t}"
        latents = stepped
        trajectory.append(latents.float())
    image = vae.decode(latents / vae.config.scaling_factor).sample
    image = (image / 2 + 0.5).clamp(0, 1)
    return torch.stack(trajectory), image.float()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--size", type=int, default=16, help="latent height and width")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    import diffusers
    from PIL import Image
    from safetensors.torch import save_file

    unet, _ = load(torch.float32)
    c = unet.config
    g = torch.Generator().manual_seed(args.seed)
    noise = torch.randn(1, c.in_channels, args.size, args.size, generator=g)
    uncond = torch.randn(1, 7, c.cross_attention_dim, generator=g)
    cond = torch.randn(1, 7, c.cross_attention_dim, generator=g)
    context = torch.cat([uncond, cond])

    latents, image = denoise(noise, context, args.steps, torch.float32, check_scheduler=True)
    _, image_f16 = denoise(noise, context, args.steps, torch.float16)
    _, image_bf16 = denoise(noise, context, args.steps, torch.bfloat16)
    ddim = PlainDdim(args.steps)
    tensors = {
        "noise": noise,
        "context": context,
        "timesteps": torch.tensor(ddim.timesteps, dtype=torch.int64),
        "alphas_cumprod": ddim.alphas_cumprod,
        "latents": latents.contiguous(),
        "image": image.contiguous(),
        "image_f16": image_f16.contiguous(),
        "image_bf16": image_bf16.contiguous(),
    }
    meta = {
        "denoise.steps": str(args.steps),
        "denoise.guidance_scale": str(GUIDANCE),
        "denoise.seed": str(args.seed),
        "denoise.scheduler": json.dumps(SCHEDULER),
        "denoise.unet": "weights/models/diffusers_sd1",
        "denoise.vae": "weights/models/diffusers_vae",
        "denoise.source": (f"scripts/denoise.py: plain DDIM (eta 0) checked against DDIMScheduler step by step; "
                           f"torch {torch.__version__}, diffusers {diffusers.__version__}"),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT), metadata=meta)
    PNG.parent.mkdir(parents=True, exist_ok=True)
    pixels = (image[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    Image.fromarray(pixels).save(PNG)
    print(f"{OUT.relative_to(ROOT)}  {OUT.stat().st_size} bytes; {PNG.relative_to(ROOT)} {pixels.shape}")
    q = lambda x: (x * 255).round()  # noqa: E731
    for name, half in [("f16", image_f16), ("bf16", image_bf16)]:
        print(f"PyTorch {name} vs its f32 image: max |diff| {(half - image).abs().max().item():.3e}, "
              f"8-bit values differing {(q(half) != q(image)).sum().item()} of {image.numel()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
