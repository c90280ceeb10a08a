"""Faithful PyTorch re-statements of published attention blocks that are not pip packages.

Each module names the published source it re-states. The code keeps the published
semantics exactly (including quirks such as dividing by ``math.sqrt`` instead of
multiplying by a reciprocal), because the exported parity bundles are produced by
running these classes.

* ``annotated_diffusion``: ``Attention``, ``LinearAttention`` (Hugging Face blog
  "The Annotated Diffusion Model").
* ``ldm``: ``LinearAttention`` (CompVis latent-diffusion, ``ldm/modules/attention.py``).
* ``fastai``: ``SelfAttention``, ``SelfAttentionFused``, ``SelfAttentionMultiHead``
  (fast.ai course22p2, ``nbs/27_attention.ipynb``).
* ``textbook``: ``Self_Attention``, ``MultiHead_Attention``, ``MultiHead_Attention_DAll``
  (textbook self-attention / multi-head attention code, seed 003).
"""
