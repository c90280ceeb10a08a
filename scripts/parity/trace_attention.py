"""The named tracers of attention blocks (diffusers ``Attention`` and ``SelfAttention1d``,
lucidrains, Annotated Diffusion, ldm, OpenAI, fast.ai, textbook, ``torch.nn.MultiheadAttention``):
norm, q/k/v after the head split, probs, context, attn, proj, with each block's own reshapes and
scale (the layouts are in ``parity_trace``'s docstring).
"""

from __future__ import annotations

import math

import torch

from .trace_hooks import attention_stages, call_arg, out_proj


def diffusers_attention(m, h):
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
    out_proj(h, m.to_out[0])

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
        unmasked = call_arg(got, "_call", "attention_mask", 2) is None
        return attention_stages(got, q, k, v, norms, probs=unmasked, scale=scale)

    return finish


def lucidrains_attention(m, h):
    h.out(m.norm, "norm")
    h.inp(m.attend, "_qkv")
    out_proj(h, m.to_out)

    def finish(got):
        q, k, v = got["_qkv"][:3]
        scale = m.attend.scale if m.attend.scale is not None else q.shape[-1] ** -0.5
        return attention_stages(got, q, k, v, [("norm", got["norm"])], scale=scale)

    return finish


def linear_attention(m, h):
    """Linear attention (lucidrains and Annotated Diffusion ``LinearAttention``, ldm
    ``LinearAttention`` / ``LinAttnBlock``): q, k, v before their softmaxes (memory key/values
    included), the context, the output projection."""
    h.out(getattr(m, "norm", None), "norm")
    h.out(m.to_qkv, "_qkv")
    out_proj(h, m.to_out)

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
        return attention_stages(got, *(t.transpose(2, 3) for t in (q, k, v)), norms, probs=False,
                       extra=[("context", context)])

    return finish


def ldm_attn_block(m, h):
    h.out(m.norm, "norm")
    for n in ("q", "k", "v"):
        h.out(getattr(m, n), "_" + n)
    out_proj(h, m.proj_out)

    def finish(got):
        b, c, hh, ww = got["_q"].shape
        # 'b c h w -> b 1 (h w) c': one head of c channels
        tok = lambda t: t.reshape(b, c, hh * ww).transpose(1, 2).unsqueeze(1)
        q, k, v = tok(got["_q"]), tok(got["_k"]), tok(got["_v"])
        return attention_stages(got, q, k, v, [("norm", got["norm"])], scale=int(c) ** (-0.5))

    return finish


def openai_attention_block(m, h):
    h.out(m.norm, "norm")
    h.inp(m.attention, "_qkv")
    out_proj(h, m.proj_out)

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
        return attention_stages(got, q, k, v, [("norm", got["norm"])], scale_q=s, scale_k=s)

    return finish


def annotated_attention(m, h):
    h.out(m.to_qkv, "_qkv")
    out_proj(h, m.to_out)

    def finish(got):
        qkv = got["_qkv"]
        b, _, hh, ww = qkv.shape
        # 'b (h c) x y -> b h c (x y)', then (B, H, N, D); q before `q * self.scale`
        q, k, v = (t.reshape(b, m.heads, -1, hh * ww).transpose(2, 3) for t in qkv.chunk(3, dim=1))
        return attention_stages(got, q, k, v, scale_q=m.scale)

    return finish


def ldm_cross_attention(m, h):
    h.call(m, "_call")
    h.out(m.to_q, "_q")
    h.out(m.to_k, "_k")
    h.out(m.to_v, "_v")
    out_proj(h, m.to_out[0])

    def finish(got):
        # rearrange(t, 'b n (h d) -> (b h) n d') = (B, H, N, D) with the batch and head axes merged
        split = lambda t: t.reshape(t.shape[0], t.shape[1], m.heads, -1).transpose(1, 2)
        q, k, v = split(got["_q"]), split(got["_k"]), split(got["_v"])
        unmasked = call_arg(got, "_call", "mask", 2) is None
        return attention_stages(got, q, k, v, probs=unmasked, scale=m.scale)

    return finish


def fastai_attention(m, h):
    """fast.ai ``SelfAttention`` (separate q/k/v or fused qkv) and ``SelfAttentionMultiHead``:
    scores divided by ``m.scale``."""
    h.out(m.norm, "norm")
    if hasattr(m, "qkv"):
        h.out(m.qkv, "_qkv")
    else:
        for n in ("q", "k", "v"):
            h.out(getattr(m, n), "_" + n)
    out_proj(h, m.proj)

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
        return attention_stages(got, q, k, v, [("norm", got["norm"])], scale=1.0 / m.scale)

    return finish


def textbook_attention(m, h):
    """textbook ``Self_Attention`` (no output projection: its ``attn`` is the output) and
    ``MultiHead_Attention``: heads ``'b nq (nh dh) -> b nh nq dh'``, scores divided by ``m.scale``."""
    for n in ("q", "k", "v"):
        h.out(getattr(m, n), "_" + n)
    fc = getattr(m, "fc", None)
    out_proj(h, fc)

    def finish(got):
        heads = getattr(m, "nh", 1)
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)
        q, k, v = (split(got[n]) for n in ("_q", "_k", "_v"))
        return attention_stages(got, q, k, v, scale=1.0 / m.scale)

    return finish


def torch_mha(m, h):
    """torch.nn.MultiheadAttention: q/k/v re-computed with the functional in-projection helpers
    its forward calls (it applies its weights functionally, so no hook sees them), bias_k/bias_v
    and add_zero_attn appended as ``F.multi_head_attention_forward`` does; ``probs`` only without
    any mask."""
    import torch.nn.functional as F

    h.call(m, "_call")

    def finish(got):
        arg = lambda name, pos: call_arg(got, "_call", name, pos)
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
        return attention_stages(got, q, k, v, probs=unmasked, scale=d ** -0.5)

    return finish


def diffusers_attention_1d(m, h):
    """diffusers ``SelfAttention1d``: GroupNorm(1), query/key/value Linears on the transposed
    view, ``transpose_for_scores`` heads, ``d ** -0.25`` on q and on k, ``proj_attn``."""
    h.out(m.group_norm, "norm")
    for n in ("query", "key", "value"):
        h.out(getattr(m, n), "_" + n[0])
    out_proj(h, m.proj_attn)

    def finish(got):
        q, k, v = (m.transpose_for_scores(got[n]) for n in ("_q", "_k", "_v"))
        s = 1 / math.sqrt(math.sqrt(k.shape[-1]))
        return attention_stages(got, q, k, v, [("norm", got["norm"])], scale_q=s, scale_k=s)

    return finish
