"""Random inputs and the attention masks the bundle specs use (every mask leaves each row at
least one position to attend to)."""

from __future__ import annotations

import torch


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def padding_mask(gen, batch, seq, p=0.3):
    """bool (batch, seq), True = ignored; never a whole row."""
    m = torch.rand(batch, seq, generator=gen) < p
    for b in range(batch):
        if m[b].all():
            m[b, torch.randint(0, seq, (1,), generator=gen)] = False
    return m


def bool_attn_mask(gen, shape, p=0.3):
    """bool (..., L, S), True = not allowed; never a whole row."""
    m = torch.rand(*shape, generator=gen) < p
    flat = m.view(-1, shape[-1])
    for r in range(flat.shape[0]):
        if flat[r].all():
            flat[r, torch.randint(0, shape[-1], (1,), generator=gen)] = False
    return m


def diffusers_cross_mask():
    """Additive float mask (B=2, 1, S=7): 0.0 kept, -10000.0 masked (as diffusers pipelines pass)."""
    m = torch.zeros(2, 1, 7)
    m[0, 0, [1, 4]] = -10000.0
    m[1, 0, [0, 5, 6]] = -10000.0
    return m


def diffusers_mask(batch, seq, masked):
    """Additive float mask (batch, 1, seq): 0.0 kept, -10000.0 at ``masked[b]`` positions."""
    m = torch.zeros(batch, 1, seq)
    for b, cols in masked.items():
        m[b, 0, cols] = -10000.0
    return m


def diffusers_self_mask():
    """Additive float self-attention mask (B=2, 1, N=9)."""
    return diffusers_mask(2, 9, {0: [3], 1: [0, 7, 8]})


def keep_mask_bool(batch, seq, lengths):
    """bool (batch, seq), True = keep: the first lengths[b] tokens, the rest padding."""
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def keep_mask_float(batch, seq, lengths):
    """float (batch, seq), 1.0 = keep, 0.0 = discard (trailing padding)."""
    return keep_mask_bool(batch, seq, lengths).float()


def mha_float_mask(gen):
    """Additive float attn_mask (L=5, S=6): a random bias with a few -10000 entries."""
    m = 0.5 * randn(gen, 5, 6)
    m[0, 2] = -10000.0
    m[3, 0] = -10000.0
    m[3, 5] = -10000.0
    return m
