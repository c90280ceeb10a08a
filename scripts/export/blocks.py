"""Building a block from its bundle's block id and config alone (``build_module``), and the
Versatile Diffusion ``DualTransformer2DModel`` helpers that build needs (pipeline-set attributes,
the forward that accepts ``encoder_attention_mask=None``).
"""

from __future__ import annotations

from torch import nn

from reference import mid_blocks


def build_module(block: str, config: dict) -> nn.Module:
    cfg = dict(config)
    if block == "diffusers.ResnetBlock2D":
        from diffusers.models.resnet import ResnetBlock2D

        return ResnetBlock2D(**cfg)
    if block == "diffusers.UNetMidBlock2D":
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2D

        return UNetMidBlock2D(**cfg)
    if block == "diffusers.UNetMidBlock1D":
        from diffusers.models.unets.unet_1d_blocks import UNetMidBlock1D

        return UNetMidBlock1D(**cfg)
    if block in ("diffusers.MidResTemporalBlock1D", "diffusers.ValueFunctionMidBlock1D"):
        from diffusers.models.unets import unet_1d_blocks

        return getattr(unet_1d_blocks, block.split(".")[1])(**cfg)
    if block == "diffusers.UNetMidBlock2DCrossAttn":
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2DCrossAttn

        # the DualTransformer2DModel attributes are not constructor arguments (see dual_attributes_)
        attrs = {k: cfg.pop(k) for k in DUAL_ATTRIBUTES if k in cfg}
        module = UNetMidBlock2DCrossAttn(**cfg)
        if cfg.get("dual_cross_attention"):
            dual_attributes_(module, attrs)
            maskless_dual_(module)
        return module
    if block == "diffusers.DualTransformer2DModel":
        from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

        attrs = {k: cfg.pop(k) for k in DUAL_ATTRIBUTES if k in cfg}
        module = DualTransformer2DModel(**cfg)
        dual_attributes_(module, attrs)
        return module
    if block == "diffusers.UNetMidBlock2DSimpleCrossAttn":
        from diffusers.models import attention_processor
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2DSimpleCrossAttn

        # ``processor`` is not a constructor argument: the processor class the attentions run
        # (the constructor picks AttnAddedKVProcessor2_0 under torch >= 2)
        processor = cfg.pop("processor", None)
        module = UNetMidBlock2DSimpleCrossAttn(**cfg)
        if processor is not None:
            for attn in module.attentions:
                attn.set_processor(getattr(attention_processor, processor)())
        return module
    if block == "diffusers.UNetMidBlock3DCrossAttn":
        from diffusers.models.unets.unet_3d_blocks import UNetMidBlock3DCrossAttn

        return UNetMidBlock3DCrossAttn(**cfg)
    if block in ("diffusers.UNetMidBlockSpatioTemporal", "diffusers.MidBlockTemporalDecoder"):
        from diffusers.models.unets import unet_3d_blocks

        return getattr(unet_3d_blocks, block.split(".")[1])(**cfg)
    if block == "diffusers.UNetMidBlockCrossAttnMotion":
        from diffusers.models.unets.unet_motion_model import UNetMidBlockCrossAttnMotion

        return UNetMidBlockCrossAttnMotion(**cfg)
    if block == "diffusers.ControlNetMidBlock":
        return mid_blocks.ControlNetMidBlock(**cfg)
    if block == "diffusers.ControlNetXSCrossAttnMidBlock2D":
        from diffusers.models.controlnets.controlnet_xs import ControlNetXSCrossAttnMidBlock2D

        module = ControlNetXSCrossAttnMidBlock2D(**cfg)
        # the real class returns the tuple (h_base, h_ctrl): its outputs named after the forward's locals
        module.output_names = ("h_base", "h_ctrl")
        return module
    if block == "denoising_diffusion_pytorch.MidBlock":
        return mid_blocks.LucidrainsMidBlock(**cfg)
    if block == "ldm.MidBlock":
        return mid_blocks.LdmMidBlock(**cfg)
    if block == "openai.MiddleBlock":
        return mid_blocks.openai_middle_block(**cfg)
    raise KeyError(f"unknown block id {block!r}")


# Attributes a pipeline sets on every DualTransformer2DModel (VersatileDiffusionDualGuidedPipeline
# .set_transformer_params), not constructor arguments: bundles carry them as extra config keys.
DUAL_ATTRIBUTES = ("mix_ratio", "condition_lengths", "transformer_index_for_condition")


def dual_attributes_(module: nn.Module, attrs: dict):
    """Set ``attrs`` (a subset of ``DUAL_ATTRIBUTES``) on every DualTransformer2DModel in ``module``
    (itself included), as ``set_transformer_params`` does."""
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    for m in module.modules():
        if isinstance(m, DualTransformer2DModel):
            for k, v in attrs.items():
                setattr(m, k, list(v) if isinstance(v, (list, tuple)) else v)


def _maskless_dual_class():
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    class DualTransformer2DModelMaskless(DualTransformer2DModel):
        """diffusers 0.42.1's UNetMidBlock2DCrossAttn / CrossAttnDownBlock2D call their attentions with
        ``encoder_attention_mask=...``, which DualTransformer2DModel.forward does not take: every call
        raises TypeError (diffusers issue #13651). This forward takes it (None only) and runs
        DualTransformer2DModel.forward unchanged."""

        def forward(self, hidden_states, encoder_hidden_states, timestep=None, attention_mask=None,
                    cross_attention_kwargs=None, return_dict: bool = True, encoder_attention_mask=None):
            assert encoder_attention_mask is None, "DualTransformer2DModel takes no encoder_attention_mask"
            return super().forward(hidden_states, encoder_hidden_states, timestep=timestep,
                                   attention_mask=attention_mask, cross_attention_kwargs=cross_attention_kwargs,
                                   return_dict=return_dict)

    return DualTransformer2DModelMaskless


def maskless_dual_(module: nn.Module):
    """Give every DualTransformer2DModel in ``module`` the forward that accepts the
    ``encoder_attention_mask=None`` its parent block passes (same weights, same arithmetic)."""
    from diffusers.models.transformers.dual_transformer_2d import DualTransformer2DModel

    cls = _maskless_dual_class()
    for m in module.modules():
        if type(m) is DualTransformer2DModel:
            m.__class__ = cls
    return module


MASKLESS_NOTE = ("; diffusers 0.42.1's UNetMidBlock2DCrossAttn.forward passes encoder_attention_mask=None to "
                 "DualTransformer2DModel.forward, which has no such parameter (TypeError on every call, diffusers "
                 "issue #13651): the export gives each DualTransformer2DModel a subclass whose forward also takes "
                 "encoder_attention_mask=None and runs DualTransformer2DModel.forward unchanged")
