"""The half-precision twins: which float32 bundles get float16 and bfloat16 twins
(``HALF_FROM``), which PyTorch cannot run in half precision (``HALF_REJECTED``), which are made
in guided-diffusion's own half form (``HALF_CONVERT_TO_FP16``), and the specs of the twins
(``add_half_precision_specs``), including the no-mask substitute and the large-activation bundles.
"""

from __future__ import annotations

import torch

from parity_bundle import CONVERT_TO_FP16_MARK

from .inputs import randn
from .sources import DIFF_SRC, VAE_MID


# half precision (float16 / bfloat16) bundles

# (parity.dtype, file-name suffix)
HALF_DTYPES = (("float16", "f16"), ("bfloat16", "bf16"))

# One float32 bundle per block id (diffusers.Attention: four; torch MHA: need_weights true and
# false) gets a float16 and a bfloat16 twin "<same name>_f16" / "<same name>_bf16": same seed,
# weights and inputs, then module.to(dtype) and the float inputs cast (bool masks unchanged).
HALF_FROM = (
    "denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4",
    "denoising_diffusion_pytorch/linear_attention_dim24_h3_d8_mem4",
    "annotated_diffusion/attention_dim24_h3_d8",
    "annotated_diffusion/linear_attention_dim24_h3_d8",
    "ldm/linear_attention_dim24_h3_d8",
    "ldm/cross_attention_sd1_mask",
    "ldm/basic_transformer_block_sd1",
    "ldm/spatial_transformer_sd1",
    "ldm/attn_block_c32",
    "ldm/spatial_self_attention_c32",
    "ldm/lin_attn_block_c12",
    "diffusers/attention_vae_mid",
    "diffusers/attention_cross",
    "diffusers/attention_qk_norm_layer_norm",
    "diffusers/feed_forward_geglu",
    "diffusers/geglu_in20_out24",
    "diffusers/basic_transformer_block_sd",
    "diffusers/transformer_2d_conv_sd1",
    "fastai/self_attention_groupnorm_ni24",
    "fastai/self_attention_multihead_ni24_h4",
    "torch/mha_self_batch_first",
    "torch/mha_bias_kv_zero_attn_float_mask",
    "textbook/self_attention_dx6_d5_dv7",
    "textbook/multihead_attention_in7_nh3_dh5",
)

# float32 bundles whose half-precision twin PyTorch (CPU, module.to(dtype)) cannot run: not
# exported; export_all re-runs them and fails loudly if PyTorch starts accepting them.
HALF_REJECTED = {
    "diffusers/attention_attnprocessor_upcast_cross_mask":
        "AttnProcessor + upcast_attention: Attention.get_attention_scores upcasts query/key to float32 but passes "
        "the half attention_mask as baddbmm's input (torch.baddbmm: 'Input dtypes must be the same'); the same "
        "configuration without the mask is exported as attention_attnprocessor_upcast_cross_nomask_{f16,bf16}",
    "openai/attention_block_legacy_c32_h2":
        "module.to(dtype): GroupNorm32 runs super().forward(x.float()) with the half GroupNorm weight (CPU "
        "group_norm: 'mixed dtype (CPU): expect parameter to have scalar type of Float'); this twin is exported in "
        "guided-diffusion's own half-precision form instead (HALF_CONVERT_TO_FP16)",
}

# float32 bundles whose twins are made the way guided-diffusion runs in half precision
# (UNetModel.convert_to_fp16 -> fp16_util.convert_module_to_f16): only the Conv1d/2d/3d weights and
# biases are cast (parity_bundle.convert_convs_to_half_), the GroupNorm32 parameters stay float32;
# x is given in the half dtype. bfloat16: the same conversion with bfloat16 (guided-diffusion has no
# bf16 mode). Same paths as the module.to(dtype) twins HALF_REJECTED lists for them.
HALF_CONVERT_TO_FP16 = (
    "openai/attention_block_legacy_c32_h2",
)


def half_source(f32_path, dtype):
    return (f"{dtype} twin of weights/{f32_path}.safetensors: same seed, weights and inputs, module.to({dtype}), "
            f"float inputs cast to {dtype} (bool inputs unchanged), run by PyTorch on CPU in {dtype}; .float64 "
            f"outputs from the float64 copy of the {dtype}-rounded weights and inputs")


def convert_to_fp16_source(f32_path, dtype):
    return (f"{dtype} twin of weights/{f32_path}.safetensors in the {CONVERT_TO_FP16_MARK}: same seed, weights and "
            f"inputs; as guided-diffusion's UNetModel.convert_to_fp16() (fp16_util.convert_module_to_f16) only the "
            f"Conv1d weights and biases are cast to {dtype}, the GroupNorm32 weight and bias stay float32 (stored "
            f"float32); x cast to {dtype} (UNetModel.forward's h = x.type(self.dtype)); run by PyTorch on CPU; "
            f".float64 outputs from the float64 copy of that mixed-dtype module on x upcast"
            + ("" if dtype == "float16" else "; guided-diffusion has no bfloat16 mode: the same conversion with "
               "bfloat16"))


def add_half_precision_specs(S):
    by_path = {s["path"]: s for s in S}
    new = []
    for stem in HALF_CONVERT_TO_FP16:
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, f32_twin=base["path"],
                            convert_to_fp16=True, source=f"{base['source']}; {convert_to_fp16_source(stem, dtype)}"))
    for stem in HALF_FROM:
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, f32_twin=base["path"],
                            source=f"{base['source']}; {half_source(stem, dtype)}"))
    for stem, why in HALF_REJECTED.items():
        base = by_path[f"{stem}.safetensors"]
        for dtype, suffix in HALF_DTYPES:
            new.append(dict(base, path=f"{stem}_{suffix}.safetensors", dtype=dtype, rejected=why))

    # Substitute for the rejected AttnProcessor + upcast + mask twin: same config, seed, weights and
    # hidden_states / encoder_hidden_states, no attention_mask.
    stem = "diffusers/attention_attnprocessor_upcast_cross_mask"
    base = by_path[f"{stem}.safetensors"]

    def no_mask(g, make=base["make_inputs"]):
        inputs = make(g)
        del inputs["attention_mask"]
        return inputs

    for dtype, suffix in HALF_DTYPES:
        new.append(dict(base, path=f"diffusers/attention_attnprocessor_upcast_cross_nomask_{suffix}.safetensors",
                        make_inputs=no_mask, dtype=dtype, f32_twin=base["path"],
                        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); '
                        "upcast_attention and upcast_softmax (switched off in the float64 copy), no mask; "
                        + half_source(stem, dtype).replace(" and inputs,", " and inputs except attention_mask "
                                                           "(left out: with a mask PyTorch rejects this configuration "
                                                           "in half precision),")))

    # Large activations as trained SD VAE decoders produce them in the mid-block attention: std ~100,
    # a few channels offset by ~500 (GroupNorm statistics and the residual add must not overflow).
    cfg = dict(VAE_MID, query_dim=64, heads=1, dim_head=64, norm_num_groups=32)

    def large(g):
        x = 100.0 * randn(g, 1, 64, 16, 16)
        x[:, [3, 17, 40]] += torch.tensor([500.0, -450.0, 550.0])[None, :, None, None]
        return {"hidden_states": x}

    for dtype, suffix in HALF_DTYPES:
        new.append(dict(path=f"diffusers/attention_vae_mid_c64_large_activations_{suffix}.safetensors",
                        block="diffusers.Attention", config=cfg, seed=690, make_inputs=large, kwargs=None,
                        dtype=dtype, large_activations=True,
                        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE UNetMidBlock2D-style kwargs (64 channels, "
                        "32 groups, 1 head) on large activations like a trained SD VAE decoder's: hidden_states = "
                        "100 * N(0, 1) with channels 3, 17, 40 offset by +500, -450, +550; run by PyTorch on CPU in "
                        f"{dtype} (module.to({dtype})); .float64 outputs from the float64 copy of the "
                        f"{dtype}-rounded weights and inputs"))
    S.extend(new)
