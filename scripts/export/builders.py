"""The model builders in the order ``export_models.py`` runs them (``--only`` takes their names).
"""

from __future__ import annotations

from .controlnet import diffusers_controlnet, diffusers_controlnet_xs
from .diffusers_1d import diffusers_unet1d, diffusers_unet1d_rl
from .diffusers_2d import diffusers_unet2d, diffusers_vae, diffusers_vq_movq
from .diffusers_g32 import diffusers_groups32
from .diffusers_cross import (diffusers_unet2d_condition, diffusers_unet2d_condition_dual,
                              diffusers_unet2d_condition_simple_cross)
from .diffusers_video import (diffusers_i2vgen_xl, diffusers_svd_unet, diffusers_svd_vae, diffusers_unet3d,
                              diffusers_unet_motion)
from .ldm import ddpm_model_checkpoint, sd_checkpoint
from .lucidrains import lucidrains
from .openai import guided_diffusion_checkpoint
from .restated import standalone_restated


MODEL_BUILDERS = (diffusers_unet2d, diffusers_vae, diffusers_vq_movq, diffusers_unet1d, diffusers_unet1d_rl, diffusers_unet2d_condition, diffusers_unet2d_condition_simple_cross,
                  diffusers_unet2d_condition_dual, diffusers_controlnet, diffusers_controlnet_xs, diffusers_unet3d, diffusers_svd_unet,
                  diffusers_svd_vae, diffusers_unet_motion, diffusers_i2vgen_xl, lucidrains, sd_checkpoint,
                  guided_diffusion_checkpoint,
                  ddpm_model_checkpoint, standalone_restated, diffusers_groups32)
