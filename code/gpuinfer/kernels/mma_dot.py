"""A tile's product on the tensor cores: x (M, BK) @ w (BN, BK)ᵀ, M the tokens of a
verify pass (padded by Triton to the MMA's 16), BN rows of a weight matrix.

One `tl.dot` over a tile of 1024 columns is 64 MMAs (m16n8k16) into one accumulator,
each waiting for the one before: at a pass's few rows a program's time is that chain,
not its bytes. `chains` cuts the tile's columns into independent dots, one batched
`tl.dot` of CHAINS accumulators, summed at the end (a different summation order:
results agree with a single chain within rounding, not to the bit).

A pass's whole product over a program's columns is `pass_dot`: the first tile
prefetched, the others loaded in a loop, x RMSNorm'ed per token. `product` picks it
(MMA) or the step's `tile.rows_dots`: a step's kernel and its pass's twin run one
program (`gemv.gemv_kernel`, which `pass_mma.gemv_pass_kernel` runs with MMA; gate/up,
q/k/v and the lm_head alike), different in their product only.
"""

import triton
import triton.language as tl

from gpuinfer.kernels.tile import INTERPRET, normed_cvt, rows_dots, widen


@triton.jit
def chained_dot(x, w, IEEE: tl.constexpr, CHAINS: tl.constexpr):
    """x (M, BK) @ w (BN, BK)ᵀ in FP32 as CHAINS dots of BK / CHAINS columns each, one
    batched `tl.dot` (independent accumulators, so the MMAs of one chain need not wait
    for the others'), then summed."""
    M: tl.constexpr = x.shape[0]
    BN: tl.constexpr = w.shape[0]
    KC: tl.constexpr = x.shape[1] // CHAINS
    xs = tl.permute(tl.reshape(x, (M, CHAINS, KC)), (1, 0, 2))  # (C, M, KC)
    ws = tl.permute(tl.reshape(w, (BN, CHAINS, KC)), (1, 2, 0))  # (C, KC, BN)
    if IEEE:
        return tl.sum(tl.dot(xs, ws, input_precision="ieee"), axis=0)
    return tl.sum(tl.dot(xs, ws), axis=0)


@triton.jit
def mma(x, w, acc, CHAINS: tl.constexpr = 1):
    """acc + x (M, BK) @ w (BN, BK)ᵀ in FP32 over CHAINS accumulators. Int8 weights
    are widened through their bits (`widen`, exact) and go to x's dtype, which holds
    every int8 value exactly."""
    if w.dtype.is_int8():
        w = widen(w, True)
    if INTERPRET:  # the interpreter's dot takes no BF16
        x, w = x.to(tl.float32), w.to(tl.float32)
    w = w.to(x.dtype)
    ieee: tl.constexpr = x.dtype == tl.float32  # FP32 checks: no TF32 rounding
    if CHAINS > 1:
        return acc + chained_dot(x, w, ieee, CHAINS)
    if ieee:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def tokens_rstd(ss, K, eps):
    """Each token's RMSNorm factor 1 / sqrt(ss / K + eps) from its sum of squares ss
    (M,), by the approximate reciprocal square root: one MUFU a token. The step's
    correctly rounded sqrt and division compile, for the pass's M rows, to a chain of
    Newton steps and branches after the PDL wait in every program (0.1 steps of a
    pass of 5 tokens at Chapter 6's target, H100). The factor differs in its last
    bits, as the MMA's summation order already makes the pass differ from the step."""
    return tl.math.rsqrt(ss / K + eps)


@triton.jit
def x_tile(x_ptr, K, cols, k_hi, tt, tok, g, rstd, NORM: tl.constexpr):
    """The pass's x[tt, cols] (M, BK) in x's dtype, RMSNorm'ed per token if NORM (g the
    tile's norm weights, rstd (M,) each token's), rounded as PyTorch rounds it."""
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + tt * K + cols[None, :], mask=tok & (cols < k_hi)[None, :],
                other=0.0)
    if NORM:
        x = normed_cvt(x.to(tl.float32), g[None, :], rstd[:, None], dt).to(dt)
    return x


@triton.jit
def pass_dot(w, g, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi, norm_ptr, eps,
             NORM: tl.constexpr, K_NORM: tl.constexpr, BLOCK_K: tl.constexpr,
             N_TILES: tl.constexpr, N_NORM: tl.constexpr, ROWS: tl.constexpr,
             M: tl.constexpr, CHAINS: tl.constexpr):
    """(M, BN) FP32: row t < ROWS the sums over k in [k_lo, k_hi) of xn[t, k] W[rows, k]
    (xn: x or RMSNorm(x)), given the prefetched first tile (w, g); rows past ROWS zero.
    RMSNorm needs each token's sum of squares over all of K first: one load of x when
    the tile spans it, else a loop of N_NORM tiles (x is read twice, from L2)."""
    tt = tl.arange(0, M)[:, None]
    tok = tt < ROWS
    cols = k_lo + tl.arange(0, BLOCK_K)
    acc = tl.zeros((M, w.shape[0]), tl.float32)
    rstd = tl.zeros((M,), tl.float32)
    if NORM and N_TILES == 1 and BLOCK_K == K_NORM:  # one load of x serves both
        dt = x_ptr.dtype.element_ty
        x = tl.load(x_ptr + tt * K + cols[None, :], mask=tok & (cols < K)[None, :],
                    other=0.0).to(tl.float32)
        rstd = tokens_rstd(tl.sum(x * x, axis=1), K, eps)
        acc = mma(normed_cvt(x, g[None, :], rstd[:, None], dt).to(dt), w, acc, CHAINS)
    else:
        if NORM:
            ss = tl.zeros((M,), tl.float32)
            for i in range(N_NORM):
                c = i * BLOCK_K + tl.arange(0, BLOCK_K)
                x = tl.load(x_ptr + tt * K + c[None, :], mask=tok & (c < K)[None, :],
                            other=0.0).to(tl.float32)
                ss += tl.sum(x * x, axis=1)
            rstd = tokens_rstd(ss, K, eps)
        acc = mma(x_tile(x_ptr, K, cols, k_hi, tt, tok, g, rstd, NORM), w, acc,
                  CHAINS)
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


@triton.jit
def product(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi, norm_ptr,
            eps, NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
            BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, N_NORM: tl.constexpr,
            BITS: tl.constexpr, ROWS: tl.constexpr, R: tl.constexpr,
            CHAINS: tl.constexpr, MMA: tl.constexpr):
    """A program's product, (R, BN) FP32: row t < ROWS the sums over k in [k_lo, k_hi)
    of xn[t, k] W[rows, k] (xn: x or RMSNorm(x)) times the rows' scales s if SCALED,
    given the prefetched first tile (w, g, s). MMA: a pass's, on the tensor cores
    (`pass_dot`: N_NORM, CHAINS); else a step's, a row of x after another, each
    reduced as a step reduces it (`tile.rows_dots`: BITS)."""
    if MMA:
        y = pass_dot(w, g, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi,
                     norm_ptr, eps, NORM, K_NORM, BLOCK_K, N_TILES, N_NORM, ROWS, R,
                     CHAINS)
        if SCALED:  # a row's scale, the same for every column: on the sums
            y = y * s[None, :]
    else:
        y = rows_dots(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi,
                      norm_ptr, eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, BITS, ROWS,
                      R)
    return y
