"""Probe helper (issue 57): a pass's product with x's RMSNorm applied *after* the MMA.

Today a pass's program (`mma_dot.pass_dot`) loads its tokens' x, sums each token's
squares over all of K (a reduction across the program's warps), and only then can
norm x, element by element (two roundings), and feed the MMA: the MMA waits for the
reduction. Since rstd is one number a token,

    y[t, n] = sum_k rstd[t] g[k] x[t, k] W[n, k]
            = rstd[t] * sum_k (g[k] x[t, k]) W[n, k],

the MMA can take x ⊙ g (one rounding to x's dtype) while the sum of squares runs beside
it, from the same loaded tiles; rstd scales the (M, BN) sums at the end. The roundings
differ from the step's (`tile.normed` rounds x·rstd, then g·that): passes agree with
steps within rounding, not to the bit (the pass is an agreement figure already).

`patch()` gives `mma_dot.product` this `pass_dot` (before any kernel compiles).

    cd scripts/probes && PYTHONPATH=../../code python pass_order.py --norm-after ...
"""
import triton
import triton.language as tl

from gpuinfer.kernels.common import round_to
from gpuinfer.kernels.mma_dot import mma
from gpuinfer.kernels.tile import INTERPRET


@triton.jit
def scaled_x(x_ptr, K, cols, k_hi, tt, tok, g, NORM: tl.constexpr):
    """x[tt, cols] (M, BK) in x's dtype, times g (rounded once) if NORM, and the
    tile's squares summed per token (M,) in FP32 (zeros without NORM)."""
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + tt * K + cols[None, :], mask=tok & (cols < k_hi)[None, :],
                other=0.0)
    ss = tl.zeros((x.shape[0],), tl.float32)
    if NORM:
        xf = x.to(tl.float32)
        ss = tl.sum(xf * xf, axis=1)
        if INTERPRET:  # the interpreter's conversion does not round to nearest
            x = round_to(xf * g[None, :], dt).to(dt)
        else:
            x = (xf * g[None, :]).to(dt)
    return x, ss


@triton.jit
def pass_dot_after(w, g, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi,
                   norm_ptr, eps, NORM: tl.constexpr, K_NORM: tl.constexpr,
                   BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                   ROWS: tl.constexpr, M: tl.constexpr, CHAINS: tl.constexpr):
    """`mma_dot.pass_dot`, RMSNorm as rstd ⊙ ((x ⊙ g) Wᵀ). A normed product's program
    spans all of K (no split: N_TILES == N_NORM), so its tiles give the sums of
    squares."""
    tl.static_assert(not NORM or N_TILES == N_NORM, "a normed product split in K")
    tt = tl.arange(0, M)[:, None]
    tok = tt < ROWS
    cols = k_lo + tl.arange(0, BLOCK_K)
    x, ss = scaled_x(x_ptr, K, cols, k_hi, tt, tok, g, NORM)
    acc = mma(x, w, tl.zeros((M, w.shape[0]), tl.float32), CHAINS)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    for i in range(1, N_TILES):
        cols = k_lo + i * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_rows + cols[None, :],
                    mask=row_mask[:, None] & (cols < k_hi)[None, :], other=0.0)
        if NORM:
            g = tl.load(norm_ptr + cols, mask=cols < k_hi, other=0.0).to(tl.float32)
        x, part = scaled_x(x_ptr, K, cols, k_hi, tt, tok, g, NORM)
        ss += part
        acc = mma(x, w, acc, CHAINS)
    if NORM:
        acc = acc * tl.math.div_rn(1.0, tl.sqrt_rn(ss / K + eps))[:, None]
    return acc


def patch():
    """Before any pass kernel compiles: `product` reads pass_dot from mma_dot."""
    from gpuinfer.kernels import mma_dot
    mma_dot.pass_dot = pass_dot_after
