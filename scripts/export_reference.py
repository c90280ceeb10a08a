#!/usr/bin/env python3
"""Regenerate every reference parity bundle in ``weights/`` (format "1", see parity_bundle.py).

    python scripts/export_reference.py            # delete the owned bundles, export them all
    python scripts/export_reference.py --verify   # export, then reload and re-check every file
    python scripts/export_reference.py --verify-only   # only re-check the files on disk

Blocks come from the real libraries where they are pip packages
(denoising-diffusion-pytorch, diffusers, torch.nn.MultiheadAttention) and from the faithful
re-statements in ``scripts/reference/`` otherwise. Everything is deterministic (fixed seeds,
single-threaded CPU PyTorch).

``--verify`` reloads each bundle with safetensors, rebuilds the module from the stored
``parity.block`` + ``parity.config`` + state dict alone, reruns it (float32 and the float64
copy) and asserts the outputs are bit-identical to the stored ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from parity_bundle import export_bundle, float64_copy, load_bundle, randomize_, run_module  # noqa: E402
from reference import annotated_diffusion, fastai, ldm, textbook  # noqa: E402

REPO = HERE.parent
WEIGHTS = REPO / "weights"
# weights/<family>/ folders whose *.safetensors this script owns (stale ones are deleted)
FAMILIES = ["denoising_diffusion_pytorch", "annotated_diffusion", "ldm", "diffusers", "fastai", "torch", "textbook"]

LEGACY_DIFFUSERS_KEYS = [("to_q.", "query."), ("to_k.", "key."), ("to_v.", "value."), ("to_out.0.", "proj_attn.")]


# --------------------------------------------------------------------------------------------
# building a block from (block id, config, state-dict keys) alone


def build_module(block: str, config: dict, state_keys=()) -> nn.Module:
    """Construct the PyTorch block for ``block`` from its stored constructor kwargs.

    ``state_keys`` tells apart classes published under one block id (fast.ai SelfAttention
    GroupNorm vs BatchNorm/fused-qkv variant)."""
    cfg = dict(config)
    keys = set(state_keys)
    if block == "denoising_diffusion_pytorch.Attention":
        from denoising_diffusion_pytorch.denoising_diffusion_pytorch import Attention

        return Attention(**cfg)
    if block == "denoising_diffusion_pytorch.LinearAttention":
        from denoising_diffusion_pytorch.denoising_diffusion_pytorch import LinearAttention

        return LinearAttention(**cfg)
    if block == "annotated_diffusion.Attention":
        return annotated_diffusion.Attention(**cfg)
    if block == "annotated_diffusion.LinearAttention":
        return annotated_diffusion.LinearAttention(**cfg)
    if block == "ldm.LinearAttention":
        return ldm.LinearAttention(**cfg)
    if block == "diffusers.Attention":
        from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

        processor = cfg.pop("processor", None)
        m = Attention(**cfg)
        if processor is not None:
            m.set_processor({"AttnProcessor": AttnProcessor, "AttnProcessor2_0": AttnProcessor2_0}[processor]())
        return m
    if block == "fastai.SelfAttention":
        if "qkv.weight" in keys or "norm.running_mean" in keys:
            return fastai.SelfAttentionFused(**cfg)
        return fastai.SelfAttention(**cfg)
    if block == "fastai.SelfAttentionMultiHead":
        return fastai.SelfAttentionMultiHead(**cfg)
    if block == "torch.nn.MultiheadAttention":
        return nn.MultiheadAttention(**cfg)
    if block == "textbook.SelfAttention":
        return textbook.Self_Attention(**cfg)
    if block == "textbook.MultiHeadAttention":
        if "d_all" in cfg:
            return textbook.MultiHead_Attention_DAll(**cfg)
        return textbook.MultiHead_Attention(**cfg)
    raise KeyError(f"unknown block id {block!r}")


def to_legacy_diffusers_keys(sd):
    out = OrderedDict()
    for k, v in sd.items():
        for new, old in LEGACY_DIFFUSERS_KEYS:
            if k.startswith(new):
                k = old + k[len(new):]
                break
        out[k] = v
    return out


def from_legacy_diffusers_keys(sd):
    out = OrderedDict()
    for k, v in sd.items():
        for new, old in LEGACY_DIFFUSERS_KEYS:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


# --------------------------------------------------------------------------------------------
# the bundles


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def padding_mask(gen, batch, seq, p=0.3):
    """bool (batch, seq), True = ignored; never a whole row."""
    m = torch.rand(batch, seq, generator=gen) < p
    for b in range(batch):
        if m[b].all():
            m[b, torch.randint(0, seq, (1,), generator=gen)] = False
    return m


def bool_attn_mask(gen, shape, p=0.3):
    """bool (..., L, S), True = not allowed; never a whole row."""
    m = torch.rand(*shape, generator=gen) < p
    flat = m.view(-1, shape[-1])
    for r in range(flat.shape[0]):
        if flat[r].all():
            flat[r, torch.randint(0, shape[-1], (1,), generator=gen)] = False
    return m


def diffusers_cross_mask():
    """Additive float mask (B=2, 1, S=7): 0.0 kept, -10000.0 masked (as diffusers pipelines pass)."""
    m = torch.zeros(2, 1, 7)
    m[0, 0, [1, 4]] = -10000.0
    m[1, 0, [0, 5, 6]] = -10000.0
    return m


def mha_float_mask(gen):
    """Additive float attn_mask (L=5, S=6): a random bias with a few -10000 entries."""
    m = 0.5 * randn(gen, 5, 6)
    m[0, 2] = -10000.0
    m[3, 0] = -10000.0
    m[3, 5] = -10000.0
    return m


LUCID = "real library class denoising_diffusion_pytorch.denoising_diffusion_pytorch.{}"
AD_SRC = ("re-statement scripts/reference/annotated_diffusion.py of huggingface/blog annotated-diffusion.md "
          "(commit fd0b6566b04f) {}")
LDM_SRC = ("re-statement scripts/reference/ldm.py of CompVis/latent-diffusion ldm/modules/attention.py "
           "(commit a506df575647) LinearAttention{}")
FASTAI_SRC = "re-statement scripts/reference/fastai.py of fastai/course22p2 nbs/27_attention.ipynb (commit df9323235bc3) {}"
TEXTBOOK_SRC = "re-statement scripts/reference/textbook.py of the seed-003 textbook notes {}"
DIFF_SRC = "real library class diffusers.models.attention_processor.Attention"

VAE_MID = dict(query_dim=32, heads=1, dim_head=32, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=8,
               spatial_norm_dim=None, residual_connection=True, bias=True, upcast_softmax=True,
               _from_deprecated_attn_block=True)


def bundle_specs():
    """Every bundle: (relative path, block id, config, seed, make_inputs(gen), kwargs, source, extra)."""
    S = []

    def add(path, block, config, seed, make_inputs, kwargs=None, source=None, **extra):
        S.append(dict(path=path, block=block, config=config, seed=seed, make_inputs=make_inputs,
                      kwargs=kwargs, source=source, **extra))

    # lucidrains/denoising-diffusion-pytorch 2.3.4
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 100 if cls == "Attention" else 200
        add(f"denoising_diffusion_pytorch/{short}_dim24_h3_d8_mem4.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=24, heads=3, dim_head=8, num_mem_kv=4), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LUCID.format(cls))
        add(f"denoising_diffusion_pytorch/{short}_dim20_h2_d12_mem1.safetensors", f"denoising_diffusion_pytorch.{cls}",
            dict(dim=20, heads=2, dim_head=12, num_mem_kv=1), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=LUCID.format(cls))

    # Hugging Face annotated diffusion (GroupNorm(1) derivative of lucidrains)
    for cls, short in (("Attention", "attention"), ("LinearAttention", "linear_attention")):
        base = 300 if cls == "Attention" else 400
        add(f"annotated_diffusion/{short}_dim24_h3_d8.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=24, heads=3, dim_head=8), base + 1,
            lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=AD_SRC.format(cls))
        add(f"annotated_diffusion/{short}_dim20_h2_d12.safetensors", f"annotated_diffusion.{cls}",
            dict(dim=20, heads=2, dim_head=12), base + 2,
            lambda g: {"x": randn(g, 3, 20, 6, 3)}, source=AD_SRC.format(cls))

    # CompVis latent-diffusion LinearAttention (+ the LinAttnBlock case heads=1, dim_head=dim)
    add("ldm/linear_attention_dim24_h3_d8.safetensors", "ldm.LinearAttention",
        dict(dim=24, heads=3, dim_head=8), 501, lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=LDM_SRC.format(""))
    add("ldm/lin_attn_block_dim20.safetensors", "ldm.LinearAttention",
        dict(dim=20, heads=1, dim_head=20), 502, lambda g: {"x": randn(g, 3, 20, 6, 3)},
        source=LDM_SRC.format(" (the LinAttnBlock(in_channels=20) configuration)"))

    # diffusers 0.42.1 Attention
    add("diffusers/attention_vae_mid.safetensors", "diffusers.Attention", dict(VAE_MID), 601,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE UNetMidBlock2D-style kwargs")
    add("diffusers/attention_unet2d_mid.safetensors", "diffusers.Attention",
        dict(query_dim=48, heads=3, dim_head=16, rescale_output_factor=2.0, eps=1e-5, norm_num_groups=4,
             residual_connection=True, bias=True, upcast_softmax=True, _from_deprecated_attn_block=True), 602,
        lambda g: {"hidden_states": randn(g, 3, 48, 6, 3)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), UNet2DModel UNetMidBlock2D-style kwargs")
    add("diffusers/attention_vae_mid_legacy_keys.safetensors", "diffusers.Attention", dict(VAE_MID), 603,
        lambda g: {"hidden_states": randn(g, 2, 32, 5, 7)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), VAE-style kwargs; state dict stored under the legacy "
        "AttentionBlock key names (to_q->query, to_k->key, to_v->value, to_out.0->proj_attn; group_norm unchanged) "
        "as in diffusers <= 0.16 checkpoints",
        legacy_keys=True)
    add("diffusers/attention_cross.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=5, dim_head=8, bias=False), 604,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention")
    add("diffusers/attention_cross_mask.safetensors", "diffusers.Attention",
        dict(query_dim=40, cross_attention_dim=24, heads=2, dim_head=16, bias=True), 605,
        lambda g: {"hidden_states": randn(g, 2, 11, 40), "encoder_hidden_states": randn(g, 2, 7, 24),
                   "attention_mask": diffusers_cross_mask()},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, 1, S) mask")
    add("diffusers/attention_self_tokens_attnprocessor.safetensors", "diffusers.Attention",
        dict(query_dim=30, heads=3, dim_head=10, out_bias=False, processor="AttnProcessor"), 606,
        lambda g: {"hidden_states": randn(g, 2, 9, 30)},
        source=DIFF_SRC + ' built without "processor", then set_processor(AttnProcessor()); token self-attention')

    # fast.ai course22p2 nb 27
    add("fastai/self_attention_groupnorm_ni24.safetensors", "fastai.SelfAttention", dict(ni=24), 701,
        lambda g: {"x": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 9 SelfAttention (GroupNorm(1), q/k/v/proj)"))
    add("fastai/self_attention_batchnorm_fused_ni20.safetensors", "fastai.SelfAttention", dict(ni=20), 702,
        lambda g: {"inp": randn(g, 3, 20, 6, 3)},
        source=FASTAI_SRC.format("cell 19 SelfAttention (BatchNorm2d, fused qkv; class SelfAttentionFused here)"),
        fused=True)
    add("fastai/self_attention_multihead_ni24_h4.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=24, nheads=4),
        703, lambda g: {"inp": randn(g, 2, 24, 5, 7)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))
    add("fastai/self_attention_multihead_ni30_h3.safetensors", "fastai.SelfAttentionMultiHead", dict(ni=30, nheads=3),
        704, lambda g: {"inp": randn(g, 3, 30, 6, 3)}, source=FASTAI_SRC.format("cell 29 SelfAttentionMultiHead"))

    # torch.nn.MultiheadAttention
    def mha2(g):
        return {"query": randn(g, 6, 3, 20), "key": randn(g, 8, 3, 12), "value": randn(g, 8, 3, 7),
                "key_padding_mask": padding_mask(g, 3, 8)}

    def mha3(g):
        kv = randn(g, 2, 6, 16)
        # key and value are the same tensor object (torch's "key is value" path); both stored
        return {"query": randn(g, 2, 5, 16), "key": kv, "value": kv, "attn_mask": mha_float_mask(g)}

    def mha4(g):
        return {"query": randn(g, 4, 2, 18), "key": randn(g, 7, 2, 18), "value": randn(g, 7, 2, 18),
                "attn_mask": bool_attn_mask(g, (2 * 3, 4, 7))}

    add("torch/mha_self_batch_first.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=24, num_heads=3, batch_first=True), 801, lambda g: {"query": randn(g, 2, 9, 24)},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention (key = value = query, same tensor)")
    add("torch/mha_kdim_vdim_key_padding_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=20, num_heads=4, kdim=12, vdim=7, bias=False), 802, mha2,
        kwargs=dict(need_weights=True, average_attn_weights=False),
        source="torch.nn.MultiheadAttention with kdim/vdim, bool key_padding_mask (True = ignored)")
    add("torch/mha_bias_kv_zero_attn_float_mask.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=16, num_heads=2, add_bias_kv=True, add_zero_attn=True, batch_first=True), 803, mha3,
        kwargs=dict(need_weights=False),
        source="torch.nn.MultiheadAttention add_bias_kv + add_zero_attn, additive float attn_mask, key is value")
    add("torch/mha_bool_attn_mask_3d.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=18, num_heads=3), 804, mha4, kwargs=dict(need_weights=True),
        source="torch.nn.MultiheadAttention with a bool (N*num_heads, L, S) attn_mask (True = not allowed)")

    # textbook (seed 003)
    add("textbook/self_attention_dx6_d5_dv7.safetensors", "textbook.SelfAttention", dict(Dx=6, D=5, Dv=7), 901,
        lambda g: {"x": randn(g, 2, 9, 6)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/self_attention_dx10_d12_dv4.safetensors", "textbook.SelfAttention", dict(Dx=10, D=12, Dv=4), 902,
        lambda g: {"x": randn(g, 3, 5, 10)}, source=TEXTBOOK_SRC.format("Self_Attention(Dx, D, Dv)"))
    add("textbook/multihead_attention_in7_nh3_dh5.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=7, nh=3, dh=5), 903, lambda g: {"x": randn(g, 2, 9, 7)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, nh, dh) (first form)"))
    add("textbook/multihead_attention_in10_dall12_nh4.safetensors", "textbook.MultiHeadAttention",
        dict(input_dim=10, d_all=12, nh=4), 904, lambda g: {"x": randn(g, 3, 6, 10)},
        source=TEXTBOOK_SRC.format("MultiHead_Attention(input_dim, d_all, nh) (second form; "
                                   "class MultiHead_Attention_DAll here)"))
    # Edge cases a port gets wrong: no memory tokens, out_dim, 2-D masks, scale_qk=False
    # (diffusers then defaults to AttnProcessor with scale 1), unbatched / causal / even-head MHA.
    add("denoising_diffusion_pytorch/attention_dim16_h2_d8_nomem.safetensors", "denoising_diffusion_pytorch.Attention",
        dict(dim=16, heads=2, dim_head=8, num_mem_kv=0), 103,
        lambda g: {"x": randn(g, 2, 16, 3, 5)}, source=LUCID.format("Attention") + ", num_mem_kv=0")
    add("diffusers/attention_out_dim.safetensors", "diffusers.Attention",
        dict(query_dim=32, heads=4, dim_head=8, out_dim=24, bias=True), 607,
        lambda g: {"hidden_states": randn(g, 2, 6, 32)},
        source=DIFF_SRC + " (AttnProcessor2_0 default), out_dim given (heads = out_dim // dim_head)")
    add("diffusers/attention_cross_mask_2d.safetensors", "diffusers.Attention",
        dict(query_dim=24, cross_attention_dim=10, heads=3, dim_head=8), 608,
        lambda g: {"hidden_states": randn(g, 2, 7, 24), "encoder_hidden_states": randn(g, 2, 5, 10),
                   "attention_mask": torch.tensor([[0.0, -10000.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -10000.0, -10000.0]])},
        source=DIFF_SRC + " (AttnProcessor2_0 default), cross-attention with an additive (B, S) mask")
    add("diffusers/attention_no_scale_qk.safetensors", "diffusers.Attention",
        dict(query_dim=24, heads=3, dim_head=8, scale_qk=False), 609,
        lambda g: {"hidden_states": randn(g, 2, 7, 24)},
        source=DIFF_SRC + " scale_qk=False (diffusers then picks AttnProcessor, scale 1.0)")
    add("torch/mha_unbatched.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2), 805,
        lambda g: {"query": randn(g, 5, 12), "key": randn(g, 6, 12), "value": randn(g, 6, 12)},
        kwargs=dict(need_weights=True), source="torch.nn.MultiheadAttention on unbatched (L, E) inputs")
    add("torch/mha_causal.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=2, batch_first=True), 806,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(5)},
        kwargs=dict(need_weights=False, is_causal=True),
        source="torch.nn.MultiheadAttention self-attention with is_causal=True and its causal attn_mask")
    add("torch/mha_even_heads_float_padding.safetensors", "torch.nn.MultiheadAttention",
        dict(embed_dim=12, num_heads=4, batch_first=True), 807,
        lambda g: {"query": randn(g, 2, 5, 12),
                   "key_padding_mask": torch.tensor([[0.0, 0.0, float("-inf"), 0.0, 0.0], [0.0] * 5])},
        kwargs=dict(need_weights=True, average_attn_weights=True),
        source="torch.nn.MultiheadAttention self-attention, even head count, additive float key_padding_mask")
    return S


# --------------------------------------------------------------------------------------------


def export_all(specs):
    for fam in FAMILIES:
        d = WEIGHTS / fam
        if d.is_dir():
            for f in sorted(d.glob("*.safetensors")):
                f.unlink()
    results = []
    for spec in specs:
        keys = ("qkv.weight",) if spec.get("fused") else ()
        module = build_module(spec["block"], spec["config"], keys)
        randomize_(module, spec["seed"])
        gen = torch.Generator().manual_seed(spec["seed"] + 100_000)
        inputs = spec["make_inputs"](gen)
        sd = to_legacy_diffusers_keys(module.state_dict()) if spec.get("legacy_keys") else None
        info = export_bundle(module, spec["block"], spec["config"], inputs, WEIGHTS / spec["path"],
                             kwargs=spec["kwargs"], source=spec["source"], state_dict=sd)
        diffs = ", ".join(f"{k} {v:.3e}" for k, v in info["max_abs_diff_f64"].items())
        ins = ", ".join(f"{k}{tuple(v.shape)}{'' if v.dtype == torch.float32 else ':' + str(v.dtype).replace('torch.', '')}"
                        for k, v in inputs.items())
        print(f"wrote weights/{spec['path']} ({info['bytes']} B) {spec['block']} {json.dumps(spec['config'])} "
              f"inputs [{ins}] max|f32-f64| {diffs}")
        results.append(info)
    total = sum(r["bytes"] for r in results)
    print(f"{len(results)} bundles, {total} bytes in total")
    return results


def verify_file(path: Path) -> str:
    b = load_bundle(path)
    meta = b["metadata"]
    for key in ("parity.format", "parity.block", "parity.config", "parity.inputs", "parity.outputs",
                "parity.dtype", "parity.source"):
        assert key in meta, f"{path}: missing metadata {key}"
    sd = b["state_dict"]
    if b["block"] == "diffusers.Attention" and any(k.startswith("query.") for k in sd):
        sd = from_legacy_diffusers_keys(sd)
    module = build_module(b["block"], b["config"], sd.keys())
    missing, unexpected = module.load_state_dict(sd, strict=True)
    module.eval()
    want_dtype = getattr(torch, meta["parity.dtype"])
    assert all(p.dtype == want_dtype for p in module.parameters()), f"{path}: dtype mismatch"
    for name, t in list(b["inputs"].items()) + list(b["expected"].items()) + list(sd.items()):
        assert t.is_contiguous(), f"{path}: {name} not contiguous"
    inputs = OrderedDict(b["inputs"])
    # inputs stored twice because they were the same object (MHA key is value): rebuild the aliasing
    if "key" in inputs and "value" in inputs and torch.equal(inputs["key"], inputs["value"]):
        inputs["value"] = inputs["key"]
    names = list(b["expected"])
    out_names = ["attn_output", "attn_weights"] if isinstance(module, nn.MultiheadAttention) else None
    got = run_module(module, inputs, b["kwargs"], out_names)
    assert list(got) == names, f"{path}: outputs {list(got)} != stored {names}"
    for n in names:
        assert got[n].dtype == b["expected"][n].dtype and torch.equal(got[n], b["expected"][n]), \
            f"{path}: output {n} differs from the stored one"
    m64 = float64_copy(module)
    in64 = OrderedDict()
    memo = {}
    for k, v in inputs.items():
        if id(v) not in memo:
            memo[id(v)] = v.double() if v.is_floating_point() else v
        in64[k] = memo[id(v)]
    got64 = run_module(m64, in64, b["kwargs"], out_names)
    for n in names:
        assert got64[n].dtype == torch.float64 and torch.equal(got64[n], b["expected_f64"][n]), \
            f"{path}: float64 output {n} differs from the stored one"
    diffs = {n: float((b["expected"][n].double() - b["expected_f64"][n]).abs().max()) for n in names}
    return ", ".join(f"{n} {d:.3e}" for n, d in diffs.items())


def verify_all(specs):
    paths = [WEIGHTS / s["path"] for s in specs]
    on_disk = sorted(p for fam in FAMILIES for p in (WEIGHTS / fam).glob("*.safetensors"))
    extra = sorted(set(on_disk) - set(paths))
    assert not extra, f"stale bundles on disk: {extra}"
    for p in paths:
        diffs = verify_file(p)
        print(f"verified {p.relative_to(REPO)}: rebuilt from metadata, outputs bit-identical "
              f"(max|f32-f64| {diffs})")
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    print(f"verified {len(paths)} bundles; weights/ holds {total} bytes")
    assert total < 3 * 1024 * 1024, "weights/ exceeds 3 MB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="after exporting, reload and re-check every bundle")
    ap.add_argument("--verify-only", action="store_true", help="only re-check the bundles on disk")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    specs = bundle_specs()
    if not args.verify_only:
        export_all(specs)
    if args.verify or args.verify_only:
        verify_all(specs)


if __name__ == "__main__":
    main()
