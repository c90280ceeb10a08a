"""Fresh inputs for a template: random sizes where the template's shapes allow, random values, and
the input conditions ("outlier", the input half of "ill").

The *main* input is the first floating input with more than three distinct values (the
template's ``hidden_states`` / ``x`` / ``query``). Its layout is read off its shape and the
config: 4-D / 5-D inputs are channel-first ``(B, C, *spatial)``; a 3-D input is ``(B, N, C)``
(tokens) when its last size is a config value and its middle one is not, ``(B, C, T)`` in the
opposite case, and left at its size when both or neither are; ``torch.nn.MultiheadAttention``
without ``batch_first`` is ``(L, N, E)`` and unbatched ``(L, E)``.

A *plan* resizes the batch (to 1-3) and the main input's spatial / sequence sizes. Other inputs
follow: a *data* input (floating, more than three distinct values) that has the template's batch
at the batch position or the main input's size at a resized position (same rank) is regenerated
at the new size; a *fixed* input (masks, bool / int tensors, ``image_only_indicator``) keeps its
values, its rows repeated cyclically along the batch / resized positions. Whether the block
accepts a plan is PyTorch's to say: ``candidate_plans`` lists fallbacks down to the template's own
sizes, and the generator takes the first one the block runs on.

Values: every data input is ``mean + std * N(0, 1)`` with the template tensor's mean and standard
deviation (captured mid-block inputs such as ``temb`` keep their scale); aliased inputs (one
tensor passed twice, MultiheadAttention's ``key is value``) stay aliased.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

# the most positions (H * W, or tokens / time steps) a plan gives the main input, and the longest side
MAX_POSITIONS = 576
MAX_SIDE = 48
# the most positions of a "long" plan (200 to this many tokens)
LONG_POSITIONS = 600


def _config_ints(config) -> set:
    out = set()

    def walk(v):
        if isinstance(v, bool):
            return
        if isinstance(v, int):
            out.add(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(config)
    return out


def is_data(t) -> bool:
    """A floating tensor with more than three distinct values (not a mask / indicator)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 3 and t.unique().numel() > 3


def layout(template):
    """(main input name, batch dim or None, resizable dims of the main input, channel dim)."""
    main = next((k for k, v in template.inputs.items() if is_data(v)), None)
    if main is None:
        return None, None, [], None
    shape = template.inputs[main].shape
    nd = len(shape)
    if template.block == "torch.nn.MultiheadAttention":
        if nd == 2:
            return main, None, [0], 1
        if template.config.get("batch_first"):
            return main, 0, [1], 2
        return main, 1, [0], 2
    if nd >= 4:
        return main, 0, list(range(nd - 2, nd)), 1
    if nd == 3:
        ints = _config_ints(template.config)
        d1, d2 = shape[1] in ints, shape[2] in ints
        if d2 and not d1:
            return main, 0, [1], 2
        if d1 and not d2:
            return main, 0, [2], 1
        return main, 0, [], nd - 1
    return main, 0, [], nd - 1


def candidate_plans(template, rng, max_elements, long=False):
    """Plans to try in order: new batch and sizes, new sizes only, new batch only, the template's
    own sizes. A plan is ``{"batch": B or None, "sizes": {dim: size}}`` for the main input. ``long``:
    200-600 positions (long sequences), batch 1-2."""
    main, bdim, dims, _ = layout(template)
    if main is None:
        return [{"batch": None, "sizes": {}}]
    shape = list(template.inputs[main].shape)
    batch = rng.choice([1, 2, 2, 3]) if bdim is not None else None
    sizes = {}
    # positions per item (the product of the resized dims): log-uniform from 2-4 up to MAX_POSITIONS,
    # fewer where the main input's other dims would take the outputs past max_elements
    per_item = math.prod(s for d, s in enumerate(shape) if d not in dims and d != bdim)
    cap = max(4, min(MAX_POSITIONS, max_elements // (4 * max(1, per_item) * (batch or 1))))
    low = 4
    if long:
        batch = rng.choice([1, 2]) if bdim is not None else None
        low, cap = 200, max(200, min(LONG_POSITIONS, max_elements // (max(1, per_item) * (batch or 1))))
    if len(dims) == 2:
        n = math.exp(rng.uniform(math.log(low), math.log(cap)))
        a = math.exp(rng.uniform(-0.6, 0.6))
        h = max(1, min(MAX_SIDE if not long else 64, round(math.sqrt(n) * a)))
        w = max(1, min(MAX_SIDE, round(n / h)))
        if h * w < 2:
            w = 2
        sizes = {dims[0]: h, dims[1]: w}
    elif len(dims) == 1:
        sizes = {dims[0]: max(2, round(math.exp(rng.uniform(math.log(max(2, low)), math.log(cap)))))}
    plans = []
    for p in ({"batch": batch, "sizes": sizes}, {"batch": None, "sizes": sizes},
              {"batch": batch, "sizes": {}}, {"batch": None, "sizes": {}}):
        if p not in plans:
            plans.append(p)
    return plans


def shrink(plan):
    """The plan with its resized dims halved (None when nothing is left to shrink)."""
    sizes = {d: max(1, s // 2) for d, s in plan["sizes"].items()}
    if sizes == plan["sizes"]:
        if plan["batch"] and plan["batch"] > 1:
            return {"batch": 1, "sizes": sizes}
        return None
    return {"batch": plan["batch"], "sizes": sizes}


def _index_along(t, dim, n):
    idx = torch.arange(n) % t.shape[dim]
    return t.index_select(dim, idx)


def make_inputs(template, plan, gen):
    """The template's inputs resized by ``plan``, data inputs drawn afresh with ``gen``."""
    main, bdim, dims, _ = layout(template)
    mshape = template.inputs[main].shape if main is not None else None
    b0 = mshape[bdim] if main is not None and bdim is not None else None
    out, memo = OrderedDict(), {}
    for name, t in template.inputs.items():
        if not isinstance(t, torch.Tensor):
            out[name] = t
            continue
        if id(t) in memo:
            out[name] = memo[id(t)]
            continue
        shape = list(t.shape)
        changes = {}
        if plan["batch"] is not None and b0 is not None and len(shape) > bdim and shape[bdim] == b0 and len(shape) >= 2:
            changes[bdim] = plan["batch"]
        for d, s in plan["sizes"].items():
            if name == main or (len(shape) == len(mshape) and shape[d] == mshape[d] and d != bdim):
                changes[d] = s
        if is_data(t):
            for d, s in changes.items():
                shape[d] = s
            mean, std = float(t.mean()), float(t.std())
            std = min(max(std, 0.05), 50.0)
            new = mean + std * torch.randn(*shape, generator=gen)
        else:
            new = t
            for d, s in changes.items():
                new = _index_along(new, d, s)
            new = new.clone()
        memo[id(t)] = new
        out[name] = new
    return out


def apply_outlier(template, inputs, rng, gen, strength):
    """Massive activations in the main input: a few elements set to +-``strength`` x its std, or one
    whole channel shifted by +-``strength`` x std (``strength`` 1e2..1e4). Returns a description."""
    main, _, _, cdim = layout(template)
    if main is None:
        return inputs, "no data input"
    x = inputs[main].clone()
    std = float(x.std()) if x.numel() > 1 else 1.0
    std = std if std > 0 else 1.0
    if rng.random() < 0.5 or x.dim() < 2:
        k = rng.randint(1, 4)
        flat = x.view(-1)
        pos = torch.randint(0, flat.numel(), (k,), generator=gen)
        signs = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0)
        flat[pos] = signs * strength * std
        what = f"{k} element(s) of {main} set to +-{strength:.3g} std"
    else:
        c = rng.randrange(x.shape[cdim])
        sign = rng.choice([-1.0, 1.0])
        x.select(cdim, c).add_(sign * strength * std)
        what = f"channel {c} (dim {cdim}) of {main} shifted by {sign * strength:.3g} std"
    new = OrderedDict()
    for k, v in inputs.items():
        new[k] = x if v is inputs[main] else v
    return new, what


def apply_offset(template, inputs, offset):
    """The main input plus a large common offset (an ill-conditioned input)."""
    main, _, _, _ = layout(template)
    if main is None:
        return inputs, "no data input"
    x = inputs[main] + offset
    return OrderedDict((k, x if v is inputs[main] else v) for k, v in inputs.items()), f"{main} + {offset:.3g}"


def elements(outputs) -> int:
    return sum(int(t.numel()) for t in outputs.values())


def scale_channels(template, inputs, rng, gen):
    """One to three channels of the main input multiplied by 100-1000 (a few "massive" channels, as in
    real models' activations). Returns ``(inputs, description)``."""
    main, _, _, cdim = layout(template)
    if main is None or inputs[main].dim() < 2:
        return inputs, "no channel to scale"
    x = inputs[main].clone()
    channels = rng.sample(range(x.shape[cdim]), min(x.shape[cdim], rng.randint(1, 3)))
    factors = [10 ** rng.uniform(2, 3) for _ in channels]
    for c, f in zip(channels, factors):
        x.select(cdim, c).mul_(f)
    new = OrderedDict((k, x if v is inputs[main] else v) for k, v in inputs.items())
    return new, "channels " + ", ".join(f"{c} x {f:.3g}" for c, f in zip(channels, factors)) + f" (dim {cdim}) of {main}"


def near_constant(template, inputs, rng, gen):
    """Every data input replaced by a constant plus noise of 1e-3 to 1e-5 of it (near-constant
    inputs: GroupNorm's variance near 0, attention scores nearly equal)."""
    new, memo, what = OrderedDict(), {}, []
    for k, v in inputs.items():
        if id(v) in memo:
            new[k] = memo[id(v)]
            continue
        if is_data(v):
            level = rng.choice([-1, 1]) * 10 ** rng.uniform(-1, 1)
            rel = 10 ** rng.uniform(-5, -3)
            memo[id(v)] = level * (1 + rel * torch.randn(v.shape, generator=gen))
            what.append(f"{k} = {level:.3g} (1 + {rel:.1e} N(0,1))")
        else:
            memo[id(v)] = v
        new[k] = memo[id(v)]
    return new, "; ".join(what) or "no data input"


def mean_shift(template, inputs, rng, gen):
    """The main input with a mean of +-30..70 (its spread kept)."""
    offset = rng.choice([-1, 1]) * rng.uniform(30, 70)
    return apply_offset(template, inputs, offset)


def mask_inputs(inputs):
    """The names of the additive (floating) mask inputs: floating tensors with at most three
    distinct values, one of them 0."""
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not is_data(v) and v.numel() > 1 and bool((v == 0).any())]


def large_masks(template, inputs, rng, gen, dtype):
    """Every additive mask input redrawn: each (batch, query) row keeps a random prefix or suffix of
    its keys (left or right padding, at least one key kept) and masks the rest with a large finite
    value (``finfo(dtype).min``, -1e9, -1e4), the conventions of HF and ``masked_fill``. Returns
    ``(inputs, description)``; unchanged when the template has no additive mask."""
    names = mask_inputs(inputs)
    if not names:
        return inputs, "no additive mask"
    value = rng.choice([torch.finfo(dtype).min, -1e9, -1e4])
    new = OrderedDict(inputs)
    for k in names:
        m = inputs[k]
        keys = m.shape[-1]
        rows = m.reshape(-1, keys).shape[0]
        out = torch.zeros(rows, keys, dtype=m.dtype)
        for r in range(rows):
            keep = rng.randint(1, keys)
            if rng.random() < 0.5:
                out[r, keep:] = value
            else:
                out[r, : keys - keep] = value
        new[k] = out.reshape(m.shape)
    return new, f"masks {names} redrawn with {value:.3g} (left / right padding)"
