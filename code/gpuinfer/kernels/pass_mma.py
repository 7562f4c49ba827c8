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

Each kernel runs the step's own program (`gemv.gemv_kernel`, `gemv.gemv_silu_kernel`)
with its product on the tensor cores (MMA: `mma_dot.product`, `mma_dot.pass_dot`), so
all else is the step's: the next kernel let launch first (`common.pdl_launch_next`),
the first weight tile loaded before the PDL wait (`tile.prefetch`,
`common.pdl_wait_only`) and x, written by the kernel before, after it;
the other tiles (a long K, the down projection's) in a loop over K; an RMSNorm
prologue per token, a residual epilogue (`gemv.store_linear`), SiLU(gate) * up on the
stacked gate/up rows (`gemv.gate_up_rows`, `gemv.store_silu`), split-K finished by the
last program (`split_k_sum`). Weights: in x's dtype (BF16: a BF16 MMA with FP32
accumulation; FP32: `input_precision="ieee"`, no TF32), or int8 with a scale a row,
widened exactly to x's dtype (`tile.widen`), the scale applied to the sums.
Interpreted, `tl.dot` cannot multiply BF16: both sides go to FP32 there.

The normalised x is rounded as PyTorch rounds it (`tile.normed`), but the products
are summed in the MMA's order, not the step's: results match the PyTorch references
within tolerance, not to the bit, and a pass's logits are not the steps' logits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import Workspace, check_pow2, launch_options
from gpuinfer.kernels.gemv import (GemvConfig, gemv_kernel, gemv_silu_kernel,
                                   launch_plan)
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

    block_k: int = 1024  # the other fields GemvConfig's, in its order
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

    def kernel_args(self, k: int, norm) -> dict:
        """`GemvConfig.kernel_args`, and the pass's product's (`mma_dot.pass_dot`):
        the tiles of x that RMSNorm's sums of squares take, and the chains."""
        return dict(super().kernel_args(k, norm), N_NORM=triton.cdiv(k, self.block_k),
                    CHAINS=self.chains)


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
def gemv_pass_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, ws_ptr,
                     cnt_ptr, N, K, stride_w, k_per_split, eps,
                     NORM: tl.constexpr, SCALED: tl.constexpr, RESIDUAL: tl.constexpr,
                     K_NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                     SPLIT_K: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                     CHAINS: tl.constexpr):
    """out = [res +] [RMSNorm](x) Wᵀ for the ROWS tokens of x (ROWS, K): the step's
    program (`gemv.gemv_kernel`), its product on the tensor cores; a kernel of its own,
    so that a trace tells a pass's products from a step's."""
    gemv_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, ws_ptr, cnt_ptr, N,
                K, stride_w, k_per_split, eps, NORM, SCALED, RESIDUAL, K_NORM, BLOCK_N,
                BLOCK_K, N_TILES, SPLIT_K, PDL, BITS=True, ROWS=ROWS, N_NORM=N_NORM,
                CHAINS=CHAINS, MMA=True)


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
    the step's program (`gemv.gemv_silu_kernel`) on the tensor cores, tile row 2i gate
    row j and 2i + 1 up row j in one MMA (N side 2 BLOCK_N)."""
    gemv_silu_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, ws_ptr, cnt_ptr, N, K,
                     stride_w, k_per_split, eps, NORM, SCALED, K_NORM, BLOCK_N, BLOCK_K,
                     N_TILES, SPLIT_K, PDL, ROWS, N_NORM=N_NORM, CHAINS=CHAINS,
                     MMA=True)


def _pass_plan(config: MmaConfig, w: torch.Tensor, x: torch.Tensor, n: int,
               rows_per_out: int, out: torch.Tensor | None, workspace: Workspace | None,
               residual: torch.Tensor | None = None,
               ) -> tuple[int, MmaConfig, torch.Tensor, Workspace, tuple]:
    """`gemv.launch_plan` for a pass: T checked (`pass_tokens`), the weights against x
    (`check_weights`), the buffers in x's dtype, the tiling fitted to K. Returns T, the
    tiling, the output, the workspace and the grid."""
    k = w.shape[1]
    pass_tokens(x, k)
    check_weights(w, x)
    config = config.fit(k)
    tokens, out, ws, grid = launch_plan(config, w, x, n, rows_per_out, out, workspace,
                                        residual, dtype=x.dtype)
    return tokens, config, out, ws, grid


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
    tokens, config, out, ws, grid = _pass_plan(config, w, x, n, 1, out, workspace,
                                               residual)
    gemv_pass_kernel[grid](
        w, scale, x, out, residual, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        RESIDUAL=residual is not None, SPLIT_K=grid[1], PDL=pdl, ROWS=tokens,
        **config.kernel_args(k, norm),
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
    tokens, config, out, ws, grid = _pass_plan(config, w, x, n, 2, out, workspace)
    gemv_silu_pass_kernel[grid](
        w, scale, x, out, norm, ws.partials, ws.counters,
        n, k, w.stride(0), config.k_per_split(k), eps, SCALED=scale is not None,
        SPLIT_K=grid[1], PDL=pdl, ROWS=tokens, **config.kernel_args(k, norm),
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
    - q/k/v and o of 1024 < K <= 2048 (BF16): one tile of the whole K at 8 warps, no
      split (at 1B on the H200: 1.335 and 1.343 steps at 5 tokens against 1.360);
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
        elif name in ("qkv", "o") and 1024 < k <= 2048 and weights == "bf16":
            # Each program's whole row loaded before the PDL wait, with no split-K sum
            c = MmaConfig(4 if name == "qkv" else 8, 2048, num_warps=8, chains=16)
        else:
            c = MmaConfig(4 if name == "qkv" and k > 1024 else 8, 1024, chains=16)
        tiles = triton.cdiv(k, c.block_k)
        split = 1 if name == "lm_head" else \
            tiles if name in ("o", "down") and tiles <= 4 else triton.cdiv(k, 4 * 1024)
        c = replace(c, split_k=split).fit(k)
        stages = 2 if c.tiles(k) > 1 and weights == "bf16" else 1
        out[name] = replace(c, num_stages=stages)
    return out
