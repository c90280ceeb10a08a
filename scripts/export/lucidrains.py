"""Builder of the lucidrains ``denoising_diffusion_pytorch`` checkpoint (``Trainer.save``'s dict)
and its mid-block bundles.
"""

from __future__ import annotations

import torch

from parity_bundle import randomize_, run_module
from reference import mid_blocks
from .common import capture, Ctx, gen, LUCID_MID, MODELS, randn, tensor_inputs, WEIGHTS


def lucidrains(ctx: Ctx):
    from denoising_diffusion_pytorch.version import __version__
    from denoising_diffusion_pytorch import GaussianDiffusion, Unet
    from ema_pytorch import EMA

    torch.manual_seed(0)
    unet = Unet(dim=6, dim_mults=(1, 2), attn_heads=(4, 2), attn_dim_head=(4, 8))
    diffusion = GaussianDiffusion(unet, image_size=(8, 12), timesteps=100)
    randomize_(diffusion.model, 7301)
    # as Trainer.__init__ builds them: Adam over the diffusion parameters, EMA(diffusion, beta=ema_decay,
    # update_every=ema_update_every) with the Trainer defaults
    opt = torch.optim.Adam(diffusion.parameters(), lr=1e-4, betas=(0.9, 0.99))
    ema = EMA(diffusion, beta=0.995, update_every=10)
    ema.update()  # first call: copies the online weights into the EMA model (initted, step 1)
    # "training": new online weights, then one moving-average step (decay 0.5) so EMA != online
    randomize_(diffusion.model, 7302)
    ema.update_moving_average(ema.ema_model, ema.online_model, current_decay=0.5)
    diffusion.eval()
    ema.ema_model.eval()
    data = {"step": 1, "model": diffusion.state_dict(), "opt": opt.state_dict(), "ema": ema.state_dict(),
            "scaler": None, "version": __version__}
    folder = MODELS / "lucidrains_ddpm"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-1.pt"
    torch.save(data, path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()
    g = gen(7303)
    x, time = randn(g, 2, 3, 8, 12), torch.tensor([3, 71])
    for entry, net, prefix in (("model", diffusion.model, "model."), ("ema", ema.ema_model.model, "ema_model.model.")):
        wrapper = mid_blocks.LucidrainsMidBlock.of(net)
        ins, _ = capture(net.mid_block1, lambda: net(x, time), names={"t": "time_emb"})
        _, out = capture(net.mid_block2, lambda: net(x, time))
        cfg = mid_blocks.LucidrainsMidBlock.config_of(net)
        assert torch.equal(run_module(wrapper, tensor_inputs(ins))["output"], out)
        src = (LUCID_MID + f"; the Unet of the Trainer.save checkpoint weights/{weights}, entry '{entry}' "
               f"({'GaussianDiffusion.state_dict()' if entry == 'model' else 'ema_pytorch EMA.state_dict(); EMA != online weights'}), "
               "prefix " + prefix + "; x = the Unet's mid_block1 input and time_emb = time_mlp(time) captured by a "
               "forward pre-hook while the Unet ran on random x (2, 3, 8, 12), time [3, 71]; expected output = "
               "mid_block2's output in that run")
        ctx.bundle(f"lucidrains_mid_block_{entry}", "denoising_diffusion_pytorch.MidBlock", cfg, tensor_inputs(ins), out,
                   state=wrapper.state_dict(), source=src, half=(entry == "model"))
        ctx.bundle(f"lucidrains_mid_block_{entry}_ref", "denoising_diffusion_pytorch.MidBlock", cfg, tensor_inputs(ins),
                   out, ref=(weights, prefix, entry), source=src)
