"""Probe (issue 57), CPU: can a pass kernel's weight-tile staging (convert_layout to the
MMA operand layout: STS + BAR + LDSM) be moved relative to the PDL wait? Compiles, for
sm_90 at Chapter 6's target gate/up (2 x 2816 x 1024 BF16, 8 pairs x 1024 columns, 16
chains, PDL on), variants of `gemv.gemv_silu_kernel`'s MMA program, and dumps their
TTGIR/PTX/SASS into DIR for `pass_sass_order.py`:

  ORDER=0: the repo's program (`mma_dot.product`): Triton hoists the staging right
           after the weight load, before griddepcontrol.wait.
  ORDER=1: x loaded right after the wait, then the weight tile passed through an
           identity inline asm (is_pure=False), so its staging follows x's load.
  ORDER=2: as 1 with the identity asm before x's load (staging after the wait,
           before x's load).

    PYTHONPATH=code python scripts/probes/pass_sass_exp.py [DIR=/tmp/pass_sass]
"""
import os
import sys

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.aot import compile_only
from gpuinfer.kernels.common import pdl_wait, split_k_sum
from gpuinfer.kernels.gemv import gate_up_rows, store_silu
from gpuinfer.kernels.mma_dot import mma, product
from gpuinfer.kernels.tile import normed, prefetch, split_columns

sys.path.insert(0, os.path.dirname(__file__))
from pass_sass_dump import dump_and_say  # noqa: E402


@triton.jit
def after(w):
    """w unchanged, through an asm the compiler may not move (is_pure=False): what
    uses w is ordered after the ops before this call."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=w.dtype,
                                     is_pure=False, pack=2)


@triton.jit
def silu_order_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, ws_ptr, cnt_ptr,
                      N, K, stride_w, k_per_split, eps,
                      NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr,
                      ROWS: tl.constexpr, N_NORM: tl.constexpr, CHAINS: tl.constexpr,
                      ORDER: tl.constexpr):
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    r, j, rows = gate_up_rows(block, N, BLOCK_N)
    k_lo, k_hi = split_columns(pid_k, K, k_per_split)
    w, g, s = prefetch(w_ptr, stride_w, rows, j < N, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    R: tl.constexpr = triton.next_power_of_2(ROWS)
    rr = tl.arange(0, R)[:, None]
    if ORDER == 0:
        y = product(w, g, s, w_ptr, stride_w, rows, j < N, x_ptr, K, k_lo, k_hi,
                    norm_ptr, eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, N_NORM, True,
                    ROWS, R, CHAINS, True)
    else:  # pass_dot's one-tile NORM branch, the weights' uses fenced after x's load
        tl.static_assert(NORM and N_TILES == 1 and BLOCK_K == K_NORM)
        if ORDER == 2:
            w = after(w)
        dt = x_ptr.dtype.element_ty
        cols = k_lo + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rr * K + cols[None, :], mask=(rr < ROWS) & (cols < K)[None, :],
                    other=0.0)
        if ORDER == 1:
            w = after(w)
        x = x.to(tl.float32)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=1) / K + eps))
        y = mma(normed(x, g[None, :], rstd[:, None], dt).to(dt), w,
                tl.zeros((R, w.shape[0]), tl.float32), CHAINS)
    at = rr * (2 * BLOCK_N) + r[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K, R * 2 * BLOCK_N)
    if last:
        store_silu(out_ptr, y, block, N, rr, BLOCK_N, ROWS)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/pass_sass"
    os.makedirs(d, exist_ok=True)
    H, I = 1024, 2816
    t = lambda *s: torch.empty(s, dtype=torch.bfloat16)  # noqa: E731
    ws, cnt = t(1), torch.empty(1, dtype=torch.int32)
    for T in (2, 5):
        for order in (0, 1, 2):
            with compile_only(90) as compiled:
                silu_order_kernel[(I // 8, 1)](
                    t(2 * I, H), None, t(T, H), t(T, I), t(H), ws, cnt, I, H, H, H, 1e-5,
                    NORM=True, SCALED=False, K_NORM=H, BLOCK_N=8, BLOCK_K=H, N_TILES=1,
                    SPLIT_K=1, PDL=True, ROWS=T, N_NORM=1, CHAINS=16, ORDER=order,
                    num_warps=4, num_stages=1, launch_pdl=True)
            k = compiled[-1][2]
            label = f"exp_gate_up_T{T}_order{order}"
            dump_and_say(d, label, k)


if __name__ == "__main__":
    main()
