"""Faithful PyTorch re-statements of published attention blocks that are not pip packages.

Each module names the published source it re-states. The code keeps the published
semantics exactly (including quirks such as dividing by ``math.sqrt`` instead of
multiplying by a reciprocal), because the exported parity bundles are produced by
running these classes.

* ``annotated_diffusion``: ``Attention``, ``LinearAttention`` (Hugging Face blog
  "The Annotated Diffusion Model").
* ``ldm``: ``LinearAttention`` (CompVis latent-diffusion, ``ldm/modules/attention.py``).
* ``ldm_sd``: the Stable Diffusion 1.x / 2.x attention blocks (``ldm/modules/attention.py``) and
  ``AttnBlock`` (``ldm/modules/diffusionmodules/model.py``).
* ``ldm_model``: ``ResnetBlock``, ``make_attn``, ``get_timestep_embedding``
  (``ldm/modules/diffusionmodules/model.py``, the first-stage VAE / DDPM ``Model`` parts).
* ``openai``: ``AttentionBlock``, ``ResBlock``, ``TimestepEmbedSequential``, ``timestep_embedding``
  (openai/guided-diffusion ``unet.py`` / ``nn.py`` = ldm ``openaimodel.py``).
* ``mid_blocks``: not published classes but the glue for whole bottlenecks: ``LucidrainsMidBlock``
  and ``LdmMidBlock`` hold a parent model's mid submodules under the parent's attribute names
  (their parents have no mid-block class), ``openai_middle_block`` builds UNetModel's
  ``middle_block``.
* ``fastai``: ``SelfAttention``, ``SelfAttentionFused``, ``SelfAttentionMultiHead``
  (fast.ai course22p2, ``nbs/27_attention.ipynb``).
* ``textbook``: ``Self_Attention``, ``MultiHead_Attention``, ``MultiHead_Attention_DAll``
  (textbook self-attention / multi-head attention code, seed 003).
"""
