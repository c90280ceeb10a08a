"""The cases behind ``scripts/bench_torch.py`` (its command line and JSON fields are documented
there).

The modules, each importing only modules above it in this list (``scripts/check_imports.py`` checks
there is no cycle):

* ``machine``: what every timed case shares: the MKL vendor-check shim (``--mkl-avx512``), the CPU's
  name, resident-set readings, ``--device`` / ``--dtype`` (``placement``) and ``Timer``;
* ``attention``: the ``core`` (``F.scaled_dot_product_attention``) and ``block`` (one attention
  block at 512 channels) cases;
* ``whole``: the whole-block cases (``WHOLE``): their bundles in ``target/bench_blocks/``, written
  and timed;
* ``compare``: every case alternately here and with the Rust examples, and the Markdown table.

Nothing here imports torch at module level: ``--mkl-avx512`` re-runs ``bench_torch.py`` with the
shim preloaded before torch loads.
"""
