"""The Stable Diffusion family's bundle specs: diffusers 0.42.1 (real library) ``Attention``
configurations, ``FeedForward`` / ``GEGLU`` / ``BasicTransformerBlock`` / ``Transformer2DModel``, ldm
SD 2.x (stable-diffusion-sdkit) and SD 1.x (re-stated in ``reference/ldm_sd1.py``) attention and
``diffusionmodules/model.py`` blocks, and OpenAI guided-diffusion's ``AttentionBlock``
(guided-diffusion-sdk). Each function adds its specs with ``add`` (see ``specs.bundle_specs``).
"""

from __future__ import annotations

from .inputs import diffusers_cross_mask, diffusers_mask, diffusers_self_mask, keep_mask_bool, keep_mask_float, randn
from .sources import (DIFF_ACT_SRC, DIFF_FF_SRC, DIFF_SRC, DIFF_T2D_SRC, LDM_MODEL_SRC, LIN_ATTN_SRC, OPENAI_SRC,
                      SD1_SRC, SD2_SRC, VAE_MID)


def diffusers_attention_more(add):
    """diffusers.Attention: more configurations (spatial norm, cross-attention norms, qk norms, added
    key/values, conv-shaped weights, AttnProcessor with upcasts)."""
    add("diffusers/attention_spatial_norm_movq.safetensors", "diffusers.Attention",
        dict(query_dim=32, heads=2, dim_head=16, norm_num_groups=None, spatial_norm_dim=6, residual_connection=True,
             bias=True, upcast_softmax=True, _from_deprecated_attn_block=True), 610,
        lambda g: {"hidden_states": randn(g, 2, 32, 6, 4), "temb": randn(g, 2, 6, 3, 2)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), MoVQ-style VAE-decoder mid attention with SpatialNorm: "
        "temb is the zq map, forwarded by Attention.forward(**cross_attention_kwargs) to the processor, "
        "interpolated (nearest) to the (H, W) of hidden_states inside SpatialNorm")
    add("diffusers/attention_cross_norm_layer_norm.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=20, heads=2, dim_head=20, cross_attention_norm="layer_norm"), 611,
        lambda g: {"hidden_states": randn(g, 2, 9, 40), "encoder_hidden_states": randn(g, 2, 6, 20)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), cross_attention_norm="layer_norm" on encoder_hidden_states')
    add("diffusers/attention_cross_norm_group_norm.safetensors", "diffusers.Attention",
        dict(query_dim=30, cross_attention_dim=20, heads=3, dim_head=10, bias=True, cross_attention_norm="group_norm",
             cross_attention_norm_num_groups=4), 612,
        lambda g: {"hidden_states": randn(g, 3, 7, 30), "encoder_hidden_states": randn(g, 3, 5, 20)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), cross_attention_norm="group_norm" (GroupNorm(4, 20, eps 1e-5) '
        "over the feature axis of encoder_hidden_states)")
    add("diffusers/attention_qk_norm_layer_norm.safetensors", "diffusers.Attention",
        dict(query_dim=36, heads=3, dim_head=12, qk_norm="layer_norm", eps=1e-6), 613,
        lambda g: {"hidden_states": randn(g, 2, 7, 36)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default, which applies norm_q/norm_k per head), qk_norm="layer_norm"')
    add("diffusers/attention_qk_norm_rms_norm.safetensors", "diffusers.Attention",
        dict(query_dim=36, cross_attention_dim=14, heads=3, dim_head=12, bias=True, qk_norm="rms_norm"), 614,
        lambda g: {"hidden_states": randn(g, 2, 7, 36), "encoder_hidden_states": randn(g, 2, 5, 14)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), qk_norm="rms_norm" (diffusers RMSNorm, eps 1e-5; its '
        "float32 variance cast is switched off in the float64 copy), cross-attention")
    add("diffusers/attention_qk_norm_l2.safetensors", "diffusers.Attention",
        dict(query_dim=30, heads=2, dim_head=15, qk_norm="l2"), 615,
        lambda g: {"hidden_states": randn(g, 3, 6, 30)},
        source=DIFF_SRC + ' (AttnProcessor2_0 default), qk_norm="l2" (LpNorm = F.normalize(p=2, dim=-1, eps=1e-5))')
    for i, (proc, extra, short) in enumerate((
            ("AttnAddedKVProcessor2_0", {}, "attn_added_kv_2_0"),
            ("AttnAddedKVProcessor2_0", {"only_cross_attention": True}, "attn_added_kv_2_0_only_cross"),
            ("AttnAddedKVProcessor", {}, "attn_added_kv"),
            ("AttnAddedKVProcessor2_0", {"cross_attention_norm": "group_norm", "cross_attention_norm_num_groups": 4},
             "attn_added_kv_2_0_cross_group_norm"))):
        cfg = dict(query_dim=24, cross_attention_dim=24, heads=2, dim_head=12, added_kv_proj_dim=12,
                   norm_num_groups=8, bias=True, upcast_softmax=True, only_cross_attention=False,
                   cross_attention_norm=None)
        cfg.update(extra)
        cfg["processor"] = proc
        add(f"diffusers/attention_{short}.safetensors", "diffusers.Attention", cfg, 616 + i,
            lambda g: {"hidden_states": randn(g, 2, 24, 5, 3), "encoder_hidden_states": randn(g, 2, 7, 12)},
            source=DIFF_SRC + f' built without "processor", then set_processor({proc}()); '
            "UNetMidBlock2DSimpleCrossAttn-style kwargs (added_kv_proj_dim: text keys/values prepended to the "
            "image keys/values)")
    add("diffusers/attention_vae_mid_conv_weights.safetensors", "diffusers.Attention", dict(VAE_MID), 620,
        lambda g: {"hidden_states": randn(g, 3, 32, 3, 5)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE-style kwargs; to_q/to_k/to_v/to_out.0 weights stored "
        "as (C, C, 1, 1) conv kernels (as in some ldm->diffusers converted checkpoints); squeeze them to (C, C)",
        conv_weights=True)
    add("diffusers/attention_attnprocessor_upcast_cross_mask.safetensors", "diffusers.Attention",
        dict(query_dim=80, cross_attention_dim=24, heads=2, dim_head=40, upcast_attention=True, upcast_softmax=True,
             processor="AttnProcessor"), 621,
        lambda g: {"hidden_states": randn(g, 2, 9, 80), "encoder_hidden_states": randn(g, 2, 7, 24),
                   "attention_mask": diffusers_cross_mask()},
        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); upcast_attention and '
        "upcast_softmax (switched off in the float64 copy), additive (B, 1, S) mask")


def diffusers_transformers(add):
    """diffusers FeedForward / GEGLU / BasicTransformerBlock / Transformer2DModel."""
    for i, (act, dim, dim_out, mult, final_dropout, inner_dim, bias, shape) in enumerate((
            ("geglu", 20, None, 4, False, None, True, (2, 7, 20)),
            ("gelu", 24, 10, 2, False, None, False, (3, 5, 24)),
            ("gelu-approximate", 20, None, 4, True, 36, True, (2, 9, 20)),
            ("geglu-approximate", 18, 14, 3, False, None, True, (2, 5, 18)))):
        add(f"diffusers/feed_forward_{act.replace('-', '_')}.safetensors", "diffusers.FeedForward",
            dict(dim=dim, dim_out=dim_out, mult=mult, dropout=0.0, activation_fn=act, final_dropout=final_dropout,
                 inner_dim=inner_dim, bias=bias), 630 + i,
            lambda g, shape=shape: {"hidden_states": randn(g, *shape)},
            source=DIFF_FF_SRC.format("FeedForward") + f' activation_fn="{act}"')
    add("diffusers/geglu_in20_out24.safetensors", "diffusers.GEGLU", dict(dim_in=20, dim_out=24, bias=True), 640,
        lambda g: {"hidden_states": randn(g, 2, 7, 20)}, source=DIFF_ACT_SRC.format("GEGLU"))
    add("diffusers/geglu_in14_out10_nobias.safetensors", "diffusers.GEGLU", dict(dim_in=14, dim_out=10, bias=False),
        641, lambda g: {"hidden_states": randn(g, 3, 5, 14)}, source=DIFF_ACT_SRC.format("GEGLU") + ", bias=False")
    add("diffusers/basic_transformer_block_sd.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=24, num_attention_heads=2, attention_head_dim=12, dropout=0.0, cross_attention_dim=20,
             activation_fn="geglu", attention_bias=True, norm_type="layer_norm"), 650,
        lambda g: {"hidden_states": randn(g, 2, 9, 24), "encoder_hidden_states": randn(g, 2, 7, 20),
                   "attention_mask": diffusers_self_mask(), "encoder_attention_mask": diffusers_cross_mask()},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " SD-style (self-attn, cross-attn, GEGLU FF); masks "
        "are additive (B, 1, S) biases passed through unchanged to attn1 / attn2")
    add("diffusers/basic_transformer_block_only_cross.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=20, num_attention_heads=2, attention_head_dim=10, cross_attention_dim=12, attention_bias=False,
             only_cross_attention=True, upcast_attention=True), 651,
        lambda g: {"hidden_states": randn(g, 3, 5, 20), "encoder_hidden_states": randn(g, 3, 6, 12),
                   "attention_mask": diffusers_mask(3, 6, {0: [5], 2: [0, 4]})},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " only_cross_attention=True (attn1 attends to "
        "encoder_hidden_states with attention_mask; attn2 too, without a mask)")
    add("diffusers/basic_transformer_block_double_self.safetensors", "diffusers.BasicTransformerBlock",
        dict(dim=20, num_attention_heads=2, attention_head_dim=10, double_self_attention=True, attention_bias=True), 652,
        lambda g: {"hidden_states": randn(g, 2, 7, 20)},
        source=DIFF_FF_SRC.format("BasicTransformerBlock") + " double_self_attention=True, no cross_attention_dim "
        "(attn2 is a second self-attention)")
    add("diffusers/transformer_2d_conv_sd1.safetensors", "diffusers.Transformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=12, in_channels=16, num_layers=1, cross_attention_dim=20,
             norm_num_groups=4, use_linear_projection=False, attention_bias=False, upcast_attention=False,
             only_cross_attention=False), 660,
        lambda g: {"hidden_states": randn(g, 2, 16, 5, 3), "encoder_hidden_states": randn(g, 2, 7, 20),
                   "encoder_attention_mask": keep_mask_float(2, 7, [5, 7])},
        kwargs={"return_dict": False},
        source=DIFF_T2D_SRC + " SD1-style (conv proj_in/proj_out, in_channels != inner_dim); 2-D "
        "encoder_attention_mask (1 = keep, 0 = discard) converted to a (1 - m) * -10000 bias")
    add("diffusers/transformer_2d_linear_2layers.safetensors", "diffusers.Transformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=10, in_channels=20, num_layers=2, cross_attention_dim=12,
             norm_num_groups=5, use_linear_projection=True, attention_bias=True, upcast_attention=True,
             only_cross_attention=False), 661,
        lambda g: {"hidden_states": randn(g, 2, 20, 3, 5), "encoder_hidden_states": randn(g, 2, 6, 12),
                   "encoder_attention_mask": keep_mask_float(2, 6, [6, 3])},
        kwargs={"return_dict": False},
        source=DIFF_T2D_SRC + " SD2/XL-style (linear proj_in/proj_out), 2 layers, upcast_attention (ignored by "
        "AttnProcessor2_0)")


def ldm_attention(add):
    """ldm (SD 1.x / SD 2.x) attention.py: CrossAttention, BasicTransformerBlock, SpatialTransformer,
    SpatialSelfAttention."""
    add("ldm/cross_attention_sd1_mask.safetensors", "ldm.CrossAttention",
        dict(query_dim=40, context_dim=24, heads=2, dim_head=20, dropout=0.0), 510,
        lambda g: {"x": randn(g, 2, 9, 40), "context": randn(g, 2, 7, 24), "mask": keep_mask_bool(2, 7, [5, 7])},
        source=SD1_SRC.format("CrossAttention (class CrossAttentionSD1 here)") + "; bool mask (B, S), True = keep, "
        "masked logits filled with -finfo(float32).max")
    add("ldm/cross_attention_sd1_self.safetensors", "ldm.CrossAttention",
        dict(query_dim=24, context_dim=None, heads=3, dim_head=10, dropout=0.0), 511,
        lambda g: {"x": randn(g, 2, 7, 24)},
        source=SD1_SRC.format("CrossAttention (class CrossAttentionSD1 here)") + "; self-attention (context None)")
    add("ldm/cross_attention_sd2_mask.safetensors", "ldm.CrossAttention",
        dict(query_dim=36, context_dim=20, heads=3, dim_head=12, dropout=0.0), 512,
        lambda g: {"x": randn(g, 3, 5, 36), "context": randn(g, 3, 6, 20), "mask": keep_mask_bool(3, 6, [4, 6, 2])},
        source=SD2_SRC.format("CrossAttention") + '; ATTN_PRECISION "fp32" (q, k upcast; .float() '
        "keeps float64 in the float64 copy); bool mask (B, S), True = keep")
    add("ldm/basic_transformer_block_sd1.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=24, n_heads=2, d_head=12, dropout=0.0, context_dim=20, gated_ff=True, checkpoint=True), 520,
        lambda g: {"x": randn(g, 2, 9, 24), "context": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("BasicTransformerBlock (class BasicTransformerBlockSD1 here)"))
    add("ldm/basic_transformer_block_sd1_plain_ff_self.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=20, n_heads=2, d_head=10, dropout=0.0, context_dim=None, gated_ff=False, checkpoint=False), 521,
        lambda g: {"x": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("BasicTransformerBlock (class BasicTransformerBlockSD1 here)") + "; gated_ff=False "
        "(Linear + GELU feed-forward, keys ff.net.0.0.*), no context (attn2 is a self-attention)")
    add("ldm/basic_transformer_block_sd2_disable_self_attn.safetensors", "ldm.BasicTransformerBlock",
        dict(dim=20, n_heads=2, d_head=10, dropout=0.0, context_dim=12, gated_ff=True, checkpoint=True,
             disable_self_attn=True), 522,
        lambda g: {"x": randn(g, 3, 5, 20), "context": randn(g, 3, 6, 12)},
        source=SD2_SRC.format("BasicTransformerBlock") + "; disable_self_attn "
        "(attn1 is a cross-attention over context too)")
    add("ldm/spatial_transformer_sd1.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=12, depth=1, dropout=0.0, context_dim=20), 530,
        lambda g: {"x": randn(g, 2, 32, 5, 3), "context": randn(g, 2, 7, 20)},
        source=SD1_SRC.format("SpatialTransformer (class SpatialTransformerSD1 here)") + "; conv proj_in/proj_out, "
        "in_channels != inner_dim")
    add("ldm/spatial_transformer_sd2_linear_depth2.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=16, depth=2, dropout=0.0, context_dim=[20, 12],
             disable_self_attn=False, use_linear=True, use_checkpoint=True), 531,
        lambda g: {"x": randn(g, 2, 32, 3, 5), "context": [randn(g, 2, 7, 20), randn(g, 2, 5, 12)]},
        source=SD2_SRC.format("SpatialTransformer") + "; use_linear (proj_out = "
        "Linear(in_channels, inner_dim), in == inner), depth 2 with one context per block: the forward takes a "
        "list, stored as inputs context.0 / context.1 (block i gets context.i)")
    add("ldm/spatial_transformer_sd2_disable_self_attn.safetensors", "ldm.SpatialTransformer",
        dict(in_channels=32, n_heads=2, d_head=10, depth=1, dropout=0.0, context_dim=12,
             disable_self_attn=True, use_linear=False, use_checkpoint=True), 532,
        lambda g: {"x": randn(g, 2, 32, 3, 5), "context": randn(g, 2, 6, 12)},
        source=SD2_SRC.format("SpatialTransformer") + "; conv proj_in/proj_out, "
        "disable_self_attn, int context_dim (wrapped into a list), single context tensor")
    add("ldm/spatial_self_attention_c32.safetensors", "ldm.SpatialSelfAttention", dict(in_channels=32), 540,
        lambda g: {"x": randn(g, 2, 32, 3, 5)}, source=SD2_SRC.format("SpatialSelfAttention") + "; unchanged from SD 1.x")
    add("ldm/spatial_self_attention_c64.safetensors", "ldm.SpatialSelfAttention", dict(in_channels=64), 541,
        lambda g: {"x": randn(g, 2, 64, 3, 3)}, source=SD2_SRC.format("SpatialSelfAttention") + "; unchanged from SD 1.x")


def ldm_model_and_openai(add):
    """ldm diffusionmodules/model.py (AttnBlock, LinAttnBlock) and OpenAI guided-diffusion's
    AttentionBlock."""
    add("ldm/attn_block_c32.safetensors", "ldm.AttnBlock", dict(in_channels=32), 550,
        lambda g: {"x": randn(g, 2, 32, 5, 3)}, source=LDM_MODEL_SRC.format("AttnBlock"))
    add("ldm/attn_block_c64.safetensors", "ldm.AttnBlock", dict(in_channels=64), 551,
        lambda g: {"x": randn(g, 3, 64, 3, 3)}, source=LDM_MODEL_SRC.format("AttnBlock"))
    add("ldm/lin_attn_block_c12.safetensors", "ldm.LinAttnBlock", dict(in_channels=12), 552,
        lambda g: {"x": randn(g, 2, 12, 5, 7)},
        source=LIN_ATTN_SRC)
    add("ldm/lin_attn_block_c20.safetensors", "ldm.LinAttnBlock", dict(in_channels=20), 553,
        lambda g: {"x": randn(g, 3, 20, 6, 3)},
        source=LIN_ATTN_SRC)

    # OpenAI guided-diffusion AttentionBlock
    add("openai/attention_block_legacy_c32_h2.safetensors", "openai.AttentionBlock",
        dict(channels=32, num_heads=2, num_head_channels=-1, use_checkpoint=False, use_new_attention_order=False),
        560, lambda g: {"x": randn(g, 2, 32, 5, 3)},
        source=OPENAI_SRC.format(" with QKVAttentionLegacy (split heads before q/k/v)"))
    add("openai/attention_block_new_order_c32_hc16.safetensors", "openai.AttentionBlock",
        dict(channels=32, num_heads=1, num_head_channels=16, use_checkpoint=False, use_new_attention_order=True),
        561, lambda g: {"x": randn(g, 3, 32, 3, 5)},
        source=OPENAI_SRC.format(" with QKVAttention (split q/k/v before heads); num_head_channels=16 -> 2 heads"))
    add("openai/attention_block_legacy_1d_c64_hc8.safetensors", "openai.AttentionBlock",
        dict(channels=64, num_heads=1, num_head_channels=8, use_checkpoint=True, use_new_attention_order=False),
        562, lambda g: {"x": randn(g, 2, 64, 7)},
        source=OPENAI_SRC.format(" with QKVAttentionLegacy on a 1-D (B, C, T) input; num_head_channels=8 -> 8 heads"))


# in export order
SD_FAMILIES = (diffusers_attention_more, diffusers_transformers, ldm_attention, ldm_model_and_openai)
