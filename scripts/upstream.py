"""The published packages the ldm (SD 2.x) and OpenAI blocks are taken from, imported once.

* ``stable-diffusion-sdkit`` 2.1.5 ships the ``ldm`` tree of Stability-AI/stablediffusion (SD 2.x)
  unchanged: ``ldm.modules.attention`` (``CrossAttention``, ``BasicTransformerBlock``,
  ``SpatialTransformer``, ``SpatialSelfAttention``), ``ldm.modules.diffusionmodules.model``
  (``ResnetBlock``, ``AttnBlock``, ``make_attn``, ``Model``, ``Encoder``, ``Decoder``) and
  ``.openaimodel`` (``UNetModel``, ``ResBlock``, ``TimestepEmbedSequential``, ...).
* ``guided-diffusion-sdk`` 1.0.0 ships openai/guided-diffusion's ``guided_diffusion`` package. Its
  ``unet.py`` and ``nn.py`` differ from the repository's HEAD in gradient checkpointing only:
  ``AttentionBlock.forward`` passes ``self.use_checkpoint`` where the repository passes ``True``,
  and ``CheckpointFunction`` saves its inputs with ``save_for_backward`` under
  ``torch.cuda.amp.custom_fwd``. Both run the same forward under ``torch.no_grad()``.

Both are installed with ``pip install --no-deps`` (``scripts/requirements-nodeps.txt``: their
own pins are years old); ``openaimodel.UNetModel`` imports ``omegaconf`` when given a
``context_dim``.

Importing here keeps the exporters' output readable: ``ldm.modules.diffusionmodules.model`` prints a
line when xformers is missing and ``make_attn`` prints one per block; guided-diffusion's ``nn.py``
raises a FutureWarning for ``torch.cuda.amp.custom_fwd``. xformers must be absent, so that SD 2.x's
``BasicTransformerBlock`` builds the plain ``CrossAttention`` ("softmax" mode) and ``make_attn``'s
"vanilla" is ``AttnBlock``: that is checked at import.
"""

import contextlib
import io
import warnings

with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from guided_diffusion import unet as gd_unet  # noqa: F401
    from ldm.modules import attention as ldm_attention
    from ldm.modules.diffusionmodules import model as ldm_model
    from ldm.modules.diffusionmodules import openaimodel as ldm_openaimodel  # noqa: F401

if ldm_attention.XFORMERS_IS_AVAILBLE or ldm_model.XFORMERS_IS_AVAILBLE:
    raise ImportError("xformers is installed: SD 2.x's ldm tree would build its xformers attention classes, "
                      "which the parity bundles do not describe; export from an environment without xformers")

# distribution names of the packages above (parity.source lists their versions)
DISTRIBUTIONS = {"ldm": "stable-diffusion-sdkit", "guided_diffusion": "guided-diffusion-sdk"}


def quietly(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its prints dropped (``make_attn``, ``Encoder``, ``Decoder`` print)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)
