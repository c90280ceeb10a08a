"""``randomize_``: deterministic random values for every parameter and buffer of a block, scaled
so that activations stay O(1) (the exporters' synthetic weights).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn


_NORM_TYPES = (
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def _is_norm(mod: nn.Module) -> bool:
    return isinstance(mod, _NORM_TYPES) or "norm" in type(mod).__name__.lower()


def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Set EVERY parameter and buffer of ``module`` to deterministic random values, in place.

    * weights (ndim >= 2): N(0, std = 1/sqrt(fan_in)), fan_in = prod(shape[1:]), so
      activations stay O(1) (Linear, Conv, MHA in/q/k/v projections);
    * Linear/Conv/projection biases: 0.2 * N(0, 1);
    * norm weights / gains (``weight`` of GroupNorm, LayerNorm, BatchNorm, ..., and any ``g``,
      e.g. lucidrains RMSNorm): 1 + 0.2 * N(0, 1); norm biases: 0.1 * N(0, 1);
    * BatchNorm ``running_mean``: 0.2 * N(0, 1); ``running_var``: U(0.5, 1.5);
      ``num_batches_tracked``: a random int;
    * ``mem_kv`` (lucidrains memory key/values), MHA ``bias_k``/``bias_v``: N(0, 1);
    * anything else: floating -> 0.2 * N(0, 1) (with a warning); integer buffers -> random int.
    Returns ``module``.
    """
    gen = torch.Generator().manual_seed(int(seed))

    def randn(t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)

    def rand(t: torch.Tensor) -> torch.Tensor:
        return torch.rand(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)

    with torch.no_grad():
        for mod_name, mod in module.named_modules():
            norm = _is_norm(mod)
            for name, p in mod.named_parameters(recurse=False):
                full = f"{mod_name}.{name}" if mod_name else name
                if not p.is_floating_point():
                    continue
                if name == "g" or (norm and name in ("weight", "gamma", "scale")):
                    p.copy_(1.0 + 0.2 * randn(p))
                elif norm and name in ("bias", "b", "beta"):
                    p.copy_(0.1 * randn(p))
                elif name in ("mem_kv", "bias_k", "bias_v"):
                    p.copy_(randn(p))
                elif p.dim() >= 2:
                    fan_in = math.prod(p.shape[1:])
                    p.copy_(randn(p) / math.sqrt(max(fan_in, 1)))
                elif "bias" in name:
                    p.copy_(0.2 * randn(p))
                else:
                    warnings.warn(f"randomize_: no rule for parameter {full!r}; using 0.2*N(0,1)")
                    p.copy_(0.2 * randn(p))
            for name, b in mod.named_buffers(recurse=False):
                full = f"{mod_name}.{name}" if mod_name else name
                if name == "running_mean":
                    b.copy_(0.2 * randn(b))
                elif name == "running_var":
                    b.copy_(0.5 + rand(b))
                elif name == "num_batches_tracked" or not (b.is_floating_point() or b.dtype == torch.bool):
                    b.copy_(torch.randint(1, 10_000, b.shape, generator=gen).to(b.dtype))
                elif b.is_floating_point():
                    warnings.warn(f"randomize_: no rule for buffer {full!r}; using 0.2*N(0,1)")
                    b.copy_(0.2 * randn(b))
                else:
                    warnings.warn(f"randomize_: bool buffer {full!r} left unchanged")
    return module
