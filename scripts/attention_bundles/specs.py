"""Every attention bundle as a spec (``bundle_specs``): relative path, block id, config, seed,
``make_inputs(gen)``, forward kwargs, ``parity.source`` and extra flags (``legacy_keys``,
``conv_weights``, ``fused``, and for the half-precision twins ``dtype``, ``f32_twin``,
``convert_to_fp16``, ``rejected``, ``large_activations``). The specs of the real and re-stated
attention classes outside the Stable Diffusion family are here, one function per source; the
Stable Diffusion family's are in ``specs_sd``, the twins' in ``half``.
"""

from __future__ import annotations

import torch

from .half import add_half_precision_specs
from .inputs import bool_attn_mask, diffusers_cross_mask, mha_float_mask, padding_mask, randn
from .sources import AD_SRC, DIFF_SRC, FASTAI_SRC, LDM_SRC, LUCID, TEXTBOOK_SRC, VAE_MID
from .specs_sd import SD_FAMILIES


def bundle_specs():
    """Every bundle: (relative path, block id, config, seed, make_inputs(gen), kwargs, source, extra)."""
    S = []

    def add(path, block, config, seed, make_inputs, kwargs=None, source=None, **extra):
        S.append(dict(path=path, block=block, config=config, seed=seed, make_inputs=make_inputs,
                      kwargs=kwargs, source=source, **extra))

    for family in (lucidrains_and_annotated, ldm_linear, diffusers_attention, fastai, torch_mha, textbook,
                   edge_cases) + SD_FAMILIES:
        family(add)
    add_half_precision_specs(S)
    return S


def lucidrains_and_annotated(add):
    """lucidrains/denoising-diffusion-pytorch 2.3.4 and Hugging Face annotated diffusion."""
    # lucidrains/denoising-diffusion-pytorch 2.3.4
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 100 if cls == "Attention" else 200
        add(f"denoising_diffusion_pytorch/{short}_dim24_h3_d8_mem4.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=24, heads=3, dim_head=8, num_mem_kv=4), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LUCID.format(cls))
        add(f"denoising_diffusion_pytorch/{short}_dim20_h2_d12_mem1.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=20, heads=2, dim_head=12, num_mem_kv=1), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=LUCID.format(cls))

    # Hugging Face annotated diffusion (GroupNorm(1) derivative of lucidrains)
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 300 if cls == "Attention" else 400
        add(f"annotated_diffusion/{short}_dim24_h3_d8.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=24, heads=3, dim_head=8), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=AD_SRC.format(cls))
        add(f"annotated_diffusion/{short}_dim20_h2_d12.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=20, heads=2, dim_head=12), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=AD_SRC.format(cls))


def ldm_linear(add):
    """CompVis latent-diffusion LinearAttention (+ the LinAttnBlock case heads=1, dim_head=dim)."""
    add("ldm/linear_attention_dim24_h3_d8.safetensors", "ldm.LinearAttention",
        dict(dim=24, heads=3, dim_head=8), 501, lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LDM_SRC.format(""))
    add("ldm/lin_attn_block_dim20.safetensors", "ldm.LinearAttention",
        dict(dim=20, heads=1, dim_head=20), 502, lambda g: {"x": randn(g, 3, 20, 6, 3)},
        source=LDM_SRC.format(" (the LinAttnBlock(in_channels=20) configuration)"))


def diffusers_attention(add):
    """diffusers 0.42.1 Attention."""
    add("diffusers/attention_vae_mid.safetensors", "diffusers.Attention", dict(VAE_MID), 601,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE UNetMidBlock2D-style kwargs")
    add("diffusers/attention_unet2d_mid.safetensors", "diffusers.Attention",
        dict(query_dim=48, heads=3, dim_head=16, rescale_output_factor=2.0, eps=1e-5, norm_num_groups=4,
             residual_connection=True, bias=True, upcast_softmax=True, _from_deprecated_attn_block=True), 602,
        lambda g: {"hidden_states": randn(g, 3, 48, 6, 3)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), UNet2DModel UNetMidBlock2D-style kwargs")
    add("diffusers/attention_vae_mid_legacy_keys.safetensors", "diffusers.Attention", dict(VAE_MID), 603,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE-style kwargs; state dict stored under the legacy "
        "AttentionBlock key names (to_q->query, to_k->key, to_v->value, to_out.0->proj_attn; group_norm unchanged) "
        "as in diffusers <= 0.16 checkpoints",
        legacy_keys=True)
    add("diffusers/attention_cross.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=5, dim_head=8, bias=False), 604,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention")
    add("diffusers/attention_cross_mask.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=2, dim_head=16, bias=True), 605,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24),
                   "attention_mask": diffusers_cross_mask()},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, 1, S) mask")
    add("diffusers/attention_self_tokens_attnprocessor.safetensors", "diffusers.Attention",
        dict(query_dim=30, heads=3, dim_head=10, out_bias=False, processor="AttnProcessor"), 606,
        lambda g: {"hidden_states": randn(g, 2, 9, 30)},
        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); token self-attention')


def fastai(add):
    """fast.ai course22p2 nb 27."""
    add("fastai/self_attention_groupnorm_ni24.safetensors", "fastai.SelfAttention", dict(ni=24), 701,
        lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 9 SelfAttention (GroupNorm(1), q/k/v/proj)"))
    add("fastai/self_attention_batchnorm_fused_ni20.safetensors", "fastai.SelfAttention", dict(ni=20), 702,
        lambda g: {"inp": randn(g, 3, 20, 6, 3)},
        source=FASTAI_SRC.format("cell 19 SelfAttention (BatchNorm2d, fused qkv; class SelfAttentionFused here)"),
        fused=True)
    add("fastai/self_attention_multihead_ni24_h4.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=24, nheads=4),
        703, lambda g: {"inp": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))
    add("fastai/self_attention_multihead_ni30_h3.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=30, nheads=3),
        704, lambda g: {"inp": randn(g, 3, 30, 6, 3)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))


def torch_mha(add):
    """torch.nn.MultiheadAttention."""
    def mha2(g):
        return {"query": randn(g, 6, 3, 20), "key": randn(g, 8, 3, 12), "value": randn(g, 8, 3, 7),
                "key_padding_mask": padding_mask(g, 3, 8)}

    def mha3(g):
        kv = randn(g, 2, 6, 16)
        # key and value are the same tensor object (torch's "key is value" path); both stored
        return {"query": randn(g, 2, 5, 16), "key": kv, "value": kv, "attn_mask": mha_float_mask(g)}

    def mha4(g):
        return {"query": randn(g, 4, 2, 18), "key": randn(g, 7, 2, 18), "value": randn(g, 7, 2, 18),
                "attn_mask": bool_attn_mask(g, (2 * 3, 4, 7))}

    add("torch/mha_self_batch_first.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=24, num_heads=3, batch_first=True), 801, lambda g: {"query": randn(g, 2, 9, 24)},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention (key = value = query, same tensor)")
    add("torch/mha_kdim_vdim_key_padding_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=20, num_heads=4, kdim=12, vdim=7, bias=False), 802, mha2,
        kwargs=dict(need_weights=True, average_attn_weights=False),
        source="torch.nn.MultiheadAttention with kdim/vdim, bool key_padding_mask (True = ignored)")
    add("torch/mha_bias_kv_zero_attn_float_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=16, num_heads=2, add_bias_kv=True, add_zero_attn=True, batch_first=True), 803, mha3,
        kwargs=dict(need_weights=False),
        source="torch.nn.MultiheadAttention add_bias_kv + add_zero_attn, additive float attn_mask, key is value")
    add("torch/mha_bool_attn_mask_3d.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=18, num_heads=3), 804, mha4, kwargs=dict(need_weights=True),
        source="torch.nn.MultiheadAttention with a bool (N*num_heads, L, S) attn_mask (True = not allowed)")


def textbook(add):
    """textbook (seed 003)."""
    add("textbook/self_attention_dx6_d5_dv7.safetensors", "textbook.SelfAttention", dict(Dx=6, D=5, Dv=7), 901,
        lambda g: {"x": randn(g, 2, 9, 6)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/self_attention_dx10_d12_dv4.safetensors", "textbook.SelfAttention", dict(Dx=10, D=12, Dv=4), 902,
        lambda g: {"x": randn(g, 3, 5, 10)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/multihead_attention_in7_nh3_dh5.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=7, nh=3, dh=5), 903, lambda g: {"x": randn(g, 2, 9, 7)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, nh, dh) (first form)"))
    add("textbook/multihead_attention_in10_dall12_nh4.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=10, d_all=12, nh=4), 904, lambda g: {"x": randn(g, 3, 6, 10)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, d_all, nh) (second form; "
                                   "class MultiHead_Attention_DAll here)"))


def edge_cases(add):
    """Edge cases a port gets wrong: no memory tokens, out_dim, 2-D masks, scale_qk=False (diffusers
    then defaults to AttnProcessor with scale 1), unbatched / causal / even-head MHA."""
    add("denoising_diffusion_pytorch/attention_dim16_h2_d8_nomem.safetensors", "denoising_diffusion_pytorch.Attention",
        dict(dim=16, heads=2, dim_head=8, num_mem_kv=0), 103,
        lambda g: {"x": randn(g, 2, 16, 3, 5)}, source=LUCID.format("Attention") + ", num_mem_kv=0")
    add("diffusers/attention_out_dim.safetensors", "diffusers.Attention",
        dict(query_dim=32, heads=4, dim_head=8, out_dim=24, bias=True), 607,
        lambda g: {"hidden_states": randn(g, 2, 6, 32)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), out_dim given (heads = out_dim // dim_head)")
    add("diffusers/attention_cross_mask_2d.safetensors", "diffusers.Attention",
        dict(query_dim=24, cross_attention_dim=10, heads=3, dim_head=8), 608,
        lambda g: {"hidden_states": randn(g, 2, 7, 24), "encoder_hidden_states": randn(g, 2, 5, 10),
                   "attention_mask": torch.tensor([[0.0, -10000.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -10000.0, -10000.0]])},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, S) mask")
    add("diffusers/attention_no_scale_qk.safetensors", "diffusers.Attention",
        dict(query_dim=24, heads=3, dim_head=8, scale_qk=False), 609,
        lambda g: {"hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " scale_qk=False (diffusers then picks AttnProcessor, scale 1.0)")
    add("torch/mha_unbatched.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2), 805,
        lambda g: {"query": randn(g, 5, 12), "key": randn(g, 6, 12), "value": randn(g, 6, 12)},
        kwargs=dict(need_weights=True), source="torch.nn.MultiheadAttention on unbatched (L, E) inputs")
    add("torch/mha_causal.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2, batch_first=True), 806,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(5)},
        kwargs=dict(need_weights=False, is_causal=True),
        source="torch.nn.MultiheadAttention self-attention with is_causal=True and its causal attn_mask")
    add("torch/mha_even_heads_float_padding.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=4, batch_first=True), 807,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "key_padding_mask": torch.tensor([[0.0, 0.0, float("-inf"), 0.0, 0.0], [0.0] * 5])},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention, even head count, additive float key_padding_mask")
