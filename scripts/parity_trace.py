"""Stage traces for parity bundles, recorded with forward hooks (the reference classes are never
edited).

``trace_module(block, module, inputs, kwargs, output_names)`` runs ``module`` once with hooks on
its submodules and returns ``(outputs, stages)``: the outputs of that run (the caller asserts they
equal the untraced run's, bit for bit) and an ordered dict stage name -> tensor in forward order,
or ``None`` for a block (or processor) without a tracer. Stages that are not a submodule's input
or output (q/k/v after the head split, the attention weights) are computed here from hooked
tensors, with the block's own reshapes. The one exception is ``torch.nn.MultiheadAttention``,
which applies its projections functionally (no submodule runs): its q/k/v are re-computed with the
functional helpers its forward calls (``F._in_projection_packed`` / ``F._in_projection``).

Composite blocks (transformer blocks, resnets, mid blocks) nest the tracers of their submodules:
a nested stage is ``<submodule name>/<stage>`` (``attn1/q``, ``resnets.0/conv1``), and a nested
block's output is its stage ``<name>/output``.

Stage layouts (the same on the Rust side, ``unet_attention::trace``):

* ``norm``: the input norm's output, as the norm module returns it;
  ``spatial_norm``: diffusers ``spatial_norm`` output;
* ``q``, ``k``, ``v``: ``(B, heads, tokens, head_dim)`` after the head split, before any scale;
  ``k``/``v`` include memory key/values (lucidrains); after ``norm_q``/``norm_k`` (diffusers
  ``qk_norm``) where present;
* ``probs``: ``(B, heads, Lq, Lk)`` = ``softmax(q·kᵀ·scale)`` in float32 with the block's own
  scale; only without an attention mask and when it has at most ``PROBS_MAX_ELEMENTS`` elements;
* ``context``: linear attention's ``(B, heads, d_k, d_v)`` context ``softmax(k)·vᵀ``;
* ``attn``: the input of the output projection; ``proj``: its output (before any residual);
* ``proj_in`` / ``act``: a feed-forward's inner projection and its activated output
  (``(B, N, inner)``); ``proj_in`` / ``proj_out`` of a spatial transformer: its input and output
  projections;
* ``norm1``, ``norm2``, ``norm3``: the norms of a transformer block or resnet;
  ``conv1``, ``conv2``: a resnet's convolutions; ``temb``: its time-embedding projection
  ``(B, C)`` or ``(B, 2C)``; ``shortcut``: its shortcut branch (1×1 / 3×3 conv or identity);
* ``output``: the block's output; not stored twice at the top (it is
  ``parity.output.<first output>``).

**Module stages** (``trace_module(..., mode="modules")``, ``export_bundle(..., trace="modules")``,
and what ``export_bundle(..., trace=True)`` records for a block id without a tracer in ``TRACERS``):
any ``nn.Module`` traced without a tracer of its own. Every submodule that runs (each entry of
``module.named_modules()`` but the module itself) records its output, under a stage name made
from its qualified module path by these rules:

1. split the path on ``.`` into components (``attentions.0.transformer_blocks.0.attn1.to_q`` ->
   ``attentions``, ``0``, ``transformer_blocks``, ``0``, ``attn1``, ``to_q``);
2. a component of ASCII digits only (a ``ModuleList`` / ``Sequential`` index) stays joined to
   the component before it with ``.``; every other component starts a new level (so does a
   leading index, as in an ``nn.Sequential`` block: ``0.in_layers.2`` -> ``0/in_layers.2``);
3. the levels are joined with ``/``: ``resnets.0.norm1`` -> ``resnets.0/norm1``,
   ``attentions.0.transformer_blocks.0.attn1.to_q`` -> ``attentions.0/transformer_blocks.0/attn1/to_q``,
   ``attentions.0.transformer_blocks.0.attn1.to_out.0`` -> ``attentions.0/transformer_blocks.0/attn1/to_out.0``,
   ``blocks.1.0`` -> ``blocks.1.0``;
4. the k-th call of the same submodule (k >= 2) is ``<name>#k``: the first call is the plain name
   (a ResnetBlock2D's one ``nonlinearity`` runs three times: ``resnets.0/nonlinearity``,
   ``resnets.0/nonlinearity#2``, ``resnets.0/nonlinearity#3``). Calls are counted whether or not
   they record a stage (rule 5), and per module object: a module registered under two paths
   (shared) has the first path ``named_modules()`` gives and one count;
5. a call records a stage only when it returns a floating-point tensor, or a tuple / list /
   ``BaseOutput`` (diffusers' ``*Output``) / dict whose first tensor entry is one (that entry);
   other outputs (``None``, integers, nested structures) record nothing;
6. stages are in the order the calls *return* (forward order of completion: a submodule's own
   stage comes after the stages of the submodules it called, as ``<name>/output`` does above);
   the top module's output is the stage ``output``, last, stored as ``parity.output.<first
   output>`` as for any bundle.

A submodule whose stage name would be ``output`` is an error. The bundle records the mode as
metadata ``parity.trace_mode`` = ``"modules"`` (absent: the named tracers), and checks re-record
its stages the same way. Module stages are the modules' own outputs, unreshaped (no ``q``/``k``/
``v`` head split, no ``probs``): a port records, at the end of its forward of the submodule with
that path, the tensor that submodule returns, under the name these rules give.

Bundles store stage ``s`` as ``parity.trace.<s>`` and the metadata ``parity.trace`` = JSON list of
the stage names in forward order (``output`` last). Every bundle also stores the float64 run's
stages (the stages of the float64 copy of the module on the same inputs), so that an intermediate
stage is judged like an output: against PyTorch's own error. Half-precision bundles store them as
``parity.trace.<s>.float64``; float32 bundles as ``parity.trace.<s>.float64_delta``, the bfloat16
rounding of ``float64 stage - float32 stage`` (``float64_delta``): the float64 stage is the stored
stage plus the delta, exact to 2^-9 of PyTorch's own error at each element, at a quarter of the
bytes of a float64 copy.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import OrderedDict

import torch

PROBS_MAX_ELEMENTS = 1 << 16
# Key suffix of a float32 bundle's float64 stages, stored as deltas (``float64_delta``).
DELTA_SUFFIX = ".float64_delta"


def float64_delta(stage, stage64):
    """``stage64 - stage`` (float64 minus float32) rounded to bfloat16: what a float32 bundle stores for
    its float64 stage (0 where the two are the same value, infinities included)."""
    s = stage.double()
    return torch.where(stage64 == s, torch.zeros_like(s), stage64 - s).to(torch.bfloat16).contiguous()
# Stage names (the last path component, without a trailing digit); a tracer may not invent others.
STAGES = {"spatial_norm", "norm", "q", "k", "v", "probs", "context", "attn", "proj", "proj_in", "act",
          "proj_out", "conv", "temb", "shortcut", "output"}


class _Hooks:
    """Forward hooks of one traced run; ``sub(name)`` gives the view a nested tracer registers
    through (its names prefixed ``name/``)."""

    def __init__(self, handles=None, got=None, prefix=""):
        self.handles = [] if handles is None else handles
        self.got = {} if got is None else got
        self.prefix = prefix

    def sub(self, name):
        return _Hooks(self.handles, self.got, f"{self.prefix}{name}/")

    def out(self, mod, name):
        if mod is not None:
            key = self.prefix + name
            self.handles.append(mod.register_forward_hook(lambda m, a, o: self.got.setdefault(key, o)))

    def inp(self, mod, name):
        if mod is not None:
            key = self.prefix + name
            self.handles.append(mod.register_forward_pre_hook(lambda m, a: self.got.setdefault(key, a)))

    def call(self, mod, name):
        """The positional and keyword arguments ``mod`` is called with: ``(args, kwargs)``."""
        key = self.prefix + name
        self.handles.append(mod.register_forward_pre_hook(
            lambda m, a, kw: self.got.setdefault(key, (a, kw)) and None, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()


def _view(got, prefix):
    """The entries a nested tracer registered under ``prefix/``, without the prefix."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in got.items() if k.startswith(prefix + "/")}


def _nest(h, name, mod, make):
    """Trace submodule ``mod`` (attribute path ``name``) with tracer ``make``: returns a finish
    function giving its stages as ``name/<stage>``, ending with ``name/output``."""
    if mod is None:
        return lambda got: OrderedDict()
    sub = h.sub(name)
    sub.out(mod, "output")
    inner = make(mod, sub) if make is not None else None

    def finish(got):
        mine = _view(got, name)
        st = OrderedDict()
        if inner is not None:
            st.update(inner(mine))
        out = mine["output"]
        # Transformer2DModel(return_dict=False) returns a 1-tuple, otherwise an output dataclass
        out = out[0] if isinstance(out, tuple) else getattr(out, "sample", out)
        st["output"] = out
        return OrderedDict((f"{name}/{k}", v) for k, v in st.items())

    return finish


def _arg(h_got, key, name, pos):
    """Argument ``name`` (or positional ``pos``) of a call recorded with ``_Hooks.call``."""
    args, kwargs = h_got[key]
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else None


def _probs(q, k, scale_q=1.0, scale_k=1.0, scale=1.0):
    """softmax over keys of (q·scale_q)(k·scale_k)ᵀ·scale, float32 (q, k: (B, H, N, D))."""
    if q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] > PROBS_MAX_ELEMENTS:
        return None
    q, k = q.float(), k.float()
    if scale_q != 1.0:
        q = q * scale_q
    if scale_k != 1.0:
        k = k * scale_k
    w = q @ k.transpose(-1, -2)
    if scale != 1.0:
        w = w * scale
    return torch.softmax(w, dim=-1)


def _out_proj(h, mod):
    """Hook a block's output projection: its input is the stage ``attn``, its output ``proj``."""
    h.inp(mod, "_attn")
    h.out(mod, "proj")


def _stages(got, q, k, v, first=(), probs=True, extra=(), **scales):
    """The stage dict in order: `first` (norms), q, k, v, probs (unless `probs` is False or it is
    too large), `extra` (linear attention's context), attn and proj (from ``_out_proj``, when the
    block has an output projection)."""
    st = OrderedDict(first)
    st["q"], st["k"], st["v"] = q, k, v
    p = _probs(q, k, **scales) if probs else None
    if p is not None:
        st["probs"] = p
    st.update(extra)
    if "_attn" in got:
        st["attn"] = got["_attn"][0]
        st["proj"] = got["proj"]
    return st


def _diffusers(m, h):
    proc = type(m.processor).__name__
    added_kv = proc in ("AttnAddedKVProcessor2_0", "AttnAddedKVProcessor")
    if proc not in ("AttnProcessor2_0", "AttnProcessor") and not added_kv:
        return None
    h.call(m, "_call")
    h.out(getattr(m, "spatial_norm", None), "spatial_norm")
    h.out(m.group_norm, "norm")
    h.out(m.to_q, "_q")
    h.out(m.to_k, "_k")
    h.out(m.to_v, "_v")
    if added_kv:
        h.out(m.add_k_proj, "_ak")
        h.out(m.add_v_proj, "_av")
    h.out(getattr(m, "norm_q", None), "_qn")
    h.out(getattr(m, "norm_k", None), "_kn")
    _out_proj(h, m.to_out[0])

    def finish(got):
        heads = m.heads

        def split(t):
            b = t.shape[0]
            return t.reshape(b, -1, heads, t.shape[-1] // heads).transpose(1, 2)

        norms = [(name, got[name]) for name in ("spatial_norm", "norm") if name in got]
        q = split(got["_q"])
        if added_kv:
            # AttnAddedKVProcessor(2_0): key = cat([add_k_proj(encoder), to_k(hidden)], tokens)
            k, v = split(got["_ak"]), split(got["_av"])
            if "_k" in got:
                k, v = torch.cat([k, split(got["_k"])], 2), torch.cat([v, split(got["_v"])], 2)
            # F.scaled_dot_product_attention with its default scale (attn.scale is ignored there)
            scale = q.shape[-1] ** -0.5 if proc == "AttnAddedKVProcessor2_0" else m.scale
        else:
            k, v = split(got["_k"]), split(got["_v"])
            scale = m.scale
        # AttnProcessor2_0 applies norm_q/norm_k to the split (B, heads, N, D) tensors.
        if "_qn" in got and got["_qn"].dim() == 4:
            q = got["_qn"]
        if "_kn" in got and got["_kn"].dim() == 4:
            k = got["_kn"]
        unmasked = _arg(got, "_call", "attention_mask", 2) is None
        return _stages(got, q, k, v, norms, probs=unmasked, scale=scale)

    return finish


def _ddpm(m, h):
    h.out(m.norm, "norm")
    h.inp(m.attend, "_qkv")
    _out_proj(h, m.to_out)

    def finish(got):
        q, k, v = got["_qkv"][:3]
        scale = m.attend.scale if m.attend.scale is not None else q.shape[-1] ** -0.5
        return _stages(got, q, k, v, [("norm", got["norm"])], scale=scale)

    return finish


def _linear(m, h):
    """Linear attention (lucidrains and Annotated Diffusion ``LinearAttention``, ldm
    ``LinearAttention`` / ``LinAttnBlock``): q, k, v before their softmaxes (memory key/values
    included), the context, the output projection."""
    h.out(getattr(m, "norm", None), "norm")
    h.out(m.to_qkv, "_qkv")
    _out_proj(h, m.to_out)

    def finish(got):
        qkv = got["_qkv"]
        b, _, hh, ww = qkv.shape
        # 'b (h c) x y -> b h c (x y)' of chunk(3) = ldm's 'b (qkv heads c) h w -> qkv b heads c (h w)'
        q, k, v = (t.reshape(b, m.heads, -1, hh * ww) for t in qkv.chunk(3, dim=1))
        mem = getattr(m, "mem_kv", None)
        if mem is not None:
            # lucidrains: repeat(mem_kv, 'h c n -> b h c n'), cat on the token axis
            mk, mv = (t.unsqueeze(0).expand(b, *t.shape) for t in mem)
            k, v = torch.cat((mk, k), dim=-1), torch.cat((mv, v), dim=-1)
        norms = [("norm", got["norm"])] if "norm" in got else []
        # context = einsum('b h d n, b h e n -> b h d e', k.softmax(dim=-1), v)
        context = torch.einsum("bhdn,bhen->bhde", k.softmax(dim=-1), v)
        return _stages(got, *(t.transpose(2, 3) for t in (q, k, v)), norms, probs=False,
                       extra=[("context", context)])

    return finish


def _ldm_attn_block(m, h):
    h.out(m.norm, "norm")
    for n in ("q", "k", "v"):
        h.out(getattr(m, n), "_" + n)
    _out_proj(h, m.proj_out)

    def finish(got):
        b, c, hh, ww = got["_q"].shape
        # 'b c h w -> b 1 (h w) c': one head of c channels
        tok = lambda t: t.reshape(b, c, hh * ww).transpose(1, 2).unsqueeze(1)
        q, k, v = tok(got["_q"]), tok(got["_k"]), tok(got["_v"])
        return _stages(got, q, k, v, [("norm", got["norm"])], scale=int(c) ** (-0.5))

    return finish


def _openai(m, h):
    h.out(m.norm, "norm")
    h.inp(m.attention, "_qkv")
    _out_proj(h, m.proj_out)

    def finish(got):
        qkv = got["_qkv"][0]
        bs, width, length = qkv.shape
        heads = m.attention.n_heads
        ch = width // (3 * heads)
        if type(m.attention).__name__ == "QKVAttentionLegacy":
            # qkv.reshape(bs * n_heads, ch * 3, length).split(ch, dim=1)
            parts = qkv.reshape(bs * heads, ch * 3, length).split(ch, dim=1)
        else:
            # q, k, v = qkv.chunk(3, dim=1); each .view(bs * n_heads, ch, length)
            parts = [t.reshape(bs * heads, ch, length) for t in qkv.chunk(3, dim=1)]
        q, k, v = (t.reshape(bs, heads, ch, length).transpose(2, 3) for t in parts)
        s = 1 / math.sqrt(math.sqrt(ch))
        return _stages(got, q, k, v, [("norm", got["norm"])], scale_q=s, scale_k=s)

    return finish


def _annotated(m, h):
    h.out(m.to_qkv, "_qkv")
    _out_proj(h, m.to_out)

    def finish(got):
        qkv = got["_qkv"]
        b, _, hh, ww = qkv.shape
        # 'b (h c) x y -> b h c (x y)', then (B, H, N, D); q before `q * self.scale`
        q, k, v = (t.reshape(b, m.heads, -1, hh * ww).transpose(2, 3) for t in qkv.chunk(3, dim=1))
        return _stages(got, q, k, v, scale_q=m.scale)

    return finish


def _ldm_cross(m, h):
    h.call(m, "_call")
    h.out(m.to_q, "_q")
    h.out(m.to_k, "_k")
    h.out(m.to_v, "_v")
    _out_proj(h, m.to_out[0])

    def finish(got):
        # rearrange(t, 'b n (h d) -> (b h) n d') = (B, H, N, D) with the batch and head axes merged
        split = lambda t: t.reshape(t.shape[0], t.shape[1], m.heads, -1).transpose(1, 2)
        q, k, v = split(got["_q"]), split(got["_k"]), split(got["_v"])
        unmasked = _arg(got, "_call", "mask", 2) is None
        return _stages(got, q, k, v, probs=unmasked, scale=m.scale)

    return finish


def _fastai(m, h):
    """fast.ai ``SelfAttention`` (separate q/k/v or fused qkv) and ``SelfAttentionMultiHead``:
    scores divided by ``m.scale``."""
    h.out(m.norm, "norm")
    if hasattr(m, "qkv"):
        h.out(m.qkv, "_qkv")
    else:
        for n in ("q", "k", "v"):
            h.out(getattr(m, n), "_" + n)
    _out_proj(h, m.proj)

    def finish(got):
        heads = getattr(m, "nheads", 1)
        if "_qkv" in got:
            x = got["_qkv"]  # (n, s, 3·ni)
            n, s, _ = x.shape
            if heads > 1:
                # rearrange 'n s (h d) -> (n h) s d', then chunk(3, dim=-1): per-head [q_h|k_h|v_h]
                q, k, v = x.reshape(n, s, heads, -1).transpose(1, 2).chunk(3, dim=-1)
            else:
                q, k, v = (t.unsqueeze(1) for t in x.chunk(3, dim=-1))
        else:
            q, k, v = (got[n].unsqueeze(1) for n in ("_q", "_k", "_v"))
        return _stages(got, q, k, v, [("norm", got["norm"])], scale=1.0 / m.scale)

    return finish


def _textbook(m, h):
    """textbook ``Self_Attention`` (no output projection: its ``attn`` is the output) and
    ``MultiHead_Attention``: heads ``'b nq (nh dh) -> b nh nq dh'``, scores divided by ``m.scale``."""
    for n in ("q", "k", "v"):
        h.out(getattr(m, n), "_" + n)
    fc = getattr(m, "fc", None)
    _out_proj(h, fc)

    def finish(got):
        heads = getattr(m, "nh", 1)
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)
        q, k, v = (split(got[n]) for n in ("_q", "_k", "_v"))
        return _stages(got, q, k, v, scale=1.0 / m.scale)

    return finish


def _torch_mha(m, h):
    """torch.nn.MultiheadAttention: q/k/v re-computed with the functional in-projection helpers
    its forward calls (it applies its weights functionally, so no hook sees them), bias_k/bias_v
    and add_zero_attn appended as ``F.multi_head_attention_forward`` does; ``probs`` only without
    any mask."""
    import torch.nn.functional as F

    h.call(m, "_call")

    def finish(got):
        arg = lambda name, pos: _arg(got, "_call", name, pos)
        query = arg("query", 0)
        key = arg("key", 1)
        value = arg("value", 2)
        key = query if key is None else key
        value = key if value is None else value
        batched = query.dim() == 3
        # to (L, N, E), as the functional forward sees them
        lne = lambda t: (t.transpose(0, 1) if m.batch_first else t) if batched else t.unsqueeze(1)
        qi, ki, vi = lne(query), lne(key), lne(value)
        if m._qkv_same_embed_dim:
            q, k, v = F._in_projection_packed(qi, ki, vi, m.in_proj_weight, m.in_proj_bias)
        else:
            b = (None,) * 3 if m.in_proj_bias is None else m.in_proj_bias.chunk(3)
            q, k, v = F._in_projection(qi, ki, vi, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight, *b)
        n = qi.shape[1]
        if m.bias_k is not None:
            k = torch.cat([k, m.bias_k.repeat(1, n, 1)])
            v = torch.cat([v, m.bias_v.repeat(1, n, 1)])
        heads, d = m.num_heads, m.head_dim
        split = lambda t: t.reshape(t.shape[0], n, heads, d).permute(1, 2, 0, 3)  # (N, H, S, d)
        q, k, v = split(q), split(k), split(v)
        if m.add_zero_attn:
            z = torch.zeros(n, heads, 1, d, dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, z], 2), torch.cat([v, z], 2)
        unmasked = arg("attn_mask", 4) is None and arg("key_padding_mask", 3) is None
        return _stages(got, q, k, v, probs=unmasked, scale=d ** -0.5)

    return finish


# --- feed-forwards, transformer blocks --------------------------------------------------------


def _diffusers_geglu(m, h):
    h.out(m.proj, "proj_in")
    return lambda got: OrderedDict(proj_in=got["proj_in"])


def _feed_forward(m, h):
    """diffusers / ldm FeedForward: ``net = [act (its own Linear inside), Dropout, Linear, ...]``;
    ldm's non-GLU ``act`` is ``Sequential(Linear, GELU)``."""
    act = m.net[0]
    h.out(act.proj if hasattr(act, "proj") else act[0], "proj_in")
    h.out(act, "act")
    h.out(m.net[2], "proj")
    return lambda got: OrderedDict((k, got[k]) for k in ("proj_in", "act", "proj"))


def _transformer_block(attn):
    """diffusers (norm_type "layer_norm") / ldm BasicTransformerBlock: norm1, attn1, norm2, attn2,
    norm3, ff."""

    def make(m, h):
        h.out(m.norm1, "norm1")
        a1 = _nest(h, "attn1", m.attn1, attn)
        h.out(getattr(m, "norm2", None), "norm2")
        a2 = _nest(h, "attn2", getattr(m, "attn2", None), attn)
        h.out(m.norm3, "norm3")
        ff = _nest(h, "ff", m.ff, _feed_forward)

        def finish(got):
            st = OrderedDict(norm1=got["norm1"])
            st.update(a1(got))
            if "norm2" in got:
                st["norm2"] = got["norm2"]
            st.update(a2(got))
            st["norm3"] = got["norm3"]
            st.update(ff(got))
            return st

        return finish

    return make


def _spatial_transformer(block):
    """diffusers Transformer2DModel (continuous input) / ldm SpatialTransformer: norm, proj_in,
    transformer_blocks.<i>, proj_out."""

    def make(m, h):
        h.out(m.norm, "norm")
        h.out(m.proj_in, "proj_in")
        blocks = [_nest(h, f"transformer_blocks.{i}", b, block) for i, b in enumerate(m.transformer_blocks)]
        h.out(m.proj_out, "proj_out")

        def finish(got):
            st = OrderedDict(norm=got["norm"], proj_in=got["proj_in"])
            for f in blocks:
                st.update(f(got))
            st["proj_out"] = got["proj_out"]
            return st

        return finish

    return make


# --- resnets and mid blocks -------------------------------------------------------------------


def _resnet(**paths):
    """A resnet's stages from its submodules: stage name -> attribute path, in forward order (a
    missing submodule is skipped)."""

    def get(m, path):
        for part in path.split("."):
            if m is None:
                return None
            m = m[int(part)] if part.isdigit() else getattr(m, part, None)
        return m

    def make(m, h):
        for name, path in paths.items():
            h.out(get(m, path), name)
        return lambda got: OrderedDict((n, got[n]) for n in paths if n in got)

    return make


_diffusers_resnet = _resnet(norm1="norm1", conv1="conv1", temb="time_emb_proj", norm2="norm2", conv2="conv2",
                            shortcut="conv_shortcut")
# lucidrains: time_emb = mlp(time_emb) first; Block = (proj, norm, FiLM, act)
_ddpm_resnet = _resnet(temb="mlp", conv1="block1.proj", norm1="block1.norm", conv2="block2.proj",
                       norm2="block2.norm", shortcut="res_conv")
_ldm_resnet = _resnet(norm1="norm1", conv1="conv1", temb="temb_proj", norm2="norm2", conv2="conv2",
                      shortcut="nin_shortcut")
# guided diffusion ResBlock: in_layers = (norm, SiLU, conv), out_layers = (norm, SiLU, Dropout, conv)
_openai_resnet = _resnet(norm1="in_layers.0", conv1="in_layers.2", temb="emb_layers", norm2="out_layers.0",
                         conv2="out_layers.3", shortcut="skip_connection")


# diffusers TemporalConvLayer: convN = (GroupNorm, SiLU, [Dropout], Conv3d); stages (B, C, F, H, W)
_temporal_conv = _resnet(norm1="conv1.0", conv1="conv1.2", norm2="conv2.0", conv2="conv2.3", norm3="conv3.0",
                         conv3="conv3.3", norm4="conv4.0", conv4="conv4.3")


def _ldm_shortcut_fix(make):
    """ldm ResnetBlock's shortcut is ``conv_shortcut`` (3×3) or ``nin_shortcut`` (1×1)."""

    def wrapped(m, h):
        if getattr(m, "conv_shortcut", None) is not None and getattr(m, "nin_shortcut", None) is None:
            h.out(m.conv_shortcut, "shortcut")
        return make(m, h)

    return wrapped


def _sequence(children, ran_only=False):
    """A block that runs named submodules in order: each child's stages nested under its name.
    ``children(m)`` lists ``(name, submodule, tracer)``; a ``None`` tracer nests only ``output``.
    ``ran_only``: a child whose output was not recorded (a branch the forward's arguments skipped)
    has no stages (otherwise every child must run)."""

    def make(m, h):
        parts = [(name, _nest(h, name, sub, tracer)) for name, sub, tracer in children(m)]

        def finish(got):
            st = OrderedDict()
            for name, f in parts:
                if not ran_only or f"{name}/output" in got:
                    st.update(f(got))
            return st

        return finish

    return make


def _by_class(m):
    """The tracer for a submodule of a mid block, by class."""
    name = type(m).__name__
    mod = type(m).__module__
    if name == "Attention" and mod.startswith("diffusers"):
        return _diffusers
    if name == "Attention" and mod.startswith("denoising_diffusion_pytorch"):
        return _ddpm
    if name.startswith("DualTransformer2DModel"):
        return TRACERS["diffusers.DualTransformer2DModel"]
    if name.startswith("Transformer2DModel"):
        return TRACERS["diffusers.Transformer2DModel"]
    if name in ("TransformerTemporalModel", "AnimateDiffTransformer3D"):
        return TRACERS["diffusers.TransformerTemporalModel"]
    if name == "TemporalConvLayer":
        return _temporal_conv
    if name == "SpatioTemporalResBlock":
        return _sequence(_spatio_temporal_res)
    if name == "TransformerSpatioTemporalModel":
        return TRACERS["diffusers.TransformerSpatioTemporalModel"]
    if name.startswith("SpatialTransformer"):
        return TRACERS["ldm.SpatialTransformer"]
    if name == "AttnBlock":
        return _ldm_attn_block
    if name in ("LinAttnBlock", "LinearAttention"):
        return _linear
    if name == "AttentionBlock":
        return _openai
    if name in ("ResnetBlock2D", "ResnetBlockCondNorm2D"):
        # ResnetBlockCondNorm2D ("spatial"): norm1/norm2 are SpatialNorms, no time_emb_proj
        return _diffusers_resnet
    if name == "ResBlock":
        return _openai_resnet
    if name == "ResnetBlock" and mod.startswith("denoising_diffusion_pytorch"):
        return _ddpm_resnet
    if name == "ResnetBlock":
        return _ldm_shortcut_fix(_ldm_resnet)
    if name == "Identity":
        return None
    raise KeyError(f"no stage tracer for a mid-block submodule of class {mod}.{name}")


def _attention_1d(m, h):
    """diffusers ``SelfAttention1d``: GroupNorm(1), query/key/value Linears on the transposed
    view, ``transpose_for_scores`` heads, ``d ** -0.25`` on q and on k, ``proj_attn``."""
    h.out(m.group_norm, "norm")
    for n in ("query", "key", "value"):
        h.out(getattr(m, n), "_" + n[0])
    _out_proj(h, m.proj_attn)

    def finish(got):
        q, k, v = (m.transpose_for_scores(got[n]) for n in ("_q", "_k", "_v"))
        s = 1 / math.sqrt(math.sqrt(k.shape[-1]))
        return _stages(got, q, k, v, [("norm", got["norm"])], scale_q=s, scale_k=s)

    return finish


# diffusers ResConvBlock (1-D): conv_1, group_norm_1, GELU, conv_2, group_norm_2, GELU, + conv_skip
_res_conv_1d = _resnet(conv1="conv_1", norm1="group_norm_1", conv2="conv_2", norm2="group_norm_2",
                       shortcut="conv_skip")


def _temporal_resnet_1d(m, h):
    """diffusers ResidualTemporalBlock1D: time_emb(mish(t)), Conv1dBlocks (conv, GroupNorm on the
    (B, C, 1, L) view, Mish), residual_conv when the channels change."""
    paths = dict(temb="time_emb", conv1="conv_in.conv1d", norm1="conv_in.group_norm", conv2="conv_out.conv1d",
                 norm2="conv_out.group_norm")
    if not isinstance(m.residual_conv, torch.nn.Identity):
        paths["shortcut"] = "residual_conv"
    return _resnet(**paths)(m, h)


def _diffusers_mid_1d_temporal(m):
    if hasattr(m, "res1"):  # ValueFunctionMidBlock1D
        return [("res1", m.res1, _temporal_resnet_1d), ("down1", m.down1, None), ("res2", m.res2, _temporal_resnet_1d),
                ("down2", m.down2, None)]
    out = [(f"resnets.{i}", r, _temporal_resnet_1d) for i, r in enumerate(m.resnets)]
    if m.upsample is not None:
        out.append(("upsample", m.upsample, None))
    if m.downsample is not None:
        out.append(("downsample", m.downsample, None))
    return out


def _diffusers_mid_1d(m):
    # forward: down, then (resnet, attention) pairs, then up
    out = [("down", m.down, None)]
    for i, (r, a) in enumerate(zip(m.resnets, m.attentions)):
        out += [(f"resnets.{i}", r, _res_conv_1d), (f"attentions.{i}", a, _attention_1d)]
    return out + [("up", m.up, None)]


def _children(names):
    return lambda m: [(n, getattr(m, n), _by_class(getattr(m, n))) for n in names]


def _diffusers_mid(m):
    # forward: resnets[0], then (attention, resnet) pairs
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, (a, r) in enumerate(zip(m.attentions, m.resnets[1:])):
        if a is not None:
            out.append((f"attentions.{i}", a, _by_class(a)))
        out.append((f"resnets.{i + 1}", r, _by_class(r)))
    return out


def _dual_transformers(m):
    # forward: transformers[transformer_index_for_condition[i]] for condition 0, then 1
    order = list(m.transformer_index_for_condition)
    if len(set(order)) != len(order):
        raise KeyError("DualTransformer2DModel with one transformer for both conditions: stages would repeat")
    return [(f"transformers.{i}", m.transformers[i], TRACERS["diffusers.Transformer2DModel"]) for i in order]


def _diffusers_mid_3d(m):
    # UNetMidBlock3DCrossAttn: resnets[0], temp_convs[0], then (attention, temporal attention, resnet,
    # temporal conv) per layer
    out = [(f"{n}.0", getattr(m, n)[0], _by_class(getattr(m, n)[0])) for n in ("resnets", "temp_convs")]
    for i, mods in enumerate(zip(m.attentions, m.temp_attentions, m.resnets[1:], m.temp_convs[1:])):
        names = (f"attentions.{i}", f"temp_attentions.{i}", f"resnets.{i + 1}", f"temp_convs.{i + 1}")
        out += [(n, sub, _by_class(sub)) for n, sub in zip(names, mods)]
    return out


def _diffusers_mid_motion(m):
    # UNetMidBlockCrossAttnMotion: resnets[0], then (attention, motion module, resnet) per layer
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, mods in enumerate(zip(m.attentions, m.motion_modules, m.resnets[1:])):
        names = (f"attentions.{i}", f"motion_modules.{i}", f"resnets.{i + 1}")
        out += [(n, sub, _by_class(sub)) for n, sub in zip(names, mods)]
    return out


_diffusers_btb = _transformer_block(_diffusers)
_ldm_btb = _transformer_block(_ldm_cross)

# Stable Video Diffusion. TemporalResnetBlock: stages (B, C, F, H, W), temb (B, F, C)
_temporal_resnet = _resnet(norm1="norm1", conv1="conv1", temb="time_emb_proj", norm2="norm2", conv2="conv2")


def _spatio_temporal_res(m):
    # SpatioTemporalResBlock: spatial_res_block (B*F, C, H, W), temporal_res_block and time_mixer (B, C, F, H, W)
    return [("spatial_res_block", m.spatial_res_block, _diffusers_resnet),
            ("temporal_res_block", m.temporal_res_block, _temporal_resnet), ("time_mixer", m.time_mixer, None)]


def _temporal_btb(m, h):
    """TemporalBasicTransformerBlock: ff_in, then a BasicTransformerBlock's stages on (B*H*W, F, C) tokens (its
    output is (B*F, H*W, C), as the block returns it)."""
    ff_in = _nest(h, "ff_in", m.ff_in, _feed_forward)
    inner = _diffusers_btb(m, h)

    def finish(got):
        st = ff_in(got)
        st.update(inner(got))
        return st

    return finish


def _spatio_temporal_transformer(m, h):
    """TransformerSpatioTemporalModel: norm, proj_in, time_pos_embed, then per layer transformer_blocks.<i> and
    temporal_transformer_blocks.<i>, proj_out (time_mixer runs once per layer: not a stage)."""
    h.out(m.norm, "norm")
    h.out(m.proj_in, "proj_in")
    emb = _nest(h, "time_pos_embed", m.time_pos_embed, None)
    parts = []
    for i, (b, t) in enumerate(zip(m.transformer_blocks, m.temporal_transformer_blocks)):
        parts.append(_nest(h, f"transformer_blocks.{i}", b, _diffusers_btb))
        parts.append(_nest(h, f"temporal_transformer_blocks.{i}", t, _temporal_btb))
    h.out(m.proj_out, "proj_out")

    def finish(got):
        st = OrderedDict(norm=got["norm"], proj_in=got["proj_in"])
        st.update(emb(got))
        for f in parts:
            st.update(f(got))
        st["proj_out"] = got["proj_out"]
        return st

    return finish


def _temporal_decoder_mid(m):
    # MidBlockTemporalDecoder: resnets[0], then zip(resnets[1:], attentions): attention, resnet
    out = [("resnets.0", m.resnets[0], _by_class(m.resnets[0]))]
    for i, (r, a) in enumerate(zip(m.resnets[1:], m.attentions)):
        out += [(f"attentions.{i}", a, _by_class(a)), (f"resnets.{i + 1}", r, _by_class(r))]
    return out


TRACERS = {
    "diffusers.Attention": _diffusers,
    "diffusers.FeedForward": _feed_forward,
    "diffusers.GEGLU": _diffusers_geglu,
    "diffusers.BasicTransformerBlock": _diffusers_btb,
    "diffusers.Transformer2DModel": _spatial_transformer(_diffusers_btb),
    # Versatile Diffusion: each transformer's stages under transformers.<i>/, in the order they run
    "diffusers.DualTransformer2DModel": _sequence(_dual_transformers),
    "diffusers.ResnetBlock2D": _diffusers_resnet,
    "diffusers.UNetMidBlock2D": _sequence(_diffusers_mid),
    "diffusers.UNetMidBlock1D": _sequence(_diffusers_mid_1d),
    "diffusers.MidResTemporalBlock1D": _sequence(_diffusers_mid_1d_temporal),
    "diffusers.ValueFunctionMidBlock1D": _sequence(_diffusers_mid_1d_temporal),
    "diffusers.UNetMidBlock2DCrossAttn": _sequence(_diffusers_mid),
    "diffusers.UNetMidBlock2DSimpleCrossAttn": _sequence(_diffusers_mid),
    # TransformerTemporalModel: norm (B, C, F, H, W), proj_in / blocks / proj_out on (B*H*W, F, inner) tokens
    "diffusers.TransformerTemporalModel": _spatial_transformer(_diffusers_btb),
    "diffusers.TemporalConvLayer": _temporal_conv,
    "diffusers.UNetMidBlock3DCrossAttn": _sequence(_diffusers_mid_3d),
    "diffusers.TransformerSpatioTemporalModel": _spatio_temporal_transformer,
    "diffusers.SpatioTemporalResBlock": _sequence(_spatio_temporal_res),
    "diffusers.UNetMidBlockSpatioTemporal": _sequence(_diffusers_mid),
    "diffusers.MidBlockTemporalDecoder": _sequence(_temporal_decoder_mid),
    # AnimateDiff: the motion modules (AnimateDiffTransformer3D) trace as TransformerTemporalModel
    "diffusers.UNetMidBlockCrossAttnMotion": _sequence(_diffusers_mid_motion),
    # ControlNetModel: the mid block's stages under mid_block/, the zero conv's output (before
    # conditioning_scale and the pooling) as controlnet_mid_block/output
    "diffusers.ControlNetMidBlock": _sequence(lambda m: [("mid_block", m.mid_block, _sequence(_diffusers_mid)),
                                                         ("controlnet_mid_block", m.controlnet_mid_block, None)]),
    # UNetControlNetXSModel: the zero convs' outputs and both mid blocks' stages, in forward order; with
    # apply_control=False only base_midblock runs (the parts that did not run are left out)
    "diffusers.ControlNetXSCrossAttnMidBlock2D": _sequence(lambda m: [
        ("base_to_ctrl", m.base_to_ctrl, None), ("base_midblock", m.base_midblock, _sequence(_diffusers_mid)),
        ("ctrl_midblock", m.ctrl_midblock, _sequence(_diffusers_mid)), ("ctrl_to_base", m.ctrl_to_base, None)],
        ran_only=True),
    "denoising_diffusion_pytorch.Attention": _ddpm,
    "denoising_diffusion_pytorch.LinearAttention": _linear,
    "denoising_diffusion_pytorch.MidBlock": _sequence(_children(("mid_block1", "mid_attn", "mid_block2"))),
    "annotated_diffusion.Attention": _annotated,
    "annotated_diffusion.LinearAttention": _linear,
    "ldm.LinearAttention": _linear,
    "ldm.LinAttnBlock": _linear,
    "ldm.CrossAttention": _ldm_cross,
    "ldm.BasicTransformerBlock": _ldm_btb,
    "ldm.SpatialTransformer": _spatial_transformer(_ldm_btb),
    "ldm.AttnBlock": _ldm_attn_block,
    "ldm.SpatialSelfAttention": _ldm_attn_block,
    "ldm.MidBlock": _sequence(_children(("block_1", "attn_1", "block_2"))),
    "openai.AttentionBlock": _openai,
    "openai.MiddleBlock": _sequence(lambda m: [(str(i), c, _by_class(c)) for i, c in enumerate(m)]),
    "fastai.SelfAttention": _fastai,
    "fastai.SelfAttentionMultiHead": _fastai,
    "torch.nn.MultiheadAttention": _torch_mha,
    "textbook.SelfAttention": _textbook,
    "textbook.MultiHeadAttention": _textbook,
}


def _base(name):
    return name.rsplit("/", 1)[-1].rstrip("0123456789")


# Trace modes: the named tracers of ``TRACERS`` ("named"), or every submodule's output under its
# module path ("modules").
NAMED, MODULES = "named", "modules"
# Metadata key of a bundle's trace mode (written for "modules" only; absent means "named").
TRACE_MODE_KEY = "parity.trace_mode"


def module_stage_name(path: str) -> str:
    """The stage name of the submodule at qualified path ``path`` (module docstring, rules 1-3):
    ``resnets.0.norm1`` -> ``resnets.0/norm1``."""
    if not path:
        raise ValueError("the top module has no stage name of its own (its output is the stage 'output')")
    levels = []
    for part in path.split("."):
        if levels and part.isdigit() and part.isascii():
            levels[-1] += "." + part
        else:
            levels.append(part)
    return "/".join(levels)


def _first_tensor(out):
    """The tensor a module stage records of output ``out`` (rule 5), or ``None``."""
    if isinstance(out, torch.Tensor):
        items = [out]
    elif isinstance(out, (tuple, list)):
        items = list(out)
    elif isinstance(out, dict):  # diffusers BaseOutput is an OrderedDict of its non-None fields
        items = list(out.values())
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [getattr(out, f.name) for f in dataclasses.fields(out)]
    else:
        items = []
    t = next((x for x in items if isinstance(x, torch.Tensor)), None)
    return t if t is not None and t.is_floating_point() else None


def trace_modules(module, inputs, kwargs=None, output_names=None):
    """Run ``module`` recording every submodule's output under its module path (mode "modules",
    rules in the module docstring): ``(outputs, stages)``, stages as contiguous CPU copies taken
    when each call returns."""
    from parity_bundle import run_module

    got, calls, handles = OrderedDict(), {}, []

    def hook(name):
        def record(mod, args, out):
            n = calls[name] = calls.get(name, 0) + 1
            t = _first_tensor(out)
            if t is not None:
                got[name if n == 1 else f"{name}#{n}"] = t.detach().cpu().clone().contiguous()
        return record

    for path, sub in module.named_modules():
        if not path:
            continue
        name = module_stage_name(path)
        if name == "output":
            raise KeyError(f"{type(module).__name__}: submodule {path!r} would be the stage 'output' (the block's "
                           "own output)")
        handles.append(sub.register_forward_hook(hook(name)))
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        for h in handles:
            h.remove()
    return outs, got


def resolve_mode(block, trace):
    """The mode ``export_bundle(trace=...)`` records: ``True`` -> the block's named tracer if
    ``TRACERS`` has one, else "modules"; "named" / "modules" as given; ``False`` -> ``None``."""
    if trace is False or trace is None:
        return None
    if trace is True:
        return NAMED if block in TRACERS else MODULES
    if trace not in (NAMED, MODULES):
        raise ValueError(f"trace={trace!r}: True, False, {NAMED!r} or {MODULES!r}")
    return trace


def trace_module(block, module, inputs, kwargs=None, output_names=None, mode=NAMED):
    """Run ``module`` with stage hooks: ``(outputs, stages)``; ``stages`` is ``None`` when the
    block has no tracer (mode "named"). ``stages`` holds contiguous copies, in forward order.
    ``mode="modules"``: every submodule's output under its module path (``trace_modules``)."""
    from parity_bundle import run_module

    if mode == MODULES:
        return trace_modules(module, inputs, kwargs, output_names)
    if mode != NAMED:
        raise ValueError(f"trace mode {mode!r}: {NAMED!r} or {MODULES!r}")
    make = TRACERS.get(block)
    hooks = _Hooks()
    finish = make(module, hooks) if make is not None else None
    try:
        outs = run_module(module, inputs, kwargs, output_names)
    finally:
        hooks.remove()
    if finish is None:
        return outs, None
    got = finish(hooks.got)
    unknown = sorted(k for k in got if _base(k) not in STAGES or k == "output")
    if unknown:
        raise KeyError(f"{block}: stages {unknown} are not stage names ({sorted(STAGES)})")
    stages = OrderedDict((k, v.detach().cpu().clone().contiguous()) for k, v in got.items())
    return outs, stages


def verify_traces(path, bundle, module, inputs, module64, inputs64, kwargs=None, output_names=None):
    """Re-record a loaded bundle's stages (``parity_bundle.load_bundle``) with the hooks and check
    they are the stored ones bit for bit: the module's stages, and for a half-precision bundle the
    float64 copy's. Every block with a tracer must carry traces."""
    meta = bundle["metadata"]
    mode = meta.get(TRACE_MODE_KEY, NAMED)
    _, stages = trace_module(bundle["block"], module, inputs, kwargs, output_names, mode)
    if stages is None:
        assert "parity.trace" not in meta and not bundle["trace"], f"{path}: unexpected traces"
        return
    want = json.loads(meta.get("parity.trace", "null"))
    assert want == list(stages) + ["output"], f"{path}: parity.trace {want}, hooks give {list(stages)}"
    for n, t in stages.items():
        assert t.dtype == bundle["trace"][n].dtype and torch.equal(t, bundle["trace"][n]), f"{path}: trace {n} differs"
    if meta["parity.dtype"] in ("float16", "bfloat16", "float32"):
        _, stages64 = trace_module(bundle["block"], module64, inputs64, kwargs, output_names, mode)
        assert list(bundle["trace_f64"]) == list(stages64), f"{path}: float64 stages {list(bundle['trace_f64'])}"
        for n, t in stages64.items():
            if meta["parity.dtype"] == "float32":
                stored = bundle["trace"][n]
                want = stored.double() + float64_delta(stored, t).double()
            else:
                want = t.double()
            assert torch.equal(want, bundle["trace_f64"][n]), f"{path}: float64 trace {n} differs"
    else:
        assert not bundle["trace_f64"], f"{path}: float64 stages in a {meta['parity.dtype']} bundle"
