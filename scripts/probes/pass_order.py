"""Probe (issue 57): does a pass kernel pay for staging its weight tile before the PDL
wait? Compiled for sm_90 on the CPU (`pass_sass-2026-12-06-CPU.txt`), every pass
product writes its prefetched weight tile to shared memory (STS, BAR, LDSM: the MMA's
operand layout) *before* `griddepcontrol.wait`. Those stores consume the weights'
load registers, so a program reaches the wait, lets the next kernel launch
(`launch_dependents`) and issues x's load only once its whole tile has landed; the
step's GEMV waits on nothing before its wait. `--late` runs the pass with the tile
passed through an identity asm after x's load (the compiler cannot hoist its staging
over it): x is loaded and the next kernel launched right after the wait, the weights
staged while x is normed.

Run both orders, alternating processes, each against the step in its own rounds:

    cd scripts/probes && for o in "" --late "" --late; do
        PYTHONPATH=../../code timeout 120 python pass_order.py $o --shapes target 1b
    done

About 25 s a process on the H200 (target and 1B: rule only, T = 2, 5, 7, and a trace
at T = 5). `--smoke`: the toy shape, interpreted (the asm is skipped there).
"""

import os
import sys

import triton
import triton.language as tl

# --late: every product's tile fenced after x; --late-norm: only the RMSNorm'ed ones
# (q/k/v, gate/up: the one-tile branch), o and down as today
LATE = "--late" in sys.argv or "--late-norm" in sys.argv
FENCE_ALL_FLAG = "--late" in sys.argv
for flag in ("--late", "--late-norm"):
    if flag in sys.argv:
        sys.argv.remove(flag)
if "--smoke" in sys.argv:  # before any kernel module is imported
    from gpuinfer.kernels.interpret import use_interpreter
    use_interpreter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpuinfer.kernels import mma_dot  # noqa: E402
from gpuinfer.kernels.mma_dot import mma, x_tile  # noqa: E402
from gpuinfer.kernels.tile import INTERPRET, normed  # noqa: E402

FENCE_ALL = tl.constexpr(FENCE_ALL_FLAG)


@triton.jit
def after(w):
    """w unchanged, through an asm with side effects: what uses w (its staging into
    shared memory) stays after the ops before this call."""
    if INTERPRET:
        return w
    else:
        tl.static_assert(w.dtype.primitive_bitwidth == 16, "BF16 weights only")
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=w.dtype,
                                         is_pure=False, pack=2)


@triton.jit
def pass_dot_late(w, g, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi,
                  norm_ptr, eps, NORM: tl.constexpr, K_NORM: tl.constexpr,
                  BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                  ROWS: tl.constexpr, M: tl.constexpr, CHAINS: tl.constexpr):
    """`mma_dot.pass_dot` with the first tile's uses fenced after x's load."""
    tt = tl.arange(0, M)[:, None]
    tok = tt < ROWS
    cols = k_lo + tl.arange(0, BLOCK_K)
    acc = tl.zeros((M, w.shape[0]), tl.float32)
    rstd = tl.zeros((M,), tl.float32)
    if NORM and N_TILES == 1 and BLOCK_K == K_NORM:
        dt = x_ptr.dtype.element_ty
        x = tl.load(x_ptr + tt * K + cols[None, :], mask=tok & (cols < K)[None, :],
                    other=0.0)
        w = after(w)
        x = x.to(tl.float32)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=1) / K + eps))
        acc = mma(normed(x, g[None, :], rstd[:, None], dt).to(dt), w, acc, CHAINS)
    else:
        if NORM:
            ss = tl.zeros((M,), tl.float32)
            for i in range(N_NORM):
                c = i * BLOCK_K + tl.arange(0, BLOCK_K)
                x = tl.load(x_ptr + tt * K + c[None, :], mask=tok & (c < K)[None, :],
                            other=0.0).to(tl.float32)
                ss += tl.sum(x * x, axis=1)
            rstd = tl.math.div_rn(1.0, tl.sqrt_rn(ss / K + eps))
        x = x_tile(x_ptr, K, cols, k_hi, tt, tok, g, rstd, NORM)
        if FENCE_ALL:
            w = after(w)
        acc = mma(x, w, acc, CHAINS)
        w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
        for i in range(1, N_TILES):
            cols = k_lo + i * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_rows + cols[None, :],
                        mask=row_mask[:, None] & (cols < k_hi)[None, :], other=0.0)
            if NORM:
                g = tl.load(norm_ptr + cols, mask=cols < k_hi, other=0.0).to(tl.float32)
            acc = mma(x_tile(x_ptr, K, cols, k_hi, tt, tok, g, rstd, NORM), w, acc,
                      CHAINS)
    return acc


# --hw-round: the pass's norm rounded by cvt, not integer operations (`hw_round.py`)
HW_ROUND = "--hw-round" in sys.argv
if HW_ROUND:
    sys.argv.remove("--hw-round")
    import hw_round  # noqa: E402
    hw_round.patch(pass_only=True)

# --norm-after: the pass's norm as rstd * ((x * g) W^T), after the MMA (`norm_after.py`)
NORM_AFTER = "--norm-after" in sys.argv
if NORM_AFTER:
    sys.argv.remove("--norm-after")
    import norm_after  # noqa: E402
    norm_after.patch()

if LATE:  # before any pass kernel compiles: `product` reads pass_dot from here
    mma_dot.pass_dot = pass_dot_late

# --early: the products' kernels (step's and pass's: gemv, gemv_silu, q/k/v) let the
# next kernel launch before they even load their weights (`early_launch.py`)
# (with the package's products launching early already, since 2026-12-06 08:30 UTC)
# --early-others: the other kernels let the next launch before their wait;
# --early-others=pass_attention,pass_mma_heads: only those modules' kernels
EARLY = "--early" in sys.argv
OTHERS = next((a for a in sys.argv if a.startswith("--early-others")), None)
if EARLY or OTHERS:
    import early_launch  # noqa: E402
if EARLY:
    sys.argv.remove("--early")
    early_launch.patch()
if OTHERS:
    sys.argv.remove(OTHERS)
    _, _, names = OTHERS.partition("=")
    early_launch.patch_others(names.split(",") if names else early_launch.OTHERS)

# --qkv=ARM: one change to what the pass's q/k/v meets inside a pass (`qkv_context.py`)
QKV = next((a for a in sys.argv if a.startswith("--qkv=")), None)
if QKV:
    sys.argv.remove(QKV)
    import qkv_context  # noqa: E402
    qkv_context.patch(QKV.partition("=")[2])

import pass_variants as pv  # noqa: E402

for label in pv.VARIANTS:
    pv.VARIANTS[label] = {"rule": pv.VARIANTS[label]["rule"]}
staging = ("late (weights staged after x is loaded)" if FENCE_ALL_FLAG else
           "late for q/k/v and gate/up") if LATE else "as today"
pv.say(("pass norm rounded by cvt; " if HW_ROUND else "")
       + ("pass norm after the MMA; " if NORM_AFTER else "")
       + ("early launch; " if EARLY else "")
       + (f"others early ({OTHERS}); " if OTHERS else "")
       + (f"q/k/v {QKV[6:]}; " if QKV else "") + "pass_dot: " + staging)

if __name__ == "__main__":
    pv.main()
