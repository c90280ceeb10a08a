"""Builder of the guided-diffusion checkpoint (a bare ``UNetModel.state_dict()``) and its
``openai.MiddleBlock`` bundle.
"""

from __future__ import annotations

import json

import torch

from parity_bundle import randomize_
from .common import capture, Ctx, gen, GUIDED, MODELS, OPENAI_MID, randn, tensor_inputs, WEIGHTS


def guided_diffusion_checkpoint(ctx: Ctx):
    """guided-diffusion's own checkpoint format, a bare ``UNetModel.state_dict()`` ``.pt``, of a whole
    ``guided_diffusion.unet.UNetModel`` (AttentionBlock with QKVAttentionLegacy, 4 heads,
    use_scale_shift_norm)."""
    from guided_diffusion.unet import UNetModel

    torch.manual_seed(0)
    unet_kw = dict(image_size=8, in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                   attention_resolutions=(), channel_mult=(1,), num_heads=4, use_scale_shift_norm=True)
    unet = UNetModel(**unet_kw)
    randomize_(unet, 7501)
    unet.eval()
    folder = MODELS / "guided_tiny"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "guided_tiny.pt"
    torch.save(unet.state_dict(), path)
    ctx.files.append(path)
    weights = path.relative_to(WEIGHTS).as_posix()
    cfg = dict(channels=32, emb_channels=unet.time_embed[0].out_features, dropout=0.0, dims=2,
               use_scale_shift_norm=True, num_heads=4, num_head_channels=-1, use_new_attention_order=False,
               use_spatial_transformer=False, transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
               disable_middle_self_attn=False, legacy=True)
    g = gen(7510)
    x, t = randn(g, 2, 3, 5, 3), torch.tensor([17, 503])
    ins, out = capture(unet.middle_block, lambda: unet(x, t))
    ctx.bundle("openai_middle_block_guided_legacy_scale_shift_ref", "openai.MiddleBlock", cfg, tensor_inputs(ins), out,
               ref=(weights, "middle_block."),
               source=OPENAI_MID.format("AttentionBlock (QKVAttentionLegacy, 4 heads)") + f" of {GUIDED}: the "
               f"middle_block of the whole UNetModel({json.dumps(unet_kw)}) saved as its bare state dict weights/{weights}; "
               "x and emb = the middle_block's inputs captured by a forward pre-hook while the UNetModel ran on random "
               "x (2, 3, 5, 3), timesteps [17, 503]; expected output = its output in that run")
