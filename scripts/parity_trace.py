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
7. an attention module (diffusers ``Attention`` with ``AttnProcessor2_0`` / ``AttnProcessor`` /
   the added-KV processors, ``SelfAttention1d``, lucidrains ``Attention``, ldm ``AttnBlock`` /
   ``SpatialSelfAttention`` / ``CrossAttention`` / ``LinearAttention``, OpenAI
   ``AttentionBlock``) also records the stages of its attention core, which no submodule returns,
   under its own path: ``<path>/q``, ``k``, ``v`` (``(B, heads, tokens, head_dim)`` after the
   head split, before any scale), ``probs`` (``(B, heads, Lq, Lk)``, f32, unmasked and at most
   65,536 weights), ``context`` (linear attention) and ``attn`` (the input of the output
   projection, heads merged), in the layouts of the named stages below, just before the output
   projection's stage (``attentions.0/transformer_blocks.0/attn1/to_v``,
   ``.../attn1/q``, ``k``, ``v``, ``probs``, ``attn``, ``.../attn1/to_out.0``); a name a submodule
   already has (ldm ``AttnBlock``'s ``q`` convolution) is left to the submodule.

A submodule whose stage name would be ``output`` is an error. The bundle records the mode as
metadata ``parity.trace_mode`` = ``"modules"`` (absent: the named tracers), and checks re-record
its stages the same way. Module stages are the modules' own outputs, unreshaped, plus the
attention cores of rule 7: a port records, at the end of its forward of the submodule with that
path, the tensor that submodule returns, under the name these rules give, and inside its
attention the core's tensors in the layouts rule 7 gives.

Bundles store stage ``s`` as ``parity.trace.<s>`` and the metadata ``parity.trace`` = JSON list of
the stage names in forward order (``output`` last). Every bundle also stores the float64 run's
stages (the stages of the float64 copy of the module on the same inputs), so that an intermediate
stage is judged like an output: against PyTorch's own error. Half-precision bundles store them as
``parity.trace.<s>.float64``; float32 bundles as ``parity.trace.<s>.float64_delta``, the bfloat16
rounding of ``float64 stage - float32 stage`` (``float64_delta``): the float64 stage is the stored
stage plus the delta, exact to 2^-9 of PyTorch's own error at each element, at a quarter of the
bytes of a float64 copy.

This module is the public face of the tracing half of the package ``scripts/parity/`` (see its
``__init__``): ``parity.trace_hooks`` (the hook plumbing, ``STAGES``), ``parity.trace_attention``
(the attention tracers), ``parity.tracers`` (composite blocks and ``TRACERS``),
``parity.trace_modules`` (module stages), ``parity.tracing`` (``trace_module``, ``verify_traces``)
and ``parity.files`` (``float64_delta``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPTS = str(Path(__file__).resolve().parent)
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)

from parity.files import DELTA_SUFFIX, float64_delta  # noqa: E402
from parity.trace_hooks import PROBS_MAX_ELEMENTS, STAGES  # noqa: E402
from parity.trace_modules import module_stage_name, trace_modules  # noqa: E402
from parity.tracers import TRACERS  # noqa: E402
from parity.tracing import MODULES, NAMED, TRACE_MODE_KEY, resolve_mode, trace_module, verify_traces  # noqa: E402

__all__ = [
    "PROBS_MAX_ELEMENTS",
    "DELTA_SUFFIX",
    "float64_delta",
    "STAGES",
    "TRACERS",
    "NAMED",
    "MODULES",
    "TRACE_MODE_KEY",
    "module_stage_name",
    "trace_modules",
    "resolve_mode",
    "trace_module",
    "verify_traces",
]
