"""The q/k/v projection with the rotary embedding and KV-cache write in its epilogue.

Llama's rotary embedding (transformers' rotate_half convention) mixes dimension d of a
head with dimension d + head_dim/2 of the same head:

    out[d]        = q[d] cos[d]        - q[d + half] sin[d]
    out[d + half] = q[d + half] cos[d + half] + q[d] sin[d + half]

so each program computes rows in such pairs (tile row 2i is dimension d, row 2i + 1 is
d + half) and rotates them in registers. The epilogue then writes the query heads to `q`
and the key and value heads straight into slot `pos` of the cache: no q/k/v vector,
no separate rotary or cache-update kernel. With split-K the last program of a block of
pairs rotates the finished sums (`split_k_sum`). The verify pass's kernel
(`pass_mma_heads.qkv_rope_pass_kernel`) runs this kernel's program: it differs in its
dot only (MMA).

pos is read from a tensor, unchecked (a CUDA graph's replay runs whatever pos holds):
outside the cache's slots, the cache is not written and the rotary tables are read at
row 0, so no call writes or reads outside its buffers (the decoder refuses such a step
on the host; q is then meaningless, and nothing reads it but the same step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.model.llama import rms_norm, rotate_half
from gpuinfer.kernels.common import (Workspace, launch_options, pdl_launch_next,
                                     pdl_wait_only, round_to, split_k_sum)
from gpuinfer.kernels.gemv import GemvConfig, pass_outputs, workspace_for
from gpuinfer.kernels.mma_dot import product
from gpuinfer.kernels.tile import prefetch, split_columns
from gpuinfer.model.quant import Int8Matrix, matvec_fp32, unpack


@triton.jit
def qkv_rope_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                    cos_ptr, sin_ptr, pos_ptr, ws_ptr, cnt_ptr,
                    K, stride_w, k_per_split, eps, cache_head_stride,
                    N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                    NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
                    BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                    SPLIT_K: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr,
                    N_NORM: tl.constexpr = 1, CHAINS: tl.constexpr = 1,
                    MMA: tl.constexpr = False):
    """The module's q/k/v with rotary and cache write, for the ROWS tokens of x. MMA:
    the product on the tensor cores (`mma_dot.product`), as the verify pass's kernel
    runs this program (`pass_mma_heads.qkv_rope_pass_kernel`)."""
    block = tl.program_id(0)
    pid_k = tl.program_id(1)
    r, rows, paired = rotary_rows(block, N_HEADS, N_KV, HEAD_DIM, BLOCK_N)
    k_lo, k_hi = split_columns(pid_k, K, k_per_split)
    pdl_launch_next(PDL)  # the next kernel loads its weights while this one runs
    w, g, s = prefetch(w_ptr, stride_w, rows, paired, k_lo, k_hi, norm_ptr, scale_ptr,
                       NORM, SCALED, BLOCK_K)
    pdl_wait_only(PDL)
    # The pass's tokens at slots pos - ROWS + 1 ... pos, a row each (padded to R); pos
    # and each position's cos/sin now, so that they arrive while the dot runs.
    R: tl.constexpr = triton.next_power_of_2(ROWS)
    rr = tl.arange(0, R)
    slots, tables = rotary_slots(pos_ptr, cos_ptr, sin_ptr, rr, block,
                                 cache_head_stride, N_HEADS, N_KV, HEAD_DIM, BLOCK_N,
                                 ROWS)
    y = product(w, g, s, w_ptr, stride_w, rows, paired, x_ptr, K, k_lo, k_hi, norm_ptr,
                eps, NORM, SCALED, K_NORM, BLOCK_K, N_TILES, N_NORM, True, ROWS, R,
                CHAINS, MMA)
    at = rr[:, None] * (2 * BLOCK_N) + r[None, :]
    y, last = split_k_sum(y, at, ws_ptr, cnt_ptr, block, pid_k, SPLIT_K,
                          R * 2 * BLOCK_N)
    if last:
        rotary_store(y, rr, slots, tables, q_ptr, k_cache_ptr, v_cache_ptr,
                     cache_head_stride, N_HEADS, N_KV, HEAD_DIM, ROWS)


def check_qkv(w: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, n_heads: int) -> int:
    """head_dim, read off the cache (kv_heads, capacity, head_dim), for a launch of the
    step's or the pass's q/k/v kernel, once w (the stacked (q; k; v) matrix, unpacked)
    and the rotary tables (a row a slot) are checked against it: refused before any
    launch, since the kernels trust them."""
    n_kv, capacity, head_dim = k_cache.shape
    if (rows := min(cos.shape[0], sin.shape[0])) < capacity:
        raise ValueError(f"rotary tables of {rows} rows for a cache of {capacity} "
                         "slots: make them (capacity, head_dim), a row per slot")
    if w.shape[0] != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"{tuple(w.shape)} is not q, k, v of {n_heads}/{n_kv} heads")
    if not all(t.is_contiguous() for t in (k_cache, v_cache, cos, sin)):
        raise ValueError("the cache and the rotary tables must be contiguous")
    return head_dim


def qkv_rope(w: torch.Tensor | Int8Matrix, x: torch.Tensor, q: torch.Tensor,
             k_cache: torch.Tensor,
             v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             pos: torch.Tensor, *, n_heads: int, norm: torch.Tensor | None = None,
             eps: float = 1e-5, config: GemvConfig = GemvConfig(), pdl: bool = False,
             workspace: Workspace | None = None) -> None:
    """q (n_heads * d,) = rotary(Wq xn); k_cache, v_cache (kv_heads, capacity, d): slot
    pos = rotary(Wk xn), Wv xn. w is the stacked (q; k; v) matrix, xn = RMSNorm(x) when
    `norm` is given; cos, sin (capacity, d) the rotary tables; pos a one-element
    tensor. Where pos is not a slot of the cache, nothing is written to it. x (T,
    hidden) and q (T, n_heads * d): a pass of T tokens at slots pos - T + 1 ... pos,
    each against every weight tile while it is loaded."""
    w, scale = unpack(w)
    head_dim = check_qkv(w, k_cache, v_cache, cos, sin, n_heads)
    tokens, _ = pass_outputs(x, w.shape[1], n_heads * head_dim, q=q)  # q: (T, heads d)
    launch_qkv(qkv_rope_kernel, config, w, scale, x, norm, q, k_cache, v_cache,
               (cos, sin, pos), n_heads=n_heads, tokens=tokens, eps=eps, pdl=pdl,
               workspace=workspace)


def launch_qkv(kernel, config: GemvConfig, w: torch.Tensor, scale, x, norm, q,
               k_cache: torch.Tensor, v_cache, rotary: tuple, *, n_heads: int,
               tokens: int, eps: float, pdl: bool, workspace: Workspace | None):
    """Launch `kernel`, the step's q/k/v kernel or the pass's (whose arguments are the
    step's and its tiling's, `MmaConfig.kernel_args`), over the `tokens` rows of x, its
    buffers already checked (`check_qkv`); rotary: (cos, sin, pos)."""
    _, capacity, head_dim = k_cache.shape
    n_pairs, k = w.shape[0] // 2, w.shape[1]
    ws = workspace_for(config, n_pairs, k, 2, workspace, w.device, tokens)
    grid = config.grid(n_pairs, k)
    kernel[grid](
        w, scale, x, norm, q, k_cache, v_cache, *rotary, ws.partials, ws.counters,
        k, w.stride(0), config.k_per_split(k), eps, capacity * head_dim,
        N_HEADS=n_heads, N_KV=k_cache.shape[0], HEAD_DIM=head_dim,
        SCALED=scale is not None, SPLIT_K=grid[1], PDL=pdl, ROWS=tokens,
        **config.kernel_args(k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))


def qkv_rope_reference(w, x, cos, sin, pos: int, *, n_heads: int, n_kv: int,
                       norm=None, eps=1e-5):
    """(q (n_heads * d,), k (n_kv, d), v (n_kv, d)): StaticDecoder.logits' q/k/v and
    rotary, op for op, with FP32 accumulation."""
    head_dim = cos.shape[-1]
    xn = x if norm is None else rms_norm(x, norm, eps)
    qkv = matvec_fp32(w, xn).to(x.dtype).view(n_heads + 2 * n_kv, head_dim)
    qk = qkv[: n_heads + n_kv]
    qk = qk * cos[pos] + rotate_half(qk) * sin[pos]
    return qk[:n_heads].reshape(-1), qk[n_heads:], qkv[n_heads + n_kv :]


# --- qkv_rope_kernel's pieces (a step's program and a pass's): rows, slots, epilogue


@triton.jit
def rotary_rows(block, N_HEADS: tl.constexpr, N_KV: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program `block`'s 2 BLOCK_N rows of the stacked (q; k; v) matrix, in rotary
    pairs: tile row 2i is dimension d of a head, row 2i + 1 dimension d + HEAD_DIM / 2.
    Returns the tile's row numbers, the matrix's rows and which of them exist (the
    last block's pairs may run past the heads). The step's and the pass's q/k/v
    kernels pair their rows here, so that `rotary_store` finds the pairs alike."""
    HALF: tl.constexpr = HEAD_DIM // 2
    r = tl.arange(0, 2 * BLOCK_N)
    p = block * BLOCK_N + r // 2  # pair index: head p // HALF, dimension p % HALF
    rows = (p // HALF) * HEAD_DIM + p % HALF + (r % 2) * HALF
    return r, rows, p < (N_HEADS + 2 * N_KV) * HALF


@triton.jit
def rotary_slots(pos_ptr, cos_ptr, sin_ptr, rr, block, cache_head_stride,
                 N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """Where the block's pairs go, and the rotary tables' entries that rotate them, for
    the pass's tokens at slots pos - ROWS + 1 ... pos (rr: a row each, padded): read
    before the dot, so that they arrive while it runs. Returns two tuples: (head, d,
    valid, pos, in_cache), each pair's head and dimension, whether the pair exists,
    each token's slot and whether it is one of the cache's (outside, the slot reads
    as 0: the tables' row and the slot stay in bounds); and (cos_lo, cos_hi, sin_lo,
    sin_hi), (R, BLOCK_N) in FP32 at dimensions d and d + HEAD_DIM / 2."""
    HALF: tl.constexpr = HEAD_DIM // 2
    pp = block * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = pp < (N_HEADS + 2 * N_KV) * HALF
    head = tl.where(valid, pp // HALF, 0)
    d = pp % HALF
    pos = tl.load(pos_ptr) - (ROWS - 1) + rr
    # a slot of the cache? (cache_head_stride = capacity * HEAD_DIM: no new argument)
    in_cache = (pos >= 0) & (pos * HEAD_DIM < cache_head_stride) & (rr < ROWS)
    pos = tl.where(in_cache, pos, 0)  # the tables' row and the slot stay in bounds
    table = pos[:, None] * HEAD_DIM + d[None, :]
    cos_lo = tl.load(cos_ptr + table).to(tl.float32)
    cos_hi = tl.load(cos_ptr + table + HALF).to(tl.float32)
    sin_lo = tl.load(sin_ptr + table).to(tl.float32)
    sin_hi = tl.load(sin_ptr + table + HALF).to(tl.float32)
    return (head, d, valid, pos, in_cache), (cos_lo, cos_hi, sin_lo, sin_hi)


@triton.jit
def rotary_store(y, rr, slots, tables, q_ptr, k_cache_ptr, v_cache_ptr,
                 cache_head_stride, N_HEADS: tl.constexpr, N_KV: tl.constexpr,
                 HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """The q/k/v epilogue: y (R, 2 BLOCK_N), the pairs' finished sums in FP32 in the
    order of `rotary_rows`, rounded as F.linear rounds them, the queries and keys
    rotated as PyTorch rotates them; the queries stored to q, the keys and values to
    their slots of the cache (`slots`, `tables`: `rotary_slots`')."""
    HALF: tl.constexpr = HEAD_DIM // 2
    head, d, valid, pos, in_cache = slots
    cos_lo, cos_hi, sin_lo, sin_hi = tables
    dt = q_ptr.dtype.element_ty
    # dimensions d and d + HALF, the tile's rows in pairs
    lo, hi = tl.split(tl.reshape(y, (y.shape[0], y.shape[1] // 2, 2)))
    lo = round_to(lo, dt)  # F.linear's output in the activations' dtype
    hi = round_to(hi, dt)
    # q * cos + rotate_half(q) * sin, each product and the sum rounded as in PyTorch
    rot_lo = round_to(round_to(lo * cos_lo, dt) + round_to(-hi * sin_lo, dt), dt)
    rot_hi = round_to(round_to(hi * cos_hi, dt) + round_to(lo * sin_hi, dt), dt)
    rotary = (head < N_HEADS + N_KV)[None, :]  # queries and keys, not values
    lo = tl.where(rotary, rot_lo, lo).to(dt)
    hi = tl.where(rotary, rot_hi, hi).to(dt)
    is_q = (valid & (head < N_HEADS))[None, :] & (rr < ROWS)[:, None]
    q_at = q_ptr + rr[:, None] * (N_HEADS * HEAD_DIM) + (head * HEAD_DIM + d)[None, :]
    tl.store(q_at, lo, mask=is_q)
    tl.store(q_at + HALF, hi, mask=is_q)
    # heads N_HEADS.. are keys, then values: kv head h at slot pos of the cache
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
