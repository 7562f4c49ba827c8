"""CPU analysis (issue 57): what a verify pass's kernels cost the H100 on paper, read
off their sm_90 binaries, compiled ahead on a machine without a GPU (`kernels.aot`).

For the step's kernels (`tiling.default_configs`, T = 1) and the tensor-core pass's
(`pass_mma.mma_configs`, T = 2, 5, 8), at Chapter 6's target shape and the 1B shape,
BF16, PDL on: registers, stack (spills), shared memory (static + Triton's dynamic),
the programs an SM holds (registers, warps, shared memory), the grid, the programs an
SM gets (grid / 132, at most what it holds), the weight bytes a program loads before
its PDL wait (the first tile) and after it, the bytes in flight per SM before the
wait (first tile x programs an SM gets, "preSM") and in the loop after it (tile x
(stages - 1) x programs an SM gets, where a program has more tiles, "loopSM"), and
whether the MMAs are wgmma (HGMMA) or mma.sync (HMMA), grepped from the PTX and the
SASS. Also the launches of a step and of a pass, counted from the launchers called.

    PYTHONPATH=code python scripts/probes/pass_resources.py [--tokens 2 5 8]

Run it without TRITON_INTERPRET. About 2 minutes on a 2-core CPU (ptxas).
"""

import argparse
import math
import re
import subprocess
import tempfile

import torch
import triton

from gpuinfer.kernels.aot import _cuobjdump, compile_only, resource_usage
from gpuinfer.kernels.tiling import default_attention, default_configs

SMS, REGS_SM, THREADS_SM, SMEM_SM, BLOCKS_SM = 132, 65536, 2048, 233472, 32
TARGET = dict(hidden=1024, inter=2816, heads=16, kv=4, d=64, vocab=8192, layers=16)
ONE_B = dict(hidden=2048, inter=8192, heads=32, kv=8, d=64, vocab=128256, layers=16)
SHAPES = {"target": TARGET, "1b": ONE_B}
CAPACITY = 256  # spec_mma.py's decoders: attention's one program a kv head
BF16 = torch.bfloat16


def llama(s):
    from types import SimpleNamespace
    return SimpleNamespace(hidden_size=s["hidden"], intermediate_size=s["inter"],
                           num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                           head_dim=s["d"], vocab_size=s["vocab"])


def mma_kind(kernel) -> str:
    """'wgmma' (HGMMA), 'mma.sync' (HMMA) or '-' from the PTX and the SASS."""
    ptx = kernel.asm.get("ptx", "")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    hg, hm = len(re.findall(r"\bHGMMA", sass)), len(re.findall(r"\bHMMA", sass))
    if "wgmma" in ptx or hg:
        return f"wgmma({hg})"
    if "mma.sync" in ptx or hm:
        return f"mma.sync({hm})"
    return "-"


def resident(regs, warps, smem) -> int:
    """Programs an H100 SM holds: registers (256 a warp granule), threads, shared."""
    per_warp = math.ceil(regs * 32 / 256) * 256
    by_regs = REGS_SM // (per_warp * warps)
    by_threads = THREADS_SM // (32 * warps)
    by_smem = SMEM_SM // (smem + 1024) if smem else BLOCKS_SM
    return min(BLOCKS_SM, by_regs, by_threads, by_smem)


class Plan:
    """What each launch loads: (rows a program, block_k, tiles a program, stages)."""

    def __init__(self):
        self.rows = []  # (name, grid programs, tile bytes, tiles a program, stages)

    def add(self, name, programs, rows, block_k, tiles, stages):
        self.rows.append((name, programs, rows * block_k * 2, tiles, stages))


def launch_all(s, tokens, plan, configs, mma):
    """Every kernel of one layer and the head, step (mma None) or pass; fills plan."""
    from gpuinfer.kernels.attention import decode_attention
    from gpuinfer.kernels.embed_head import embed, lm_head_argmax
    from gpuinfer.kernels.gemv import gemv, gemv_silu
    from gpuinfer.kernels.pass_mma import gemv_pass, gemv_silu_pass
    from gpuinfer.kernels.pass_mma_heads import lm_head_argmax_pass, qkv_rope_pass
    from gpuinfer.kernels.qkv_rope import qkv_rope

    h, i, heads, kv, d, v = (s[k] for k in ("hidden", "inter", "heads", "kv", "d",
                                            "vocab"))

    def t(*shape, dt=BF16):
        return torch.empty(shape, dtype=dt)

    one = tokens == 1
    row = (lambda *n: t(*n)) if one else (lambda *n: t(tokens, *n))
    x, pos, toks = row(h), t(1, dt=torch.long), t(CAPACITY, dt=torch.long)
    cache, table, q = t(kv, CAPACITY, d), t(CAPACITY, d), row(heads * d)
    c = configs
    ks = {"qkv": h, "o": heads * d, "gate_up": h, "down": i, "lm_head": h}
    outs = {"qkv": (heads + 2 * kv) * d // 2, "o": h, "gate_up": i, "down": h,
            "lm_head": v}
    for name in ks:
        cf = c[name].fit(ks[name])
        per = 2 if name in ("qkv", "gate_up") else 1
        blocks, splits = cf.grid(outs[name], ks[name])
        plan.add(name, blocks * splits, cf.block_n * per, cf.block_k,
                 cf.tiles(ks[name]), cf.num_stages)
    embed(t(v, h), toks, pos, x, pdl=True)
    if mma:
        qkv_rope_pass(t((heads + 2 * kv) * d, h), x, q, cache, cache, table, table,
                      pos, n_heads=heads, norm=t(h), config=c["qkv"], pdl=True)
    else:
        qkv_rope(t((heads + 2 * kv) * d, h), x, q, cache, cache, table, table, pos,
                 n_heads=heads, norm=t(h), config=c["qkv"], pdl=True)
    decode_attention(q, cache, cache, pos, row(heads * d), pdl=True,
                     **default_attention(True, CAPACITY))
    o, down, gu = (gemv_pass, gemv_pass, gemv_silu_pass) if mma else \
        (gemv, gemv, gemv_silu)
    o(t(h, heads * d), q, x, residual=x, config=c["o"], pdl=True)
    gu(t(2 * i, h), x, row(i), norm=t(h), config=c["gate_up"], pdl=True)
    down(t(h, i), row(i), x, residual=x, config=c["down"], pdl=True)
    if mma:
        lm_head_argmax_pass(t(v, h), x, row(v), toks, pos, norm=t(h),
                            config=c["lm_head"], inline=False, pdl=True)
    else:
        lm_head_argmax(t(v, h), x, row(v), toks, pos, norm=t(h),
                       config=c["lm_head"], inline=False, pdl=True)


GEMV_KERNELS = {"qkv_rope_kernel": "qkv", "qkv_rope_pass_kernel": "qkv",
                "gemv_kernel": None, "gemv_pass_kernel": None,
                "gemv_silu_kernel": "gate_up", "gemv_silu_pass_kernel": "gate_up",
                "lm_head_argmax_kernel": "lm_head", "lm_head_pass_kernel": "lm_head"}


def report(label, s, tokens, mma):
    from gpuinfer.kernels.pass_mma import mma_configs
    configs = mma_configs(llama(s), gpu=True) if mma else default_configs(True)
    plan = Plan()
    with compile_only(90) as compiled:
        launch_all(s, tokens, plan, configs, mma)
    products = {name: rest for name, *rest in plan.rows}
    gemv_seen = iter(("o", "down"))
    print(f"\n{label} T={tokens} ({'mma pass' if mma else 'step'}): "
          f"{len(compiled)} launches for embed + 1 layer + head; a "
          f"{'pass' if mma else 'step'} launches {1 + 5 * s['layers'] + 2}", flush=True)
    print(f"  {'kernel':24s} {'prod':7s} regs stk  smem occ warps  grid  /SM  "
          f"pre-KB post-KB preSM loopSM mma")
    for name, kwargs, kernel in compiled:
        u = resource_usage(kernel)
        smem = kernel.metadata.shared
        warps = kernel.metadata.num_warps
        occ = resident(u["regs"], warps, smem)
        prod = GEMV_KERNELS.get(name, "-")
        if name in ("gemv_kernel", "gemv_pass_kernel"):
            prod = next(gemv_seen)
        cells = ""
        if prod and prod != "-":
            programs, tile, tiles, stages = products[prod]
            per_sm = min(occ, programs / SMS)
            pre = tile * per_sm / 1024  # issued before the PDL wait, an SM
            loop = tile * max(1, stages - 1) * per_sm / 1024 if tiles > 1 else 0
            cells = (f"{programs:5d} {programs / SMS:4.1f} {tile / 1024:6.1f} "
                     f"{tile * (tiles - 1) / 1024:7.1f} {pre:6.1f} {loop:6.1f}")
        else:
            cells = f"{'':5s} {'':4s} {'':6s} {'':7s} {'':6s} {'':6s}"
        print(f"  {name:24s} {prod:7s} {u['regs']:4d} {u['stack']:3d} {smem:5d} "
              f"{occ:3d} {occ * warps:5d} {cells} {mma_kind(kernel)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="*", default=[2, 5, 8])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    a = ap.parse_args()
    from gpuinfer.kernels.common import INTERPRETED
    if INTERPRETED:
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels do not compile")
    for label in a.shapes:
        s = SHAPES[label]
        report(label, s, 1, mma=False)
        for t in a.tokens:
            report(label, s, t, mma=True)


if __name__ == "__main__":
    main()
