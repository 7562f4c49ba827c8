"""The batch-1 matrix-vector product y = W @ x, the step's dominant kernel.

At batch 1 a GEMV reads each weight once and does two flops per weight: its time is
the time to stream W from HBM. Each program reduces `block_n` rows over a range of
columns; what matters is how many programs stream at once and how soon each starts:

- Under Programmatic Dependent Launch a kernel starts while the previous one
  finishes. The weights do not depend on the previous kernel, only x does: each
  program loads its first weight tile (`tile.prefetch`) *before* the PDL wait
  (`pdl_wait_only`). With `block_k >= K / split_k` that tile is the program's whole
  slice, all of it in flight before the previous kernel ends. And before it loads
  anything, a program lets the next kernel launch (`pdl_launch_next`), so that the
  next kernel's weights are on their way while this one waits for x.
- `split_k` cuts the columns into ranges, one program each, so that a small matrix
  still has many programs; the last program of a block of rows sums the partials in
  a fixed order (`split_k_sum`) and runs the epilogue. (On the H200 it did not pay:
  scripts/probes/NOTES-triton.md.)
- Fusions: RMSNorm in the prologue (each program recomputes the sum of squares of x,
  2048 elements from L2), a residual add in the epilogue, and SiLU(gate) * up for the
  stacked gate/up matrix, whose paired rows each program computes together.
- Weights may be int8 with a scale per row (`gpuinfer.model.quant`): the tile is
  loaded as int8, widened in registers (`tile.widen`, without a conversion
  instruction), and each row's sum multiplied by its scale.
- A pass: x of T rows (a verify pass's tokens), each multiplied by the tile while it
  is in registers (`tile.rows_dots`), the T results stored together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gpuinfer.model.llama import rms_norm
from gpuinfer.kernels.common import (Workspace, check_pow2, launch_options,
                                     pdl_launch_next, pdl_wait_only, round_to,
                                     split_k_sum)
from gpuinfer.kernels.mma_dot import product
from gpuinfer.kernels.tile import prefetch, split_columns
from gpuinfer.model.quant import Int8Matrix, matvec_fp32, unpack

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

    def kernel_args(self, k: int, norm) -> dict:
        """The compile-time arguments a product's kernel takes from this tiling for
        K = k columns, with the RMSNorm prologue if `norm` (its weight) is given."""
        return dict(NORM=norm is not None, K_NORM=triton.next_power_of_2(k),
                    BLOCK_N=self.block_n, BLOCK_K=self.block_k, N_TILES=self.tiles(k))


@triton.jit
def store_linear(out_ptr, y, res, rr, rows, N, mask, RESIDUAL: tl.constexpr):
    """A product's epilogue: y (R, BLOCK_N), its finished FP32 sums, stored to out
    (rows rr (R, 1) of N) at the block's `rows`, as F.linear's output in the
    activations' dtype, plus the residual res (FP32) if RESIDUAL, the sum rounded
    again as PyTorch's add rounds it."""
    dt = out_ptr.dtype.element_ty
    y = round_to(y, dt)  # F.linear's output, in the activations' dtype
    if RESIDUAL:
        y = round_to(res + y, dt)
    tl.store(out_ptr + rr * N + rows[None, :], y.to(dt), mask=mask)


@triton.jit
def gate_up_rows(block, N, BLOCK_N: tl.constexpr):
    """Program `block`'s 2 BLOCK_N rows of the stacked gate/up matrix (2N rows), in
    pairs: tile row 2i is gate row j, row 2i + 1 up row j, j = block * BLOCK_N + i,
    as `store_silu` takes them apart. Returns the tile's row numbers, each one's
    output j (j < N: the row exists) and the matrix's rows."""
    r = tl.arange(0, 2 * BLOCK_N)
    j = block * BLOCK_N + r // 2
    return r, j, j + (r % 2) * N


@triton.jit
def store_silu(out_ptr, y, block, N, rr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """The gate/up epilogue: y (R, 2 BLOCK_N), the pairs' finished FP32 sums in the
    order of `gate_up_rows`; out[t, j] = SiLU(gate) * up for each token t (rr (R, 1),
    its rows, padded) and output j of the block, each operation rounded to the
    activations' dtype as the Llama MLP rounds it."""
    dt = out_ptr.dtype.element_ty
    gate, up = tl.split(tl.reshape(y, (y.shape[0], BLOCK_N, 2)))
    gate = round_to(gate, dt)
    silu = round_to(gate / (1.0 + tl.exp(-gate)), dt)
    out = round_to(silu * round_to(up, dt), dt)
    jj = block * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(out_ptr + rr * N + jj, out.to(dt), mask=(rr < ROWS) & (jj < N))


@triton.jit
def gemv_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, ws_ptr, cnt_ptr,
                N, K, stride_w, k_per_split, eps,
                NORM: tl.constexpr, SCALED: tl.constexpr, RESIDUAL: tl.constexpr,
                K_NORM: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                SPLIT_K: tl.constexpr, PDL: tl.constexpr, BITS: tl.constexpr,
                ROWS: tl.constexpr, N_NORM: tl.constexpr = 1, CHAINS: tl.constexpr = 1,
                MMA: tl.constexpr = False):
    """out = [res +] W @ [RMSNorm](x), for each of ROWS vectors x (rows of x, out and
    res, one after another). out may be res itself: each program reads and writes only
    its own rows of it. MMA: the product on the tensor cores (`mma_dot.product`), as
    a pass's kernel runs this program (`pass_mma.gemv_pass_kernel`)."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)  # the split of K's columns
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo, k_hi = split_columns(pid_k, K, k_per_split)
    valid = rows < N
    pdl_launch_next(PDL)  # the next kernel loads its weights while this one runs
    w, g, s = prefetch(w_ptr, stride_w, rows, valid, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait_only(PDL)
    R: tl.constexpr = triton.next_power_of_2(ROWS)  # a row per token, padded
    rr = tl.arange(0, R)[:, None]
    at = rr * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # in the block's partials
    mask = (rr < ROWS) & valid[None, :]
    res = 0.0
    if RESIDUAL:  # now, in the shadow of the weights, not after the sum
        res = tl.load(res_ptr + rr * N + rows[None, :], mask=mask).to(tl.float32)
    y = product(w, g, s, w_ptr, stride_w, rows, valid, x_ptr, K, k_lo, k_hi, norm_ptr,
                eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, N_NORM, BITS, ROWS, R,
                CHAINS, MMA)
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K, R * BLOCK_N)
    if last:  # F.linear's output [+ res], rounded to the activations' dtype
        store_linear(out_ptr, y, res, rr, rows, N, mask, RESIDUAL)


@triton.jit
def gemv_silu_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, ws_ptr, cnt_ptr,
                     N, K, stride_w, k_per_split, eps,
                     NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     N_TILES: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr,
                     ROWS: tl.constexpr, N_NORM: tl.constexpr = 1,
                     CHAINS: tl.constexpr = 1, MMA: tl.constexpr = False):
    """out[j] = SiLU(gate_j) * up_j for W = [gate; up] (2N rows), for each of ROWS
    vectors x: the MLP's intermediate is written once, gate and up never. Tile row 2i
    is gate row j, row 2i + 1 up row j. MMA: as `gemv_kernel`'s, for
    `pass_mma.gemv_silu_pass_kernel` (one MMA for both rows of a pair)."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    r, j, rows = gate_up_rows(block, N, BLOCK_N)
    k_lo, k_hi = split_columns(pid_k, K, k_per_split)
    pdl_launch_next(PDL)  # the next kernel loads its weights while this one runs
    w, g, s = prefetch(w_ptr, stride_w, rows, j < N, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait_only(PDL)
    R: tl.constexpr = triton.next_power_of_2(ROWS)
    rr = tl.arange(0, R)[:, None]
    y = product(w, g, s, w_ptr, stride_w, rows, j < N, x_ptr, K, k_lo, k_hi, norm_ptr,
                eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, N_NORM, True, ROWS, R,
                CHAINS, MMA)
    at = rr * (2 * BLOCK_N) + r[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K,
                          R * 2 * BLOCK_N)
    if last:
        store_silu(out_ptr, y, block, N, rr, BLOCK_N, ROWS)


def workspace_for(config: GemvConfig, n_out: int, k: int, rows_per_out: int,
                  workspace: Workspace | None, device, tokens: int = 1) -> Workspace:
    """The workspace a split-K launch over `tokens` vectors needs (a fresh one if none
    is given): partials for each token (padded to a power of two), a counter a block."""
    blocks, splits = config.grid(n_out, k)
    need = (blocks * splits * config.block_n * rows_per_out
            * triton.next_power_of_2(tokens))
    if workspace is None:
        return Workspace(device, need if splits > 1 else 1, blocks)
    return workspace.check(need if splits > 1 else 0, blocks)


def tokens_of(x: torch.Tensor, k: int) -> int:
    """How many vectors x holds: (k,) one, (T, k) T (a pass's tokens, each a row)."""
    if x.dim() not in (1, 2) or x.shape[-1] != k or not x.is_contiguous():
        raise ValueError(f"x of shape {tuple(x.shape)}: ({k},) or (tokens, {k}), "
                         "contiguous")
    return 1 if x.dim() == 1 else x.shape[0]


def pass_outputs(x: torch.Tensor, k: int, n: int, dtype: torch.dtype | None = None,
                 **buffers: torch.Tensor | None) -> tuple[int, tuple[int, ...]]:
    """How many vectors x holds (`tokens_of`) and the shape of a launch's output, n a
    vector: (n,) for x (k,), (T, n) for x (T, k). Each buffer given by name (out=,
    residual=, q=, logits=; None: not given) must have that shape, contiguous (and
    `dtype`, if given), or is refused naming both shapes, before any launch: the
    kernels write and read T rows of n, and a one-token buffer would be written past
    its end. Every launcher that takes a pass checks its buffers here."""
    tokens = tokens_of(x, k)
    shape = (n,) if x.dim() == 1 else (tokens, n)
    for name, t in buffers.items():
        if t is None:
            continue
        if tuple(t.shape) != shape or not t.is_contiguous() or \
                (dtype is not None and t.dtype != dtype):
            of = "" if dtype is None else f" ({t.dtype})"
            want = "" if dtype is None else f" ({dtype})"
            raise ValueError(f"{name} of shape {tuple(t.shape)}{of} for a pass of shape "
                             f"{shape}{want}: they must match, contiguous")
    return tokens, shape


def launch_plan(config: GemvConfig, w: torch.Tensor, x: torch.Tensor, n: int,
                rows_per_out: int, out: torch.Tensor | None,
                workspace: Workspace | None, residual: torch.Tensor | None = None,
                dtype: torch.dtype | None = None,
                ) -> tuple[int, torch.Tensor, Workspace, tuple]:
    """What a launch of `n` outputs a vector of x needs, read off w (., K) and x: how many
    vectors x holds, the output ((n,) or (tokens, n), a fresh one if none is given; out
    and residual checked, in `dtype` if given, `pass_outputs`), the workspace
    (`workspace_for`) and the grid."""
    k = w.shape[1]
    tokens, shape = pass_outputs(x, k, n, dtype, out=out, residual=residual)
    out = torch.empty(shape, device=w.device, dtype=x.dtype) if out is None else out
    ws = workspace_for(config, n, k, rows_per_out, workspace, w.device, tokens)
    return tokens, out, ws, config.grid(n, k)


def gemv(w: torch.Tensor | Int8Matrix, x: torch.Tensor, out: torch.Tensor | None = None,
         *, norm: torch.Tensor | None = None, eps: float = 1e-5,
         residual: torch.Tensor | None = None, config: GemvConfig = GemvConfig(),
         pdl: bool = False, workspace: Workspace | None = None,
         int8_widen: str = "bits") -> torch.Tensor:
    """W (N, K) @ x (K,) -> (N,), with the RMSNorm prologue (`norm`, its weight) and
    the residual add (`residual`, may be `out` itself) when given. x may be (T, K), T
    vectors (out, residual: (T, N), else refused before any launch, `pass_outputs`),
    each multiplied by every weight tile while it is loaded: the weights are read once
    for all of them. W: in x's dtype, or an
    Int8Matrix, widened to FP32 through its float bits ("bits") or by conversion
    instructions ("convert"), the same numbers either way (`widen`)."""
    if int8_widen not in INT8_WIDEN:
        raise ValueError(f"int8_widen={int8_widen!r}: one of {INT8_WIDEN}")
    w, scale = unpack(w)
    n, k = w.shape
    tokens, out, ws, grid = launch_plan(config, w, x, n, 1, out, workspace,
                                        residual)
    gemv_kernel[grid](
        w, scale, x, out, residual, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        RESIDUAL=residual is not None, SPLIT_K=grid[1], PDL=pdl,
        BITS=int8_widen == "bits", ROWS=tokens, **config.kernel_args(k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv_silu(w: torch.Tensor | Int8Matrix, x: torch.Tensor,
              out: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
              eps: float = 1e-5, config: GemvConfig = GemvConfig(), pdl: bool = False,
              workspace: Workspace | None = None) -> torch.Tensor:
    """SiLU(W[:N] @ xn) * (W[N:] @ xn) for the stacked gate/up W (2N, K) -> (N,); x
    (T, K) gives (T, N) (out: that shape, or refused), the weights read once."""
    w, scale = unpack(w)
    n2, k = w.shape
    n = n2 // 2
    tokens, out, ws, grid = launch_plan(config, w, x, n, 2, out, workspace)
    gemv_silu_kernel[grid](
        w, scale, x, out, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        SPLIT_K=grid[1], PDL=pdl, ROWS=tokens, **config.kernel_args(k, norm),
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
