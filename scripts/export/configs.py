"""The kwargs each diffusers parent passes to its mid block (transcribed from diffusers 0.42.1):
the configs the bundles store, shared by several builders and by ``export_own.py``.
"""

from __future__ import annotations


def unet2d_mid_config(model) -> dict:
    """``UNet2DModel.__init__``: ``UNetMidBlock2D(in_channels=block_out_channels[-1],
    temb_channels=time_embed_dim, dropout, resnet_eps=norm_eps, resnet_act_fn=act_fn,
    output_scale_factor=mid_block_scale_factor, resnet_time_scale_shift, attention_head_dim=
    attention_head_dim if not None else block_out_channels[-1], resnet_groups=norm_num_groups,
    attn_groups=attn_norm_num_groups, add_attention)``."""
    c = model.config
    return dict(in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, resnet_time_scale_shift=c.resnet_time_scale_shift,
                attention_head_dim=c.attention_head_dim if c.attention_head_dim is not None else c.block_out_channels[-1],
                resnet_groups=c.norm_num_groups, attn_groups=c.attn_norm_num_groups, add_attention=c.add_attention)


def vae_mid_config(model, part: str) -> dict:
    """``Encoder`` / ``Decoder`` (autoencoders/vae.py) with ``norm_type="group"``:
    ``UNetMidBlock2D(in_channels=block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn=act_fn,
    output_scale_factor=1, resnet_time_scale_shift="default", attention_head_dim=block_out_channels[-1],
    resnet_groups=norm_num_groups, temb_channels=None, add_attention=mid_block_add_attention)``."""
    c = model.config
    assert part in ("encoder", "decoder")
    return dict(in_channels=c.block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn=c.act_fn, output_scale_factor=1,
                resnet_time_scale_shift="default", attention_head_dim=c.block_out_channels[-1],
                resnet_groups=c.norm_num_groups, temb_channels=None, add_attention=c.mid_block_add_attention)


def _per_block(value, n):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def unet2d_condition_mid_config(model) -> dict:
    """``UNet2DConditionModel.__init__`` -> ``get_mid_block("UNetMidBlock2DCrossAttn", ...)`` ->
    ``UNetMidBlock2DCrossAttn(transformer_layers_per_block, in_channels, temb_channels, dropout,
    resnet_eps, resnet_act_fn, output_scale_factor, resnet_time_scale_shift, cross_attention_dim,
    num_attention_heads, resnet_groups, dual_cross_attention, use_linear_projection,
    upcast_attention, attention_type)`` with the per-block lists' last entries and
    ``num_attention_heads = num_attention_heads or attention_head_dim``."""
    c = model.config
    assert c.mid_block_type == "UNetMidBlock2DCrossAttn"
    n = len(c.down_block_types)
    heads = c.num_attention_heads or c.attention_head_dim
    return dict(transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, resnet_time_scale_shift=c.resnet_time_scale_shift,
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(heads, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=c.dual_cross_attention, use_linear_projection=c.use_linear_projection,
                upcast_attention=c.upcast_attention, attention_type=c.attention_type)


def unet2d_condition_simple_cross_mid_config(model) -> dict:
    """``UNet2DConditionModel.__init__`` -> ``get_mid_block("UNetMidBlock2DSimpleCrossAttn", ...)`` ->
    ``UNetMidBlock2DSimpleCrossAttn(in_channels, temb_channels, dropout, resnet_eps, resnet_act_fn,
    output_scale_factor, cross_attention_dim, attention_head_dim, resnet_groups, resnet_time_scale_shift,
    skip_time_act=resnet_skip_time_act, only_cross_attention=mid_block_only_cross_attention,
    cross_attention_norm)`` with ``cross_attention_dim[-1]``, ``attention_head_dim[-1]`` and
    ``mid_block_only_cross_attention`` None -> ``only_cross_attention`` if a bool, else False."""
    c = model.config
    assert c.mid_block_type == "UNetMidBlock2DSimpleCrossAttn"
    n = len(c.down_block_types)
    only = c.mid_block_only_cross_attention
    if only is None:
        only = c.only_cross_attention if isinstance(c.only_cross_attention, bool) else False
    return dict(in_channels=c.block_out_channels[-1], temb_channels=model.time_embedding.linear_2.out_features,
                dropout=c.dropout, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                attention_head_dim=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                resnet_time_scale_shift=c.resnet_time_scale_shift, skip_time_act=c.resnet_skip_time_act,
                only_cross_attention=only, cross_attention_norm=c.cross_attention_norm)


def unet3d_condition_mid_config(model) -> dict:
    """``UNet3DConditionModel.__init__`` (unets/unet_3d_condition.py): ``num_attention_heads`` must be None
    (NotImplementedError otherwise), ``num_attention_heads = num_attention_heads or attention_head_dim`` made
    per-block, ``time_embed_dim = block_out_channels[0] * 4``, then ``UNetMidBlock3DCrossAttn(in_channels=
    block_out_channels[-1], temb_channels=time_embed_dim, resnet_eps=norm_eps, resnet_act_fn=act_fn,
    output_scale_factor=mid_block_scale_factor, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False)``."""
    c = model.config
    assert c.num_attention_heads is None
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor, cross_attention_dim=c.cross_attention_dim,
                num_attention_heads=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False)


def controlnet_mid_config(model) -> dict:
    """``ControlNetModel.__init__`` (controlnets/controlnet.py): ``time_embed_dim = block_out_channels[0] * 4``,
    ``num_attention_heads = num_attention_heads or attention_head_dim`` (made per-block), then for
    ``mid_block_type="UNetMidBlock2DCrossAttn"`` ``UNetMidBlock2DCrossAttn(transformer_layers_per_block=
    transformer_layers_per_block[-1], in_channels=block_out_channels[-1], temb_channels=time_embed_dim,
    resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
    resnet_time_scale_shift, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, use_linear_projection, upcast_attention)`` (no dropout, attention_type or
    resnet_groups_out: their defaults), for ``"UNetMidBlock2D"`` ``UNetMidBlock2D(in_channels, temb_channels,
    num_layers=0, resnet_eps, resnet_act_fn, output_scale_factor, resnet_groups, resnet_time_scale_shift,
    add_attention=False)``; ``controlnet_mid_block = Conv2d(block_out_channels[-1], block_out_channels[-1], 1)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    common = dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps,
                  resnet_act_fn=c.act_fn, output_scale_factor=c.mid_block_scale_factor,
                  resnet_time_scale_shift=c.resnet_time_scale_shift, resnet_groups=c.norm_num_groups)
    if c.mid_block_type == "UNetMidBlock2DCrossAttn":
        heads = c.num_attention_heads or c.attention_head_dim
        mid = dict(common, transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                   cross_attention_dim=c.cross_attention_dim, num_attention_heads=_per_block(heads, n)[-1],
                   use_linear_projection=c.use_linear_projection, upcast_attention=c.upcast_attention)
    else:
        assert c.mid_block_type == "UNetMidBlock2D"
        mid = dict(common, num_layers=0, add_attention=False)
    return dict(mid_block_type=c.mid_block_type, mid_block=mid, global_pool_conditions=c.global_pool_conditions)


def mid2d_resnet_config(mid_cfg: dict) -> dict:
    """``UNetMidBlock2D.__init__``'s ``ResnetBlock2D(in_channels=in_channels, out_channels=in_channels,
    temb_channels, eps=resnet_eps, groups=resnet_groups, dropout, time_embedding_norm=
    resnet_time_scale_shift, non_linearity=resnet_act_fn, output_scale_factor, pre_norm=resnet_pre_norm)``
    (the same for every resnet; ``resnet_groups`` None -> ``min(in_channels // 4, 32)``)."""
    c = mid_cfg["in_channels"]
    groups = mid_cfg.get("resnet_groups", 32)
    groups = groups if groups is not None else min(c // 4, 32)
    return dict(in_channels=c, out_channels=c, temb_channels=mid_cfg["temb_channels"],
                eps=mid_cfg.get("resnet_eps", 1e-6), groups=groups, dropout=mid_cfg.get("dropout", 0.0),
                time_embedding_norm=mid_cfg.get("resnet_time_scale_shift", "default"),
                non_linearity=mid_cfg.get("resnet_act_fn", "swish"),
                output_scale_factor=mid_cfg.get("output_scale_factor", 1.0), pre_norm=mid_cfg.get("resnet_pre_norm", True))


def cross_attn_resnet0_config(mid_cfg: dict) -> dict:
    """``UNetMidBlock2DCrossAttn.__init__``'s first ``ResnetBlock2D(in_channels, out_channels, temb_channels,
    eps=resnet_eps, groups=resnet_groups, groups_out=resnet_groups_out, dropout, time_embedding_norm,
    non_linearity, output_scale_factor, pre_norm)`` (``resnet_groups_out = resnet_groups_out or resnet_groups``)."""
    cfg = mid2d_resnet_config(mid_cfg)
    cfg["out_channels"] = mid_cfg.get("out_channels") or mid_cfg["in_channels"]
    cfg["groups_out"] = mid_cfg.get("resnet_groups_out") or cfg["groups"]
    keys = ["in_channels", "out_channels", "temb_channels", "eps", "groups", "groups_out", "dropout",
            "time_embedding_norm", "non_linearity", "output_scale_factor", "pre_norm"]
    return {k: cfg[k] for k in keys}
