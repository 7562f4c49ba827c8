"""The two ends of a verify pass on the tensor cores: the q/k/v projection with the
rotary embedding and the cache write (`qkv_rope`'s epilogue), and the lm_head with
each token's argmax (`lm_head_argmax`'s): each kernel runs the step's program
(`qkv_rope.qkv_rope_kernel`, `embed_head.lm_head_argmax_kernel`) with its product as
`pass_mma`'s, the T tokens by each weight tile in one `tl.dot` (`mma_dot.product`).

q/k/v: tile row 2i is dimension d of a head, row 2i + 1 dimension d + head_dim / 2
(the rotary pairs, `qkv_rope.rotary_rows`, as the step pairs them), both in one MMA;
the step's epilogue (`qkv_rope.rotary_store`) rotates token t at slot pos - T + 1 + t
and writes its key and value there. The lm_head: each program writes its block of
every token's logits and each token's block maximum; the acceptance of the proposals
is `embed_head.pick_tokens`, run by the last program (`inline`) or by
`argmax_reduce_kernel` after, or, given a `PassArgmaxWorkspace`, by `accept_kernel`:
one program a token picks that token's choice, side by side, and the last of them
accepts (`pick_tokens` picks the tokens' choices one after another in one program:
2.3 µs at 2 tokens, 5.0 at 5 at Chapter 6's target, 7 and 25 at the 1B shape, on an
H100).

Sums in the MMA's order: within tolerance of the references, not to the bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import (Workspace, arrive, launch_options, pdl_launch_next,
                                     pdl_wait_only)
from gpuinfer.kernels.embed_head import ArgmaxWorkspace, accept_choices, \
    argmax_reduce_kernel, choose, launch_lm_head, lm_head_argmax_kernel
from gpuinfer.kernels.gemv import pass_outputs
from gpuinfer.kernels.pass_mma import MmaConfig, check_weights, pass_tokens
from gpuinfer.kernels.qkv_rope import check_qkv, launch_qkv, qkv_rope_kernel
from gpuinfer.model.quant import Int8Matrix, unpack


@triton.jit
def qkv_rope_pass_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, k_cache_ptr,
                         v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, ws_ptr, cnt_ptr,
                         K, stride_w, k_per_split, eps, cache_head_stride,
                         N_HEADS: tl.constexpr, N_KV: tl.constexpr,
                         HEAD_DIM: tl.constexpr, NORM: tl.constexpr,
                         SCALED: tl.constexpr, K_NORM: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         N_TILES: tl.constexpr, N_NORM: tl.constexpr,
                         SPLIT_K: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                         CHAINS: tl.constexpr):
    """The step's program (`qkv_rope.qkv_rope_kernel`), its product on the tensor
    cores; a kernel of its own, so that a trace tells a pass's products from a
    step's."""
    qkv_rope_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                    cos_ptr, sin_ptr, pos_ptr, ws_ptr, cnt_ptr, K, stride_w,
                    k_per_split, eps, cache_head_stride, N_HEADS, N_KV, HEAD_DIM,
                    NORM, SCALED, K_NORM, BLOCK_N, BLOCK_K, N_TILES, SPLIT_K, PDL, ROWS,
                    N_NORM=N_NORM, CHAINS=CHAINS, MMA=True)


@triton.jit
def lm_head_pass_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, logits_ptr, best_ptr,
                        best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr, N, K, stride_w,
                        eps, capacity, NORM: tl.constexpr, SCALED: tl.constexpr,
                        K_NORM: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                        N_NORM: tl.constexpr, BLOCK_R: tl.constexpr,
                        N_CHUNKS: tl.constexpr, INLINE: tl.constexpr, PDL: tl.constexpr,
                        ROWS: tl.constexpr, ACCEPT: tl.constexpr, CHAINS: tl.constexpr):
    """The step's program (`embed_head.lm_head_argmax_kernel`), its product on the
    tensor cores."""
    lm_head_argmax_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, logits_ptr, best_ptr,
                          best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr, N, K, stride_w,
                          eps, capacity, NORM, SCALED, K_NORM, BLOCK_N, BLOCK_K,
                          N_TILES, BLOCK_R, N_CHUNKS, INLINE, PDL, ROWS, ACCEPT,
                          N_NORM=N_NORM, CHAINS=CHAINS, MMA=True)


class PassArgmaxWorkspace(ArgmaxWorkspace):
    """An `ArgmaxWorkspace` that also holds each token's choice of a pass of up to
    `rows` tokens, for `accept_kernel`."""

    def __init__(self, device, n_blocks: int, block_r: int = 2048, rows: int = 1):
        super().__init__(device, n_blocks, block_r, rows)
        self.choices = torch.empty(rows, device=device, dtype=torch.int64)


@triton.jit
def accept_kernel(best_ptr, best_idx_ptr, choices_ptr, cnt_ptr, n_blocks, tokens_ptr,
                  pos_ptr, capacity, BLOCK_R: tl.constexpr, N_CHUNKS: tl.constexpr,
                  PDL: tl.constexpr, ROWS: tl.constexpr):
    """`pick_tokens` with ACCEPT, a program a token: program t writes token t's choice;
    the last to finish accepts the proposals up to the first that is not the choice
    after the token before it, writes the choices up to there and moves pos (the
    acceptance `pick_tokens` runs too: `embed_head.accept_choices`)."""
    pdl_launch_next(PDL)  # before the wait, as the pass's attention
    pdl_wait_only(PDL)
    t = tl.program_id(0)
    mine = choose(best_ptr + t * n_blocks, best_idx_ptr + t * n_blocks, n_blocks,
                  BLOCK_R, N_CHUNKS)
    tl.store(choices_ptr + t, mine)
    if arrive(cnt_ptr, ROWS):
        r = tl.arange(0, triton.next_power_of_2(ROWS))
        choices = tl.load(choices_ptr + r, mask=r < ROWS, other=-1,
                          cache_modifier=".cg")
        accept_choices(choices, r, tokens_ptr, pos_ptr, capacity, ROWS)


def qkv_rope_pass(w: torch.Tensor | Int8Matrix, x: torch.Tensor, q: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, pos: torch.Tensor, *, n_heads: int,
                  norm: torch.Tensor | None = None, eps: float = 1e-5,
                  config: MmaConfig = MmaConfig(), pdl: bool = False,
                  workspace: Workspace | None = None) -> None:
    """`qkv_rope` for the T tokens of x (T, hidden) at slots pos - T + 1 ... pos: q
    (T, n_heads * d) the rotated queries, the keys and values written to those slots
    of k_cache, v_cache (kv_heads, capacity, d) (none where a slot is outside the
    cache); cos, sin (capacity, d); pos a one-element tensor."""
    w, scale = unpack(w)
    head_dim = check_qkv(w, k_cache, v_cache, cos, sin, n_heads)
    k = w.shape[1]
    tokens = pass_tokens(x, k)
    check_weights(w, x)
    pass_outputs(x, k, n_heads * head_dim, x.dtype, q=q)
    launch_qkv(qkv_rope_pass_kernel, config.fit(k), w, scale, x, norm, q, k_cache,
               v_cache, (cos, sin, pos), n_heads=n_heads, tokens=tokens, eps=eps,
               pdl=pdl, workspace=workspace)


def lm_head_argmax_pass(w: torch.Tensor | Int8Matrix, x: torch.Tensor,
                        logits: torch.Tensor, tokens: torch.Tensor,
                        pos: torch.Tensor, *,
                        norm: torch.Tensor | None = None, eps: float = 1e-5,
                        config: MmaConfig = MmaConfig(), inline: bool = True,
                        accept: bool = False, pdl: bool = False,
                        workspace: ArgmaxWorkspace | None = None) -> None:
    """`lm_head_argmax` for the T tokens of x (T, hidden): logits (T, vocab) =
    RMSNorm(x) Wᵀ; then the last token's choice written after it (pos += 1), or with
    `accept` the proposals accepted as `embed_head.pick_tokens` says (not `inline`,
    with a `PassArgmaxWorkspace` of enough rows: by `accept_kernel`). tokens
    (capacity,) int64."""
    w, scale = unpack(w)
    n, k = w.shape
    if config.split_k != 1:
        raise ValueError("the lm_head argmax has no split-K (one program per block)")
    rows = pass_tokens(x, k)
    check_weights(w, x)
    pass_outputs(x, k, n, x.dtype, logits=logits)
    config = config.fit(k)
    blocks, ws = launch_lm_head(lm_head_pass_kernel, config, w, scale, x, norm, logits,
                                tokens, pos, rows, eps=eps, inline=inline,
                                accept=accept, pdl=pdl, workspace=workspace)
    if inline:
        return
    block_r = min(16384, triton.next_power_of_2(blocks))
    options = launch_options(max(4, min(16, block_r // 1024)), 1, pdl)
    if accept and isinstance(ws, PassArgmaxWorkspace) and ws.choices.numel() >= rows:
        accept_kernel[(rows,)](
            ws.best, ws.best_idx, ws.choices, ws.counter, blocks, tokens, pos,
            tokens.numel(), BLOCK_R=block_r, N_CHUNKS=triton.cdiv(blocks, block_r),
            PDL=pdl, ROWS=rows, **options)
    else:
        argmax_reduce_kernel[(1,)](
            ws.best, ws.best_idx, blocks, tokens, pos, tokens.numel(),
            BLOCK_R=block_r, N_CHUNKS=triton.cdiv(blocks, block_r), PDL=pdl, ROWS=rows,
            ACCEPT=accept, **options)
