"""Probe (not book code): tune the Triton step of the 1B model toward its roof.

For BF16 and int8 weights: per-matrix GemvConfig and attention tiling swept one at a
time around the defaults, each variant the whole graphed step, timed in interleaved
rounds at a context of CTX slots; then the per-matrix winners combined; then the
65-product chains (ours, Inductor's, cuBLAS; BF16 and int8) in rounds; then the step at
long contexts for several attention splits. Prints a line per result; writes JSON to
$OUT/probe_roof.json.

    PYTHONPATH=code python3 scripts/probes/probe_roof.py             # round 1, around
                                                                    # the package defaults
    PYTHONPATH=code python3 scripts/probes/probe_roof.py --round2    # the rounds as run
    ...                                              --round3, --round4   on 2026-12-01
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
import traceback

import torch
import triton

from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.experiments import triton_bench as tb
from gpuinfer.kernels.attention import AttentionWorkspace
from gpuinfer.kernels.common import Workspace
from gpuinfer.kernels.embed_head import ArgmaxWorkspace
from gpuinfer.kernels.gemv import GemvConfig
from gpuinfer.kernels.quant import quantize_int8
from gpuinfer.kernels.tiling import GEMVS, alone_configs
from gpuinfer.model.configs import build_model, model_config

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp")
RESULTS: dict = {}
KEEP: list = []  # a graph replays into its decoder's buffers: they must outlive it
CTX = 192
REPS = 16
ROUNDS = 7
QUICK = "--quick" in sys.argv


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def save():
    with open(f"{OUT}/probe_roof.json", "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


KS = {"qkv": 2048, "o": 2048, "gate_up": 2048, "down": 8192, "lm_head": 2048}


def derive(base: TritonDecoder, configs=None, attention=None) -> TritonDecoder:
    """A decoder sharing base's weights and state, with other tilings."""
    d = copy.copy(base)
    merged = {**base.configs, **(configs or {})}
    d.configs = {n: base._fit(c, KS[n]) for n, c in merged.items()}
    d.attention = {**base.attention, **(attention or {})}
    d.workspace = Workspace(base.device, 1 << 22, 1 << 16)
    d.attn_workspace = AttentionWorkspace(base.device, base.n_kv,
                                          base.n_heads // base.n_kv, base.head_dim,
                                          d.attention["n_split"])
    d.argmax_workspace = ArgmaxWorkspace(
        base.device, triton.cdiv(base.lm_head.shape[0], d.configs["lm_head"].block_n))
    d.graph = None
    return d


def rounds(fns: dict, setup=None, reps=REPS, n_rounds=ROUNDS) -> dict:
    """{name: (median, min, max)} ms per call, interleaved rounds, one warm-up round."""
    names = list(fns)
    times = {n: [] for n in names}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(n_rounds + 1):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            if setup:
                setup()
            torch.cuda.synchronize()
            start.record()
            for _ in range(reps):
                fns[n]()
            end.record()
            end.synchronize()
            if r:
                times[n].append(start.elapsed_time(end) / reps)
    return {n: (statistics.median(t), min(t), max(t)) for n, t in times.items()}


def step_sweep(tag: str, base: TritonDecoder, variants: dict, ctx=CTX) -> dict:
    """variants: {name: (configs, attention)}; each the whole step graphed."""
    graphs = {}
    for name, (configs, attention) in variants.items():
        try:
            d = derive(base, configs, attention)
            KEEP.append(d)
            graphs[name] = d.capture().replay
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            log(f"{tag} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
    res = rounds(graphs, setup=lambda: base.pos.fill_(ctx))
    for name, (med, lo, hi) in sorted(res.items(), key=lambda kv: kv[1][0]):
        log(f"{tag} ctx {ctx} {name:40s} {med * 1e3:8.1f} us  [{lo * 1e3:.1f}, "
            f"{hi * 1e3:.1f}]")
    RESULTS[f"{tag}@{ctx}"] = res
    save()
    return res


def gemv_sweeps(int8: bool) -> dict:
    G = GemvConfig
    if not int8:
        return {
            "qkv": [G(2, 2048, 1, 4), G(2, 2048, 1, 8), G(4, 2048, 1, 4), G(8, 2048, 1, 8),
                    G(1, 2048, 1, 4), G(4, 2048, 2, 8), G(2, 2048, 2, 4), G(4, 1024, 1, 4)],
            "o": [G(4, 2048, 1, 4), G(4, 2048, 1, 8), G(8, 2048, 1, 4), G(16, 1024, 1, 8),
                  G(2, 2048, 1, 4), G(8, 2048, 2, 8), G(4, 2048, 2, 4), G(16, 2048, 1, 16)],
            "gate_up": [G(4, 2048, 1, 8), G(2, 2048, 1, 8), G(1, 2048, 1, 4),
                        G(4, 2048, 1, 4), G(8, 2048, 1, 8), G(1, 2048, 1, 2),
                        G(4, 1024, 1, 8), G(8, 1024, 1, 8), G(2, 1024, 1, 4)],
            "down": [G(4, 2048, 1, 4), G(16, 2048, 1, 8), G(8, 2048, 1, 4),
                     G(4, 4096, 1, 8), G(2, 8192, 1, 8), G(4, 8192, 1, 16),
                     G(8, 1024, 1, 4), G(8, 2048, 2, 8), G(4, 4096, 2, 8)],
            "lm_head": [G(16, 2048, 1, 8), G(4, 2048, 1, 4), G(8, 2048, 1, 4),
                        G(4, 2048, 1, 8), G(16, 2048, 1, 16), G(32, 1024, 1, 8)],
        }
    return {
        "qkv": [G(8, 2048, 1, 8), G(2, 2048, 1, 4), G(4, 2048, 1, 4), G(8, 2048, 1, 4),
                G(16, 2048, 1, 8), G(4, 2048, 2, 8)],
        "o": [G(16, 2048, 1, 8), G(16, 2048, 1, 4), G(4, 2048, 1, 4), G(32, 2048, 1, 8),
              G(8, 2048, 1, 4), G(16, 2048, 2, 8)],
        "gate_up": [G(4, 2048, 1, 8), G(4, 2048, 1, 4), G(8, 2048, 1, 8), G(2, 2048, 1, 8),
                    G(8, 2048, 1, 4), G(1, 2048, 1, 2)],
        "down": [G(16, 2048, 1, 8), G(8, 4096, 1, 8), G(4, 8192, 1, 8), G(8, 2048, 1, 4),
                 G(16, 4096, 1, 16), G(8, 2048, 2, 8)],
        "lm_head": [G(16, 2048, 1, 8), G(32, 2048, 1, 8), G(16, 2048, 1, 4),
                    G(32, 2048, 1, 16)],
    }


ATTN = [dict(n_split=n, block_s=b, num_warps=w)
        for n, b, w in ((8, 64, 4), (16, 64, 4), (16, 32, 4), (8, 32, 4), (4, 64, 4),
                        (16, 64, 2), (32, 32, 4), (64, 64, 4))]


def label(c: GemvConfig) -> str:
    return f"{c.block_n}x{c.block_k}/s{c.split_k}/w{c.num_warps}"


def tune(tag: str, base: TritonDecoder, int8: bool) -> tuple[dict, dict]:
    variants = {"default": (None, None)}
    for name, options in gemv_sweeps(int8).items():
        for c in options[:3] if QUICK else options:
            variants[f"{name} {label(c)}"] = ({name: c}, None)
    for a in ATTN[:2] if QUICK else ATTN:
        variants[f"attn {a['n_split']}x{a['block_s']}/w{a['num_warps']}"] = (None, a)
    res = step_sweep(tag, base, variants)
    best_cfg, best_att = {}, None
    ref = res["default"][0]
    for name in GEMVS:
        cands = [(res[f"{name} {label(c)}"][0], c) for c in gemv_sweeps(int8)[name]
                 if f"{name} {label(c)}" in res]
        if cands:
            t, c = min(cands, key=lambda tc: tc[0])
            if t < ref * 0.998:
                best_cfg[name] = c
    acands = [(res[k][0], a) for a in ATTN for k in
              [f"attn {a['n_split']}x{a['block_s']}/w{a['num_warps']}"] if k in res]
    if acands:
        t, a = min(acands, key=lambda ta: ta[0])
        if t < ref * 0.998:
            best_att = a
    log(f"{tag} winners: {({n: label(c) for n, c in best_cfg.items()})} attn {best_att}")
    combo = {"default": (None, None), "combined": (best_cfg, best_att),
             "combined, no PDL": (best_cfg, best_att)}
    res2 = {}
    graphs = {}
    for name, (configs, attention) in combo.items():
        d = derive(base, configs, attention)
        KEEP.append(d)
        if "no PDL" in name:
            d.pdl = False
        graphs[name] = d.capture().replay
    res2 = rounds(graphs, setup=lambda: base.pos.fill_(CTX), n_rounds=11)
    for name, (med, lo, hi) in res2.items():
        log(f"{tag} COMBINED {name:24s} {med * 1e3:8.1f} us [{lo * 1e3:.1f}, {hi * 1e3:.1f}]")
    RESULTS[f"{tag} combined"] = {"res": res2, "configs": {n: label(c) for n, c in
                                                           best_cfg.items()},
                                  "attention": best_att}
    save()
    return best_cfg, best_att


def chains(base: TritonDecoder, quant: TritonDecoder, best_bf16: dict, best_int8: dict):
    """The 65 products chained in one graph (`triton_bench.gemv_chain`), ours with the
    default and the tuned tiling, cuBLAS (BF16 only) and Inductor, in rounds."""
    for tag, dec, best in (("bf16", base, best_bf16), ("int8", quant, best_int8)):
        t = time.time()
        fns = {"ours PDL default": tb.gemv_chain(dec, "ours", pdl=True),
               "ours PDL tuned": tb.gemv_chain(derive(dec, best), "ours", pdl=True)}
        if not dec.quantized:
            fns["cuBLAS"] = tb.gemv_chain(dec, "cuBLAS")
        fns["Inductor"] = tb.gemv_chain(dec, "Inductor")
        log(f"{tag} chains built in {time.time() - t:.1f}s")
        res = rounds(fns, reps=4, n_rounds=9)
        for n, (med, lo, hi) in res.items():
            log(f"CHAIN {tag} {n:22s} {med:.4f} ms [{lo:.4f}, {hi:.4f}]")
        RESULTS[f"chain {tag}"] = res
        save()


def long_contexts(base, best_cfg, tag):
    for ctx in (1024, 4096, 16384, 32700):
        variants = {f"attn {n}x{b}": (best_cfg, dict(n_split=n, block_s=b, num_warps=4))
                    for n, b in ((32, 64), (64, 64), (128, 64), (64, 128), (16, 64))}
        step_sweep(tag, base, variants, ctx=ctx)


def build(capacity: int) -> tuple[TritonDecoder, TritonDecoder]:
    """The 1B model's BF16 and int8 decoders, for a cache of `capacity` slots."""
    model = build_model(model_config("1b"), seed=0, device="cuda", dtype=torch.bfloat16)
    log("model built", torch.cuda.get_device_name())
    return (TritonDecoder(model, capacity=capacity),
            TritonDecoder(model, capacity=capacity, quantize=quantize_int8))


def main():
    torch.manual_seed(0)
    base, quant = build(32768 + 128)
    log("decoders built; defaults", {n: label(c) for n, c in base.configs.items()},
        base.attention)
    best_bf16, att_bf16 = tune("bf16", base, int8=False)
    best_int8, att_int8 = tune("int8", quant, int8=True)
    try:
        chains(base, quant, best_bf16, best_int8)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    long_contexts(base, best_bf16, "bf16 long")
    long_contexts(quant, best_int8, "int8 long")
    log("done")


G = GemvConfig
BF16_R1 = {"qkv": G(4, 1024, 1, 4), "o": G(16, 1024, 1, 8), "gate_up": G(4, 2048, 1, 4),
           "down": G(8, 2048, 1, 4), "lm_head": G(8, 2048, 1, 4)}
INT8_R1 = {"gate_up": G(4, 2048, 1, 4), "lm_head": G(16, 2048, 1, 4)}
ATT_R1 = dict(n_split=16, block_s=64, num_warps=2)
BF16_R2 = {
    "qkv": [G(4, 1024, 1, 2), G(2, 1024, 1, 2), G(2, 2048, 1, 4), G(2, 1024, 1, 4),
            G(8, 1024, 1, 4), G(4, 512, 1, 4), G(4, 2048, 1, 4)],
    "o": [G(16, 1024, 1, 4), G(8, 1024, 1, 4), G(8, 2048, 1, 4), G(16, 512, 1, 8),
          G(32, 1024, 1, 8), G(8, 1024, 1, 2), G(4, 2048, 1, 2)],
    "gate_up": [G(4, 2048, 1, 2), G(2, 2048, 1, 2), G(8, 1024, 1, 4), G(4, 1024, 1, 4),
                G(2, 2048, 1, 4), G(8, 2048, 1, 4)],
    "down": [G(8, 2048, 1, 2), G(4, 2048, 1, 2), G(16, 2048, 1, 4), G(8, 1024, 1, 2),
             G(16, 1024, 1, 4), G(4, 4096, 1, 4)],
    "lm_head": [G(8, 2048, 1, 2), G(4, 2048, 1, 2), G(16, 2048, 1, 4), G(16, 1024, 1, 4),
                G(8, 1024, 1, 2)],
}
INT8_R2 = {
    "qkv": [G(4, 1024, 1, 4), G(8, 1024, 1, 4), G(4, 2048, 1, 2), G(8, 2048, 1, 2)],
    "o": [G(8, 2048, 1, 2), G(16, 1024, 1, 4), G(16, 1024, 1, 8), G(8, 1024, 1, 4)],
    "gate_up": [G(4, 2048, 1, 2), G(8, 1024, 1, 4), G(2, 2048, 1, 2), G(4, 1024, 1, 4)],
    "down": [G(16, 1024, 1, 4), G(8, 4096, 1, 4), G(4, 4096, 1, 4), G(16, 2048, 1, 4),
             G(8, 1024, 1, 8)],
    "lm_head": [G(16, 2048, 1, 2), G(32, 1024, 1, 4), G(8, 2048, 1, 4), G(32, 2048, 1, 4)],
}
ATT_R2 = [dict(n_split=n, block_s=b, num_warps=w)
          for n, b, w in ((64, 64, 2), (64, 64, 4), (32, 64, 2), (64, 128, 4),
                          (64, 128, 2), (8, 64, 2), (32, 32, 2), (128, 64, 2))]


def round2(tag, base, r1, sweeps, att_r1=ATT_R1, att_sweep=ATT_R2):
    """One matrix (or attention) at a time around the tiling r1 / att_r1; then r1
    against the winners combined."""
    variants = {"r1": (r1, att_r1)}
    for name, options in sweeps.items():
        for c in options:
            variants[f"{name} {label(c)}"] = ({**r1, name: c}, att_r1)
    for a in att_sweep:
        variants[f"attn {a['n_split']}x{a['block_s']}/w{a['num_warps']}"] = (r1, a)
    res = step_sweep(tag, base, variants)
    best = dict(r1)
    ref = res["r1"][0]
    for name, options in sweeps.items():
        cands = [(res[f"{name} {label(c)}"][0], c) for c in options
                 if f"{name} {label(c)}" in res]
        t, c = min(cands, key=lambda tc: tc[0])
        if t < ref * 0.998:
            best[name] = c
    acands = [(res[f"attn {a['n_split']}x{a['block_s']}/w{a['num_warps']}"][0], a)
              for a in att_sweep]
    t, a = min(acands, key=lambda ta: ta[0])
    best_att = a if t < ref * 0.998 else att_r1
    log(f"{tag} r2 winners: {({n: label(c) for n, c in best.items()})} attn {best_att}")
    graphs = {}
    for name, (cf, at) in {"r1": (r1, att_r1), "r2": (best, best_att)}.items():
        d = derive(base, cf, at)
        KEEP.append(d)
        graphs[name] = d.capture().replay
    for ctx in (192,):
        res2 = rounds(graphs, setup=lambda: base.pos.fill_(ctx), n_rounds=11)
        for name, (med, lo, hi) in res2.items():
            log(f"{tag} R2 ctx {ctx} {name:22s} {med * 1e3:8.1f} us [{lo * 1e3:.1f}, "
                f"{hi * 1e3:.1f}]")
        RESULTS[f"{tag} r2 @{ctx}"] = res2
    RESULTS[f"{tag} r2 winners"] = ({n: label(c) for n, c in best.items()}, best_att)
    save()
    return best, best_att


def chain_sweep(base, quant, best, best8):
    old = alone_configs(True)  # round 1's starting point: 8 warps
    fns = {}
    for name, cf in {"step tiling": best, "w8 tiling": old}.items():
        fns[name] = tb.gemv_chain(derive(base, cf), "ours", pdl=True)
    for m in GEMVS:
        fns[f"step tiling, {m} w8"] = tb.gemv_chain(derive(base, {**best, m: old[m]}),
                                                    "ours", pdl=True)
    fns["int8 step tiling"] = tb.gemv_chain(derive(quant, best8), "ours", pdl=True)
    fns["int8 default"] = tb.gemv_chain(derive(quant, old), "ours", pdl=True)
    res = rounds(fns, reps=4, n_rounds=9)
    for n, (med, lo, hi) in res.items():
        log(f"CHAIN {n:28s} {med:.4f} ms [{lo:.4f}, {hi:.4f}]")
    RESULTS["chain sweep"] = res
    save()


def main2():
    base, quant = build(32768 + 128)
    int8_r1 = alone_configs(True) | INT8_R1  # round 1's base: the old defaults
    best, best_att = round2("bf16", base, BF16_R1, BF16_R2)
    best8, att8 = round2("int8", quant, int8_r1, INT8_R2)
    chain_sweep(base, quant, best, best8)
    log("done")


BF16_R3 = {
    "qkv": [G(8, 512, 1, 4), G(2, 512, 1, 2), G(4, 512, 1, 2), G(2, 1024, 1, 2)],
    "o": [G(4, 1024, 1, 2), G(2, 2048, 1, 2), G(4, 1024, 1, 4), G(8, 1024, 1, 4)],
    "gate_up": [G(4, 512, 1, 4), G(2, 1024, 1, 2), G(8, 512, 1, 4), G(4, 1024, 1, 8),
                G(2, 512, 1, 2)],
    "down": [G(4, 1024, 1, 2), G(8, 512, 1, 4), G(4, 2048, 1, 4), G(8, 1024, 1, 4)],
    "lm_head": [G(8, 1024, 1, 4), G(4, 1024, 1, 2), G(16, 1024, 1, 8), G(4, 2048, 1, 4)],
}
INT8_R3 = {
    "qkv": [G(8, 512, 1, 4), G(4, 512, 1, 2), G(8, 1024, 1, 8)],
    "o": [G(8, 1024, 1, 4), G(16, 1024, 1, 8), G(8, 2048, 1, 4)],
    "gate_up": [G(8, 512, 1, 4), G(4, 512, 1, 4), G(8, 1024, 1, 8), G(2, 1024, 1, 2)],
    "down": [G(16, 1024, 1, 8), G(8, 1024, 1, 4), G(16, 2048, 1, 8)],
    "lm_head": [G(16, 1024, 1, 4), G(16, 1024, 1, 8), G(8, 1024, 1, 4)],
}
ATT_R3 = [dict(n_split=n, block_s=b, num_warps=w)
          for n, b, w in ((16, 64, 1), (8, 64, 1), (8, 128, 2), (16, 32, 1), (32, 64, 1),
                          (16, 128, 2), (8, 64, 2), (16, 64, 4))]


BF16_R4 = {
    "gate_up": [G(4, 256, 1, 4), G(8, 256, 1, 4), G(2, 512, 1, 4), G(8, 512, 1, 8),
                G(4, 512, 1, 8), G(2, 256, 1, 2)],
    "qkv": [G(4, 512, 1, 4), G(8, 512, 1, 8), G(8, 256, 1, 4)],
    "o": [G(8, 512, 1, 4), G(8, 1024, 1, 8), G(16, 512, 1, 4)],
    "down": [G(8, 1024, 1, 8), G(16, 512, 1, 4), G(8, 512, 1, 8)],
    "lm_head": [G(8, 512, 1, 4), G(16, 512, 1, 4), G(8, 1024, 1, 8)],
}
INT8_R4 = {
    "gate_up": [G(8, 256, 1, 4), G(16, 512, 1, 8), G(16, 256, 1, 4), G(8, 512, 1, 8),
                G(4, 256, 1, 4)],
    "qkv": [G(8, 512, 1, 8), G(8, 256, 1, 4), G(4, 256, 1, 4)],
    "o": [G(16, 512, 1, 8), G(8, 512, 1, 4), G(16, 1024, 1, 4)],
    "down": [G(8, 1024, 1, 8), G(16, 512, 1, 8), G(8, 512, 1, 4)],
    "lm_head": [G(8, 512, 1, 4), G(16, 512, 1, 4), G(4, 1024, 1, 4)],
}


# Where rounds 3 and 4 started: the winners of the round before (round 3's were the
# package defaults at the time)
BF16_R2_BEST = {"qkv": G(4, 1024, 1, 4), "o": G(8, 2048, 1, 4), "gate_up": G(4, 1024, 1, 4),
                "down": G(8, 2048, 1, 4), "lm_head": G(8, 2048, 1, 4)}
INT8_R2_BEST = BF16_R2_BEST | {"o": G(8, 2048, 1, 8), "down": G(8, 2048, 1, 8)}
ROUND_3 = (BF16_R2_BEST, INT8_R2_BEST, BF16_R3, INT8_R3, ATT_R3)
ROUND_4 = (BF16_R2_BEST | {"gate_up": G(4, 512, 1, 4)},
           INT8_R2_BEST | {"gate_up": G(8, 512, 1, 4), "lm_head": G(8, 1024, 1, 4)},
           BF16_R4, INT8_R4, [dict(n_split=16, block_s=32, num_warps=1)])


def recentre(bf16, int8, bf16_sweeps, int8_sweeps, att_sweep):
    """A round around the given tilings, at this chapter's cache of 320 slots."""
    base, quant = build(320)
    att = dict(n_split=16, block_s=64, num_warps=2)  # default_attention for 320 slots
    round2("bf16", base, bf16, bf16_sweeps, att, att_sweep)
    round2("int8", quant, int8, int8_sweeps, att, att_sweep)
    log("done")


if __name__ == "__main__":
    if "--round4" in sys.argv:
        recentre(*ROUND_4)
    elif "--round3" in sys.argv:
        recentre(*ROUND_3)
    elif "--round2" in sys.argv:
        main2()
    else:
        main()
