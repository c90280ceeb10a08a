"""``compare``: each case alternately with PyTorch (``bench_torch.py``) and with the Rust examples,
``--rounds`` times, every JSON line appended to ``--out``, then the Markdown table of the medians.
"""

import json
import os
import subprocess
import sys

from .attention import BLOCKS, CORE_SHAPES
from .machine import BENCH_TORCH, mkl_avx512_env
from .whole import REPO, WHOLE, ensure_whole, whole_path

BUNDLE_BIN = os.path.join(REPO, "target", "release", "examples", "bench_bundle")
SDPA_BIN = os.path.join(REPO, "target", "release", "examples", "bench_sdpa")


def case_args():
    """Every case as its ``bench_torch.py`` arguments, in table order."""
    return ([["core", *map(str, s)] for s in CORE_SHAPES] + [["block", k, str(s)] for k, s in BLOCKS]
            + [["whole", name] for name in WHOLE])


# Repetitions per run when ``compare`` is not given ``--reps``: about half a second of calls.
DEFAULT_REPS = {
    "core 1 1 4096 4096 512": 5,
    "core 1 1 16384 16384 512": 2,
    "core 2 20 1024 1024 64": 10,
    "core 2 8 64 64 160": 400,
    "core 2 8 64 77 160": 400,
    "core 4 4 256 260 32": 150,
    "core 1 4 1024 1028 32": 50,
    "block vae 64": 5,
    "block vae 128": 2,
    "block ddpm 16": 50,
    "block ddpm 32": 10,
    # whole blocks: one call took (PyTorch / ours, s, 2-core AMD EPYC without AVX-512, loaded): resnet 0.3 / 0.7,
    # ddpm 16 0.06 / 0.09, ddpm 32 0.24 / 0.30, openai 0.14 / 0.34, sd15 1.2 / 0.8, vae 64 1.8 / 2.8,
    # vae 128 7.5 / 12.5, sdxl 7.3 / 8.9 (each run adds one warm-up call)
    "whole resnet_512_64": 3,
    "whole ddpm_mid_16": 10,
    "whole ddpm_mid_32": 3,
    "whole openai_mid_256": 5,
    "whole sd15_mid": 2,
    "whole vae_mid_64": 2,
    "whole vae_mid_128": 1,
    "whole sdxl_mid": 1,
}


def compare(args):
    """``bench_torch.py compare``: time every selected case on both sides, ``args.rounds`` rounds
    each, alternating, and print the table."""
    cases = [c for c in case_args() if not args.only or args.only in " ".join(c)]
    # --device / --dtype go to both sides only where given (the Rust binaries' defaults otherwise)
    place = [x for f, v in (("--device", args.device), ("--dtype", args.dtype)) if v is not None for x in (f, v)]
    strict = ["--strict-f32"] if args.strict_f32 else []
    on_gpu = not (args.device or "cpu").startswith("cpu")
    # Whole-block bundles are written before any timing (the float64 reference runs take a while).
    for c in cases:
        if c[0] == "whole":
            ensure_whole(c[1])
    # The shim is built once; only PyTorch's runs get it.
    torch_env = mkl_avx512_env() if args.mkl_avx512 else None
    rows = {}
    for c in cases:
        extra = ["--reps", str(args.reps or (20 if on_gpu else DEFAULT_REPS.get(" ".join(c), 5))), *place]
        ours = [args.bundle_bin, whole_path(c[1])] if c[0] == "whole" else [args.rust_example, *c]
        for _ in range(args.rounds):
            for cmd, env in (([sys.executable, BENCH_TORCH, *c, *extra, *strict], torch_env), ([*ours, *extra], None)):
                run = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                line = run.stdout.strip().splitlines()[-1]
                rec = json.loads(line)
                with open(args.out, "a") as f:
                    f.write(line + "\n")
                rows.setdefault(" ".join(c), {}).setdefault(rec["impl"], []).append(rec)
                print(line, file=sys.stderr, flush=True)
    print_table(rows)


def _median(recs, field):
    xs = sorted(field(r) for r in recs)
    return xs[len(xs) // 2]


def _gpu_mem(recs):
    """Median GPU peak over the live bytes before the calls, and median peak, in MiB; ``None``
    where a record lacks them (CPU runs, or a device without a memory pool on our side)."""
    if not all(r.get("gpu_peak_mib") is not None and r.get("gpu_before_mib") is not None for r in recs):
        return None
    return (_median(recs, lambda r: r["gpu_peak_mib"] - r["gpu_before_mib"]), _median(recs, lambda r: r["gpu_peak_mib"]))


def print_table(rows):
    """The Markdown table: per case, the medians (over every repetition of every round) and the
    fastest calls of both sides, their peak resident set over the one before the first call, and
    the inputs' and outputs' size; on a GPU also both sides' GPU memory: the peak over the live
    bytes before the calls, and the peak itself (block, inputs and all). ``rows``: case -> impl
    (``torch`` / ``candle``) -> JSON records."""
    gpu = any(r.get("gpu_peak_mib") is not None for by in rows.values() for recs in by.values() for r in recs)
    extra_head = " GPU peak − before, PyTorch / ours (MiB) | GPU peak, PyTorch / ours (MiB) |" if gpu else ""
    print("| case | PyTorch ms | ours ms | speed ours/PyTorch | fastest call PyTorch / ours (ms) | PyTorch peak RSS − before (MiB) | ours peak RSS − before (MiB) | inputs+output (MiB) |" + extra_head)
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if gpu else ""))
    for key, by in rows.items():
        t_ms = sorted(x for r in by["torch"] for x in r["ms"])
        o_ms = sorted(x for r in by["candle"] for x in r["ms"])
        tm, om = t_ms[len(t_ms) // 2], o_ms[len(o_ms) // 2]
        tmem = _median(by["torch"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        omem = _median(by["candle"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        fastest = f"{t_ms[0]:.2f} / {o_ms[0]:.2f}"
        extra = ""
        if gpu:
            tg, og = _gpu_mem(by["torch"]), _gpu_mem(by["candle"])
            show = lambda i: f"{tg[i]:.0f} / {og[i]:.0f}" if tg and og else "n/a"  # noqa: E731
            extra = f" {show(0)} | {show(1)} |"
        print(f"| {by['torch'][0]['case']} | {tm:.2f} | {om:.2f} | {tm / om:.2f} | {fastest} | {tmem:.0f} | {omem:.0f} | {by['torch'][0]['io_mib']:.1f} |" + extra)
