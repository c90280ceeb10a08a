"""The float64 copy every bundle's reference outputs come from (``float64_copy``: a deep copy
``.double()``-ed with the in-block float32 upcasts switched off) and guided-diffusion's
half-precision form (``convert_convs_to_half_``: only the convolutions in half precision).
"""

from __future__ import annotations

import copy
import types
from typing import Callable

import torch
from torch import nn


# the phrase a bundle's ``parity.source`` contains when it was made with ``convert_convs_to_half_``
# (the export scripts' --verify rebuild the mixed-dtype module from it)
CONVERT_TO_FP16_MARK = "guided-diffusion convert_to_fp16 form"


def convert_convs_to_half_(module: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """guided-diffusion's half-precision mode, in place: ``UNetModel.convert_to_fp16()`` applies
    ``fp16_util.convert_module_to_f16`` to ``input_blocks``, ``middle_block`` and ``output_blocks``,
    which converts the weight and bias of every ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d`` to
    float16 (``l.weight.data = l.weight.data.half()``) and nothing else: the ``GroupNorm32``
    parameters and the ``nn.Linear`` of ``ResBlock.emb_layers`` stay float32. (openai/guided-diffusion
    22e0df818350 ``guided_diffusion/fp16_util.py``, same in improved-diffusion; ldm's
    ``openaimodel.py`` replaces ``convert_module_to_f16`` by a no-op.) ``dtype=torch.bfloat16``
    applies the same conversion with bfloat16, which guided-diffusion itself does not offer.
    Returns ``module``."""
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)
    return module


def _rms_norm_forward_keep_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """diffusers ``RMSNorm.forward`` without its ``.to(torch.float32)`` of the variance."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
    if self.weight is not None:
        hidden_states = hidden_states * self.weight
        if self.bias is not None:
            hidden_states = hidden_states + self.bias
    return hidden_states


# Published forwards with a hard-coded ``.float()`` cast: (module, class) -> what is cast.
_FLOAT_CASTS = {
    ("guided_diffusion.unet", "QKVAttentionLegacy"): "softmax(weight.float())",
    ("guided_diffusion.unet", "QKVAttention"): "softmax(weight.float())",
    ("ldm.modules.diffusionmodules.openaimodel", "QKVAttentionLegacy"): "softmax(weight.float())",
    ("ldm.modules.diffusionmodules.openaimodel", "QKVAttention"): "softmax(weight.float())",
    ("ldm.modules.attention", "CrossAttention"): 'q.float(), k.float() when ATTN_PRECISION is "fp32"',
}


def _float_keeps_float64(forward: Callable) -> Callable:
    """``forward`` run with ``Tensor.float()`` returning a float64 tensor unchanged (every other
    dtype is cast as usual), so a published forward's float32 cast does not downcast the float64
    copy; the forward's own code runs unchanged."""

    def run(*args, **kwargs):
        cast = torch.Tensor.float

        def keep_float64(t, *a, **k):
            return t if t.dtype == torch.float64 else cast(t, *a, **k)

        torch.Tensor.float = keep_float64
        try:
            return forward(*args, **kwargs)
        finally:
            torch.Tensor.float = cast

    return run


def _disable_upcasts(module: nn.Module) -> None:
    """Switch off in-block float32 upcasts (they would downcast a float64 run).

    * any boolean ``upcast_softmax`` / ``upcast_attention`` attribute is set to False (diffusers
      ``Attention``);
    * a ``GroupNorm32`` (OpenAI / ldm ``openaimodel``: ``super().forward(x.float())``) runs as a
      plain ``nn.GroupNorm``;
    * the published OpenAI ``QKVAttention`` / ``QKVAttentionLegacy`` (softmax of ``weight.float()``)
      and SD 2.x ``CrossAttention`` (``q.float()``, ``k.float()``) run their own forward with
      ``.float()`` keeping float64 tensors (``_FLOAT_CASTS``);
    * a diffusers ``RMSNorm`` (variance computed ``.to(torch.float32)``) keeps the input dtype.
    """
    for sub in module.modules():
        for attr in ("upcast_softmax", "upcast_attention"):
            # instance attributes only (diffusers ModelMixin forwards unknown attributes to its config)
            if isinstance(vars(sub).get(attr), bool):
                setattr(sub, attr, False)
        cls = type(sub)
        if cls.__name__ == "GroupNorm32" and isinstance(sub, nn.GroupNorm):
            sub.forward = types.MethodType(nn.GroupNorm.forward, sub)
        elif (cls.__module__, cls.__name__) in _FLOAT_CASTS:
            sub.forward = _float_keeps_float64(sub.forward)
        elif cls.__name__ == "RMSNorm" and cls.__module__.startswith("diffusers."):
            sub.forward = types.MethodType(_rms_norm_forward_keep_dtype, sub)


def _standardize_with_eps(eps: float) -> Callable:
    """The Annotated Diffusion post's ``WeightStandardizedConv2d.forward`` (scripts/reference/
    annotated_diffusion.py, its published ``/ rsqrt`` kept) with ``eps`` fixed: the published
    ``1e-5 if x.dtype == torch.float32 else 1e-3`` is a dtype-dependent constant, which a float64
    twin takes from the dtype of the run it is the twin of (1e-5 for float32, 1e-3 for half)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
        normalized = (w - mean) / (var + eps).rsqrt()
        return torch.nn.functional.conv2d(x, normalized, self.bias, self.stride, self.padding, self.dilation,
                                          self.groups)

    return forward


def _keep_run_eps(module: nn.Module, run_dtype: torch.dtype) -> None:
    """Each weight-standardized conv of the Annotated Diffusion post with the eps of ``run_dtype``."""
    eps = 1e-5 if run_dtype == torch.float32 else 1e-3
    for sub in module.modules():
        cls = type(sub)
        if cls.__name__ == "WeightStandardizedConv2d" and cls.__module__.endswith("annotated_diffusion"):
            sub.forward = types.MethodType(_standardize_with_eps(eps), sub)


def _run_group_norm32_in_float64(module: nn.Module) -> None:
    """``GroupNorm32`` as a plain ``nn.GroupNorm``: its ``super().forward(x.float())`` cannot run with
    float64 weights (PyTorch's CPU kernel refuses the mixed dtypes), so even a plain ``.double()``
    twin needs this one cast switched off."""
    for sub in module.modules():
        if type(sub).__name__ == "GroupNorm32" and isinstance(sub, nn.GroupNorm):
            sub.forward = types.MethodType(nn.GroupNorm.forward, sub)


def float64_copy(module: nn.Module, prepare: Callable[[nn.Module], None] | None = None,
                 casts: str = "off") -> nn.Module:
    """Deep copy of ``module`` in float64 with in-block float32 upcasts disabled and dtype-dependent
    constants taken from ``module``'s dtype (``casts="off"``), or left as the published forward has
    them (``casts="kept"``: a plain ``.double()``, but for ``GroupNorm32``, which PyTorch cannot run
    that way)."""
    if casts not in ("off", "kept"):
        raise ValueError(f"casts={casts!r}: 'off' or 'kept'")
    run_dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    m64 = copy.deepcopy(module).double().eval()
    if casts == "off":
        _disable_upcasts(m64)
        _keep_run_eps(m64, run_dtype)
    else:
        _run_group_norm32_in_float64(m64)
    if prepare is not None:
        prepare(m64)
    return m64
