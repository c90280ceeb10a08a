#!/usr/bin/env bash
# A user's own whole model, checked: a diffusers U-Net folder whose config is in no other committed
# folder (its own block types, widths, head widths, transformer depths, linear projections,
# upcast attention) and an unconditional UNet2DModel of its own, saved with diffusers'
# save_pretrained from a seeded random initialisation, then exported with the user's command,
# `scripts/export_own.py FOLDER --whole`, into weights/own/whole/ (committed: `check weights`
# runs them in every CI lane).
#
#   bash scripts/own_whole_example.sh            # needs the Python of scripts/requirements.txt
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
out=weights/own/whole
"$python" - <<'PY'
import torch
from diffusers import UNet2DConditionModel, UNet2DModel

torch.manual_seed(57)
UNet2DConditionModel(
    sample_size=16, in_channels=4, out_channels=4,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(16, 24), layers_per_block=1, norm_num_groups=8,
    attention_head_dim=(2, 3), transformer_layers_per_block=(1, 2), cross_attention_dim=20,
    use_linear_projection=True, upcast_attention=True,
).save_pretrained("weights/own/whole/unseen_unet")
torch.manual_seed(58)
UNet2DModel(
    sample_size=16, in_channels=3, out_channels=3,
    down_block_types=("AttnDownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D", "AttnUpBlock2D"),
    block_out_channels=(8, 12, 16), layers_per_block=1, norm_num_groups=4, attention_head_dim=4,
    resnet_time_scale_shift="scale_shift", attn_norm_num_groups=2,
).save_pretrained("weights/own/whole/unseen_unet2d")
PY
"$python" scripts/export_own.py "$out/unseen_unet" --whole --dtype bf16 --out "$out" --tokens 5 --timestep 321.5 --batch 1 --size 4 6
"$python" scripts/export_own.py "$out/unseen_unet2d" --whole --dtype f16 --out "$out" --timestep 250 --batch 1 --size 4 8
