"""Re-statements of the Stable Diffusion (ldm) attention blocks.

Published sources:

* SD 1.x = CompVis/latent-diffusion ``ldm/modules/attention.py`` (HEAD a506df575647; identical in
  CompVis/stable-diffusion 21f890f9da3c): ``GEGLU``, ``FeedForward``, ``SpatialSelfAttention``,
  ``CrossAttention``, ``BasicTransformerBlock``, ``SpatialTransformer`` -> here ``GEGLU``,
  ``FeedForward``, ``SpatialSelfAttention``, ``CrossAttentionSD1``, ``BasicTransformerBlockSD1``,
  ``SpatialTransformerSD1``; and ``ldm/modules/diffusionmodules/model.py``: ``Normalize``,
  ``AttnBlock``, ``LinAttnBlock`` (re-exported from ``ldm.py`` in this folder).
* SD 2.x = Stability-AI/stablediffusion ``ldm/modules/attention.py`` (HEAD cf1d67a6fd5e):
  ``CrossAttention``, ``BasicTransformerBlock``, ``SpatialTransformer`` -> here
  ``CrossAttentionSD2``, ``BasicTransformerBlockSD2``, ``SpatialTransformerSD2``. (SD2's
  ``GEGLU``, ``FeedForward``, ``SpatialSelfAttention`` are unchanged from SD1.)
* ``checkpoint`` / ``CheckpointFunction`` from ``ldm/modules/diffusionmodules/util.py`` (the
  forward of the checkpointed function is run under ``torch.no_grad()``; identical numerics).

Semantics kept exactly (the parity bundles are produced by running these classes):

* GEGLU: ``proj = Linear(dim_in, 2*dim_out)``; first half = value, second half = gate;
  ``x * F.gelu(gate)`` (exact erf GELU).
* FeedForward(glu=False): ``Sequential(Linear, GELU())``; keys ``net.0.0.*`` / ``net.2.*``;
  (glu=True) ``net.0.proj.*`` / ``net.2.*``; ``inner_dim = int(dim * mult)``.
* CrossAttention: no biases on to_q/to_k/to_v, bias on to_out.0; heads split ``'b n (h d) ->
  (b h) n d'``; ``sim = einsum(q, k) * scale`` (scale AFTER the matmul, ``dim_head ** -0.5``);
  mask: ``rearrange(mask, 'b ... -> b (...)')``, ``repeat(mask, 'b j -> (b h) () j')``,
  ``sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)`` (True = keep; masked logits are the
  most negative finite value, not -inf); softmax over keys.
* SD2 CrossAttention: when the module global ``_ATTN_PRECISION`` (env ``ATTN_PRECISION``,
  default ``"fp32"``) is ``"fp32"``, q and k are cast to float32 before the logits (inside
  ``torch.autocast(enabled=False, device_type='cuda')``), so ``sim`` and the softmax are float32
  and ``einsum(sim, v)`` mixes dtypes under half precision. Parity hook (not in the published
  class): the global is captured into the instance attribute ``upcast_attention`` at
  construction, which ``parity_bundle.float64_copy`` switches off so the float64 reference is
  not downcast. In float32 both branches are the same computation.
* BasicTransformerBlock: pre-LayerNorm (eps 1e-5) residual blocks ``attn1``, ``attn2``
  (context; self-attention if context is None), ``ff`` (GEGLU when ``gated_ff``).
  SD2 ``disable_self_attn``: attn1 becomes a cross-attention over ``context`` too
  (``to_k``/``to_v`` of width ``context_dim``).
* SpatialTransformer SD1: GroupNorm(32, C, eps 1e-6) -> conv1x1 proj_in -> tokens
  ``'b c h w -> b (h w) c'`` -> blocks -> back -> conv1x1 proj_out -> ``+ x_in``.
  SD2: ``context_dim`` int is wrapped into ``[context_dim]`` and indexed per depth
  (``context_dim[d]``: an int with depth > 1 raises IndexError); forward wraps a non-list
  ``context`` into ``[context]`` and passes ``context[i]`` to block i (a single tensor with
  depth > 1 raises IndexError, so depth > 1 needs a list of contexts). ``use_linear``:
  proj_in = ``Linear(in, inner)`` applied AFTER the flatten, ``proj_out = Linear(in_channels,
  inner_dim)`` (arguments swapped in the published code; only consistent when in == inner) applied
  BEFORE the unflatten.
* AttnBlock / SpatialSelfAttention: single head over C channels, scale ``int(c) ** -0.5`` after
  the matmul, softmax over keys, ``x + proj_out(h)``.
* The SD1 latent-diffusion HEAD wraps the SpatialTransformer forward in
  ``torch.cuda.amp.autocast()`` in some copies; CompVis/stable-diffusion does not. It is a no-op
  for CPU tensors and is left out here.
"""

import os
from inspect import isfunction

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import einsum, nn

from .ldm import LinAttnBlock, LinearAttention  # noqa: F401  (ldm/modules/diffusionmodules/model.py)

# CrossAttn precision handling (Stability-AI/stablediffusion)
_ATTN_PRECISION = os.environ.get("ATTN_PRECISION", "fp32")


def exists(val):
    return val is not None


def default(val, d):
    if exists(val):
        return val
    return d() if isfunction(d) else d


# ldm/modules/diffusionmodules/util.py


def checkpoint(func, inputs, params, flag):
    """Evaluate a function without caching intermediate activations (gradient checkpointing)."""
    if flag:
        args = tuple(inputs) + tuple(params)
        return CheckpointFunction.apply(func, len(inputs), *args)
    else:
        return func(*inputs)


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, length, *args):
        ctx.run_function = run_function
        ctx.input_tensors = list(args[:length])
        ctx.input_params = list(args[length:])
        with torch.no_grad():
            output_tensors = ctx.run_function(*ctx.input_tensors)
        return output_tensors

    @staticmethod
    def backward(ctx, *output_grads):
        ctx.input_tensors = [x.detach().requires_grad_(True) for x in ctx.input_tensors]
        with torch.enable_grad():
            shallow_copies = [x.view_as(x) for x in ctx.input_tensors]
            output_tensors = ctx.run_function(*shallow_copies)
        input_grads = torch.autograd.grad(
            output_tensors,
            ctx.input_tensors + ctx.input_params,
            output_grads,
            allow_unused=True,
        )
        del ctx.input_tensors
        del ctx.input_params
        del output_tensors
        return (None, None) + input_grads


# ldm/modules/attention.py (shared by SD1 and SD2)


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, dim_out=None, mult=4, glu=False, dropout=0.):
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = default(dim_out, dim)
        project_in = nn.Sequential(
            nn.Linear(dim, inner_dim),
            nn.GELU()
        ) if not glu else GEGLU(dim, inner_dim)

        self.net = nn.Sequential(
            project_in,
            nn.Dropout(dropout),
            nn.Linear(inner_dim, dim_out)
        )

    def forward(self, x):
        return self.net(x)


def zero_module(module):
    """Zero out the parameters of a module and return it."""
    for p in module.parameters():
        p.detach().zero_()
    return module


def Normalize(in_channels):
    return torch.nn.GroupNorm(num_groups=32, num_channels=in_channels, eps=1e-6, affine=True)


class SpatialSelfAttention(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.in_channels = in_channels

        self.norm = Normalize(in_channels)
        self.q = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.k = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.v = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h_ = x
        h_ = self.norm(h_)
        q = self.q(h_)
        k = self.k(h_)
        v = self.v(h_)

        # compute attention
        b, c, h, w = q.shape
        q = rearrange(q, 'b c h w -> b (h w) c')
        k = rearrange(k, 'b c h w -> b c (h w)')
        w_ = torch.einsum('bij,bjk->bik', q, k)

        w_ = w_ * (int(c)**(-0.5))
        w_ = torch.nn.functional.softmax(w_, dim=2)

        # attend to values
        v = rearrange(v, 'b c h w -> b c (h w)')
        w_ = rearrange(w_, 'b i j -> b j i')
        h_ = torch.einsum('bij,bjk->bik', v, w_)
        h_ = rearrange(h_, 'b c (h w) -> b c h w', h=h)
        h_ = self.proj_out(h_)

        return x + h_


# SD 1.x (CompVis/latent-diffusion a506df575647 = CompVis/stable-diffusion 21f890f9da3c)


class CrossAttentionSD1(nn.Module):
    """``CrossAttention`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x)."""

    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)

        self.scale = dim_head ** -0.5
        self.heads = heads

        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)

        self.to_out = nn.Sequential(
            nn.Linear(inner_dim, query_dim),
            nn.Dropout(dropout)
        )

    def forward(self, x, context=None, mask=None):
        h = self.heads

        q = self.to_q(x)
        context = default(context, x)
        k = self.to_k(context)
        v = self.to_v(context)

        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> (b h) n d', h=h), (q, k, v))

        sim = einsum('b i d, b j d -> b i j', q, k) * self.scale

        if exists(mask):
            mask = rearrange(mask, 'b ... -> b (...)')
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = repeat(mask, 'b j -> (b h) () j', h=h)
            sim.masked_fill_(~mask, max_neg_value)

        # attention, what we cannot get enough of
        attn = sim.softmax(dim=-1)

        out = einsum('b i j, b j d -> b i d', attn, v)
        out = rearrange(out, '(b h) n d -> b n (h d)', h=h)
        return self.to_out(out)


class BasicTransformerBlockSD1(nn.Module):
    """``BasicTransformerBlock`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x)."""

    def __init__(self, dim, n_heads, d_head, dropout=0., context_dim=None, gated_ff=True, checkpoint=True):
        super().__init__()
        self.attn1 = CrossAttentionSD1(query_dim=dim, heads=n_heads, dim_head=d_head, dropout=dropout)  # is a self-attention
        self.ff = FeedForward(dim, dropout=dropout, glu=gated_ff)
        self.attn2 = CrossAttentionSD1(query_dim=dim, context_dim=context_dim,
                                       heads=n_heads, dim_head=d_head, dropout=dropout)  # is self-attn if context is none
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.checkpoint = checkpoint

    def forward(self, x, context=None):
        return checkpoint(self._forward, (x, context), self.parameters(), self.checkpoint)

    def _forward(self, x, context=None):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context=context) + x
        x = self.ff(self.norm3(x)) + x
        return x


class SpatialTransformerSD1(nn.Module):
    """``SpatialTransformer`` of CompVis/latent-diffusion / stable-diffusion (SD 1.x): conv proj_in/out.

    Transformer block for image-like data. First, project the input (aka embedding)
    and reshape to b, t, d. Then apply standard transformer action. Finally, reshape to image.
    """

    def __init__(self, in_channels, n_heads, d_head, depth=1, dropout=0., context_dim=None):
        super().__init__()
        self.in_channels = in_channels
        inner_dim = n_heads * d_head
        self.norm = Normalize(in_channels)

        self.proj_in = nn.Conv2d(in_channels, inner_dim, kernel_size=1, stride=1, padding=0)

        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlockSD1(inner_dim, n_heads, d_head, dropout=dropout, context_dim=context_dim)
                for d in range(depth)]
        )

        self.proj_out = zero_module(nn.Conv2d(inner_dim, in_channels, kernel_size=1, stride=1, padding=0))

    def forward(self, x, context=None):
        # note: if no context is given, cross-attention defaults to self-attention
        b, c, h, w = x.shape
        x_in = x
        x = self.norm(x)
        x = self.proj_in(x)
        x = rearrange(x, 'b c h w -> b (h w) c')
        for block in self.transformer_blocks:
            x = block(x, context=context)
        x = rearrange(x, 'b (h w) c -> b c h w', h=h, w=w)
        x = self.proj_out(x)
        return x + x_in


# SD 2.x (Stability-AI/stablediffusion cf1d67a6fd5e). Without xformers installed (as here)
# BasicTransformerBlock picks attn_mode "softmax" = CrossAttention.


class CrossAttentionSD2(nn.Module):
    """``CrossAttention`` of Stability-AI/stablediffusion (SD 2.x): q, k upcast to float32."""

    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)

        self.scale = dim_head ** -0.5
        self.heads = heads

        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)

        self.to_out = nn.Sequential(
            nn.Linear(inner_dim, query_dim),
            nn.Dropout(dropout)
        )
        # parity hook (see the module docstring): the published forward tests the module global
        # `_ATTN_PRECISION == "fp32"`; float64_copy() sets this to False.
        self.upcast_attention = _ATTN_PRECISION == "fp32"

    def forward(self, x, context=None, mask=None):
        h = self.heads

        q = self.to_q(x)
        context = default(context, x)
        k = self.to_k(context)
        v = self.to_v(context)

        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> (b h) n d', h=h), (q, k, v))

        # force cast to fp32 to avoid overflowing
        if self.upcast_attention:  # published: if _ATTN_PRECISION == "fp32":
            with torch.autocast(enabled=False, device_type='cuda'):
                q, k = q.float(), k.float()
                sim = einsum('b i d, b j d -> b i j', q, k) * self.scale
        else:
            sim = einsum('b i d, b j d -> b i j', q, k) * self.scale

        del q, k

        if exists(mask):
            mask = rearrange(mask, 'b ... -> b (...)')
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = repeat(mask, 'b j -> (b h) () j', h=h)
            sim.masked_fill_(~mask, max_neg_value)

        # attention, what we cannot get enough of
        sim = sim.softmax(dim=-1)

        out = einsum('b i j, b j d -> b i d', sim, v)
        out = rearrange(out, '(b h) n d -> b n (h d)', h=h)
        return self.to_out(out)


class BasicTransformerBlockSD2(nn.Module):
    """``BasicTransformerBlock`` of Stability-AI/stablediffusion (SD 2.x), "softmax" attention mode."""

    ATTENTION_MODES = {
        "softmax": CrossAttentionSD2,  # vanilla attention
        # "softmax-xformers": MemoryEfficientCrossAttention (xformers; not re-stated)
    }

    def __init__(self, dim, n_heads, d_head, dropout=0., context_dim=None, gated_ff=True, checkpoint=True,
                 disable_self_attn=False):
        super().__init__()
        attn_mode = "softmax"
        assert attn_mode in self.ATTENTION_MODES
        attn_cls = self.ATTENTION_MODES[attn_mode]
        self.disable_self_attn = disable_self_attn
        self.attn1 = attn_cls(query_dim=dim, heads=n_heads, dim_head=d_head, dropout=dropout,
                              context_dim=context_dim if self.disable_self_attn else None)  # is a self-attention if not self.disable_self_attn
        self.ff = FeedForward(dim, dropout=dropout, glu=gated_ff)
        self.attn2 = attn_cls(query_dim=dim, context_dim=context_dim,
                              heads=n_heads, dim_head=d_head, dropout=dropout)  # is self-attn if context is none
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.checkpoint = checkpoint

    def forward(self, x, context=None):
        return checkpoint(self._forward, (x, context), self.parameters(), self.checkpoint)

    def _forward(self, x, context=None):
        x = self.attn1(self.norm1(x), context=context if self.disable_self_attn else None) + x
        x = self.attn2(self.norm2(x), context=context) + x
        x = self.ff(self.norm3(x)) + x
        return x


class SpatialTransformerSD2(nn.Module):
    """``SpatialTransformer`` of Stability-AI/stablediffusion (SD 2.x).

    Transformer block for image-like data. First, project the input (aka embedding)
    and reshape to b, t, d. Then apply standard transformer action. Finally, reshape to image.
    NEW: use_linear for more efficiency instead of the 1x1 convs
    """

    def __init__(self, in_channels, n_heads, d_head,
                 depth=1, dropout=0., context_dim=None,
                 disable_self_attn=False, use_linear=False,
                 use_checkpoint=True):
        super().__init__()
        if exists(context_dim) and not isinstance(context_dim, list):
            context_dim = [context_dim]
        self.in_channels = in_channels
        inner_dim = n_heads * d_head
        self.norm = Normalize(in_channels)
        if not use_linear:
            self.proj_in = nn.Conv2d(in_channels, inner_dim, kernel_size=1, stride=1, padding=0)
        else:
            self.proj_in = nn.Linear(in_channels, inner_dim)

        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlockSD2(inner_dim, n_heads, d_head, dropout=dropout, context_dim=context_dim[d],
                                      disable_self_attn=disable_self_attn, checkpoint=use_checkpoint)
                for d in range(depth)]
        )
        if not use_linear:
            self.proj_out = zero_module(nn.Conv2d(inner_dim, in_channels, kernel_size=1, stride=1, padding=0))
        else:
            self.proj_out = zero_module(nn.Linear(in_channels, inner_dim))
        self.use_linear = use_linear

    def forward(self, x, context=None):
        # note: if no context is given, cross-attention defaults to self-attention
        if not isinstance(context, list):
            context = [context]
        b, c, h, w = x.shape
        x_in = x
        x = self.norm(x)
        if not self.use_linear:
            x = self.proj_in(x)
        x = rearrange(x, 'b c h w -> b (h w) c').contiguous()
        if self.use_linear:
            x = self.proj_in(x)
        for i, block in enumerate(self.transformer_blocks):
            x = block(x, context=context[i])
        if self.use_linear:
            x = self.proj_out(x)
        x = rearrange(x, 'b (h w) c -> b c h w', h=h, w=w).contiguous()
        if not self.use_linear:
            x = self.proj_out(x)
        return x + x_in


# ldm/modules/diffusionmodules/model.py


def NormalizeModel(in_channels, num_groups=32):
    """``Normalize`` of ldm/modules/diffusionmodules/model.py (same as the one above)."""
    return torch.nn.GroupNorm(num_groups=num_groups, num_channels=in_channels, eps=1e-6, affine=True)


class AttnBlock(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.in_channels = in_channels

        self.norm = NormalizeModel(in_channels)
        self.q = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.k = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.v = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h_ = x
        h_ = self.norm(h_)
        q = self.q(h_)
        k = self.k(h_)
        v = self.v(h_)

        # compute attention
        b, c, h, w = q.shape
        q = q.reshape(b, c, h*w)
        q = q.permute(0, 2, 1)   # b,hw,c
        k = k.reshape(b, c, h*w)  # b,c,hw
        w_ = torch.bmm(q, k)     # b,hw,hw    w[b,i,j]=sum_c q[b,i,c]k[b,c,j]
        w_ = w_ * (int(c)**(-0.5))
        w_ = torch.nn.functional.softmax(w_, dim=2)

        # attend to values
        v = v.reshape(b, c, h*w)
        w_ = w_.permute(0, 2, 1)   # b,hw,hw (first hw of k, second of q)
        h_ = torch.bmm(v, w_)     # b, c,hw (hw of q) h_[b,c,j] = sum_i v[b,c,i] w_[b,i,j]
        h_ = h_.reshape(b, c, h, w)

        h_ = self.proj_out(h_)

        return x + h_
