"""What every timed case shares: the MKL vendor-check shim (``--mkl-avx512``), the CPU's name,
resident-set readings, the device and dtype of ``--device`` / ``--dtype`` and ``Timer`` (wall-clock
milliseconds, GPU queue drained, GPU memory fields).
"""

import os
import subprocess
import sys
import tempfile
import time

# the command line every subprocess of the benchmark runs (``python bench_torch.py ...``)
BENCH_TORCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench_torch.py")

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
    """Re-run ``bench_torch.py`` with these arguments and the shim preloaded, unless it already is."""
    if os.environ.get(MKL_MARK) != "1":
        os.execve(sys.executable, [sys.executable, BENCH_TORCH, *args], mkl_avx512_env())


def cpu_model():
    """The CPU's model name (``/proc/cpuinfo``), or ``"unknown"``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def rss_mib(key):
    """A ``/proc/self/status`` reading (``VmRSS:``, ``VmHWM:``) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")



def reset_peak_rss():
    """Reset ``VmHWM`` (Linux: ``/proc/self/clear_refs`` 5); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False



def placement(args):
    """``(device, dtype)`` from ``--device`` / ``--dtype``; ``--strict-f32`` turns TF32 off in cuDNN
    (PyTorch's default lets its float32 convolutions run in TF32) and cuBLAS."""
    import torch

    if args.strict_f32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    return torch.device(args.device), dtypes[args.dtype]


class Timer:
    """Wall-clock milliseconds of a call, with the GPU's queue drained after it; the GPU memory
    fields of the JSON line."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()

    def time(self, run):
        if self.cuda:
            self.torch.cuda.synchronize()
        t = time.perf_counter()
        out = run()
        if self.cuda:
            self.torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3, out

    def fields(self, args):
        if not self.cuda:
            return {}
        cuda = self.torch.cuda
        free, total = cuda.mem_get_info()
        return {"device": args.device, "dtype": args.dtype,
                "tf32_convs": self.torch.backends.cudnn.allow_tf32,
                "tf32_matmuls": self.torch.backends.cuda.matmul.allow_tf32,
                "gpu": cuda.get_device_name(), "gpu_before_mib": round(self.before / 2**20, 1),
                "gpu_peak_mib": round(cuda.max_memory_allocated() / 2**20, 1),
                "gpu_device_used_mib": round((total - free) / 2**20, 1)}
