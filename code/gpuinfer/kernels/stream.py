"""GEMVs that stream: a few programs per multiprocessor, each multiplying row block
after row block, with the next block's weights in flight while it multiplies this one.

`gemv` launches one program per block of rows: thousands for the gate/up matrix, in
waves. Each program loads its tile, waits for it, multiplies and exits, and the last
wave leaves multiprocessors idle while it ends. Here the grid is `per_sm` programs per
multiprocessor, as many as are resident at once, and program p takes the blocks p,
p + grid, p + 2 grid, ...: while it multiplies one block, the loads of the next are
already issued (two tiles live in its registers), so every multiprocessor keeps bytes
in flight from its first block to its last. The first block's tile is loaded before
the PDL wait, as in `gemv`; x (and its RMSNorm) is read once per program, not once per
block. A tile is a block's whole rows (block_k = K), so that one block is one load.

The arithmetic is `gemv`'s with one tile per block (`GemvConfig(block_n, K)`): the
same products, sums and roundings, in the same order. Programs never wait on each
other, so the interpreter runs the same code (one program after another).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import INTERPRETED, launch_options, pdl_wait, round_to
from gpuinfer.kernels.gemv import normed, prefetch, widen


def resident_grid(blocks: int, per_sm: int, device) -> tuple[int, int]:
    """(programs, blocks per program) for `blocks` row blocks at `per_sm` programs per
    multiprocessor; interpreted, two programs (so that each takes several blocks)."""
    device = torch.device(device)
    if INTERPRETED or device.type != "cuda":
        sms = 1
    else:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = max(1, min(blocks, per_sm * sms * (2 if sms == 1 else 1)))
    return programs, triton.cdiv(blocks, programs)


@triton.jit
def x_normed(x_ptr, g, K, eps, NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """x in FP32, RMSNorm'ed (weights g) if NORM: all K columns, once per program."""
    cols = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))
        x = normed(x, g, rstd, x_ptr.dtype.element_ty)
    return x


@triton.jit
def stream_gemv_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, N, K,
                       stride_w, eps, NORM: tl.constexpr, SCALED: tl.constexpr,
                       RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, ITERS: tl.constexpr, PDL: tl.constexpr):
    """out = [res +] W @ [RMSNorm](x), blocks of BLOCK_N rows, ITERS per program."""
    step = tl.num_programs(0) * BLOCK_N
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w, g, s = prefetch(w_ptr, stride_w, rows, rows < N, 0, K, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    xn = x_normed(x_ptr, g, K, eps, NORM, BLOCK_K)
    dt = out_ptr.dtype.element_ty
    for _ in range(ITERS):
        # the next block's tile first: in flight while this one is multiplied
        nxt = rows + step
        w_next, _g, s_next = prefetch(w_ptr, stride_w, nxt, nxt < N, 0, K, norm_ptr,
                                      scale_ptr, False, SCALED, BLOCK_K)
        acc = tl.sum(widen(w, True) * xn[None, :], axis=1)
        if SCALED:
            acc = acc * s
        y = round_to(acc, dt)
        if RESIDUAL:
            y = round_to(tl.load(res_ptr + rows, mask=rows < N).to(tl.float32) + y, dt)
        tl.store(out_ptr + rows, y.to(dt), mask=rows < N)
        w, s, rows = w_next, s_next, nxt


@triton.jit
def stream_silu_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, N, K, stride_w, eps,
                       NORM: tl.constexpr, SCALED: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, ITERS: tl.constexpr, PDL: tl.constexpr):
    """out[j] = SiLU(gate_j) * up_j for W = [gate; up] (2N rows), BLOCK_N pairs a
    block; tile row 2i is gate row j, row 2i + 1 up row j (`gemv_silu_kernel`)."""
    step = tl.num_programs(0) * BLOCK_N
    r = tl.arange(0, 2 * BLOCK_N)
    j = tl.program_id(0) * BLOCK_N + r // 2
    w, g, s = prefetch(w_ptr, stride_w, j + (r % 2) * N, j < N, 0, K, norm_ptr,
                       scale_ptr, NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    xn = x_normed(x_ptr, g, K, eps, NORM, BLOCK_K)
    dt = out_ptr.dtype.element_ty
    jj = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    for _ in range(ITERS):
        nj = j + step
        w_next, _g, s_next = prefetch(w_ptr, stride_w, nj + (r % 2) * N, nj < N, 0, K,
                                      norm_ptr, scale_ptr, False, SCALED, BLOCK_K)
        acc = tl.sum(widen(w, True) * xn[None, :], axis=1)
        if SCALED:
            acc = acc * s
        gate, up = tl.split(tl.reshape(acc, (BLOCK_N, 2)))
        gate = round_to(gate, dt)
        silu = round_to(gate / (1.0 + tl.exp(-gate)), dt)
        tl.store(out_ptr + jj, round_to(silu * round_to(up, dt), dt).to(dt),
                 mask=jj < N)
        w, s, j, jj = w_next, s_next, nj, jj + step


def stream_gemv(w, scale, x, out, *, norm, eps, residual, block_n, per_sm, num_warps,
                pdl) -> torch.Tensor:
    """`gemv` streamed: W (N, K) as stored (scale: int8's per-row scales, or None)."""
    n, k = w.shape
    programs, iters = resident_grid(triton.cdiv(n, block_n), per_sm, w.device)
    stream_gemv_kernel[(programs,)](
        w, scale, x, out, residual, norm, n, k, w.stride(0), eps,
        NORM=norm is not None, SCALED=scale is not None, RESIDUAL=residual is not None,
        BLOCK_N=block_n, BLOCK_K=triton.next_power_of_2(k), ITERS=iters, PDL=pdl,
        **launch_options(num_warps, 1, pdl))
    return out


def stream_silu(w, scale, x, out, *, norm, eps, block_n, per_sm, num_warps,
                pdl) -> torch.Tensor:
    """`gemv_silu` streamed: the stacked gate/up W (2N, K) -> (N,)."""
    n2, k = w.shape
    programs, iters = resident_grid(triton.cdiv(n2 // 2, block_n), per_sm, w.device)
    stream_silu_kernel[(programs,)](
        w, scale, x, out, norm, n2 // 2, k, w.stride(0), eps,
        NORM=norm is not None, SCALED=scale is not None, BLOCK_N=block_n,
        BLOCK_K=triton.next_power_of_2(k), ITERS=iters, PDL=pdl,
        **launch_options(num_warps, 1, pdl))
    return out
