"""Write PyTorch -> Candle parity bundles (format "1") for your own attention modules.

A bundle is one ``.safetensors`` file holding

* the module's ``state_dict()`` under its own keys, unchanged (buffers included);
* ``parity.input.<name>`` for every forward input (dtype kept, bool masks stay bool);
* ``parity.output.<name>`` for every output, computed by PyTorch in the module's dtype;
* ``parity.output.<name>.float64``: the same block run by PyTorch in float64 (a deep copy
  ``.double()``-ed, float inputs upcast, bool inputs unchanged, in-block float32 upcasts such
  as diffusers' ``upcast_softmax`` / ``upcast_attention`` switched off in that copy);

and string metadata: ``parity.format`` ("1"), ``parity.block`` (block id), ``parity.config``
(JSON of the constructor kwargs), ``parity.inputs`` / ``parity.outputs`` (JSON name lists),
optional ``parity.kwargs`` (JSON of non-tensor forward arguments), ``parity.dtype`` and
``parity.source`` (library versions / provenance).

Usage::

    import torch
    from diffusers.models.attention_processor import Attention
    from parity_bundle import export_bundle, randomize_

    config = dict(query_dim=64, heads=4, dim_head=16, norm_num_groups=8,
                  residual_connection=True, bias=True, upcast_softmax=True,
                  _from_deprecated_attn_block=True)
    attn = Attention(**config)
    randomize_(attn, seed=0)          # or load your trained weights
    x = torch.randn(2, 64, 5, 7)
    export_bundle(attn, "diffusers.Attention", config, {"hidden_states": x},
                  "weights/mine/mid_attn.safetensors")

    # torch.nn.MultiheadAttention, self-attention: pass only the query; key and value
    # default to the very same tensor (so torch takes its self-attention path).
    mha = torch.nn.MultiheadAttention(embed_dim=24, num_heads=3, batch_first=True)
    export_bundle(mha, "torch.nn.MultiheadAttention",
                  dict(embed_dim=24, num_heads=3, batch_first=True),
                  {"query": torch.randn(2, 9, 24)}, "weights/mine/mha.safetensors",
                  kwargs={"need_weights": True, "average_attn_weights": True})

Half precision: cast the module first (``attn.to(torch.float16)`` / ``torch.bfloat16``); the
float inputs are cast to the module's dtype, the outputs are PyTorch's run in that dtype, and the
``.float64`` outputs come from the float64 copy of the cast module, i.e. from the half-rounded
weights and inputs upcast exactly to float64.

Mixed precision (guided-diffusion's ``convert_to_fp16``: convolutions in float16, norms and the
time-embedding ``Linear`` in float32, ``x`` float16 and ``emb`` float32)::

    convert_convs_to_half_(middle_block, torch.float16)
    export_bundle(middle_block, "openai.MiddleBlock", config, {"x": x, "emb": emb}, path,
                  dtype=torch.float16, input_dtypes={"emb": torch.float32})

Each tensor is stored in the dtype PyTorch held it in; the float64 copy upcasts all of them.

The module is called as ``module(**inputs, **kwargs)``, so the input names must be the
forward's parameter names (a list argument is stored as ``<name>.0``, ``<name>.1``, ...).
``config`` must be exactly the keyword arguments the module was constructed with (the Rust side
rebuilds the block from it).

This module is the public face of the package ``scripts/parity/`` (see its ``__init__``): it
re-exports the names below, which live in ``parity.export`` (``export_bundle``), ``parity.run``
(``run_module``, ``module_in_dtype``), ``parity.float64`` (``float64_copy``,
``convert_convs_to_half_``, ``CONVERT_TO_FP16_MARK``), ``parity.files`` (``FORMAT``,
``load_bundle``, ``library_versions``, ``load_checkpoint_state_dict``, ``resolve_weights``) and
``parity.randomize`` (``randomize_``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPTS = str(Path(__file__).resolve().parent)
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)

from parity.export import export_bundle  # noqa: E402
from parity.files import (FORMAT, load_bundle, library_versions, load_checkpoint_state_dict,  # noqa: E402
                          resolve_weights)
from parity.float64 import CONVERT_TO_FP16_MARK, convert_convs_to_half_, float64_copy  # noqa: E402
from parity.randomize import randomize_  # noqa: E402
from parity.run import module_in_dtype, run_module  # noqa: E402

__all__ = [
    "FORMAT",
    "export_bundle",
    "randomize_",
    "load_bundle",
    "run_module",
    "float64_copy",
    "convert_convs_to_half_",
    "CONVERT_TO_FP16_MARK",
    "library_versions",
    "load_checkpoint_state_dict",
    "resolve_weights",
    "module_in_dtype",
]
