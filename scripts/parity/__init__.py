"""The machinery behind ``parity_bundle.py`` and ``parity_trace.py``: writing, reading and tracing
parity bundles (format "1").

The modules, each importing only modules above it in this list (``scripts/check_imports.py`` checks
there is no cycle):

* ``run``: running a module on named inputs (``run_module``), the dtype helpers, list inputs;
* ``float64``: the float64 copy of a block (``float64_copy``: in-block float32 upcasts switched off)
  and guided-diffusion's half-precision form (``convert_convs_to_half_``);
* ``files``: the bundle file (``load_bundle``, the sorted header, ``library_versions``) and
  checkpoint files (``load_checkpoint_state_dict``, ``resolve_weights``);
* ``randomize``: ``randomize_``, deterministic random weights;
* ``trace_hooks``: the forward-hook plumbing the named stage tracers share, the stage names,
  ``float64_delta``;
* ``trace_attention``: the named tracers of attention blocks;
* ``trace_blocks``: the named tracers of feed-forwards, transformer blocks, resnets and mid blocks;
* ``tracers``: ``TRACERS``, block id -> named tracer;
* ``trace_modules``: module-path stages (``trace_modules``, ``module_stage_name``);
* ``tracing``: ``trace_module`` (either mode), ``resolve_mode``, ``verify_traces``;
* ``export``: ``export_bundle``.

Users import the public names from ``parity_bundle`` and ``parity_trace``, which re-export them;
nothing here imports those two.
"""
