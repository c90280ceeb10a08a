"""The ``core`` case (``F.scaled_dot_product_attention`` on one shape) and the ``block`` cases (a real
library attention block at 512 channels: diffusers' VAE mid attention, lucidrains' ``Attention``).
"""

import json
import os
import resource

from .machine import MKL_MARK, Timer, cpu_model, placement, rss_mib

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
