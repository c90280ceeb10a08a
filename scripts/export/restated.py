"""Self-contained ``ldm.MidBlock`` / ``openai.MiddleBlock`` bundles with random weights and inputs
(no whole model).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_, run_module
from reference import mid_blocks
from .common import Ctx, gen, GUIDED, LDM_MID, LDM_MID_LINEAR, OPENAI_MID, randn, SD_OPENAIMODEL


def standalone_restated(ctx: Ctx):
    """Self-contained ldm.MidBlock / openai.MiddleBlock bundles (random weights and inputs)."""
    # ldm: LinAttnBlock mid (DDPM Model with use_linear_attn / attn_type "linear"), with temb
    for name, cfg, seed, shape, half in (
            ("ldm_mid_block_linear", dict(in_channels=32, temb_channels=24, dropout=0.0, attn_type="linear"), 7701,
             (2, 32, 5, 3), True),
            ("ldm_mid_block_vae_vanilla", dict(in_channels=32, temb_channels=0, dropout=0.0, attn_type="vanilla"),
             7702, (1, 32, 6, 4), False)):
        torch.manual_seed(0)
        m = mid_blocks.LdmMidBlock(**cfg)
        randomize_(m, seed)
        m.eval()
        g = gen(seed + 100)
        ins = OrderedDict(x=randn(g, *shape))
        if cfg["temb_channels"]:
            ins["temb"] = randn(g, shape[0], cfg["temb_channels"])
        out = run_module(m, ins)["output"]
        what = {"linear": "LinAttnBlock (no norm, no residual)", "vanilla": "AttnBlock, VAE-style temb_channels 0",
                "none": "attn_type none (nn.Identity)"}[cfg["attn_type"]]
        ctx.bundle(name, "ldm.MidBlock", cfg, ins, out, state=m.state_dict(),
                   source=LDM_MID + (LDM_MID_LINEAR if cfg["attn_type"] == "linear" else "") +
                   f"; {what}; random weights and inputs (x, temb N(0, 1))", half=half)
    # openai: SD 2.x linear SpatialTransformer middle; AttentionBlock with the new qkv order
    for name, cfg, seed, shape, what in (
            ("openai_middle_block_sd2_linear",
             dict(channels=32, emb_channels=32, dropout=0.0, dims=2, use_scale_shift_norm=False, num_heads=-1,
                  num_head_channels=8, use_new_attention_order=False, use_spatial_transformer=True, transformer_depth=1,
                  context_dim=20, use_linear_in_transformer=True, disable_middle_self_attn=False, legacy=False),
             7711, (2, 32, 4, 5), "SpatialTransformer (use_linear; num_head_channels 8 -> 4 heads of 8) from " + SD_OPENAIMODEL),
            ("openai_middle_block_new_order",
             dict(channels=32, emb_channels=24, dropout=0.0, dims=2, use_scale_shift_norm=False, num_heads=-1,
                  num_head_channels=16, use_new_attention_order=True, use_spatial_transformer=False,
                  transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
                  disable_middle_self_attn=False, legacy=False),
             7712, (2, 32, 3, 5), "AttentionBlock (QKVAttention, new order; num_head_channels 16 -> 2 heads) from " + GUIDED)):
        torch.manual_seed(0)
        m = mid_blocks.openai_middle_block(**cfg)
        randomize_(m, seed)
        m.eval()
        g = gen(seed + 100)
        ins = OrderedDict(x=randn(g, *shape), emb=randn(g, shape[0], cfg["emb_channels"]))
        if cfg["use_spatial_transformer"]:
            ins["context"] = randn(g, shape[0], 6, cfg["context_dim"])
        out = run_module(m, ins)["output"]
        ctx.bundle(name, "openai.MiddleBlock", cfg, ins, out, state=m.state_dict(),
                   source=OPENAI_MID.format(what) + "; random weights and inputs (x, emb, context N(0, 1))",
                   half=True)
