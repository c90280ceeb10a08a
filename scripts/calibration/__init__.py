"""Calibration data for the Rust checker's pass rule: thousands of freshly generated, honest
parity bundles over every block family of the project (``templates``), with random weights,
sizes, dtypes and input conditions (``inputs``), each with the same module's outputs under
planted bugs (``bugs``), written and logged by ``generate``. The command line is
``scripts/calibrate_bundles.py``. Nothing here is committed data: the bundles go to a folder
outside ``weights/``.
"""
