"""The exporters behind ``scripts/export_models.py``, one module per source family.

``common`` (paths, ``capture``, ``Ctx``), ``blocks`` (``build_module``: a block from block id +
config), ``configs`` (the kwargs diffusers parents pass their mid blocks), the builders of the
whole models and their mid-block bundles (``diffusers_2d``, ``diffusers_cross``, ``diffusers_1d``,
``diffusers_video``, ``diffusers_g32``, ``controlnet``, ``lucidrains``, ``ldm``, ``openai``, ``restated``), their run
order (``builders``), writing the bundles (``bundles``) and re-checking them (``verify``).

Imports only go down that list (``scripts/check_imports.py`` checks there is no cycle); the
modules import ``parity_bundle``, ``parity_trace``, ``reference`` and ``upstream`` from
``scripts/``, which importing this package puts on ``sys.path``.
"""

import sys
from pathlib import Path

_SCRIPTS = str(Path(__file__).resolve().parent.parent)
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
