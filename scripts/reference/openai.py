"""Re-statement of the OpenAI U-Net ``AttentionBlock`` (and, at the end of the file, the middle
block's ``ResBlock``, ``TimestepEmbedSequential`` and ``timestep_embedding``).

Published source: openai/guided-diffusion (HEAD 22e0df818350) ``guided_diffusion/unet.py``
(``AttentionBlock``, ``QKVAttentionLegacy``, ``QKVAttention``) and ``guided_diffusion/nn.py``
(``GroupNorm32``, ``normalization``, ``conv_nd``, ``zero_module``, ``checkpoint``). The same
classes are in CompVis/latent-diffusion and Stability-AI/stablediffusion
``ldm/modules/diffusionmodules/openaimodel.py`` / ``util.py`` (SD U-Nets with
``use_spatial_transformer=False``).

Semantics kept exactly:

* ``normalization(C) = GroupNorm32(32, C)`` (eps 1e-5), computed in float32 whatever the input
  dtype: ``super().forward(x.float()).type(x.dtype)``.
* ``AttentionBlock(channels, num_heads=1, num_head_channels=-1, use_checkpoint=False,
  use_new_attention_order=False)``: ``num_heads = channels // num_head_channels`` unless
  ``num_head_channels == -1``; ``forward`` always calls ``checkpoint(self._forward, (x,),
  self.parameters(), True)`` (``use_checkpoint`` is ignored; numerically irrelevant);
  ``x`` of shape ``(b, c, *spatial)`` (1-D, 2-D or 3-D) is flattened to ``(b, c, T)``;
  ``qkv = Conv1d(C, 3C, 1)`` (keys ``qkv.weight (3C, C, 1)``, ``qkv.bias``), ``proj_out =
  Conv1d(C, C, 1)``; returns ``(x + proj_out(attention(qkv(norm(x))))).reshape(b, c, *spatial)``.
* ``QKVAttentionLegacy`` ("split heads before split qkv"): ``qkv.reshape(bs * H, 3 * ch, T)
  .split(ch, dim=1)``, i.e. channel ``h*3*ch + {0, ch, 2ch} + c`` is q/k/v of head h.
* ``QKVAttention`` ("split qkv before split heads"): ``qkv.chunk(3, dim=1)`` then
  ``.view(bs * H, ch, T)``, i.e. channel ``{0, 1, 2}*H*ch + h*ch + c``.
* Both: ``scale = 1 / sqrt(sqrt(ch))`` applied to q AND k before the matmul;
  ``softmax(weight.float(), dim=-1).type(weight.dtype)`` (softmax over keys, in float32);
  output channel ``h*ch + c``.

Parity hooks (not in the published classes, no effect on the published numerics):
``QKVAttention*.upcast_softmax = True`` guards the ``.float()`` of the softmax, and
``parity_bundle.float64_copy`` switches it off and runs ``GroupNorm32`` as a plain GroupNorm in
the float64 copy, so the float64 reference is not downcast to float32.
"""

import math

import torch as th
import torch.nn as nn


# guided_diffusion/nn.py


class GroupNorm32(nn.GroupNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


def conv_nd(dims, *args, **kwargs):
    """Create a 1D, 2D, or 3D convolution module."""
    if dims == 1:
        return nn.Conv1d(*args, **kwargs)
    elif dims == 2:
        return nn.Conv2d(*args, **kwargs)
    elif dims == 3:
        return nn.Conv3d(*args, **kwargs)
    raise ValueError(f"unsupported dimensions: {dims}")


def zero_module(module):
    """Zero out the parameters of a module and return it."""
    for p in module.parameters():
        p.detach().zero_()
    return module


def normalization(channels):
    """Make a standard normalization layer."""
    return GroupNorm32(32, channels)


# guided_diffusion/nn.py `checkpoint` / `CheckpointFunction`: the same code as ldm's
# diffusionmodules/util.py (ldm copied it), re-stated once in ldm_sd.py.
from .ldm_sd import checkpoint  # noqa: E402


# guided_diffusion/unet.py


class AttentionBlock(nn.Module):
    """
    An attention block that allows spatial positions to attend to each other.

    Originally ported from here, but adapted to the N-d case.
    https://github.com/hojonathanho/diffusion/blob/1e0dceb3b3495bbe19116a5e1b3596cd0706c543/diffusion_tf/models/unet.py#L66.
    """

    def __init__(
        self,
        channels,
        num_heads=1,
        num_head_channels=-1,
        use_checkpoint=False,
        use_new_attention_order=False,
    ):
        super().__init__()
        self.channels = channels
        if num_head_channels == -1:
            self.num_heads = num_heads
        else:
            assert (
                channels % num_head_channels == 0
            ), f"q,k,v channels {channels} is not divisible by num_head_channels {num_head_channels}"
            self.num_heads = channels // num_head_channels
        self.use_checkpoint = use_checkpoint
        self.norm = normalization(channels)
        self.qkv = conv_nd(1, channels, channels * 3, 1)
        if use_new_attention_order:
            # split qkv before split heads
            self.attention = QKVAttention(self.num_heads)
        else:
            # split heads before split qkv
            self.attention = QKVAttentionLegacy(self.num_heads)

        self.proj_out = zero_module(conv_nd(1, channels, channels, 1))

    def forward(self, x):
        return checkpoint(self._forward, (x,), self.parameters(), True)

    def _forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        h = self.attention(qkv)
        h = self.proj_out(h)
        return (x + h).reshape(b, c, *spatial)


class QKVAttentionLegacy(nn.Module):
    """
    A module which performs QKV attention. Matches legacy QKVAttention + input/ouput heads shaping
    """

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.upcast_softmax = True  # parity hook (module docstring)

    def forward(self, qkv):
        """
        Apply QKV attention.

        :param qkv: an [N x (H * 3 * C) x T] tensor of Qs, Ks, and Vs.
        :return: an [N x (H * C) x T] tensor after attention.
        """
        bs, width, length = qkv.shape
        assert width % (3 * self.n_heads) == 0
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = th.einsum(
            "bct,bcs->bts", q * scale, k * scale
        )  # More stable with f16 than dividing afterwards
        weight = th.softmax(weight.float() if self.upcast_softmax else weight, dim=-1).type(weight.dtype)
        a = th.einsum("bts,bcs->bct", weight, v)
        return a.reshape(bs, -1, length)


class QKVAttention(nn.Module):
    """
    A module which performs QKV attention and splits in a different order.
    """

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.upcast_softmax = True  # parity hook (module docstring)

    def forward(self, qkv):
        """
        Apply QKV attention.

        :param qkv: an [N x (3 * H * C) x T] tensor of Qs, Ks, and Vs.
        :return: an [N x (H * C) x T] tensor after attention.
        """
        bs, width, length = qkv.shape
        assert width % (3 * self.n_heads) == 0
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.chunk(3, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = th.einsum(
            "bct,bcs->bts",
            (q * scale).view(bs * self.n_heads, ch, length),
            (k * scale).view(bs * self.n_heads, ch, length),
        )  # More stable with f16 than dividing afterwards
        weight = th.softmax(weight.float() if self.upcast_softmax else weight, dim=-1).type(weight.dtype)
        a = th.einsum("bts,bcs->bct", weight, v.reshape(bs * self.n_heads, ch, length))
        return a.reshape(bs, -1, length)


# --------------------------------------------------------------------------------------------
# The middle block's other parts: ResBlock, TimestepEmbedSequential, time embedding.
#
# Published source: openai/guided-diffusion 22e0df818350 ``guided_diffusion/unet.py``
# (``TimestepBlock``, ``TimestepEmbedSequential``, ``ResBlock``, ``Upsample``, ``Downsample``) and
# ``nn.py`` (``linear``, ``avg_pool_nd``, ``timestep_embedding``); the same classes are in
# CompVis/latent-diffusion a506df575647 / Stability-AI/stablediffusion cf1d67a6fd5e
# ``ldm/modules/diffusionmodules/openaimodel.py`` + ``util.py``, whose ``TimestepEmbedSequential``
# also passes ``context`` to a ``SpatialTransformer`` child (re-stated here in that ldm form,
# a superset of guided-diffusion's: without a SpatialTransformer child both are the same).
#
# Semantics kept exactly:
# * ``ResBlock(channels, emb_channels, dropout, out_channels=None, use_conv=False,
#   use_scale_shift_norm=False, dims=2, use_checkpoint=False, up=False, down=False)``:
#   ``in_layers = [normalization(C), SiLU, conv_nd(dims, C, out, 3, padding=1)]``,
#   ``emb_layers = [SiLU, linear(emb_channels, 2*out if use_scale_shift_norm else out)]``,
#   ``out_layers = [normalization(out), SiLU, Dropout, zero_module(conv_nd(dims, out, out, 3, padding=1))]``,
#   ``skip_connection`` = Identity (out == C), 3x3 conv (use_conv) or 1x1 conv.
#   forward(x, emb): ``h = in_layers(x)`` (up/down: resample between the SiLU and the conv, on h
#   and x); ``emb_out = emb_layers(emb).type(h.dtype)`` with trailing singleton dims up to h's rank;
#   scale-shift: ``scale, shift = chunk(emb_out, 2, dim=1)``, ``h = out_norm(h) * (1 + scale) + shift``,
#   ``h = out_rest(h)``; otherwise ``h = out_layers(h + emb_out)``; ``return skip_connection(x) + h``.
#   ``nn.SiLU`` here (= F.silu), unlike ldm model.py's ``x * sigmoid(x)``.
# * ``timestep_embedding(t, dim, max_period=10000)``: ``half = dim // 2``,
#   ``freqs = exp(-ln(max_period) * arange(0, half, float32) / half)``, ``args = t[:, None].float() * freqs[None]``,
#   ``cat(cos(args), sin(args))`` (cos first), zero column for an odd ``dim``.


def linear(*args, **kwargs):
    """Create a linear module."""
    return nn.Linear(*args, **kwargs)


def avg_pool_nd(dims, *args, **kwargs):
    """Create a 1D, 2D, or 3D average pooling module."""
    if dims == 1:
        return nn.AvgPool1d(*args, **kwargs)
    elif dims == 2:
        return nn.AvgPool2d(*args, **kwargs)
    elif dims == 3:
        return nn.AvgPool3d(*args, **kwargs)
    raise ValueError(f"unsupported dimensions: {dims}")


def timestep_embedding(timesteps, dim, max_period=10000):
    half = dim // 2
    freqs = th.exp(-math.log(max_period) * th.arange(start=0, end=half, dtype=th.float32) / half).to(
        device=timesteps.device)
    args = timesteps[:, None].float() * freqs[None]
    embedding = th.cat([th.cos(args), th.sin(args)], dim=-1)
    if dim % 2:
        embedding = th.cat([embedding, th.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


class TimestepBlock(nn.Module):
    """A module whose forward takes the timestep embedding as its second argument."""

    def forward(self, x, emb):
        raise NotImplementedError


def _spatial_transformer_classes():
    from .ldm_sd import SpatialTransformerSD1, SpatialTransformerSD2

    return (SpatialTransformerSD1, SpatialTransformerSD2)


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    """Sequential that gives ``emb`` to TimestepBlock children and ``context`` to SpatialTransformers."""

    def forward(self, x, emb, context=None):
        for layer in self:
            if isinstance(layer, TimestepBlock):
                x = layer(x, emb)
            elif isinstance(layer, _spatial_transformer_classes()):
                x = layer(x, context)
            else:
                x = layer(x)
        return x


class Upsample(nn.Module):
    def __init__(self, channels, use_conv, dims=2, out_channels=None):
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.dims = dims
        if use_conv:
            self.conv = conv_nd(dims, self.channels, self.out_channels, 3, padding=1)

    def forward(self, x):
        assert x.shape[1] == self.channels
        if self.dims == 3:
            x = nn.functional.interpolate(x, (x.shape[2], x.shape[3] * 2, x.shape[4] * 2), mode="nearest")
        else:
            x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        if self.use_conv:
            x = self.conv(x)
        return x


class Downsample(nn.Module):
    def __init__(self, channels, use_conv, dims=2, out_channels=None):
        super().__init__()
        self.channels = channels
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.dims = dims
        stride = 2 if dims != 3 else (1, 2, 2)
        if use_conv:
            self.op = conv_nd(dims, self.channels, self.out_channels, 3, stride=stride, padding=1)
        else:
            assert self.channels == self.out_channels
            self.op = avg_pool_nd(dims, kernel_size=stride, stride=stride)

    def forward(self, x):
        assert x.shape[1] == self.channels
        return self.op(x)


class ResBlock(TimestepBlock):
    def __init__(self, channels, emb_channels, dropout, out_channels=None, use_conv=False,
                 use_scale_shift_norm=False, dims=2, use_checkpoint=False, up=False, down=False):
        super().__init__()
        self.channels = channels
        self.emb_channels = emb_channels
        self.dropout = dropout
        self.out_channels = out_channels or channels
        self.use_conv = use_conv
        self.use_checkpoint = use_checkpoint
        self.use_scale_shift_norm = use_scale_shift_norm

        self.in_layers = nn.Sequential(
            normalization(channels),
            nn.SiLU(),
            conv_nd(dims, channels, self.out_channels, 3, padding=1),
        )
        self.updown = up or down
        if up:
            self.h_upd = Upsample(channels, False, dims)
            self.x_upd = Upsample(channels, False, dims)
        elif down:
            self.h_upd = Downsample(channels, False, dims)
            self.x_upd = Downsample(channels, False, dims)
        else:
            self.h_upd = self.x_upd = nn.Identity()
        self.emb_layers = nn.Sequential(
            nn.SiLU(),
            linear(emb_channels, 2 * self.out_channels if use_scale_shift_norm else self.out_channels),
        )
        self.out_layers = nn.Sequential(
            normalization(self.out_channels),
            nn.SiLU(),
            nn.Dropout(p=dropout),
            zero_module(conv_nd(dims, self.out_channels, self.out_channels, 3, padding=1)),
        )
        if self.out_channels == channels:
            self.skip_connection = nn.Identity()
        elif use_conv:
            self.skip_connection = conv_nd(dims, channels, self.out_channels, 3, padding=1)
        else:
            self.skip_connection = conv_nd(dims, channels, self.out_channels, 1)

    def forward(self, x, emb):
        return checkpoint(self._forward, (x, emb), self.parameters(), self.use_checkpoint)

    def _forward(self, x, emb):
        if self.updown:
            in_rest, in_conv = self.in_layers[:-1], self.in_layers[-1]
            h = in_rest(x)
            h = self.h_upd(h)
            x = self.x_upd(x)
            h = in_conv(h)
        else:
            h = self.in_layers(x)
        emb_out = self.emb_layers(emb).type(h.dtype)
        while len(emb_out.shape) < len(h.shape):
            emb_out = emb_out[..., None]
        if self.use_scale_shift_norm:
            out_norm, out_rest = self.out_layers[0], self.out_layers[1:]
            scale, shift = th.chunk(emb_out, 2, dim=1)
            h = out_norm(h) * (1 + scale) + shift
            h = out_rest(h)
        else:
            h = h + emb_out
            h = self.out_layers(h)
        return self.skip_connection(x) + h
