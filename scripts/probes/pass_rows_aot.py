"""Probe (the 4 -> 5 token jump), CPU: compile the pass's products at Chapter 6's target
shape (or 1B) for sm_90 (BF16, PDL on; `aot.compile_only`) for several T and print,
per kernel: registers, stack, shared memory, programs an SM holds, static SASS
instructions before / after the PDL wait (ACQBULK) and the kinds after it.

    PYTHONPATH=code python scripts/probes/pass_rows_aot.py [--tokens 4 5 8] [--dump DIR]
"""
import argparse
import collections
import math
import os
import re
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpuinfer.kernels.aot import compile_only, resource_usage  # noqa: E402
from pass_sass_dump import sass_of, t  # noqa: E402  (the SASS of a kernel; a dummy)

SHAPES = {"target": (1024, 2816, 16, 4, 64, 8192), "1b": (2048, 8192, 32, 8, 64, 128256)}
CAP = 256
KINDS = ("LDG", "STG", "STS", "LDS", "LDSM", "BAR", "SHFL", "HMMA", "MUFU", "F2F", "F2FP",
         "FMUL", "FADD", "FFMA", "SEL", "FSEL", "ISETP", "FSETP", "ATOM", "MEMBAR")


def ops(sass):
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[\w.]*)?",
                     line)
        if m and m.group(2) != "NOP":
            out.append(m.group(2))
    return out


def occupancy(regs, warps, smem):
    per_warp = math.ceil(regs * 32 / 256) * 256
    return min(32, 65536 // (per_warp * warps), 2048 // (32 * warps),
               233472 // (smem + 1024) if smem else 32)


def jobs(shape, T):
    from gpuinfer.kernels.pass_mma import gemv_pass, gemv_silu_pass, mma_configs
    from gpuinfer.kernels.pass_mma_heads import qkv_rope_pass, lm_head_argmax_pass
    H, I, HEADS, KV, D, V = SHAPES[shape]
    cfg = SimpleNamespace(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS,
                          num_key_value_heads=KV, head_dim=D, vocab_size=V)
    mc = mma_configs(cfg, gpu=True)
    pos, cache, table = t(1, dt=torch.long), t(KV, CAP, D), t(CAP, D)
    toks = t(CAP, dt=torch.long)
    return [
        ("qkv", lambda: qkv_rope_pass(
            t((HEADS + 2 * KV) * D, H), t(T, H), t(T, HEADS * D), cache, cache, table,
            table, pos, n_heads=HEADS, norm=t(H), config=mc["qkv"], pdl=True)),
        ("o", lambda: gemv_pass(t(H, HEADS * D), t(T, HEADS * D), x := t(T, H),
                                residual=x, config=mc["o"], pdl=True)),
        ("gate_up", lambda: gemv_silu_pass(t(2 * I, H), t(T, H), t(T, I), norm=t(H),
                                           config=mc["gate_up"], pdl=True)),
        ("down", lambda: gemv_pass(t(H, I), t(T, I), x := t(T, H), residual=x,
                                   config=mc["down"], pdl=True)),
        ("lm_head", lambda: lm_head_argmax_pass(
            t(V, H), t(T, H), t(T, V), toks, pos, norm=t(H), config=mc["lm_head"],
            inline=False, pdl=True)),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="*", default=[4, 5, 8])
    ap.add_argument("--shapes", nargs="*", default=["target"])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args()
    print(f"{'kernel':14s} T   regs stk  smem occ  instr  pre  post  "
          + " ".join(f"{k}" for k in KINDS), flush=True)
    for shape in a.shapes:
        for name in a.only or ["qkv", "o", "gate_up", "down", "lm_head"]:
            for T in a.tokens:
                launch = dict(jobs(shape, T))[name]
                with compile_only(90) as compiled:
                    launch()
                kname, kw, k = compiled[0]
                u = resource_usage(k)
                sass = sass_of(k)
                if a.dump:
                    os.makedirs(a.dump, exist_ok=True)
                    for ext in ("ttgir", "ptx"):
                        open(f"{a.dump}/{shape}_{name}_T{T}.{ext}", "w").write(k.asm[ext])
                    open(f"{a.dump}/{shape}_{name}_T{T}.sass", "w").write(sass)
                o = ops(sass)
                w = o.index("ACQBULK") if "ACQBULK" in o else 0
                c = collections.Counter(o[w:])
                occ = occupancy(u["regs"], k.metadata.num_warps, k.metadata.shared)
                print(f"{shape[:3]} {name:10s} {T:2d} {u['regs']:5d} {u['stack']:3d} "
                      f"{k.metadata.shared:5d} {occ:3d} {len(o):6d} {w:4d} {len(o) - w:5d}  "
                      + " ".join(f"{c[k_]:{len(k_)}d}" for k_ in KINDS), flush=True)


if __name__ == "__main__":
    main()
