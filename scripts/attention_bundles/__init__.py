"""The exporter behind ``scripts/export_reference.py``: the attention-block bundles in
``weights/<family>/`` (every ``FAMILIES`` folder).

The modules, each importing only modules above it in this list (``scripts/check_imports.py`` checks
there is no cycle):

* ``common``: the paths, the owned family folders, the dtype names;
* ``blocks``: a block from block id + config (``build_module``), the diffusers key forms (legacy
  names, conv-shaped weights) and ``cast_module``;
* ``inputs``: random inputs and the masks the specs use;
* ``sources``: the ``parity.source`` phrases and shared configs;
* ``half``: the float16 / bfloat16 twins (``HALF_FROM``, ``HALF_REJECTED``, ``HALF_CONVERT_TO_FP16``);
* ``specs_sd``: the Stable Diffusion family's specs (diffusers, ldm SD 1.x / 2.x, OpenAI);
* ``specs``: ``bundle_specs``, every bundle in export order;
* ``write``: writing them (``export_all``);
* ``verify``: re-checking them (``verify_all``, ``verify_file``, ``verify_half_twin``).

The modules import ``parity_bundle``, ``parity_trace``, ``reference``, ``upstream`` and
``export.common`` from ``scripts/``, which importing this package puts on ``sys.path``.
"""

import sys
from pathlib import Path

_SCRIPTS = str(Path(__file__).resolve().parent.parent)
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
