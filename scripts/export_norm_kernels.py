#!/usr/bin/env python3
"""PyTorch's own GroupNorm and LayerNorm outputs on small fixed inputs, for the test that our CPU
norm kernels reproduce PyTorch's CPU kernels bit for bit
(``crates/attention/tests/attention/norm_kernels.rs``; not a parity bundle: no float64 twin).

    python scripts/export_norm_kernels.py                  # crates/attention/tests/data/norm_kernels.safetensors
    python scripts/export_norm_kernels.py --random 400 --seed 7 --out /tmp/norm_random.safetensors

PyTorch's CPU GroupNorm has two kernels, picked by the input's memory format: a contiguous input
takes ``RowwiseMoments`` (a cascaded Welford), a ``torch.channels_last`` one sums ``x`` and ``x²``
in float32 and takes ``E[x²] − mean²`` (which loses the variance when ``|mean| ≫ std``). Each case
is ``F.group_norm`` (or ``F.layer_norm``) of an input with offset and outlier channels, in the
memory format named, with ``torch.set_num_threads(1)`` as every exporter runs. Stored per case
``NAME.x`` (always contiguous NCHW: the layout is the case's ``format``), ``NAME.weight``,
``NAME.bias``, ``NAME.y`` (PyTorch's output) and ``NAME.mean`` / ``NAME.rstd`` (``native_group_norm``
/ ``native_layer_norm``'s float32 statistics); the metadata ``cases`` lists each case's op, dtype,
groups, eps and format. ``--random N`` writes N random cases instead (the bit-identity
measurement, ``UNET_ATTENTION_NORM_CASES=FILE cargo test ... norm_kernels -- --ignored``).
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from parity.files import write_bundle  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "crates", "attention", "tests", "data", "norm_kernels.safetensors")
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# (name, op, dtype, shape, groups, format, offset of channel 1 in std, scale of channel 3)
FIXED = (
    ("gn_contig_d4_tail", "group_norm", "f32", (2, 32, 5, 7), 8, "contiguous", 300.0, 40.0),
    ("gn_contig_d16_cascade", "group_norm", "f32", (1, 16, 8, 10), 1, "contiguous", 1000.0, 1.0),
    ("gn_contig_d3", "group_norm", "f32", (2, 24, 5, 7), 8, "contiguous", 50.0, 30.0),
    ("gn_cl_d4", "group_norm", "f32", (2, 32, 5, 7), 8, "channels_last", 300.0, 40.0),
    ("gn_cl_d12_offset", "group_norm", "f32", (1, 96, 4, 5), 8, "channels_last", 542.0, 1.0),
    ("gn_cl_d7", "group_norm", "f32", (1, 14, 11, 13), 2, "channels_last", 20.0, 5.0),
    ("gn_cl_large_d5", "group_norm", "f32", (1, 5, 32, 32), 1, "channels_last", 1000.0, 3.0),
    ("gn_cl_large_d2_batch2", "group_norm", "f32", (2, 2, 32, 32), 1, "channels_last", 200.0, 1.0),
    ("gn_contig_f16", "group_norm", "f16", (2, 32, 9, 7), 8, "contiguous", 30.0, 4.0),
    ("gn_cl_f16_d16", "group_norm", "f16", (2, 48, 5, 6), 3, "channels_last", 30.0, 4.0),
    ("gn_cl_bf16_large", "group_norm", "bf16", (1, 4, 32, 32), 1, "channels_last", 20.0, 1.0),
    ("gn_contig_bf16", "group_norm", "bf16", (1, 64, 8, 8), 32, "contiguous", 10.0, 1.0),
    ("ln_flat", "layer_norm", "f32", (3, 9, 24), 0, "flat", 0.0, 0.0),
    ("ln_offset", "layer_norm", "f32", (2, 17, 20), 0, "contiguous", 50.0, 1.0),
    ("ln_long", "layer_norm", "f32", (1, 3, 1280), 0, "contiguous", 3.0, 1.0),
    ("ln_no_affine", "layer_norm", "f32", (4, 3, 77), 0, "contiguous", 9.0, 1.0),
    ("ln_f16", "layer_norm", "f16", (3, 3, 320), 0, "contiguous", 2.0, 1.0),
    ("ln_bf16", "layer_norm", "bf16", (2, 9, 40), 0, "contiguous", 2.0, 1.0),
)


def make_case(gen, name, op, dtype, shape, groups, fmt, offset, scale):
    dt = DTYPES[dtype]
    x = torch.randn(*shape, generator=gen)
    if fmt == "flat":
        x = 1.1 * (1 + 4e-5 * x)
    elif op == "group_norm":
        x[:, min(1, shape[1] - 1)] += offset
        x[:, min(3, shape[1] - 1)] *= scale
    else:
        x += offset
        x[..., min(3, shape[-1] - 1)] *= scale
    c = shape[1] if op == "group_norm" else shape[-1]
    weight = 1 + 0.3 * torch.randn(c, generator=gen)
    bias = 0.3 * torch.randn(c, generator=gen)
    x, w, b = x.to(dt), weight.to(dt), bias.to(dt)
    tensors = {"x": x.contiguous(), "weight": w, "bias": b}
    eps = 1e-5 if op == "layer_norm" else 1e-6
    if op == "group_norm":
        xin = x.contiguous(memory_format=torch.channels_last) if fmt == "channels_last" else x
        tensors["y"] = F.group_norm(xin, groups, w, b, eps).contiguous()
        n, hw = shape[0], x[0, 0].numel()
        # float32 parameters: the same kernel, float32 statistics out (a half run writes them in half).
        _, mean, rstd = torch.native_group_norm(xin, w.float(), b.float(), n, c, hw, groups, eps)
    elif name == "ln_no_affine":
        tensors = {"x": x.contiguous()}
        tensors["y"] = F.layer_norm(x, (c,), None, None, eps)
        _, mean, rstd = torch.native_layer_norm(x, (c,), None, None, eps)
    else:
        tensors["y"] = F.layer_norm(x, (c,), w, b, eps)
        _, mean, rstd = torch.native_layer_norm(x, (c,), w, b, eps)
    tensors["mean"], tensors["rstd"] = mean.float().reshape(-1), rstd.float().reshape(-1)
    meta = {"name": name, "op": op, "dtype": dtype, "groups": groups, "eps": eps,
            "format": "channels_last" if fmt == "channels_last" else "contiguous"}
    return {f"{name}.{k}": v.contiguous() for k, v in tensors.items()}, meta


def random_cases(gen, count):
    for i in range(count):
        r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
        dtype = ["f32", "f32", "f32", "f16", "bf16"][r(0, 4)]
        if r(0, 3) == 0:
            shape = (r(1, 4), r(1, 40), r(1, 700))
            yield (f"r{i}", "layer_norm", dtype, shape, 0, "contiguous", [0, 3, 50, 1000][r(0, 3)], [1, 30][r(0, 1)])
            continue
        d, groups = r(1, 40), r(1, 4)
        big = r(0, 2) == 0
        h, w = (r(32, 40), r(32, 40)) if big else (r(1, 20), r(1, 20))
        fmt = ["contiguous", "channels_last"][r(0, 1)]
        yield (f"r{i}", "group_norm", dtype, (r(1, 2), d * groups, h, w), groups, fmt,
               [0, 3, 50, 300, 1000][r(0, 4)], [1, 40][r(0, 1)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", type=int, default=0, help="write this many random cases instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    cases = random_cases(gen, args.random) if args.random else FIXED
    tensors, metas = {}, []
    for case in cases:
        t, meta = make_case(gen, *case)
        tensors.update(t)
        metas.append(meta)
    metadata = {"cases": json.dumps(metas), "torch": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": "1"}
    write_bundle(tensors, metadata, args.out)
    print(args.out, len(metas), "cases")


if __name__ == "__main__":
    with torch.no_grad():
        main()
