#!/usr/bin/env python3
"""PyTorch timings and peak memory for the cases of ``crates/attention/examples/bench_sdpa.rs``.

    python scripts/bench_torch.py core 1 1 4096 4096 512 [--reps 5] [--warmup 1]
    python scripts/bench_torch.py block vae 128
    python scripts/bench_torch.py block ddpm 32
    python scripts/bench_torch.py whole vae_mid_64 [--reps 5]   # a whole block on its bundle (see below)
    python scripts/bench_torch.py export vae_mid_64             # only write the bundle of a whole-block case
    python scripts/bench_torch.py all [--reps 5]      # every case, one subprocess each
    python scripts/bench_torch.py compare [RUST_EXAMPLE] [--bundle-bin BIN] [--rounds 5] [--reps N] [--only SUBSTR] [--out FILE] [--mkl-avx512]
    python scripts/bench_torch.py SUBCOMMAND --help             # each subcommand's options (argparse)

Unknown options, missing values and unknown case names are errors (exit status 2).

``compare`` runs each case alternately here and with the Rust example binary
(``target/release/examples/bench_sdpa``), ``--rounds`` times each, so both see the same machine
load; it appends every JSON line to ``--out`` (default ``bench_results.jsonl``) and prints a
Markdown table of the medians (and minima) over all repetitions of all rounds. Without
``--reps``, each case gets enough repetitions for about half a second per run (sub-millisecond
cases swing by tens of percent over a handful of calls on a shared machine).

**Whole blocks** (``whole NAME``, names in ``WHOLE``): a real mid block (or ResnetBlock2D) at a
real model's size, with random weights (``parity_bundle.randomize_``: weights ~ N(0, 1/fan_in),
norm weights near 1). The first use writes it as a parity bundle to
``target/bench_blocks/NAME.safetensors`` (``export_bundle``: the block id and config the repo's
exporters use, PyTorch's float32 and float64 outputs, metadata ``bench.case``), in a separate
process; every run then rebuilds the module from that bundle alone (``export_models.build_module``
+ its state dict) and runs it on the bundle's inputs, so PyTorch and ours
(``target/release/examples/bench_bundle BUNDLE``, from ``crates/parity/examples/bench_bundle.rs``)
run the very same numbers. After loading, both reset the peak resident set (``/proc/self/clear_refs``
5), so ``peak_rss_mib`` is the peak of the calls, not of reading the bundle; both also report
``max_abs_vs_f64`` (their last call's max |output − the bundle's float64 output|). ``compare``
exports every selected bundle before the timing rounds start and runs ours with ``--bundle-bin``
(default ``target/release/examples/bench_bundle``); ``RUST_EXAMPLE`` (default
``target/release/examples/bench_sdpa``) runs the other cases.

``--device cuda[:N]`` and ``--dtype f32|f16|bf16`` (core, block, whole, compare; default the CPU
and float32): run on that device in that dtype. Every timed call then ends with
``torch.cuda.synchronize()``, and the JSON adds ``device``, ``dtype``, ``gpu`` (its name),
``gpu_before_mib`` and ``gpu_peak_mib`` (``torch.cuda.memory_allocated`` before the first call and
``max_memory_allocated`` over the calls), ``tf32_convs`` and ``tf32_matmuls`` (PyTorch's defaults:
cuDNN convolutions in TF32, matmuls not; ``--strict-f32`` turns both off, so that its float32 is
float32 as ours is). ``compare`` passes both flags to the Rust binaries
(``bench_sdpa``/``bench_bundle``, built with ``--features cuda``), and, on a GPU, runs 20
repetitions per case unless ``--reps`` says otherwise. Whole-block bundles are still exported on
the CPU (float32 and float64) and moved after loading.

``--mkl-avx512`` (any command): run PyTorch with MKL's Intel code paths on a non-Intel CPU. MKL
picks its kernels by CPU vendor, and on AMD processors with AVX-512 (Zen 4/5) it runs its AVX2
kernels, about half the FLOP rate (a 4096×512×4096 sgemm on one Zen 5 core: 99 GFLOP/s stock,
191 with this flag). The flag compiles a two-function shim (``mkl_serv_intel_cpu_true`` returning
1; needs ``cc``) and re-runs the script with it in ``LD_PRELOAD``; the JSON records
``"mkl_avx512": true``. Stock PyTorch is what users get; the flag shows PyTorch's best kernels on
the same hardware.

One case per process, so ``ru_maxrss`` is that case's peak resident set. Prints one JSON line per
case, the same fields as the Rust example: times per repetition after the warm-up, median, RSS
before the first call (inputs and weights built) and peak. ``torch.set_num_threads(2)``, no
autograd (``torch.inference_mode``), float32, CPU. The core case is
``F.scaled_dot_product_attention`` (torch's CPU flash kernel for these shapes); the blocks are
the real library classes with random weights.

This file is the command line; the cases live in the package ``scripts/bench/`` (see its
``__init__``): ``bench.attention`` (core, block), ``bench.whole`` (whole, export), ``bench.compare``
and ``bench.machine`` (the MKL shim, ``Timer``, ``--device`` / ``--dtype``).
"""

import argparse
import subprocess
import sys

from bench.attention import BLOCKS, CORE_SHAPES, one
from bench.compare import BUNDLE_BIN, DEFAULT_REPS, SDPA_BIN, case_args, compare
from bench.machine import MKL_MARK, mkl_avx512_env, mkl_avx512_reexec
from bench.whole import WHOLE, build_whole, ensure_whole, export_whole, load_whole, time_whole, whole_path

__all__ = ["BLOCKS", "CORE_SHAPES", "one", "BUNDLE_BIN", "DEFAULT_REPS", "SDPA_BIN", "case_args", "compare",
           "MKL_MARK", "mkl_avx512_env", "mkl_avx512_reexec", "WHOLE", "build_whole", "ensure_whole", "export_whole",
           "load_whole", "time_whole", "whole_path", "run_options", "parser", "main"]


def run_options(device_default="cpu", dtype_default="f32", reps_default=5, warmup=True):
    """The options shared by the subcommands that run PyTorch (a parent parser)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--reps", type=int, default=reps_default, metavar="N",
                   help=f"timed repetitions after the warm-up (default {reps_default})")
    if warmup:
        p.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls first (default 1)")
    p.add_argument("--device", default=device_default, metavar="DEV",
                   help=f"cpu or cuda[:N] (default {device_default or 'the CPU'})")
    p.add_argument("--dtype", default=dtype_default, choices=("f32", "f16", "bf16"),
                   help=f"(default {dtype_default or 'f32'})")
    p.add_argument("--strict-f32", action="store_true", help="TF32 off in cuDNN and cuBLAS")
    p.add_argument("--mkl-avx512", action="store_true", help="run PyTorch with MKL's Intel code paths forced")
    return p


def parser():
    ap = argparse.ArgumentParser(prog="bench_torch.py", description=__doc__.split("\n\n", 1)[0],
                                 epilog="See the module docstring (python -c 'import bench_torch; help(bench_torch)')"
                                 " for the JSON fields.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = run_options()

    core = sub.add_parser("core", parents=[run], help="F.scaled_dot_product_attention on one shape",
                          description="Time F.scaled_dot_product_attention on q (B, H, LQ, D), k and v (B, H, LK, D).")
    for name in ("b", "h", "lq", "lk", "d"):
        core.add_argument(name, type=int, metavar=name.upper())

    block = sub.add_parser("block", parents=[run], help="a real library attention block at 512 channels",
                           description="Time diffusers' Attention (vae) or denoising_diffusion_pytorch's Attention "
                           "(ddpm) on a (1, 512, SIDE, SIDE) input.")
    block.add_argument("kind", choices=("vae", "ddpm"))
    block.add_argument("side", type=int)

    whole = sub.add_parser("whole", parents=[run], help="a whole block on its bundle (exported first if missing)",
                           description="Time a whole block rebuilt from its bundle in target/bench_blocks/.")
    whole.add_argument("name", choices=list(WHOLE))

    export = sub.add_parser("export", help="only write the bundle of a whole-block case",
                            description="Write target/bench_blocks/NAME.safetensors (float32 and float64 runs).")
    export.add_argument("name", choices=list(WHOLE))
    export.add_argument("--mkl-avx512", action="store_true", help="accepted for symmetry (the export ignores it)")

    sub.add_parser("all", parents=[run], help="every case, one subprocess each (the options go to each)",
                   description="Run every core, block and whole case, one subprocess each, with these options.")

    cmp = sub.add_parser("compare", help="alternate PyTorch and the Rust examples, print the Markdown table",
                         description="Run each case alternately here and with the Rust example binaries, append "
                         "every JSON line to --out and print a Markdown table of the medians.")
    cmp.add_argument("rust_example", nargs="?", default=SDPA_BIN, metavar="RUST_EXAMPLE",
                     help="the bench_sdpa binary (default target/release/examples/bench_sdpa)")
    cmp.add_argument("--bundle-bin", default=BUNDLE_BIN, metavar="BIN",
                     help="the bench_bundle binary (default target/release/examples/bench_bundle)")
    cmp.add_argument("--rounds", type=int, default=5, metavar="N", help="rounds per case (default 5)")
    cmp.add_argument("--reps", type=int, default=0, metavar="N",
                     help="repetitions per run (default: about half a second of calls; 20 on a GPU)")
    cmp.add_argument("--only", metavar="SUBSTR", help="only the cases whose command line contains SUBSTR")
    cmp.add_argument("--out", default="bench_results.jsonl", metavar="FILE",
                     help="JSON lines appended here (default bench_results.jsonl)")
    cmp.add_argument("--device", default=None, metavar="DEV", help="passed to both sides (default the CPU)")
    cmp.add_argument("--dtype", default=None, choices=("f32", "f16", "bf16"), help="passed to both sides (default f32)")
    cmp.add_argument("--strict-f32", action="store_true", help="TF32 off in PyTorch's runs")
    cmp.add_argument("--mkl-avx512", action="store_true", help="PyTorch's runs with MKL's Intel code paths forced")
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.exit(__doc__)
    args = parser().parse_args(argv)
    if args.mkl_avx512 and args.command != "compare":
        mkl_avx512_reexec(argv)
    if args.command == "compare":
        compare(args)
    elif args.command == "export":
        export_whole(args.name)
    elif args.command == "whole":
        time_whole(args)
    elif args.command == "all":
        for c in case_args():
            subprocess.run([sys.executable, __file__, *c, *argv[1:]], check=True)
    else:
        one(args)


if __name__ == "__main__":
    main()
