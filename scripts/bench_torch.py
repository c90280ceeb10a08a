#!/usr/bin/env python3
"""PyTorch timings and peak memory for the cases of ``crates/attention/examples/bench_sdpa.rs``.

    python scripts/bench_torch.py core 1 1 4096 4096 512 [--reps 5] [--warmup 1]
    python scripts/bench_torch.py block vae 128
    python scripts/bench_torch.py block ddpm 32
    python scripts/bench_torch.py all [--reps 5]      # every case, one subprocess each
    python scripts/bench_torch.py compare RUST_EXAMPLE [--rounds 5] [--reps N] [--only SUBSTR] [--out FILE] [--mkl-avx512]

``compare`` runs each case alternately here and with the Rust example binary
(``target/release/examples/bench_sdpa``), ``--rounds`` times each, so both see the same machine
load; it appends every JSON line to ``--out`` (default ``bench_results.jsonl``) and prints a
Markdown table of the medians (and minima) over all repetitions of all rounds. Without
``--reps``, each case gets enough repetitions for about half a second per run (sub-millisecond
cases swing by tens of percent over a handful of calls on a shared machine).

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
"""

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MKL_SHIM = """
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
"""
MKL_MARK = "UNET_BENCH_MKL_AVX512"


def mkl_avx512_env():
    """The environment with the MKL vendor-check shim preloaded (compiled into a temporary
    folder; the caller's environment if it already has it)."""
    if os.environ.get(MKL_MARK) == "1":
        return dict(os.environ)
    tmp = tempfile.mkdtemp(prefix="mkl_shim_")
    src, lib = os.path.join(tmp, "shim.c"), os.path.join(tmp, "libmkl_intel_cpu.so")
    with open(src, "w") as f:
        f.write(MKL_SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", lib, src], check=True)
    return dict(os.environ, LD_PRELOAD=lib, **{MKL_MARK: "1"})


def mkl_avx512_reexec(args):
    """Re-run this script with the shim preloaded, unless it already is."""
    if os.environ.get(MKL_MARK) != "1":
        os.execve(sys.executable, [sys.executable, __file__, *args], mkl_avx512_env())


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"

CORE_SHAPES = [
    (1, 1, 4096, 4096, 512),
    (1, 1, 16384, 16384, 512),
    (2, 20, 1024, 1024, 64),
    (2, 8, 64, 64, 160),
    (2, 8, 64, 77, 160),
    (4, 4, 256, 260, 32),
    (1, 4, 1024, 1028, 32),
]
BLOCKS = [("vae", 64), ("vae", 128), ("ddpm", 16), ("ddpm", 32)]


def rss_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


def opt(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def one(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    torch.manual_seed(0)
    reps, warmup = opt(args, "--reps", 5), opt(args, "--warmup", 1)
    if args[0] == "core":
        b, h, lq, lk, d = (int(x) for x in args[1:6])
        q = torch.randn(b, h, lq, d)
        k = torch.randn(b, h, lk, d)
        v = torch.randn(b, h, lk, d)
        case = f"sdpa {(b, h, lq, lk, d)}"
        io = 4 * b * h * d * (2 * lq + 2 * lk)

        def run():
            return F.scaled_dot_product_attention(q, k, v)

    else:
        kind, side = args[1], int(args[2])
        if kind == "vae":
            from diffusers.models.attention_processor import Attention

            block = Attention(
                512, heads=1, dim_head=512, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=32,
                spatial_norm_dim=None, residual_connection=True, bias=True, upcast_softmax=True,
                _from_deprecated_attn_block=True,
            )
            case = f"diffusers.Attention vae_mid {side}x{side}"
        else:
            from denoising_diffusion_pytorch.denoising_diffusion_pytorch import Attention

            block = Attention(512, heads=4, dim_head=32, num_mem_kv=4, flash=False)
            case = f"denoising_diffusion_pytorch.Attention mid {side}x{side}"
        block.eval()
        x = torch.randn(1, 512, side, side)
        io = 2 * 4 * x.numel()

        def run():
            return block(x)

    with torch.inference_mode():
        rss_before = rss_mib("VmRSS:")
        for _ in range(warmup):
            run()
        ms = []
        for _ in range(reps):
            t = time.perf_counter()
            out = run()
            ms.append((time.perf_counter() - t) * 1e3)
            del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "impl": "torch", "case": case, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": cpu_model(), "mkl_avx512": os.environ.get(MKL_MARK) == "1",
        "ms": [round(x, 2) for x in ms], "median_ms": round(sorted(ms)[len(ms) // 2], 2),
        "rss_before_mib": round(rss_before, 1), "peak_rss_mib": round(peak, 1), "io_mib": round(io / 2**20, 1),
    }), flush=True)


def case_args():
    return [["core", *map(str, s)] for s in CORE_SHAPES] + [["block", k, str(s)] for k, s in BLOCKS]


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
}


def compare(args):
    binary = args[0]
    rounds = opt(args, "--rounds", 5)
    reps = opt(args, "--reps", 0)
    only = args[args.index("--only") + 1] if "--only" in args else None
    out = args[args.index("--out") + 1] if "--out" in args else "bench_results.jsonl"
    # The shim is built once; only PyTorch's runs get it.
    torch_env = mkl_avx512_env() if "--mkl-avx512" in args else None
    rows = {}
    for c in case_args():
        if only and only not in " ".join(c):
            continue
        extra = ["--reps", str(reps or DEFAULT_REPS.get(" ".join(c), 5))]
        for _ in range(rounds):
            for cmd, env in (([sys.executable, __file__, *c, *extra], torch_env), ([binary, *c, *extra], None)):
                run = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                line = run.stdout.strip().splitlines()[-1]
                rec = json.loads(line)
                with open(out, "a") as f:
                    f.write(line + "\n")
                rows.setdefault(" ".join(c), {}).setdefault(rec["impl"], []).append(rec)
                print(line, file=sys.stderr, flush=True)
    print("| case | PyTorch ms | ours ms | speed ours/PyTorch | fastest call PyTorch / ours (ms) | PyTorch peak RSS − before (MiB) | ours peak RSS − before (MiB) | inputs+output (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, by in rows.items():
        def med(recs, f):
            xs = sorted(f(r) for r in recs)
            return xs[len(xs) // 2]
        t_ms = sorted(x for r in by["torch"] for x in r["ms"])
        o_ms = sorted(x for r in by["candle"] for x in r["ms"])
        tm, om = t_ms[len(t_ms) // 2], o_ms[len(o_ms) // 2]
        tmem = med(by["torch"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        omem = med(by["candle"], lambda r: r["peak_rss_mib"] - r["rss_before_mib"])
        fastest = f"{t_ms[0]:.2f} / {o_ms[0]:.2f}"
        print(f"| {by['torch'][0]['case']} | {tm:.2f} | {om:.2f} | {tm / om:.2f} | {fastest} | {tmem:.0f} | {omem:.0f} | {by['torch'][0]['io_mib']:.1f} |")


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    if "--mkl-avx512" in args and args[0] != "compare":
        mkl_avx512_reexec(args)
    if args[0] == "compare":
        compare(args[1:])
        return
    if args[0] != "all":
        one(args)
        return
    extra = args[1:]
    for c in case_args():
        subprocess.run([sys.executable, __file__, *c, *extra], check=True)


if __name__ == "__main__":
    main()
