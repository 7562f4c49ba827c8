"""What a program of a matrix product does with its tile of weights, in every kernel of the
step that multiplies (`gemv`, `qkv_rope`, `lm_head_argmax`): find its split of the
columns (`split_columns`), load the tile before the PDL wait (`prefetch`), widen int8
weights (`widen`), and reduce it against x, or against RMSNorm(x) (`rows_dot`; for each
token of a pass, `rows_dots`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpuinfer.kernels.common import INTERPRETED, place_row, round_to

INTERPRET = tl.constexpr(INTERPRETED)  # read inside kernels: a compile-time constant


@triton.jit
def rstd_of(x, K, eps):
    """1 / sqrt(mean(x^2) + eps) of a tile x (FP32) that holds all K elements of x
    (zeros past them), in FP32 (LlamaRMSNorm)."""
    return tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))


@triton.jit
def rms_rstd(x_ptr, K, eps, K_NORM: tl.constexpr):
    """`rstd_of` x, all K elements of it loaded for it."""
    cols = tl.arange(0, K_NORM)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    return rstd_of(x, K, eps)


@triton.jit
def normed(x, g, rstd, dt):
    """LlamaRMSNorm of x given rstd: g * (x * rstd).to(dtype), each product rounded to
    the activations' dtype as PyTorch rounds it. x, g in FP32."""
    return round_to(g * round_to(x * rstd, dt), dt)


@triton.jit
def normed_cvt(x, g, rstd, dt):
    """`normed`, each rounding one conversion instruction (cvt.rn, to nearest, ties to
    even), which gives `round_to`'s bits (a GPU test checks them). A pass's products
    norm up to 16 tokens' x in every program: there the integer rounding was most of
    their growth with the tokens. Interpreted: `normed` (the interpreter truncates)."""
    if INTERPRET or dt == tl.float32:
        y = normed(x, g, rstd, dt)
    else:
        y = (g * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return y


@triton.jit
def widen(w, BITS: tl.constexpr):
    """A weight tile in FP32. An int8 tile goes through its float bits, not through
    conversion instructions: on the H100/H200 an int-to-float conversion issues at an
    eighth of the rate of a float multiply-add (16 a cycle per multiprocessor), and
    converting a step's 1.2 G int8 weights one instruction each takes as long as
    reading them. Flipped to an offset byte u = q + 128 and placed in the mantissa of
    2^23 (the bits 0x4B0000uu), a weight is the float 2^23 + u, exactly; a subtraction
    leaves q. Compiled, four bytes at a time: one XOR flips them, a byte permute
    (PRMT) places each. BITS=False: the conversion instruction, to measure its cost."""
    if w.dtype.is_int8() and BITS:
        if INTERPRET:  # the same arithmetic in plain operations
            u = w.to(tl.uint8, bitcast=True).to(tl.uint32) ^ 0x80
            f = (u | 0x4B000000).to(tl.float32, bitcast=True)
        else:
            f = tl.inline_asm_elementwise(
                """{
                .reg .b32 t;
                xor.b32 t, $4, 0x80808080;
                prmt.b32 $0, t, 0x4B000000, 0x7650;
                prmt.b32 $1, t, 0x4B000000, 0x7651;
                prmt.b32 $2, t, 0x4B000000, 0x7652;
                prmt.b32 $3, t, 0x4B000000, 0x7653;
                }""", "=r,=r,=r,=r,r", [w], dtype=tl.float32, is_pure=True, pack=4)
        return f - 8388736.0  # 2^23 + 128
    return w.to(tl.float32)


@triton.jit
def split_columns(pid_k, K, k_per_split):
    """The columns [k_lo, k_hi) of K that split pid_k of a split-K product reduces
    (program_id(1) of its grid), the last split's shorter."""
    k_lo = pid_k * k_per_split
    return k_lo, tl.minimum(k_lo + k_per_split, K)


@triton.jit
def prefetch(w_ptr, stride_w, rows, row_mask, k_lo, k_hi, norm_ptr, scale_ptr,
             NORM: tl.constexpr, SCALED: tl.constexpr, BLOCK_K: tl.constexpr):
    """The first weight tile W[rows, k_lo:k_lo + BLOCK_K], its RMSNorm weights and the
    rows' int8 scales: what a program loads *before* the PDL wait. Weights are never
    written, so they may be read while the previous kernel still runs; x, written by
    it, may not."""
    cols = k_lo + tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < k_hi),
                other=0.0)
    g = 0.0
    if NORM:
        g = tl.load(norm_ptr + cols, mask=cols < k_hi, other=0.0).to(tl.float32)
    s = 1.0
    if SCALED:
        s = tl.load(scale_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return w, g, s


@triton.jit
def load_normed(x_ptr, cols, mask, g, rstd, NORM: tl.constexpr):
    """x[cols] in FP32, and RMSNorm'd (`normed`, with rstd and the norm's weights g)
    if NORM."""
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        x = normed(x, g, rstd, x_ptr.dtype.element_ty)
    return x


@triton.jit
def row_sums(acc, s, SCALED: tl.constexpr):
    """The rows' sums of products (R, BLOCK_K) in FP32, times the rows' scales s if
    SCALED: once, at the end (a row's scale is the same for every column)."""
    y = tl.sum(acc, axis=1)
    if SCALED:
        y = y * s
    return y


@triton.jit
def tile_dot(w, x, g, s, K, eps, dt, NORM: tl.constexpr, SCALED: tl.constexpr,
             BITS: tl.constexpr):
    """The rows' dot products of one weight tile w with x (FP32, a tile of it that holds
    all of it when NORM: its RMSNorm from the tile's own sum of squares, `rstd_of`),
    times the rows' scales s if SCALED: a product whose split is this one tile, a step's
    (`rows_dot`) or each token's of a pass (`rows_dots`)."""
    if NORM:
        x = normed(x, g, rstd_of(x, K, eps), dt)
    return row_sums(widen(w, BITS) * x[None, :], s, SCALED)


@triton.jit
def rows_dot(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi, norm_ptr,
             eps, NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
             BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, BITS: tl.constexpr):
    """sum over k in [k_lo, k_hi) of W[rows, k] * xn[k] in FP32 (xn: x or RMSNorm(x)),
    times the row's scale s if SCALED, given the prefetched first tile (w, g, s); the
    rest in N_TILES - 1 more tiles (a constant trip count: the interpreter cannot loop
    over tensor bounds). BITS: how int8 weights are widened (`widen`)."""
    dt = x_ptr.dtype.element_ty
    cols = k_lo + tl.arange(0, BLOCK_K)
    if N_TILES == 1 and (not NORM or BLOCK_K == K_NORM):
        # one tile, and x's norm needs no other: one load serves the sum of squares and
        # the product
        x = tl.load(x_ptr + cols, mask=cols < k_hi, other=0.0).to(tl.float32)
        y = tile_dot(w, x, g, s, K, eps, dt, NORM, SCALED, BITS)
    else:
        rstd = 0.0
        if NORM:
            rstd = rms_rstd(x_ptr, K, eps, K_NORM)
        xn = load_normed(x_ptr, cols, cols < k_hi, g, rstd, NORM)
        # A 2-D accumulator, reduced once at the end: no cross-thread reduction per tile.
        acc = widen(w, BITS) * xn[None, :]
        w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
        for t in range(1, N_TILES):
            cols = k_lo + t * BLOCK_K + tl.arange(0, BLOCK_K)
            mask = cols < k_hi
            w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & mask[None, :],
                        other=0.0)
            if NORM:
                g = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            xn = load_normed(x_ptr, cols, mask, g, rstd, NORM)
            acc += widen(w, BITS) * xn[None, :]
        y = row_sums(acc, s, SCALED)
    return y


@triton.jit
def rows_dots(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi, norm_ptr,
              eps, NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
              BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, BITS: tl.constexpr,
              ROWS: tl.constexpr, R: tl.constexpr):
    """`rows_dot` for each of a pass's ROWS vectors (the rows of x, K apart): (R, n),
    row t the t-th's, each computed as a step computes it (the same numbers, to the
    bit: `tile_dot` for both). With one tile of weights (the tile spans the split, and
    x's norm needs no other), the tile stays in registers for every token, and each
    token's x is loaded while the one before it is reduced: a reduction's barrier would
    otherwise hold the next load back, one L2 round trip per token. More tiles: token
    after token."""
    if ROWS == 1:  # a step
        y = rows_dot(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi,
                     norm_ptr, eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, BITS)[None, :]
    elif N_TILES == 1 and (not NORM or BLOCK_K == K_NORM):
        dt = x_ptr.dtype.element_ty
        y = tl.zeros((R, w.shape[0]), tl.float32)
        cols = k_lo + tl.arange(0, BLOCK_K)
        mask = cols < k_hi
        x_next = tl.load(x_ptr + cols, mask=mask, other=0.0)
        for t in tl.static_range(ROWS):
            x = x_next.to(tl.float32)
            if t + 1 < ROWS:
                x_next = tl.load(x_ptr + (t + 1) * K + cols, mask=mask, other=0.0)
            y = place_row(y, tile_dot(w, x, g, s, K, eps, dt, NORM, SCALED, BITS), t, R)
    else:
        y = tl.zeros((R, w.shape[0]), tl.float32)
        for t in tl.static_range(ROWS):
            y = place_row(y, rows_dot(w, g, s, w_ptr, stride_w, rows, row_mask,
                                      x_ptr + t * K, K, k_lo, k_hi, norm_ptr, eps, NORM,
                                      SCALED, K_NORM, BLOCK_K, N_TILES, BITS), t, R)
    return y
