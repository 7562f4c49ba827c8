"""A verify pass's matrix products on the tensor cores: y = x Wᵀ for the T tokens of a
pass (T = 1 ... 16) in one `tl.dot` a weight tile, the reduction inside the MMA.

The step's kernels (`gemv`, `gemv_silu`) multiply a pass's tokens by each weight tile
one after another (`tile.rows_dots`): T cross-warp reductions a tile, so that a pass
of 5 tokens of Chapter 6's target cost 1.98 steps although it reads the weights once.
Here each program holds BLOCK_N rows of W (the MMA's N side) and the T token rows,
padded by Triton to the MMA's 16 (the M side); one `tl.dot` a tile of BLOCK_K columns
multiplies all of them, and the reduction over K happens in the tensor cores.
The step itself keeps its GEMV kernels: a `tl.dot` step was measured at 594 µs against
267, so nothing here runs for one token unless asked.

As in the step, a program loads its first weight tile before the PDL wait
(`tile.prefetch`, `common.pdl_wait`) and x, written by the kernel before, after it;
the other tiles (a long K, the down projection's) come in a loop over K. Fusions as
the step's: an RMSNorm prologue per token, a residual epilogue, SiLU(gate) * up on
the stacked gate/up rows (paired in the tile as `gemv_silu` pairs them), split-K
finished by the last program (`split_k_sum`). Weights: in x's dtype (BF16: a BF16
MMA with FP32 accumulation; FP32: `input_precision="ieee"`, no TF32), or int8 with a
scale a row, widened exactly to x's dtype (`tile.widen`), the scale applied to the
sums. Interpreted, `tl.dot` cannot multiply BF16: both sides go to FP32 there.

The normalised x is rounded as PyTorch rounds it (`tile.normed`), but the products
are summed in the MMA's order, not the step's: results match the PyTorch references
within tolerance, not to the bit, and a pass's logits are not the steps' logits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import (Workspace, check_pow2, launch_options, pdl_wait,
                                     round_to, split_k_sum)
from gpuinfer.kernels.gemv import GemvConfig, pass_outputs, workspace_for
from gpuinfer.kernels.mma_dot import mma
from gpuinfer.kernels.tile import normed, prefetch
from gpuinfer.model.quant import Int8Matrix, unpack

MAX_TOKENS = 16  # a pass's rows: the MMA's 16 (Triton pads fewer)


@dataclass(frozen=True)
class MmaConfig(GemvConfig):
    """Tiling of a pass's product: block_n rows of W a program (pairs for the paired
    epilogues), the MMA's N side; block_k columns a tile, at least the MMA's 16;
    split_k, num_warps, num_stages as `GemvConfig`'s (stages > 1 let Triton pipeline
    the tiles after the first); chains: independent MMA accumulators a tile, each
    summing block_k / chains of its columns (a tile's MMAs in one chain wait for each
    other: 64 in a row over 1024 columns)."""

    block_n: int = 8
    block_k: int = 1024
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1
    chains: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.block_k < 16:
            raise ValueError(f"block_k={self.block_k}: a tl.dot's K is at least 16")
        check_pow2(chains=self.chains)
        if self.block_k < 16 * self.chains:
            raise ValueError(f"chains={self.chains} for block_k={self.block_k}: each "
                             "chain takes at least 16 columns (block_k >= 16 chains)")

    def fit(self, k: int) -> MmaConfig:
        """As `GemvConfig.fit`, never narrower than the MMA's 16 columns, with no
        more chains than the fitted tile has 16 columns."""
        block_k = min(self.block_k, triton.next_power_of_2(max(k, 16)))
        return replace(self, block_k=block_k, chains=min(self.chains, block_k // 16))


def pass_tokens(x: torch.Tensor, k: int) -> int:
    """T, the rows of a pass's x (T, k): 1 ... MAX_TOKENS, contiguous."""
    if x.dim() != 2 or x.shape[1] != k or not x.is_contiguous() or \
            not 1 <= x.shape[0] <= MAX_TOKENS:
        raise ValueError(f"x of shape {tuple(x.shape)}: (tokens, {k}), 1 <= tokens <= "
                         f"{MAX_TOKENS}, contiguous")
    return x.shape[0]


def check_weights(w: torch.Tensor, x: torch.Tensor):
    if w.dtype != torch.int8 and w.dtype != x.dtype:
        raise ValueError(f"weights of {w.dtype} for x of {x.dtype}: the same dtype, "
                         "or an Int8Matrix")


@triton.jit
def x_tile(x_ptr, K, cols, k_hi, tt, tok, g, rstd, NORM: tl.constexpr):
    """The pass's x[tt, cols] (M, BK) in x's dtype, RMSNorm'ed per token if NORM (g the
    tile's norm weights, rstd (M,) each token's), rounded as PyTorch rounds it."""
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + tt * K + cols[None, :], mask=tok & (cols < k_hi)[None, :],
                other=0.0)
    if NORM:
        x = normed(x.to(tl.float32), g[None, :], rstd[:, None], dt).to(dt)
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
def gemv_pass_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, ws_ptr,
                     cnt_ptr, N, K, stride_w, k_per_split, eps,
                     NORM: tl.constexpr, SCALED: tl.constexpr, RESIDUAL: tl.constexpr,
                     K_NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                     SPLIT_K: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                     CHAINS: tl.constexpr):
    """out = [res +] [RMSNorm](x) Wᵀ for the ROWS tokens of x (ROWS, K). out may be
    res itself: each program reads and writes only its own columns of it."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    valid = rows < N
    w, g, s = prefetch(w_ptr, stride_w, rows, valid, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    M: tl.constexpr = triton.next_power_of_2(ROWS)
    tt = tl.arange(0, M)[:, None]
    mask = (tt < ROWS) & valid[None, :]
    res = 0.0
    if RESIDUAL:  # now, in the shadow of the weights
        res = tl.load(res_ptr + tt * N + rows[None, :], mask=mask).to(tl.float32)
    y = pass_dot(w, g, w_ptr, stride_w, rows, valid, x_ptr, K, k_lo, k_hi, norm_ptr,
                 eps, NORM, K_NORM, BLOCK_K, N_TILES, N_NORM, ROWS, M, CHAINS)
    if SCALED:  # a row's scale, the same for every column: on the sums
        y = y * s[None, :]
    at = tt * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K, M * BLOCK_N)
    if last:
        dt = out_ptr.dtype.element_ty
        y = round_to(y, dt)  # F.linear's output, in the activations' dtype
        if RESIDUAL:
            y = round_to(res + y, dt)
        tl.store(out_ptr + tt * N + rows[None, :], y.to(dt), mask=mask)


@triton.jit
def gemv_silu_pass_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, ws_ptr, cnt_ptr,
                          N, K, stride_w, k_per_split, eps,
                          NORM: tl.constexpr, SCALED: tl.constexpr,
                          K_NORM: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                          SPLIT_K: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                          CHAINS: tl.constexpr):
    """out[t, j] = SiLU(gate_j) * up_j for W = [gate; up] (2N rows) and each token t:
    tile row 2i is gate row j, 2i + 1 up row j, both in one MMA (N side 2 BLOCK_N)."""
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
    M: tl.constexpr = triton.next_power_of_2(ROWS)
    tt = tl.arange(0, M)[:, None]
    y = pass_dot(w, g, w_ptr, stride_w, rows, j < N, x_ptr, K, k_lo, k_hi, norm_ptr,
                 eps, NORM, K_NORM, BLOCK_K, N_TILES, N_NORM, ROWS, M, CHAINS)
    if SCALED:
        y = y * s[None, :]
    at = tt * (2 * BLOCK_N) + r[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K,
                          M * 2 * BLOCK_N)
    if last:
        dt = out_ptr.dtype.element_ty
        gate, up = tl.split(tl.reshape(y, (M, BLOCK_N, 2)))
        gate = round_to(gate, dt)
        silu = round_to(gate / (1.0 + tl.exp(-gate)), dt)
        out = round_to(silu * round_to(up, dt), dt)
        jj = block * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(out_ptr + tt * N + jj, out.to(dt), mask=(tt < ROWS) & (jj < N))


def tiles_args(config: MmaConfig, k: int, norm) -> dict:
    """The tiling's compile-time arguments for K = k columns."""
    return dict(NORM=norm is not None, K_NORM=triton.next_power_of_2(k),
                BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                N_TILES=config.tiles(k), N_NORM=triton.cdiv(k, config.block_k),
                CHAINS=config.chains)


def gemv_pass(w: torch.Tensor | Int8Matrix, x: torch.Tensor,
              out: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
              eps: float = 1e-5, residual: torch.Tensor | None = None,
              config: MmaConfig = MmaConfig(), pdl: bool = False,
              workspace: Workspace | None = None) -> torch.Tensor:
    """[residual +] [RMSNorm](x) Wᵀ: x (T, K), W (N, K) (or an Int8Matrix) -> (T, N),
    the weights read once for the T tokens. out and residual: (T, N) (residual may be
    out itself), else refused before any launch."""
    w, scale = unpack(w)
    n, k = w.shape
    tokens = pass_tokens(x, k)
    check_weights(w, x)
    pass_outputs(x, k, n, x.dtype, out=out, residual=residual)
    config = config.fit(k)
    if out is None:
        out = torch.empty((tokens, n), device=w.device, dtype=x.dtype)
    ws = workspace_for(config, n, k, 1, workspace, w.device, tokens)
    grid = config.grid(n, k)
    gemv_pass_kernel[grid](
        w, scale, x, out, residual, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        RESIDUAL=residual is not None, SPLIT_K=grid[1], PDL=pdl, ROWS=tokens,
        **tiles_args(config, k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv_silu_pass(w: torch.Tensor | Int8Matrix, x: torch.Tensor,
                   out: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
                   eps: float = 1e-5, config: MmaConfig = MmaConfig(),
                   pdl: bool = False,
                   workspace: Workspace | None = None) -> torch.Tensor:
    """SiLU(xn W[:N]ᵀ) * (xn W[N:]ᵀ) for the stacked gate/up W (2N, K) and x (T, K)
    -> (T, N), xn = [RMSNorm](x); out (T, N) or refused."""
    w, scale = unpack(w)
    n2, k = w.shape
    n = n2 // 2
    tokens = pass_tokens(x, k)
    check_weights(w, x)
    pass_outputs(x, k, n, x.dtype, out=out)
    config = config.fit(k)
    if out is None:
        out = torch.empty((tokens, n), device=w.device, dtype=x.dtype)
    ws = workspace_for(config, n, k, 2, workspace, w.device, tokens)
    grid = config.grid(n, k)
    gemv_silu_pass_kernel[grid](
        w, scale, x, out, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        SPLIT_K=grid[1], PDL=pdl, ROWS=tokens, **tiles_args(config, k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def mma_configs(config, gpu: bool, weights: str = "bf16") -> dict[str, MmaConfig]:
    """The products' tiling for passes of a model of `config` (a LlamaConfig) whose
    weights are "bf16", "int8" or "fp32", by a rule read off
    `scripts/probes/pass_chains.py` (each product's best at 5 tokens, alone and in
    whole passes, at Chapter 6's target and the 1B shape; NOTES-57):

    - 8 rows of W a program (8 pairs for qkv and gate/up), tiles of 1024 columns in
      16 chains of 64 (4 MMAs a chain), split-K to keep a split to 4096 columns; the
      o- and down-projections of up to 4 tiles split into one tile a split, so that
      every program loads its weights before the PDL wait (the target's down, 3
      tiles: 97 µs for o and down in a pass of 5 tokens on an H100, 151 unsplit);
    - paired products whose K spans more than a tile (so two tiles are in flight):
      qkv 4 pairs (16 tokens would spill 8 pairs on sm_80), gate/up 16 pairs x 256
      columns in one chain (at 1B: 1.16x the step's kernel, 8 pairs x 1024 1.47x);
    - the lm_head: 32 rows x 256 columns, one chain (its many programs an SM hide
      the chain; 16 chains cost 1.22x); FP32 weights (the checks): tiles of 256.
    Pipelined (2 stages) where a program has tiles after its first, BF16 only (int8
    and FP32 tiles spilled at 2 stages on sm_90). Interpreted: few, large programs."""
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    hidden, heads = config.hidden_size, config.num_attention_heads
    ks = {"qkv": hidden, "o": heads * head_dim, "gate_up": hidden,
          "down": config.intermediate_size, "lm_head": hidden}
    out = {}
    for name, k in ks.items():
        if not gpu:
            pairs = name in ("qkv", "gate_up")
            out[name] = MmaConfig(32 if pairs else 64, 128).fit(k)
            continue
        if name == "lm_head":
            c = MmaConfig(32, 256)
        elif weights == "fp32":
            c = MmaConfig(8, 256)
        elif name == "gate_up" and k > 1024:
            c = MmaConfig(16, 256)
        else:
            c = MmaConfig(4 if name == "qkv" and k > 1024 else 8, 1024, chains=16)
        tiles = triton.cdiv(k, c.block_k)
        split = 1 if name == "lm_head" else \
            tiles if name in ("o", "down") and tiles <= 4 else triton.cdiv(k, 4 * 1024)
        c = replace(c, split_k=split).fit(k)
        stages = 2 if c.tiles(k) > 1 and weights == "bf16" else 1
        out[name] = replace(c, num_stages=stages)
    return out
