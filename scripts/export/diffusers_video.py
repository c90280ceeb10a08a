"""Builders of the diffusers video / 3-D models: ``UNet3DConditionModel``, Stable Video
Diffusion's U-Net and temporal VAE, AnimateDiff's ``UNetMotionModel`` and ``I2VGenXLUNet``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from parity_bundle import randomize_
from .common import capture, Ctx, DIFF_BLOCKS, gen, randn, save_diffusers, sub_state, tensor_inputs, WEIGHTS
from .configs import _per_block, unet3d_condition_mid_config


def diffusers_unet3d(ctx: Ctx):
    """``UNet3DConditionModel``: the ModelScope / Zeroscope text-to-video U-Net, whose mid block
    ``UNetMidBlock3DCrossAttn`` adds a ``TemporalConvLayer`` after each resnet and a
    ``TransformerTemporalModel`` after each spatial transformer, on ``(batch * num_frames, C, H, W)``.
    ``randomize_`` also replaces the zero init of each ``TemporalConvLayer.conv4`` conv."""
    from diffusers import UNet3DConditionModel

    torch.manual_seed(0)
    model = UNet3DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                                 down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                 up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), block_out_channels=(8, 16),
                                 layers_per_block=1, norm_num_groups=4, cross_attention_dim=8, attention_head_dim=4)
    randomize_(model, 7601)
    model.eval()
    assert all(bool(tc.conv4[-1].weight.detach().abs().max() > 0) for tc in model.mid_block.temp_convs)
    files = save_diffusers(model, "diffusers_unet3d")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7602)
    frames = 3
    sample, t, ehs = randn(g, 2, 4, frames, 4, 4), torch.tensor([17, 503]), randn(g, 2, 5, 8)

    def run():
        return model(sample, t, encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins["attention_mask"] is None
    cfg = unet3d_condition_mid_config(model)
    kwargs = {"num_frames": frames}
    src = (DIFF_BLOCKS.format("UNetMidBlock3DCrossAttn") + f"; the mid_block of the whole UNet3DConditionModel "
           f"weights/{weights} (block_out_channels (8, 16), attention_head_dim 4 -> the mid block's "
           "num_attention_heads 4 = 4 heads of width 4, norm_num_groups 4, cross_attention_dim 8; every TemporalConvLayer "
           "conv4 randomized, not zero), inputs captured by a forward pre-hook while the model ran on random sample "
           f"(2, 4, {frames}, 4, 4) (batch 2, {frames} frames), timesteps [17, 503], encoder_hidden_states (2, 5, 8); "
           f"the mid block sees (batch * frames, C, H, W) and num_frames={frames} (parity.kwargs), temb and "
           "encoder_hidden_states repeated per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_3d_cross_attn_unet3d"
    ctx.bundle(stem, "diffusers.UNetMidBlock3DCrossAttn", cfg, tensor_inputs(ins), out, state=state, source=src,
               half=True, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", "diffusers.UNetMidBlock3DCrossAttn", cfg, tensor_inputs(ins), out,
               ref=(weights, "mid_block."), source=src, kwargs=kwargs)
    # UNetMidBlock3DCrossAttn.forward takes attention_mask and passes it to nothing: the same output bit for
    # bit (asserted here, not stored: crates/parity/tests/cli/checkpoints.rs adds such a mask to the bundle and it still passes)
    bias = torch.zeros(2 * frames, 1, 5)
    bias[:, :, 3:] = -10000.0
    with torch.no_grad():
        assert torch.equal(model.mid_block(**tensor_inputs(ins), attention_mask=bias, **kwargs), out)


def svd_unet_mid_config(model) -> dict:
    """``UNetSpatioTemporalConditionModel.__init__`` (unets/unet_spatio_temporal_condition.py): per-block
    ``num_attention_heads``, ``cross_attention_dim``, ``transformer_layers_per_block``, ``time_embed_dim =
    block_out_channels[0] * 4``, then ``UNetMidBlockSpatioTemporal(block_out_channels[-1], temb_channels=
    time_embed_dim, transformer_layers_per_block=transformer_layers_per_block[-1], cross_attention_dim=
    cross_attention_dim[-1], num_attention_heads=num_attention_heads[-1])``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb,
                transformer_layers_per_block=_per_block(c.transformer_layers_per_block, n)[-1],
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(c.num_attention_heads, n)[-1])


def svd_vae_mid_config(model, part: str) -> dict:
    """``AutoencoderKLTemporalDecoder.__init__`` (autoencoders/autoencoder_kl_temporal_decoder.py): the encoder is
    vae.py's ``Encoder`` with its defaults (``act_fn="silu"``, ``norm_num_groups=32``, ``mid_block_add_attention=True``):
    ``UNetMidBlock2D(in_channels=block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn="silu", output_scale_factor=1,
    resnet_time_scale_shift="default", attention_head_dim=block_out_channels[-1], resnet_groups=32, temb_channels=None,
    add_attention=True)``; the decoder (``TemporalDecoder``) builds ``MidBlockTemporalDecoder(num_layers=
    layers_per_block, in_channels=block_out_channels[-1], out_channels=block_out_channels[-1],
    attention_head_dim=block_out_channels[-1])``."""
    c = model.config
    last = c.block_out_channels[-1]
    if part == "decoder":
        return dict(num_layers=c.layers_per_block, in_channels=last, out_channels=last, attention_head_dim=last)
    return dict(in_channels=last, resnet_eps=1e-6, resnet_act_fn="silu", output_scale_factor=1,
                resnet_time_scale_shift="default", attention_head_dim=last, resnet_groups=32, temb_channels=None,
                add_attention=True)


def mix_factors_(model, seed):
    """Every ``AlphaBlender.mix_factor`` set to a distinct value away from its init (0.5 in the U-Net, 0.0 in the
    VAE decoder), so that sigmoid(mix_factor) weighs the spatial and temporal paths unequally and differently per
    blender (``randomize_`` has no rule for it)."""
    from diffusers.models.resnet import AlphaBlender

    g = gen(seed)
    blenders = [m for m in model.modules() if isinstance(m, AlphaBlender)]
    with torch.no_grad():
        for m in blenders:
            m.mix_factor.copy_(torch.empty(1).uniform_(-1.5, 1.5, generator=g))
    assert blenders and all(abs(float(m.mix_factor.detach())) > 0.05 for m in blenders)


def svd_model_(ctx: Ctx, model, name, seed):
    """``randomize_`` (seed) and ``mix_factors_`` (seed + 1) ``model``, then ``save_diffusers`` of ``model.half()``
    (as Stability publishes SVD's fp16 variants; half the bytes), leaving the model in float32 holding exactly those
    float16 values: the whole model's float32 run that the bundles capture uses the weights the checkpoint holds, and
    a float32 block built on the checkpoint converts them exactly. Returns the weights' path relative to weights/."""
    randomize_(model, seed)
    mix_factors_(model, seed + 1)
    model.eval().half()
    files = save_diffusers(model, name)
    model.float()
    ctx.files += files
    return files[1].relative_to(WEIGHTS).as_posix()


def diffusers_svd_unet(ctx: Ctx):
    """``UNetSpatioTemporalConditionModel``: Stable Video Diffusion's U-Net, whose mid block
    ``UNetMidBlockSpatioTemporal`` runs ``SpatioTemporalResBlock``s and a ``TransformerSpatioTemporalModel`` on
    ``(batch * num_frames, C, H, W)``. One level (``GroupNorm(32)`` is hard-coded in these blocks, so 32 channels is
    the smallest width), resnet-only down / up blocks, every ``mix_factor`` random."""
    from diffusers import UNetSpatioTemporalConditionModel

    torch.manual_seed(0)
    model = UNetSpatioTemporalConditionModel(sample_size=4, in_channels=8, out_channels=4,
                                             down_block_types=("DownBlockSpatioTemporal",),
                                             up_block_types=("UpBlockSpatioTemporal",), block_out_channels=(32,),
                                             addition_time_embed_dim=4, projection_class_embeddings_input_dim=12,
                                             layers_per_block=1, cross_attention_dim=8, num_attention_heads=2,
                                             num_frames=2)
    weights = svd_model_(ctx, model, "diffusers_svd", 7701)
    g = gen(7713)
    frames = 2
    cfg = svd_unet_mid_config(model)
    # 3 x 2 is about the smallest latent that keeps GroupNorm(32) over 32 channels well conditioned (at 2 x 1 each
    # group holds 2 values and float32 stages differ from PyTorch's by more than the tolerance)
    sample, ehs, added = randn(g, 1, frames, 8, 3, 2), randn(g, 1, 4, 8), randn(g, 1, 3)
    ins, _ = capture(model.mid_block, lambda: model(sample, torch.tensor([321.0]), encoder_hidden_states=ehs,
                                                    added_time_ids=added))
    assert ins["image_only_indicator"].shape == (1, frames) and not ins["image_only_indicator"].any()
    # The U-Net passes image_only_indicator zeros and the same temb / context for every frame: here [[0, 1]] (frame 1
    # an image: the learned_with_images mixers take it from the spatial path) and per-frame temb / context (the
    # temporal blocks take frame 0's context, the temporal resnets each frame's temb), output by the same mid block.
    mixed = OrderedDict(ins)
    mixed["image_only_indicator"] = torch.tensor([[0.0, 1.0]])
    mixed["temb"] = ins["temb"] + 0.5 * randn(g, *ins["temb"].shape)
    mixed["encoder_hidden_states"] = randn(g, *ins["encoder_hidden_states"].shape)
    with torch.no_grad():
        mout = model.mid_block(**tensor_inputs(mixed))
    src = (DIFF_BLOCKS.replace("unet_2d_blocks", "unet_3d_blocks").format("UNetMidBlockSpatioTemporal")
           + f"; the mid_block of the whole UNetSpatioTemporalConditionModel weights/{weights} (saved in float16; "
           "block_out_channels (32,), num_attention_heads 2 (2 heads of 16), cross_attention_dim 8, "
           "transformer_layers_per_block 1; every AlphaBlender mix_factor random); hidden_states captured by a forward "
           f"pre-hook while the float32 model ran on a random sample (1, {frames}, 8, 3, 2) (batch 1, {frames} frames), "
           "timestep 321, encoder_hidden_states (1, 4, 8), added_time_ids (1, 3); the U-Net's temb plus 0.5 * N(0, 1) "
           "noise and encoder_hidden_states N(0, 1) per frame (the U-Net repeats them per frame), image_only_indicator "
           "[[0, 1]] (the U-Net passes zeros); the output is model.mid_block's on these inputs")
    ctx.bundle("unet_mid_block_spatio_temporal_svd_mixed_ref", "diffusers.UNetMidBlockSpatioTemporal", cfg,
               tensor_inputs(mixed), mout, ref=(weights, "mid_block."), source=src, half=True)


def diffusers_svd_vae(ctx: Ctx):
    """``AutoencoderKLTemporalDecoder``: Stable Video Diffusion's VAE. Its encoder's mid block is a plain
    ``UNetMidBlock2D``; its decoder's is ``MidBlockTemporalDecoder`` (``layers_per_block`` 2: ``resnets.0``,
    ``attentions.0``, ``resnets.1``). One level of 32 channels, every ``mix_factor`` random."""
    from diffusers import AutoencoderKLTemporalDecoder

    torch.manual_seed(0)
    model = AutoencoderKLTemporalDecoder(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                                         block_out_channels=(32,), layers_per_block=2, latent_channels=4,
                                         sample_size=4)
    weights = svd_model_(ctx, model, "diffusers_svd_vae", 7801)
    g = gen(7803)
    frames = 2
    x = randn(g, frames, 3, 3, 2)

    def run():
        return model(x, num_frames=frames)  # encode -> posterior mode -> decode(num_frames)

    src = ("real library class diffusers.models.unets.{} ; the {}.mid_block of the whole AutoencoderKLTemporalDecoder "
           f"weights/{weights} (saved in float16; block_out_channels (32,), layers_per_block 2; every AlphaBlender "
           f"mix_factor random), inputs captured by a forward pre-hook while the float32 AutoencoderKLTemporalDecoder.forward ran on a random sample "
           f"({frames}, 3, 3, 2) with num_frames={frames} (encode, posterior mode, decode)")
    ins, out = capture(model.encoder.mid_block, run)
    ctx.bundle("unet_mid_block_2d_svd_vae_encoder_ref", "diffusers.UNetMidBlock2D", svd_vae_mid_config(model, "encoder"),
               tensor_inputs(ins), out, ref=(weights, "encoder.mid_block."),
               source=src.format("unet_2d_blocks.UNetMidBlock2D", "encoder") + "; the VAE passes temb=None")
    ins, out = capture(model.decoder.mid_block, run)
    assert ins["image_only_indicator"].shape == (1, frames)
    cfg = svd_vae_mid_config(model, "decoder")
    dsrc = src.format("unet_3d_blocks.MidBlockTemporalDecoder", "decoder") + "; the decoder passes image_only_indicator zeros"
    ctx.bundle("mid_block_temporal_decoder_svd_ref", "diffusers.MidBlockTemporalDecoder", cfg, tensor_inputs(ins), out,
               ref=(weights, "decoder.mid_block."), source=dsrc, half=True)
    # One video of 3 frames (the learned mixers do not read image_only_indicator's values, only its frame count)
    z = randn(g, 3, 4, 2, 3)
    ins, out = capture(model.decoder.mid_block, lambda: model.decode(z, num_frames=3))
    ctx.bundle("mid_block_temporal_decoder_svd_3_frames_ref", "diffusers.MidBlockTemporalDecoder", cfg,
               tensor_inputs(ins), out, ref=(weights, "decoder.mid_block."),
               source=("real library class diffusers.models.unets.unet_3d_blocks.MidBlockTemporalDecoder; the "
                       f"decoder.mid_block of the whole AutoencoderKLTemporalDecoder weights/{weights}, inputs captured "
                       "by a forward pre-hook while AutoencoderKLTemporalDecoder.decode ran on a random latent (3, 4, 2, 3) "
                       "with num_frames=3 (one video of 3 frames); the decoder passes image_only_indicator zeros (1, 3)"))


def unet_motion_mid_config(model) -> dict:
    """``UNetMotionModel.__init__`` (unets/unet_motion_model.py), ``use_motion_mid_block=True``:
    ``UNetMidBlockCrossAttnMotion(in_channels=block_out_channels[-1], temb_channels=block_out_channels[0] * 4,
    resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
    cross_attention_dim=cross_attention_dim[-1], num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False, use_linear_projection, num_layers=mid_block_layers,
    temporal_num_attention_heads=motion_num_attention_heads[-1], temporal_max_seq_length=motion_max_seq_length,
    transformer_layers_per_block=transformer_layers_per_mid_block (None: transformer_layers_per_block[-1] when an
    int, else 1), temporal_transformer_layers_per_block=temporal_transformer_layers_per_mid_block)``."""
    c = model.config
    n = len(c.down_block_types)
    tl = c.transformer_layers_per_mid_block
    if tl is None:
        last = _per_block(c.transformer_layers_per_block, n)[-1]
        tl = last if isinstance(last, int) else 1
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=c.norm_eps, resnet_act_fn=c.act_fn,
                output_scale_factor=c.mid_block_scale_factor,
                cross_attention_dim=_per_block(c.cross_attention_dim, n)[-1],
                num_attention_heads=_per_block(c.num_attention_heads, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False, use_linear_projection=c.use_linear_projection, num_layers=c.mid_block_layers,
                temporal_num_attention_heads=_per_block(c.motion_num_attention_heads, n)[-1],
                temporal_max_seq_length=c.motion_max_seq_length, transformer_layers_per_block=tl,
                temporal_transformer_layers_per_block=c.temporal_transformer_layers_per_mid_block)


def diffusers_unet_motion(ctx: Ctx):
    """``UNetMotionModel``: AnimateDiff's U-Net, whose mid block ``UNetMidBlockCrossAttnMotion`` adds an
    ``AnimateDiffTransformer3D`` motion module (attention over the frames, sinusoidal positional embedding)
    after each spatial transformer, on ``(batch * num_frames, C, H, W)``. One down and one up block without
    cross-attention (the mid block is what is checked; the rest only has to be a real model, kept small).
    ``randomize_`` also replaces every ``pos_embed.pe`` buffer (persistent, saved with the weights) with random
    values: a port that recomputes the sinusoid instead of loading the checkpoint's table fails."""
    from diffusers import UNetMotionModel

    torch.manual_seed(0)
    model = UNetMotionModel(sample_size=4, in_channels=4, out_channels=4, down_block_types=("DownBlockMotion",),
                            up_block_types=("UpBlockMotion",), block_out_channels=(8,), layers_per_block=1,
                            norm_num_groups=4, cross_attention_dim=8, num_attention_heads=2,
                            motion_num_attention_heads=2, motion_max_seq_length=6)
    randomize_(model, 7701)
    model.eval()
    pe = model.mid_block.motion_modules[0].transformer_blocks[0].pos_embed.pe
    assert "mid_block.motion_modules.0.transformer_blocks.0.pos_embed.pe" in model.state_dict()
    assert tuple(pe.shape) == (1, 6, 8)
    files = save_diffusers(model, "diffusers_unet_motion")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7702)
    frames = 3
    # AnimateDiffPipeline repeats the prompt per frame before it calls the U-Net
    sample, t, ehs = randn(g, 2, 4, frames, 2, 2), torch.tensor([17, 503]), randn(g, 2, 5, 8)
    ehs = ehs.repeat_interleave(frames, dim=0)

    def run():
        return model(sample, t, encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins["attention_mask"] is None
    cfg = unet_motion_mid_config(model)
    kwargs = {"num_frames": frames}
    src = ("real library class diffusers.models.unets.unet_motion_model.UNetMidBlockCrossAttnMotion; the mid_block of "
           f"the whole UNetMotionModel weights/{weights} (block_out_channels (8,), num_attention_heads 2, "
           "motion_num_attention_heads 2, motion_max_seq_length 6, norm_num_groups 4, cross_attention_dim 8; every "
           "pos_embed.pe buffer randomized, as saved), inputs captured by a forward pre-hook while the model ran on "
           f"random sample (2, 4, {frames}, 2, 2) (batch 2, {frames} frames), timesteps [17, 503], encoder_hidden_states "
           f"(2, 5, 8) repeated per frame as AnimateDiffPipeline does; the mid block sees (batch * frames, C, H, W) and "
           f"num_frames={frames} (parity.kwargs), temb repeated per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_cross_attn_motion"
    block = "diffusers.UNetMidBlockCrossAttnMotion"
    ctx.bundle(stem, block, cfg, tensor_inputs(ins), out, state=state, source=src, half=True, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", block, cfg, tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src,
               kwargs=kwargs)


def i2vgen_xl_mid_config(model) -> dict:
    """``I2VGenXLUNet.__init__`` (unets/unet_i2vgen_xl.py): ``num_attention_heads = attention_head_dim`` (the config's
    ``num_attention_heads`` is ignored) made per-block, ``time_embed_dim = block_out_channels[0] * 4``, then
    ``UNetMidBlock3DCrossAttn(in_channels=block_out_channels[-1], temb_channels=time_embed_dim, resnet_eps=1e-05,
    resnet_act_fn="silu", output_scale_factor=1, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
    resnet_groups=norm_num_groups, dual_cross_attention=False)``."""
    c = model.config
    n = len(c.down_block_types)
    temb = c.block_out_channels[0] * 4
    assert temb == model.time_embedding.linear_2.out_features
    return dict(in_channels=c.block_out_channels[-1], temb_channels=temb, resnet_eps=1e-05, resnet_act_fn="silu",
                output_scale_factor=1, cross_attention_dim=c.cross_attention_dim,
                num_attention_heads=_per_block(c.attention_head_dim, n)[-1], resnet_groups=c.norm_num_groups,
                dual_cross_attention=False)


def diffusers_i2vgen_xl(ctx: Ctx):
    """``I2VGenXLUNet``: the image-to-video U-Net of I2VGen-XL, whose mid block is ``UNetMidBlock3DCrossAttn`` (built
    with fixed eps 1e-5 and SiLU, ``attention_head_dim`` as its per-head width). One down and one up block without
    cross-attention; the context the mid block attends to is the text, the image latents' context embedding (an
    AdaptiveAvgPool2d to 32 x 32, two stride-2 convs: 64 tokens) and the image embedding's ``in_channels`` tokens.
    ``randomize_`` also replaces the zero init of each ``TemporalConvLayer.conv4`` conv."""
    from diffusers import I2VGenXLUNet

    torch.manual_seed(0)
    model = I2VGenXLUNet(sample_size=4, in_channels=4, out_channels=4, down_block_types=("DownBlock3D",),
                         up_block_types=("UpBlock3D",), block_out_channels=(8,), layers_per_block=1,
                         norm_num_groups=4, cross_attention_dim=8, attention_head_dim=2)
    randomize_(model, 7801)
    model.eval()
    assert all(bool(tc.conv4[-1].weight.detach().abs().max() > 0) for tc in model.mid_block.temp_convs)
    files = save_diffusers(model, "diffusers_i2vgen_xl")
    ctx.files += files
    weights = files[1].relative_to(WEIGHTS).as_posix()
    g = gen(7802)
    frames = 3
    sample, t, ehs = randn(g, 2, 4, frames, 2, 2), torch.tensor([17, 503]), randn(g, 2, 5, 8)
    fps, image_latents, image_embeddings = torch.tensor([8, 16]), randn(g, 2, 4, frames, 2, 2), randn(g, 2, 8)

    def run():
        return model(sample, t, fps=fps, image_latents=image_latents, image_embeddings=image_embeddings,
                     encoder_hidden_states=ehs)

    ins, out = capture(model.mid_block, run)
    assert ins["num_frames"] == frames and ins.get("attention_mask") is None
    cfg = i2vgen_xl_mid_config(model)
    kwargs = {"num_frames": frames}
    ctx_len = ins["encoder_hidden_states"].shape[1]
    src = (DIFF_BLOCKS.format("UNetMidBlock3DCrossAttn").replace("unet_2d_blocks", "unet_3d_blocks")
           + f"; the mid_block of the whole I2VGenXLUNet weights/{weights} (block_out_channels (8,), "
           "attention_head_dim 2 -> the mid block's num_attention_heads 2 = 4 heads of width 2, norm_num_groups 4, "
           "cross_attention_dim 8; every TemporalConvLayer conv4 randomized, not zero), inputs captured by a forward "
           f"pre-hook while the model ran on random sample (2, 4, {frames}, 2, 2) (batch 2, {frames} frames), "
           "timesteps [17, 503], fps [8, 16], image_latents (2, 4, 3, 2, 2), image_embeddings (2, 8), "
           f"encoder_hidden_states (2, 5, 8); the mid block sees (batch * frames, C, H, W), num_frames={frames} "
           f"(parity.kwargs), temb and the {ctx_len}-token context (text, image latents, image embedding) repeated "
           "per frame")
    state = sub_state(model.state_dict(), "mid_block.")
    stem = "unet_mid_block_3d_cross_attn_i2vgen_xl"
    block = "diffusers.UNetMidBlock3DCrossAttn"
    # the same class as UNet3DConditionModel's mid block, whose bundles have the f16 / bf16 twins: f32 here
    ctx.bundle(stem, block, cfg, tensor_inputs(ins), out, state=state, source=src, kwargs=kwargs)
    ctx.bundle(f"{stem}_ref", block, cfg, tensor_inputs(ins), out, ref=(weights, "mid_block."), source=src,
               kwargs=kwargs)
