"""The batch-1 matrix-vector product y = W @ x, the step's dominant kernel.

At batch 1 a GEMV reads each weight once and does two flops per weight: its time is
the time to stream W from HBM. Each program reduces `block_n` rows over a range of
columns; what matters is how many programs stream at once and how soon each starts:

- Under Programmatic Dependent Launch a kernel starts while the previous one
  finishes. The weights do not depend on the previous kernel, only x does: each
  program loads its first weight tile (`prefetch`) *before* the PDL wait
  (`pdl_wait`). With `block_k >= K / split_k` that tile is the program's whole slice,
  all of it in flight before the previous kernel ends.
- `split_k` cuts the columns into ranges, one program each, so that a small matrix
  still has many programs; the last program of a block of rows sums the partials in
  a fixed order (`split_k_sum`) and runs the epilogue. (On the H200 it did not pay:
  scripts/probes/NOTES-triton.md.)
- Fusions: RMSNorm in the prologue (each program recomputes the sum of squares of x,
  2048 elements from L2), a residual add in the epilogue, and SiLU(gate) * up for the
  stacked gate/up matrix, whose paired rows each program computes together.
- Weights may be int8 with a scale per row (`gpuinfer.kernels.quant`): the tile is
  loaded as int8, widened in registers (`widen`, without a conversion instruction),
  and each row's sum multiplied by its scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gpuinfer.model.llama import rms_norm
from gpuinfer.kernels.common import (INTERPRETED, Workspace, check_pow2, launch_options,
                                     pdl_wait, round_to, split_k_sum)
from gpuinfer.kernels.quant import Int8Matrix, matvec_fp32, unpack

INTERPRET = tl.constexpr(INTERPRETED)  # read inside kernels: a compile-time constant
INT8_WIDEN = ("bits", "convert")  # how `gemv` widens int8 weights (`widen`)


@dataclass(frozen=True)
class GemvConfig:
    """Tiling of one GEMV. block_n counts outputs per program: rows, or (row, row)
    pairs for the paired epilogues (SiLU(gate) * up, rotary), which load 2 * block_n
    rows."""

    block_n: int = 8
    block_k: int = 2048
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        # tile sizes are tl.arange sizes: refused when the config is made, not at a launch
        check_pow2(block_n=self.block_n, block_k=self.block_k)

    def fit(self, k: int) -> GemvConfig:
        """This tiling for K = k columns: a tile no wider than k (rounded up to a power
        of two), since a wider one would only load masked-out columns."""
        return replace(self, block_k=min(self.block_k, triton.next_power_of_2(k)))

    def k_per_split(self, k: int) -> int:
        """Columns per split, a multiple of block_k."""
        return triton.cdiv(triton.cdiv(k, self.split_k), self.block_k) * self.block_k

    def tiles(self, k: int) -> int:
        """Tiles of block_k columns per split."""
        return self.k_per_split(k) // self.block_k

    def splits(self, k: int) -> int:
        """The number of non-empty splits (fewer than split_k when K is short)."""
        return triton.cdiv(k, self.k_per_split(k))

    def grid(self, n_out: int, k: int) -> tuple[int, int]:
        return triton.cdiv(n_out, self.block_n), self.splits(k)


@triton.jit
def rms_rstd(x_ptr, K, eps, K_NORM: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) over all K elements of x, in FP32 (LlamaRMSNorm)."""
    cols = tl.arange(0, K_NORM)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / K
    return tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))


@triton.jit
def normed(x, g, rstd, dt):
    """LlamaRMSNorm of x given rstd: g * (x * rstd).to(dtype), each product rounded to
    the activations' dtype as PyTorch rounds it. x, g in FP32."""
    return round_to(g * round_to(x * rstd, dt), dt)


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
def rows_dot(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, k_lo, k_hi, norm_ptr,
             eps, NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
             BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, BITS: tl.constexpr):
    """sum over k in [k_lo, k_hi) of W[rows, k] * xn[k] in FP32 (xn: x or RMSNorm(x)),
    times the row's scale s if SCALED, given the prefetched first tile (w, g, s); the
    rest in N_TILES - 1 more tiles (a constant trip count: the interpreter cannot loop
    over tensor bounds). BITS: how int8 weights are widened (`widen`)."""
    dt = x_ptr.dtype.element_ty
    cols = k_lo + tl.arange(0, BLOCK_K)
    if NORM and N_TILES == 1 and BLOCK_K == K_NORM:
        # the tile spans all of x: one load serves the sum of squares and the product
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))
        xn = normed(x, g, rstd, dt)
    else:
        rstd = 0.0
        if NORM:
            rstd = rms_rstd(x_ptr, K, eps, K_NORM)
        xn = tl.load(x_ptr + cols, mask=cols < k_hi, other=0.0).to(tl.float32)
        if NORM:
            xn = normed(xn, g, rstd, dt)
    # A 2-D accumulator, reduced once at the end: no cross-thread reduction per tile.
    acc = widen(w, BITS) * xn[None, :]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    for t in range(1, N_TILES):
        cols = k_lo + t * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = cols < k_hi
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & mask[None, :],
                    other=0.0)
        xn = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            g = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            xn = normed(xn, g, rstd, dt)
        acc += widen(w, BITS) * xn[None, :]
    if SCALED:  # the scale is the row's, the same for every column: once, at the end
        return tl.sum(acc, axis=1) * s
    return tl.sum(acc, axis=1)


@triton.jit
def gemv_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, ws_ptr, cnt_ptr,
                N, K, stride_w, k_per_split, eps,
                NORM: tl.constexpr, SCALED: tl.constexpr, RESIDUAL: tl.constexpr,
                K_NORM: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                SPLIT_K: tl.constexpr, PDL: tl.constexpr, BITS: tl.constexpr):
    """out = [res +] W @ [RMSNorm](x). out may be res itself: each program reads and
    writes only its own rows of it."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    valid = rows < N
    w, g, s = prefetch(w_ptr, stride_w, rows, valid, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    res = 0.0
    if RESIDUAL:  # now, in the shadow of the weights, not after the sum
        res = tl.load(res_ptr + rows, mask=valid).to(tl.float32)
    acc = rows_dot(w, g, s, w_ptr, stride_w, rows, valid, x_ptr, K, k_lo, k_hi,
                   norm_ptr, eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, BITS)
    acc, last = split_k_sum(acc, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K, BLOCK_N)
    if last:
        dt = out_ptr.dtype.element_ty
        y = round_to(acc, dt)  # F.linear's output, in the activations' dtype
        if RESIDUAL:
            y = round_to(res + y, dt)
        tl.store(out_ptr + rows, y.to(dt), mask=valid)


@triton.jit
def gemv_silu_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, ws_ptr, cnt_ptr,
                     N, K, stride_w, k_per_split, eps,
                     NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr):
    """out[j] = SiLU(gate_j) * up_j for W = [gate; up] (2N rows): the MLP's
    intermediate is written once, gate and up never. Tile row 2i is gate row j, row
    2i + 1 up row j."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.arange(0, 2 * BLOCK_N)
    j = block * BLOCK_N + r // 2
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rows = j + (r % 2) * N
    w, g, s = prefetch(w_ptr, stride_w, rows, j < N, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    acc = rows_dot(w, g, s, w_ptr, stride_w, rows, j < N, x_ptr, K, k_lo, k_hi,
                   norm_ptr, eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, True)
    acc, last = split_k_sum(acc, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K, 2 * BLOCK_N)
    if last:
        dt = out_ptr.dtype.element_ty
        gate, up = tl.split(tl.reshape(acc, (BLOCK_N, 2)))
        gate = round_to(gate, dt)
        silu = round_to(gate / (1.0 + tl.exp(-gate)), dt)
        out = round_to(silu * round_to(up, dt), dt)
        jj = block * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out_ptr + jj, out.to(dt), mask=jj < N)


def workspace_for(config: GemvConfig, n_out: int, k: int, rows_per_out: int,
                  workspace: Workspace | None, device) -> Workspace:
    """The workspace a split-K launch needs (a fresh one if none is given)."""
    blocks, splits = config.grid(n_out, k)
    need = blocks * splits * config.block_n * rows_per_out
    if workspace is None:
        return Workspace(device, need if splits > 1 else 1, blocks)
    return workspace.check(need if splits > 1 else 0, blocks)


def gemv(w: torch.Tensor | Int8Matrix, x: torch.Tensor, out: torch.Tensor | None = None,
         *, norm: torch.Tensor | None = None, eps: float = 1e-5,
         residual: torch.Tensor | None = None, config: GemvConfig = GemvConfig(),
         pdl: bool = False, workspace: Workspace | None = None,
         int8_widen: str = "bits") -> torch.Tensor:
    """W (N, K) @ x (K,) -> (N,), with the RMSNorm prologue (`norm`, its weight) and
    the residual add (`residual`, may be `out` itself) when given. W: in x's dtype, or
    an Int8Matrix, widened to FP32 through its float bits ("bits") or by conversion
    instructions ("convert"), the same numbers either way (`widen`)."""
    if int8_widen not in INT8_WIDEN:
        raise ValueError(f"int8_widen={int8_widen!r}: one of {INT8_WIDEN}")
    w, scale = unpack(w)
    n, k = w.shape
    out = torch.empty(n, device=w.device, dtype=x.dtype) if out is None else out
    ws = workspace_for(config, n, k, 1, workspace, w.device)
    grid = config.grid(n, k)
    gemv_kernel[grid](
        w, scale, x, out, residual, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps,
        NORM=norm is not None, SCALED=scale is not None, RESIDUAL=residual is not None,
        K_NORM=triton.next_power_of_2(k), BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, N_TILES=config.tiles(k), SPLIT_K=grid[1], PDL=pdl,
        BITS=int8_widen == "bits",
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv_silu(w: torch.Tensor | Int8Matrix, x: torch.Tensor,
              out: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
              eps: float = 1e-5, config: GemvConfig = GemvConfig(), pdl: bool = False,
              workspace: Workspace | None = None) -> torch.Tensor:
    """SiLU(W[:N] @ xn) * (W[N:] @ xn) for the stacked gate/up W (2N, K) -> (N,)."""
    w, scale = unpack(w)
    n2, k = w.shape
    n = n2 // 2
    out = torch.empty(n, device=w.device, dtype=x.dtype) if out is None else out
    ws = workspace_for(config, n, k, 2, workspace, w.device)
    grid = config.grid(n, k)
    gemv_silu_kernel[grid](
        w, scale, x, out, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps,
        NORM=norm is not None, SCALED=scale is not None,
        K_NORM=triton.next_power_of_2(k),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, N_TILES=config.tiles(k),
        SPLIT_K=grid[1], PDL=pdl,
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv_reference(w, x, *, norm=None, eps=1e-5, residual=None) -> torch.Tensor:
    """`gemv` in plain PyTorch: FP32 products and sums, rounded as F.linear rounds."""
    xn = x if norm is None else rms_norm(x, norm, eps)
    y = matvec_fp32(w, xn).to(x.dtype)
    return y if residual is None else residual + y


def gemv_silu_reference(w, x, *, norm=None, eps=1e-5) -> torch.Tensor:
    """`gemv_silu` in plain PyTorch: F.silu(gate) * up, as the Llama MLP computes it."""
    gate, up = gemv_reference(w, x, norm=norm, eps=eps).chunk(2)
    return torch.nn.functional.silu(gate) * up
