"""The two ends of a verify pass on the tensor cores: the q/k/v projection with the
rotary embedding and the cache write (`qkv_rope`'s epilogue), and the lm_head with
each token's argmax (`lm_head_argmax`'s), their products as `pass_mma`'s: the T
tokens by each weight tile in one `tl.dot`.

q/k/v: tile row 2i is dimension d of a head, row 2i + 1 dimension d + head_dim / 2
(the rotary pairs, as `qkv_rope_kernel` pairs them), both in one MMA; the epilogue
rotates token t at slot pos - T + 1 + t and writes its key and value there. The
lm_head: each program writes its block of every token's logits and each token's
block maximum; the acceptance of the proposals is `embed_head.pick_tokens`, run by
the last program (`inline`) or by `argmax_reduce_kernel` after, or, given a
`PassArgmaxWorkspace`, by `accept_kernel`: one program a token picks that token's
choice, side by side, and the last of them accepts (`pick_tokens` picks the tokens'
choices one after another in one program: 2.3 µs at 2 tokens, 5.0 at 5 at Chapter 6's
target, 7 and 25 at the 1B shape, on an H100).

Sums in the MMA's order: within tolerance of the references, not to the bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import arrive, launch_options, pdl_wait, round_to
from gpuinfer.kernels.common import Workspace, split_k_sum
from gpuinfer.kernels.embed_head import ArgmaxWorkspace, argmax_reduce_kernel, \
    choose, pick_tokens
from gpuinfer.kernels.gemv import pass_outputs, workspace_for
from gpuinfer.kernels.pass_mma import (MmaConfig, check_weights, pass_dot, pass_tokens,
                                       tiles_args)
from gpuinfer.kernels.tile import prefetch
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
    HALF: tl.constexpr = HEAD_DIM // 2
    N_PAIRS: tl.constexpr = (N_HEADS + 2 * N_KV) * HALF
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.arange(0, 2 * BLOCK_N)
    p = block * BLOCK_N + r // 2  # pair index: head p // HALF, dimension p % HALF
    rows = (p // HALF) * HEAD_DIM + p % HALF + (r % 2) * HALF
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w, g, s = prefetch(w_ptr, stride_w, rows, p < N_PAIRS, k_lo, k_hi, norm_ptr,
                       scale_ptr, NORM, SCALED, BLOCK_K)
    pdl_wait(PDL)
    M: tl.constexpr = triton.next_power_of_2(ROWS)
    rr = tl.arange(0, M)
    pp = block * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = pp < N_PAIRS
    head = tl.where(valid, pp // HALF, 0)
    d = pp % HALF
    pos = tl.load(pos_ptr) - (ROWS - 1) + rr
    # a slot of the cache? (cache_head_stride = capacity * HEAD_DIM)
    in_cache = (pos >= 0) & (pos * HEAD_DIM < cache_head_stride) & (rr < ROWS)
    pos = tl.where(in_cache, pos, 0)  # the tables' row and the slot stay in bounds
    table = pos[:, None] * HEAD_DIM + d[None, :]
    cos_lo = tl.load(cos_ptr + table).to(tl.float32)
    cos_hi = tl.load(cos_ptr + table + HALF).to(tl.float32)
    sin_lo = tl.load(sin_ptr + table).to(tl.float32)
    sin_hi = tl.load(sin_ptr + table + HALF).to(tl.float32)
    y = pass_dot(w, g, w_ptr, stride_w, rows, p < N_PAIRS, x_ptr, K, k_lo, k_hi,
                 norm_ptr, eps, NORM, K_NORM, BLOCK_K, N_TILES, N_NORM, ROWS, M,
                 CHAINS)
    if SCALED:
        y = y * s[None, :]
    at = rr[:, None] * (2 * BLOCK_N) + r[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K,
                          M * 2 * BLOCK_N)
    if last:
        dt = q_ptr.dtype.element_ty
        lo, hi = tl.split(tl.reshape(y, (M, BLOCK_N, 2)))  # dimensions d and d + HALF
        lo = round_to(lo, dt)
        hi = round_to(hi, dt)
        rot_lo = round_to(round_to(lo * cos_lo, dt) + round_to(-hi * sin_lo, dt), dt)
        rot_hi = round_to(round_to(hi * cos_hi, dt) + round_to(lo * sin_hi, dt), dt)
        rotary = (head < N_HEADS + N_KV)[None, :]  # queries and keys, not values
        lo = tl.where(rotary, rot_lo, lo).to(dt)
        hi = tl.where(rotary, rot_hi, hi).to(dt)
        is_q = (valid & (head < N_HEADS))[None, :] & (rr < ROWS)[:, None]
        q_at = q_ptr + rr[:, None] * (N_HEADS * HEAD_DIM) \
            + (head * HEAD_DIM + d)[None, :]
        tl.store(q_at, lo, mask=is_q)
        tl.store(q_at + HALF, hi, mask=is_q)
        is_k = (valid & (head >= N_HEADS) & (head < N_HEADS + N_KV))[None, :] \
            & in_cache[:, None]
        is_v = (valid & (head >= N_HEADS + N_KV))[None, :] & in_cache[:, None]
        kv_head = tl.where(head >= N_HEADS + N_KV, head - N_HEADS - N_KV,
                           tl.where(head >= N_HEADS, head - N_HEADS, 0))
        slot = (kv_head.to(tl.int64) * cache_head_stride + d)[None, :] \
            + pos[:, None] * HEAD_DIM
        tl.store(k_cache_ptr + slot, lo, mask=is_k)
        tl.store(k_cache_ptr + slot + HALF, hi, mask=is_k)
        tl.store(v_cache_ptr + slot, lo, mask=is_v)
        tl.store(v_cache_ptr + slot + HALF, hi, mask=is_v)


@triton.jit
def lm_head_pass_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, logits_ptr, best_ptr,
                        best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr, N, K, stride_w,
                        eps, capacity, NORM: tl.constexpr, SCALED: tl.constexpr,
                        K_NORM: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                        N_NORM: tl.constexpr, BLOCK_R: tl.constexpr,
                        N_CHUNKS: tl.constexpr, INLINE: tl.constexpr, PDL: tl.constexpr,
                        ROWS: tl.constexpr, ACCEPT: tl.constexpr, CHAINS: tl.constexpr):
    block = tl.program_id(0)
    blocks = tl.num_programs(0)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    w, g, s = prefetch(w_ptr, stride_w, rows, rows < N, 0, K, norm_ptr, scale_ptr, NORM,
                       SCALED, BLOCK_K)
    pdl_wait(PDL)
    M: tl.constexpr = triton.next_power_of_2(ROWS)
    rr = tl.arange(0, M)
    y = pass_dot(w, g, w_ptr, stride_w, rows, rows < N, x_ptr, K, 0, K, norm_ptr, eps,
                 NORM, K_NORM, BLOCK_K, N_TILES, N_NORM, ROWS, M, CHAINS)
    if SCALED:
        y = y * s[None, :]
    dt = logits_ptr.dtype.element_ty
    y = round_to(y, dt)
    mask = (rr < ROWS)[:, None] & (rows < N)[None, :]
    tl.store(logits_ptr + rr[:, None] * N + rows[None, :], y.to(dt), mask=mask)
    y = tl.where(mask, y, float("-inf"))
    at = tl.argmax(y, axis=1, tie_break_left=True)
    tl.store(best_ptr + rr * blocks + block, tl.max(y, axis=1), mask=rr < ROWS)
    tl.store(best_idx_ptr + rr * blocks + block, block * BLOCK_N + at, mask=rr < ROWS)
    if INLINE:
        if arrive(cnt_ptr, blocks):
            pick_tokens(best_ptr, best_idx_ptr, blocks, tokens_ptr, pos_ptr, capacity,
                        BLOCK_R, N_CHUNKS, ROWS, ACCEPT)


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
    after the token before it, writes the choices up to there and moves pos."""
    pdl_wait(PDL)
    t = tl.program_id(0)
    mine = choose(best_ptr + t * n_blocks, best_idx_ptr + t * n_blocks, n_blocks,
                  BLOCK_R, N_CHUNKS)
    tl.store(choices_ptr + t, mine)
    if arrive(cnt_ptr, ROWS):
        r = tl.arange(0, triton.next_power_of_2(ROWS))
        first = tl.load(pos_ptr) - (ROWS - 1)
        slot = first + 1 + r  # the slot after token r: proposal r, then choice r
        ours = (r < ROWS) & (slot >= 0) & (slot < capacity)
        # every proposal read before any choice is written over it
        choice = tl.load(choices_ptr + r, mask=r < ROWS, other=-1, cache_modifier=".cg")
        proposal = tl.load(tokens_ptr + slot, mask=ours & (r < ROWS - 1), other=-1)
        # m: the first proposal refused (the last token has none): choices 0 ... m go in
        m = tl.min(tl.where((proposal == choice) & (r < ROWS - 1), ROWS - 1, r), axis=0)
        tl.store(tokens_ptr + slot, choice, mask=ours & (r <= m))
        tl.store(pos_ptr, first + m + 1)


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
    n_kv, capacity, head_dim = k_cache.shape
    if (rows := min(cos.shape[0], sin.shape[0])) < capacity:
        raise ValueError(f"rotary tables of {rows} rows for a "
                         f"cache of {capacity} slots: make them (capacity, head_dim)")
    n_rows, k = w.shape
    if n_rows != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"{tuple(w.shape)} is not q, k, v of {n_heads}/{n_kv} heads")
    if not all(t.is_contiguous() for t in (k_cache, v_cache, cos, sin)):
        raise ValueError("the cache and the rotary tables must be contiguous")
    tokens = pass_tokens(x, k)
    check_weights(w, x)
    pass_outputs(x, k, n_heads * head_dim, x.dtype, q=q)
    config = config.fit(k)
    n_pairs = n_rows // 2
    ws = workspace_for(config, n_pairs, k, 2, workspace, w.device, tokens)
    grid = config.grid(n_pairs, k)
    qkv_rope_pass_kernel[grid](
        w, scale, x, norm, q, k_cache, v_cache, cos, sin, pos, ws.partials, ws.counters,
        k, w.stride(0), config.k_per_split(k), eps, capacity * head_dim,
        N_HEADS=n_heads, N_KV=n_kv, HEAD_DIM=head_dim, SCALED=scale is not None,
        SPLIT_K=grid[1], PDL=pdl, ROWS=tokens, **tiles_args(config, k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))


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
    blocks = triton.cdiv(n, config.block_n)
    ws = workspace or ArgmaxWorkspace(w.device, blocks, rows=rows)
    if ws.best.numel() < rows * blocks:
        raise ValueError(f"argmax workspace holds {ws.best.numel()} block maxima, "
                         f"need {rows} x {blocks}")
    lm_head_pass_kernel[(blocks,)](
        w, scale, x, norm, logits, ws.best, ws.best_idx, ws.counter, tokens, pos,
        n, k, w.stride(0), eps, tokens.numel(), SCALED=scale is not None,
        BLOCK_R=ws.block_r, N_CHUNKS=triton.cdiv(blocks, ws.block_r), INLINE=inline,
        PDL=pdl, ROWS=rows, ACCEPT=accept, **tiles_args(config, k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))
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
