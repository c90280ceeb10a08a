"""Whole U-Net bottlenecks ("mid blocks") of the codebases that have no class of their own for it.

diffusers has real mid-block classes (``UNetMidBlock2D``, ``UNetMidBlock2DCrossAttn``), exported
straight from the pip package. The other codebases build their bottleneck inline in the parent
model, so a parity bundle for "the bottleneck" needs a small module that HOLDS the parent's own
submodules under the parent's own attribute names (so the state-dict keys are exactly the
parent's keys with the parent prefix stripped) and whose ``forward`` is the parent's forward
lines for that stretch. These wrappers are glue, not published classes; the submodules they hold
are the real / re-stated published classes.

* ``LucidrainsMidBlock`` (block id ``denoising_diffusion_pytorch.MidBlock``): lucidrains
  denoising-diffusion-pytorch 2.3.4 ``Unet``: ``mid_block1 = ResnetBlock(mid_dim, mid_dim,
  time_emb_dim=time_dim, dropout=dropout)``, ``mid_attn = Attention(mid_dim, heads=attn_heads[-1],
  dim_head=attn_dim_head[-1], flash=flash_attn)`` (``num_mem_kv`` default 4), ``mid_block2``;
  ``Unet.forward``: ``x = mid_block1(x, t); x = mid_attn(x) + x; x = mid_block2(x, t)`` with
  ``t = time_mlp(time)``. Keys ``mid_block1.*``, ``mid_attn.*``, ``mid_block2.*`` (relative to the
  Unet: ``model.`` in the Trainer's ``model`` entry, ``ema_model.model.`` in its ``ema`` entry).
* ``LdmMidBlock`` (block id ``ldm.MidBlock``): CompVis ``ldm/modules/diffusionmodules/model.py``
  ``Model`` / ``Encoder`` / ``Decoder``: ``mid.block_1 = ResnetBlock(in_channels=block_in,
  out_channels=block_in, temb_channels=temb_ch, dropout=dropout)``, ``mid.attn_1 =
  make_attn(block_in, attn_type)``, ``mid.block_2``; forward ``h = block_1(h, temb); h = attn_1(h);
  h = block_2(h, temb)`` (no skip around attn_1: AttnBlock has its residual inside, LinAttnBlock
  none). The VAE Encoder/Decoder have ``temb_ch = 0`` (no ``temb_proj``) and pass ``temb = None``.
  Keys ``block_1.*``, ``attn_1.*``, ``block_2.*`` (relative to ``...mid.``). The parts are the
  published SD 2.x ``ResnetBlock`` and ``make_attn`` (stable-diffusion-sdkit); ``attn_type
  "linear"``, which the SD 2.x ``make_attn`` no longer has, is SD 1.x's ``LinAttnBlock``
  (re-stated in ``ldm.py``).
* ``openai_middle_block(**config)`` (block id ``openai.MiddleBlock``): the ``middle_block`` of
  OpenAI guided-diffusion / ldm ``openaimodel.UNetModel``, a real
  ``TimestepEmbedSequential(ResBlock, AttentionBlock | SpatialTransformer, ResBlock)`` (keys
  ``0.*``, ``1.*``, ``2.*``), built with UNetModel's rule for the attention's heads (below): with an
  ``AttentionBlock`` from guided-diffusion-sdk's ``guided_diffusion.unet``, with a
  ``SpatialTransformer`` from the SD 2.x ``ldm.modules.diffusionmodules.openaimodel`` (whose
  ``TimestepEmbedSequential`` passes ``context`` to it).
* ``ControlNetMidBlock`` (block id ``diffusers.ControlNetMidBlock``): diffusers 0.42.1
  ``ControlNetModel`` (``models/controlnets/controlnet.py``): ``mid_block`` (the real
  ``UNetMidBlock2DCrossAttn``, or ``UNetMidBlock2D(num_layers=0, add_attention=False)`` for
  ``mid_block_type="UNetMidBlock2D"``) and ``controlnet_mid_block = zero_module(nn.Conv2d(
  block_out_channels[-1], block_out_channels[-1], kernel_size=1))``; ``ControlNetModel.forward``:
  ``sample = mid_block(sample, emb, encoder_hidden_states=..., attention_mask=...)`` (no
  ``encoder_attention_mask``), ``mid_block_res_sample = controlnet_mid_block(sample) *
  conditioning_scale`` (``guess_mode`` scales it by ``logspace(-1, 0, n)[-1] == 1.0`` too: the
  same), then ``mean(dim=(2, 3), keepdim=True)`` with ``global_pool_conditions``. Keys
  ``mid_block.*``, ``controlnet_mid_block.*`` (the ControlNetModel's own, at its top level).
"""

from torch import nn

from upstream import gd_unet, ldm_model, ldm_openaimodel, quietly

from .ldm import LinAttnBlock


class LucidrainsMidBlock(nn.Module):
    """``Unet.mid_block1`` -> ``mid_attn`` (+ residual) -> ``mid_block2`` of denoising-diffusion-pytorch."""

    def __init__(self, dim, time_emb_dim, heads=4, dim_head=32, num_mem_kv=4, dropout=0.0, flash=False):
        super().__init__()
        from denoising_diffusion_pytorch.denoising_diffusion_pytorch import Attention, ResnetBlock

        self.mid_block1 = ResnetBlock(dim, dim, time_emb_dim=time_emb_dim, dropout=dropout)
        self.mid_attn = Attention(dim, heads=heads, dim_head=dim_head, num_mem_kv=num_mem_kv, flash=flash)
        self.mid_block2 = ResnetBlock(dim, dim, time_emb_dim=time_emb_dim, dropout=dropout)

    @classmethod
    def of(cls, unet):
        """The wrapper holding ``unet``'s own mid submodules (shared, not copied)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.mid_block1, self.mid_attn, self.mid_block2 = unet.mid_block1, unet.mid_attn, unet.mid_block2
        return self

    @staticmethod
    def config_of(unet):
        """The wrapper's config for a ``Unet`` (read back from its modules)."""
        attn = unet.mid_attn
        heads, num_mem_kv, dim_head = attn.mem_kv.shape[1:]
        return dict(dim=unet.mid_block1.block1.proj.out_channels,
                    time_emb_dim=unet.mid_block1.mlp[1].in_features, heads=int(heads), dim_head=int(dim_head),
                    num_mem_kv=int(num_mem_kv), dropout=float(unet.mid_block1.block1.dropout.p),
                    flash=bool(attn.attend.flash))

    def forward(self, x, time_emb):
        x = self.mid_block1(x, time_emb)
        x = self.mid_attn(x) + x
        x = self.mid_block2(x, time_emb)
        return x


class ControlNetMidBlock(nn.Module):
    """``ControlNetModel.mid_block`` -> ``controlnet_mid_block`` (x ``conditioning_scale``, pooled with
    ``global_pool_conditions``); outputs ``(mid_block_res_sample, sample)``."""

    output_names = ("mid_block_res_sample", "sample")

    def __init__(self, mid_block, mid_block_type="UNetMidBlock2DCrossAttn", global_pool_conditions=False):
        super().__init__()
        from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2D, UNetMidBlock2DCrossAttn

        classes = {"UNetMidBlock2DCrossAttn": UNetMidBlock2DCrossAttn, "UNetMidBlock2D": UNetMidBlock2D}
        self.mid_block = classes[mid_block_type](**mid_block)
        c = mid_block["in_channels"]
        self.controlnet_mid_block = nn.Conv2d(c, c, kernel_size=1)
        self.global_pool_conditions = global_pool_conditions

    @classmethod
    def of(cls, controlnet):
        """The wrapper holding ``controlnet``'s own mid submodules (shared, not copied)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.mid_block, self.controlnet_mid_block = controlnet.mid_block, controlnet.controlnet_mid_block
        self.global_pool_conditions = controlnet.config.global_pool_conditions
        return self

    def forward(self, hidden_states, temb, encoder_hidden_states=None, attention_mask=None, conditioning_scale=1.0):
        import torch

        if getattr(self.mid_block, "has_cross_attention", False):
            sample = self.mid_block(hidden_states, temb, encoder_hidden_states=encoder_hidden_states,
                                    attention_mask=attention_mask)
        else:
            sample = self.mid_block(hidden_states, temb)
        mid_block_res_sample = self.controlnet_mid_block(sample)
        mid_block_res_sample = mid_block_res_sample * conditioning_scale
        if self.global_pool_conditions:
            mid_block_res_sample = torch.mean(mid_block_res_sample, dim=(2, 3), keepdim=True)
        return mid_block_res_sample, sample


class LdmMidBlock(nn.Module):
    """``mid.block_1`` -> ``mid.attn_1`` -> ``mid.block_2`` of ldm ``Model`` / ``Encoder`` / ``Decoder``."""

    def __init__(self, in_channels, temb_channels, dropout=0.0, attn_type="vanilla"):
        super().__init__()
        if attn_type not in ("vanilla", "linear", "none"):
            raise ValueError(f"attn_type {attn_type!r}: expected vanilla, linear or none")
        self.block_1 = ldm_model.ResnetBlock(in_channels=in_channels, out_channels=in_channels,
                                             temb_channels=temb_channels, dropout=dropout)
        if attn_type == "linear":
            # SD 1.x make_attn: LinAttnBlock(in_channels)
            self.attn_1 = LinAttnBlock(in_channels)
        else:
            self.attn_1 = quietly(ldm_model.make_attn, in_channels, attn_type=attn_type)
        self.block_2 = ldm_model.ResnetBlock(in_channels=in_channels, out_channels=in_channels,
                                             temb_channels=temb_channels, dropout=dropout)

    def forward(self, x, temb=None):
        h = self.block_1(x, temb)
        h = self.attn_1(h)
        h = self.block_2(h, temb)
        return h


def openai_attention_heads(channels, num_heads, num_head_channels, use_spatial_transformer, legacy):
    """UNetModel's rule for the middle block (ldm openaimodel.py): returns ``(num_heads, dim_head)``.

    ``num_head_channels == -1``: ``dim_head = ch // num_heads``; otherwise
    ``num_heads = ch // num_head_channels``, ``dim_head = num_head_channels``; then with ``legacy``:
    ``dim_head = ch // num_heads`` for a SpatialTransformer, ``num_head_channels`` otherwise."""
    if num_head_channels == -1:
        dim_head = channels // num_heads
    else:
        num_heads = channels // num_head_channels
        dim_head = num_head_channels
    if legacy:
        dim_head = channels // num_heads if use_spatial_transformer else num_head_channels
    return num_heads, dim_head


def openai_middle_block(channels, emb_channels, dropout=0.0, dims=2, use_scale_shift_norm=False, num_heads=-1,
                        num_head_channels=-1, use_new_attention_order=False, use_spatial_transformer=False,
                        transformer_depth=1, context_dim=None, use_linear_in_transformer=False,
                        disable_middle_self_attn=False, legacy=True, use_checkpoint=False):
    """``UNetModel.middle_block`` = ``TimestepEmbedSequential(ResBlock, attention, ResBlock)``.

    Published constructor lines (ldm openaimodel.py; guided-diffusion passes ``num_head_channels``
    to AttentionBlock directly, which gives the same heads): ``ResBlock(ch, time_embed_dim, dropout,
    dims=dims, use_checkpoint=use_checkpoint, use_scale_shift_norm=use_scale_shift_norm)``, then
    ``AttentionBlock(ch, use_checkpoint=use_checkpoint, num_heads=num_heads,
    num_head_channels=dim_head, use_new_attention_order=use_new_attention_order)`` or
    ``SpatialTransformer(ch, num_heads, dim_head, depth=transformer_depth, context_dim=context_dim,
    disable_self_attn=disable_middle_self_attn, use_linear=use_linear_in_transformer,
    use_checkpoint=use_checkpoint)``, then the second ResBlock. The classes: guided-diffusion's
    ``guided_diffusion.unet`` for an AttentionBlock middle, SD 2.x's ``openaimodel`` for a
    SpatialTransformer middle (SD 1.x configurations included: with ``use_linear_in_transformer``
    and ``disable_middle_self_attn`` off and ``transformer_depth`` 1 the SD 2.x SpatialTransformer
    has the SD 1.x keys and float32 arithmetic; its q/k float32 cast is a no-op there)."""
    ch = channels
    num_heads, dim_head = openai_attention_heads(ch, num_heads, num_head_channels, use_spatial_transformer, legacy)
    lib = ldm_openaimodel if use_spatial_transformer else gd_unet

    def res():
        return lib.ResBlock(ch, emb_channels, dropout, dims=dims, use_checkpoint=use_checkpoint,
                            use_scale_shift_norm=use_scale_shift_norm)

    if not use_spatial_transformer:
        attn = gd_unet.AttentionBlock(ch, use_checkpoint=use_checkpoint, num_heads=num_heads,
                                      num_head_channels=dim_head, use_new_attention_order=use_new_attention_order)
    else:
        attn = ldm_openaimodel.SpatialTransformer(ch, num_heads, dim_head, depth=transformer_depth,
                                                  context_dim=context_dim, disable_self_attn=disable_middle_self_attn,
                                                  use_linear=use_linear_in_transformer, use_checkpoint=use_checkpoint)
    return lib.TimestepEmbedSequential(res(), attn, res())
