"""A tile's product on the tensor cores: x (M, BK) @ w (BN, BK)ᵀ, M the tokens of a
verify pass (padded by Triton to the MMA's 16), BN rows of a weight matrix.

One `tl.dot` over a tile of 1024 columns is 64 MMAs (m16n8k16) into one accumulator,
each waiting for the one before: at a pass's few rows a program's time is that chain,
not its bytes. `chains` cuts the tile's columns into independent dots, one batched
`tl.dot` of CHAINS accumulators, summed at the end (a different summation order:
results agree with a single chain within rounding, not to the bit).
"""

import triton
import triton.language as tl

from gpuinfer.kernels.tile import INTERPRET, widen


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
