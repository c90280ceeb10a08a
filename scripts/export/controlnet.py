"""Builders of the diffusers ControlNet models: ``ControlNetModel`` (its mid block plus the
``controlnet_mid_block`` zero convolution) and ``UNetControlNetXSModel``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_
from .common import capture, Ctx, gen, randn, save_diffusers, sub_state, tensor_inputs, WEIGHTS
from .configs import _per_block, controlnet_mid_config


def diffusers_controlnet(ctx: Ctx):
    """``ControlNetModel`` (diffusers 0.42.1 controlnets/controlnet.py): its ``mid_block`` and the
    ``controlnet_mid_block`` zero convolution (random non-zero weights here, so a port that drops or
    misreads it fails), checked as ``diffusers.ControlNetMidBlock`` against the outputs of the whole
    model's forward: the mid block's ``sample`` (captured by a forward hook) and the returned
    ``mid_block_res_sample``."""
    from diffusers import ControlNetModel

    common = dict(in_channels=4, conditioning_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), norm_num_groups=4, cross_attention_dim=24,
                  conditioning_embedding_out_channels=(4, 8))
    variants = [
        # name (None: not saved as a model), extra kwargs, seed, conditioning_scale, what
        ("diffusers_controlnet", dict(attention_head_dim=(1, 2), use_linear_projection=True,
                                      transformer_layers_per_block=(1, 2), upcast_attention=True,
                                      mid_block_scale_factor=1.25), 7501, 0.7,
         "SD 2.x / XL-like ControlNet (attention_head_dim [1, 2] -> 2 heads at the mid, use_linear_projection, "
         "transformer_layers_per_block [1, 2] -> 2 at the mid, upcast_attention, mid_block_scale_factor 1.25)"),
        ("global_pool", dict(attention_head_dim=2, resnet_time_scale_shift="scale_shift", global_pool_conditions=True),
         7502, 0.5, "SD 1.x-like ControlNet with global_pool_conditions (conv projections, attention_head_dim 2 = "
         "2 heads, resnet_time_scale_shift scale_shift; the residual mean-pooled over H, W)"),
        ("unet_mid_block_2d", dict(attention_head_dim=2, mid_block_type="UNetMidBlock2D"), 7503, 1.0,
         "ControlNet with mid_block_type UNetMidBlock2D (one ResNet: num_layers 0, add_attention False)"),
    ]
    for name, kw, seed, scale, what in variants:
        torch.manual_seed(0)
        model = ControlNetModel(**common, **kw)
        randomize_(model, seed)
        model.eval()
        assert model.controlnet_mid_block.weight.abs().min() > 0, "the zero conv must be randomised"
        g = gen(seed + 1)
        sample, t = randn(g, 2, 4, 8, 12), torch.tensor([17, 503])
        ehs, cond = randn(g, 2, 7, 24), randn(g, 2, 3, 16, 24)

        def run():
            return model(sample, t, encoder_hidden_states=ehs, controlnet_cond=cond, conditioning_scale=scale,
                         return_dict=False)

        ins, mid_out = capture(model.mid_block, run)
        with torch.no_grad():
            res = run()[1]
        cfg = controlnet_mid_config(model)
        kwargs = {"conditioning_scale": scale}
        stem = "controlnet_mid_block" + ("" if name == "diffusers_controlnet" else f"_{name}")
        inputs_what = (f"random sample (2, 4, 8, 12), timesteps [17, 503], encoder_hidden_states (2, 7, 24), "
                       f"controlnet_cond (2, 3, 16, 24), conditioning_scale {scale}")
        if name == "diffusers_controlnet":
            files = save_diffusers(model, name)
            ctx.files += files
            weights = files[1].relative_to(WEIGHTS).as_posix()
            src = (f"wrapper scripts/reference/mid_blocks.py ControlNetMidBlock holding the real diffusers "
                   f"UNetMidBlock2DCrossAttn and nn.Conv2d of the whole ControlNetModel weights/{weights} (mid_block, "
                   f"controlnet_mid_block); {what}; inputs captured by a forward pre-hook while the model ran on "
                   f"{inputs_what}; outputs: the model's mid_block_res_sample and the mid block's output")
        else:
            src = (f"wrapper scripts/reference/mid_blocks.py ControlNetMidBlock holding the real diffusers "
                   f"{cfg['mid_block_type']} and nn.Conv2d of a whole ControlNetModel (not saved); {what}; inputs "
                   f"captured by a forward pre-hook while the model ran on {inputs_what}; outputs: the model's "
                   "mid_block_res_sample and the mid block's output")
        # the wrapper on the captured inputs gives the whole model's outputs bit for bit (asserted in export_all)
        state = OrderedDict((k, v) for k, v in model.state_dict().items()
                            if k.startswith(("mid_block.", "controlnet_mid_block.")))
        ctx.bundle(stem, "diffusers.ControlNetMidBlock", cfg, tensor_inputs(ins), (res, mid_out), state=state,
                   source=src, half=(name == "diffusers_controlnet"), kwargs=kwargs)
        if name == "diffusers_controlnet":
            ctx.bundle(f"{stem}_ref", "diffusers.ControlNetMidBlock", cfg, tensor_inputs(ins), (res, mid_out),
                       ref=(weights, ""), source=src, kwargs=kwargs)

def controlnet_xs_mid_config(model) -> dict:
    """``UNetControlNetXSModel.__init__`` (controlnets/controlnet_xs.py): ``time_embed_dim = block_out_channels[0] * 4``,
    ``transformer_layers_per_block``, ``cross_attention_dim``, ``num_attention_heads`` and ``ctrl_num_attention_heads``
    made per-block, then ``ControlNetXSCrossAttnMidBlock2D(base_channels=block_out_channels[-1],
    ctrl_channels=ctrl_block_out_channels[-1], temb_channels=time_embed_dim, norm_num_groups, ctrl_max_norm_num_groups,
    transformer_layers_per_block[-1], base_num_attention_heads=num_attention_heads[-1],
    ctrl_num_attention_heads=ctrl_num_attention_heads[-1], cross_attention_dim[-1], upcast_attention,
    use_linear_projection)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.base_time_embedding.linear_2.out_features
    return dict(base_channels=c.block_out_channels[-1], ctrl_channels=c.ctrl_block_out_channels[-1], temb_channels=temb,
                norm_num_groups=c.norm_num_groups, ctrl_max_norm_num_groups=c.ctrl_max_norm_num_groups,
                transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                base_num_attention_heads=_per_block(c.num_attention_heads, n)[-1],
                ctrl_num_attention_heads=_per_block(c.ctrl_num_attention_heads, n)[-1],
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1], upcast_attention=c.upcast_attention,
                use_linear_projection=c.use_linear_projection)


def diffusers_controlnet_xs(ctx: Ctx):
    """``UNetControlNetXSModel`` (diffusers 0.42.1 controlnets/controlnet_xs.py): a U-Net fused with a ControlNet-XS
    adapter, whose mid block ``ControlNetXSCrossAttnMidBlock2D`` runs the base and the control mid blocks side by
    side, joined by the ``base_to_ctrl`` / ``ctrl_to_base`` zero convolutions (random non-zero weights here, so a
    port that drops either fails). Bundles from the real class's mid block inside the whole model's forward, with
    ``conditioning_scale`` 0.6 and, once, ``apply_control=False`` (the model's own path that leaves the control
    stream out: the mid block then returns the control input as it came)."""
    from diffusers import UNetControlNetXSModel

    torch.manual_seed(0)
    model = UNetControlNetXSModel(
        sample_size=8, down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"), block_out_channels=(4, 8), norm_num_groups=4,
        cross_attention_dim=12, transformer_layers_per_block=(1, 2), num_attention_heads=(1, 2),
        ctrl_conditioning_embedding_out_channels=(4, 8), ctrl_block_out_channels=(4, 4), ctrl_num_attention_heads=(1, 2),
        ctrl_max_norm_num_groups=3, ctrl_learn_time_embedding=True, time_embedding_mix=0.75)
    randomize_(model, 7601)
    model.eval()
    for conv in (model.mid_block.base_to_ctrl, model.mid_block.ctrl_to_base):
        assert conv.weight.abs().min() > 0, "the zero convs must be randomised"
    assert model.mid_block.ctrl_midblock.resnets[0].norm1.num_groups == 2  # find_largest_factor(gcd(4, 12), 3)
    files = save_diffusers(model, "diffusers_controlnet_xs")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    cfg = controlnet_xs_mid_config(model)
    g = gen(7602)
    sample, t = randn(g, 2, 4, 4, 6), torch.tensor([17, 503])
    ehs, cond = randn(g, 2, 5, 12), randn(g, 2, 3, 8, 12)
    what = ("tiny UNetControlNetXSModel (block_out_channels [4, 8], ctrl_block_out_channels [4, 4], DownBlock2D / UpBlock2D "
            "around the mid, 2 base and 2 ctrl heads and 2 transformer layers at the mid, use_linear_projection, "
            "upcast_attention, ctrl_max_norm_num_groups 3 -> 2 groups in ctrl_midblock (find_largest_factor(gcd(4, 12), 3)), "
            "ctrl_learn_time_embedding with time_embedding_mix 0.75)")
    for stem, scale, apply in (("controlnet_xs_mid_block", 0.6, True), ("controlnet_xs_mid_block_no_control_ref", 0.6, False)):
        def run():
            return model(sample, t, encoder_hidden_states=ehs, controlnet_cond=cond, conditioning_scale=scale,
                         apply_control=apply, return_dict=False)

        ins, outs = capture(model.mid_block, run, all_outputs=True)
        kwargs = {"conditioning_scale": scale, "apply_control": apply}
        src = (f"real library class diffusers.models.controlnets.controlnet_xs.ControlNetXSCrossAttnMidBlock2D: the "
               f"mid_block of the whole UNetControlNetXSModel weights/{weights}; {what}; inputs captured by a forward "
               f"pre-hook while the model ran on random sample (2, 4, 4, 6), timesteps [17, 503], encoder_hidden_states "
               f"(2, 5, 12), controlnet_cond (2, 3, 8, 12), conditioning_scale {scale}, apply_control {apply}; outputs: "
               f"the mid block's (h_base, h_ctrl)")
        block = "diffusers.ControlNetXSCrossAttnMidBlock2D"
        if apply:
            state = sub_state(model.state_dict(), "mid_block.")
            ctx.bundle(stem, block, cfg, tensor_inputs(ins), outs, state=state, source=src, half=True, kwargs=kwargs)
        # referencing (weightless): the checkpoint's mid_block.*
        ctx.bundle(f"{stem}_ref" if apply else stem, block, cfg, tensor_inputs(ins), outs, ref=(weights, "mid_block."),
                   source=src, kwargs=kwargs)
