"""Planted bugs: the same module and inputs run again in the bundle's dtype with one deliberate
mistake, the way a wrong port would compute. Each bug is a context manager that patches PyTorch
(or the module's attributes) and restores everything on exit.

* ``eps``: every normalization module's ``eps`` (GroupNorm, LayerNorm, GroupNorm32, BatchNorm,
  diffusers RMSNorm / LpNorm / AdaGroupNorm, ...: any module whose class name contains "Norm"
  and holds a float ``eps``) multiplied by 10 - an eps swap 1e-6 <-> 1e-5;
* ``scale`` (and ``scale_1.01``, ``scale_1.1``): the attention logits x 1.05 (x 1.01, x 1.1):
  ``F.scaled_dot_product_attention`` given ``scale = (scale or 1/sqrt(E)) * 1.05``, and every
  softmax (``Tensor.softmax``, which ``F.softmax`` calls, and ``torch.softmax``) applied to its
  input x 1.05;
* ``gelu_tanh``: ``F.gelu`` always with ``approximate="tanh"``;
* ``no_upcast`` (float16 / bfloat16 bundles): attention and softmax entirely in the half dtype -
  ``F.scaled_dot_product_attention`` replaced by the explicit math (q k^T * scale, mask, softmax,
  times v) in the half dtype, and a softmax asked to upcast (``dtype=float32``) or given a
  float32 tensor that the block upcast computed in the half dtype;
* ``head_split``: ``F.scaled_dot_product_attention`` with more than one head given q, k, v whose
  channels are grouped (dim_head, heads) instead of (heads, dim_head), the output merged back the
  same wrong way;
* ``kv_swap``: ``F.scaled_dot_product_attention`` given the values as keys and the keys as values
  (where the two have the same shape).

PyTorch's fused MultiheadAttention fast path (which no Python patch reaches) is switched off
during every bug run. A bug is stored only where it changes some output in the bundle's dtype.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

BUGS = ("eps", "scale", "scale_1.01", "scale_1.1", "gelu_tanh", "no_upcast", "head_split", "kv_swap")
HALF = (torch.float16, torch.bfloat16)
SCALE = 1.05


@contextlib.contextmanager
def _patch(obj, name, value):
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def _no_mha_fastpath():
    mha = getattr(torch.backends, "mha", None)
    if mha is None:
        yield
        return
    was = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(was)


@contextlib.contextmanager
def eps_bug(module, dtype):
    changed = []
    for m in module.modules():
        eps = getattr(m, "eps", None)
        if "Norm" in type(m).__name__ and isinstance(eps, float):
            changed.append((m, eps))
            m.eps = eps * 10
    try:
        yield bool(changed)
    finally:
        for m, eps in changed:
            m.eps = eps


def scale_bug(factor):
    @contextlib.contextmanager
    def bug(module, dtype):
        with _scaled_logits(factor):
            yield True

    return bug


@contextlib.contextmanager
def _scaled_logits(factor):
    sdpa, tsm, tsoft = F.scaled_dot_product_attention, torch.Tensor.softmax, torch.softmax

    def sdpa_scaled(query, key, value, *args, scale=None, **kwargs):
        s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        return sdpa(query, key, value, *args, scale=s * factor, **kwargs)

    def tensor_softmax(self, *args, **kwargs):
        return tsm(self * factor, *args, **kwargs)

    def torch_softmax(input, *args, **kwargs):
        return tsoft(input * factor, *args, **kwargs)

    with _patch(F, "scaled_dot_product_attention", sdpa_scaled), _patch(torch.Tensor, "softmax", tensor_softmax), \
            _patch(torch, "softmax", torch_softmax):
        yield


@contextlib.contextmanager
def gelu_tanh_bug(module, dtype):
    gelu = F.gelu

    def gelu_tanh(input, approximate="none"):
        return gelu(input, approximate="tanh")

    with _patch(F, "gelu", gelu_tanh):
        yield True


@contextlib.contextmanager
def no_upcast_bug(module, dtype):
    if dtype not in HALF:
        yield False
        return
    sdpa, tsm, tsoft = F.scaled_dot_product_attention, torch.Tensor.softmax, torch.softmax

    def low_softmax(x, dim, want):
        # the softmax the block asked for, computed from (and rounded to) the half dtype
        y = tsm(x.to(dtype), dim)
        return y.to(want if want is not None else x.dtype)

    def tensor_softmax(self, dim=None, *args, **kwargs):
        want = kwargs.get("dtype", args[0] if args else None)
        if self.is_floating_point() and (self.dtype == torch.float32 or want == torch.float32):
            return low_softmax(self, dim, want)
        return tsm(self, dim, *args, **kwargs)

    def torch_softmax(input, dim=None, *args, **kwargs):
        return tensor_softmax(input, dim, *args, **kwargs)

    def sdpa_half(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if query.dtype not in HALF or enable_gqa:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        scores = (query @ key.transpose(-2, -1)) * s
        if is_causal:
            L, S = scores.shape[-2:]
            causal = torch.ones(L, S, dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask.to(scores.dtype)
        return tsm(scores, -1) @ value

    with _patch(F, "scaled_dot_product_attention", sdpa_half), _patch(torch.Tensor, "softmax", tensor_softmax), \
            _patch(torch, "softmax", torch_softmax):
        yield True


@contextlib.contextmanager
def head_split_bug(module, dtype):
    sdpa = F.scaled_dot_product_attention

    def wrong_split(t):
        # (B, H, L, D) with channels grouped (H, D) -> the same channels read as (D, H)
        *lead, H, L, D = t.shape
        merged = t.transpose(-3, -2).reshape(*lead, L, H * D)
        return merged.reshape(*lead, L, D, H).movedim(-1, -3)

    def wrong_merge(o):
        # (B, H, L, Dv) merged back as (Dv, H), then read as (H, Dv) by the caller
        *lead, H, L, D = o.shape
        merged = o.movedim(-3, -1).reshape(*lead, L, D * H)
        return merged.reshape(*lead, L, H, D).transpose(-3, -2)

    def sdpa_split(query, key, value, *args, **kwargs):
        if query.dim() < 4 or query.shape[-3] <= 1 or key.shape[-3] != query.shape[-3] or \
                value.shape[-3] != query.shape[-3]:
            return sdpa(query, key, value, *args, **kwargs)
        out = sdpa(wrong_split(query), wrong_split(key), wrong_split(value), *args, **kwargs)
        return wrong_merge(out)

    with _patch(F, "scaled_dot_product_attention", sdpa_split):
        yield True


@contextlib.contextmanager
def kv_swap_bug(module, dtype):
    sdpa = F.scaled_dot_product_attention

    def sdpa_swapped(query, key, value, *args, **kwargs):
        if key.shape != value.shape:
            return sdpa(query, key, value, *args, **kwargs)
        return sdpa(query, value, key, *args, **kwargs)

    with _patch(F, "scaled_dot_product_attention", sdpa_swapped):
        yield True


BUG_CONTEXTS = {"eps": eps_bug, "scale": scale_bug(SCALE), "scale_1.01": scale_bug(1.01), "scale_1.1": scale_bug(1.1),
                "gelu_tanh": gelu_tanh_bug, "no_upcast": no_upcast_bug, "head_split": head_split_bug,
                "kv_swap": kv_swap_bug}


def run_bugs(module, dtype, run, module64=None, run64=None):
    """``{bug: outputs}`` for every bug whose run gives finite outputs differing from the honest
    ones; ``run()`` runs the module on the bundle's inputs and returns its named outputs (the
    honest ones first, outside any patch). With ``module64`` / ``run64`` (the float64 copy and its
    run) each found bug's outputs also hold ``<output>.float64``: the float64 copy run with the
    same bug, the twin a bundle exported from the wrong module would carry (the bug "on the
    reference side"); absent where the bug does not change the float64 run (``no_upcast``)."""
    honest = run()
    found = {}
    for bug in BUGS:
        with _no_mha_fastpath(), BUG_CONTEXTS[bug](module, dtype) as applies:
            if not applies:
                continue
            try:
                outs = run()
            except Exception:  # a bug the block cannot even run with is no use as a near-miss
                continue
        if list(outs) != list(honest):
            continue
        if any(not torch.isfinite(t).all() for t in outs.values() if t.is_floating_point()):
            continue
        if any(not torch.equal(outs[k], honest[k]) for k in honest):
            found[bug] = dict(outs)
            if run64 is not None:
                found[bug].update(_float64_bug(bug, module64, run64))
    return honest, found


def _float64_bug(bug, module64, run64) -> dict:
    """``{"<output>.float64": tensor}``: the float64 copy's outputs with ``bug`` planted (empty where
    it does not apply in float64 or fails)."""
    with _no_mha_fastpath(), BUG_CONTEXTS[bug](module64, torch.float64) as applies:
        if not applies:
            return {}
        try:
            outs = run64()
        except Exception:
            return {}
    return {f"{k}.float64": v for k, v in outs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
