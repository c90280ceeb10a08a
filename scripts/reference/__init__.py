"""Faithful PyTorch re-statements of published attention blocks that no package ships.

Each module names the published source it re-states and says why it is not imported instead (the
SD 2.x ldm tree and OpenAI's guided_diffusion are packages: ``scripts/upstream.py``). The code keeps the published
semantics exactly (including quirks such as dividing by ``math.sqrt`` instead of
multiplying by a reciprocal), because the exported parity bundles are produced by
running these classes.

* ``annotated_diffusion``: ``Attention``, ``LinearAttention`` (Hugging Face blog
  "The Annotated Diffusion Model").
* ``ldm``: ``LinearAttention`` (CompVis latent-diffusion, ``ldm/modules/attention.py``).
* ``ldm_sd1``: the Stable Diffusion 1.x ``CrossAttention``, ``BasicTransformerBlock``,
  ``SpatialTransformer`` (CompVis latent-diffusion ``ldm/modules/attention.py``; the SD 2.x tree
  changed them).
* ``mid_blocks``: not published classes but the glue for whole bottlenecks: ``LucidrainsMidBlock``
  and ``LdmMidBlock`` hold a parent model's mid submodules under the parent's attribute names
  (their parents have no mid-block class), ``openai_middle_block`` builds UNetModel's
  ``middle_block`` from the published classes.
* ``fastai``: ``SelfAttention``, ``SelfAttentionFused``, ``SelfAttentionMultiHead``
  (fast.ai course22p2, ``nbs/27_attention.ipynb``).
* ``textbook``: ``Self_Attention``, ``MultiHead_Attention``, ``MultiHead_Attention_DAll``
  (textbook self-attention / multi-head attention code, seed 003).
"""
